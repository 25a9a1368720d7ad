"""Next-word prediction (`fedpersonal.tasks.next_word_prediction`): the corpus and the task (data, models,
evaluations and processes for one config and vocabulary size), and the training of one process.

Split from `fedpersonal.tasks.next_word_prediction` (which runs the Table 2 rows and the sweeps) so each module keeps
one job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import evaluation
from fedpersonal import metrics as metrics_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.algorithms import fed_recon
from fedpersonal.data import shakespeare
from fedpersonal.data import stackoverflow
from fedpersonal.data import synthetic_text
from fedpersonal.data import text_corpus
from fedpersonal.data import text_pipeline
from fedpersonal.metrics import communication
from fedpersonal.models import next_word_prediction as nwp
from fedpersonal.program import optimizers
from fedpersonal.tasks.next_word_prediction_config import NextWordPredictionConfig

METRIC_KEYS = nwp.METRIC_NAMES + ('loss', 'num_examples')
COMMUNICATION_KEYS = (
    'scalars_down_per_client',
    'scalars_up_per_client',
    'bytes_down_per_client',
    'bytes_up_per_client',
)


def load_corpus(config: NextWordPredictionConfig) -> text_corpus.TextCorpus:
    """The configured corpus, at most `max_examples_per_client` examples per client."""
    if config.dataset == 'shakespeare':
        path = config.data_dir or '../shared/data/shakespeare'
        corpus = shakespeare.load_shakespeare(
            path, min_examples=config.min_examples_per_client, test_fraction=config.test_fraction, seed=config.seed
        )
    elif config.dataset == 'stackoverflow':
        assert config.data_dir is not None  # NextWordPredictionConfig requires it for stackoverflow.
        corpus = stackoverflow.load_stackoverflow(config.data_dir, seed=config.seed)
    else:
        corpus = synthetic_text.generate_text_corpus(
            num_clients=config.synthetic_num_clients, test_fraction=config.test_fraction, seed=config.seed
        )
    return text_corpus.limit_examples(corpus, config.max_examples_per_client)


class NextWordPredictionTask:
    """Data, models, processes and evaluations for one config and vocabulary size."""

    def __init__(self, config: NextWordPredictionConfig, corpus: text_corpus.TextCorpus, vocab_size: int):
        self.config = config
        self.corpus = corpus
        counts = text_corpus.word_counts(corpus.train)
        self.vocab = text_corpus.vocabulary(counts, vocab_size)
        total = sum(counts.values())
        self.coverage = sum(counts[w] for w in self.vocab) / total if total else 0.0
        train_ids = sorted(corpus.train)
        validation_ids = set(
            program.sample_clients(
                train_ids,
                max(1, int(round(config.validation_fraction * len(train_ids)))),
                round_num=0,
                seed=config.seed + 7,
            )
        )
        self._clients = {
            'train': {c: corpus.train[c] for c in train_ids if c not in validation_ids},
            'validation': {c: corpus.train[c] for c in train_ids if c in validation_ids},
            'test': dict(corpus.test),
        }
        self._client_data: dict[tuple[int, str], Any] = {}
        self._evaluations: dict[tuple, evaluation.Evaluation] = {}

    # ----- data -----------------------------------------------------------
    def layout(self, num_oov_buckets: int) -> text_pipeline.TokenLayout:
        return text_pipeline.TokenLayout(len(self.vocab), num_oov_buckets)

    def client_data(self, num_oov_buckets: int, split: str) -> tff.simulation.datasets.ClientData:
        key = (num_oov_buckets, split)
        if key not in self._client_data:
            encoder = text_pipeline.TokenIdEncoder(self.vocab, num_oov_buckets, self.config.max_sequence_length)
            encoded = text_pipeline.encode_clients(self._clients[split], encoder)
            if split == 'train':
                self.token_statistics = text_pipeline.token_statistics(encoded, encoder.layout)
            self._client_data[key] = text_pipeline.to_client_data(encoded)
        return self._client_data[key]

    def dataset_fn(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.batch(self.config.batch_size)

    def eval_clients(self, num_oov_buckets: int, split: str, limit: int | None) -> list[str]:
        ids = list(self.client_data(num_oov_buckets, split).client_ids)
        if limit is not None and limit < len(ids):
            ids = program.sample_clients(ids, limit, round_num=0, seed=self.config.seed + 1)
        return ids

    # ----- models ---------------------------------------------------------
    def model_fn(self, num_oov_buckets: int, oov_local: bool):
        cfg = self.config
        return nwp.model_fn(
            self.layout(num_oov_buckets),
            oov_local=oov_local,
            max_sequence_length=cfg.max_sequence_length,
            embedding_dim=cfg.embedding_dim,
            lstm_units=cfg.lstm_units,
            seed=cfg.seed,
        )

    def keras_model(self, num_oov_buckets: int):
        """A new fully global Keras model with its (global layers, local OOV layers) split."""
        cfg = self.config
        return nwp.build_keras_model(
            self.layout(num_oov_buckets),
            max_sequence_length=cfg.max_sequence_length,
            embedding_dim=cfg.embedding_dim,
            lstm_units=cfg.lstm_units,
            seed=cfg.seed,
        )

    def tff_model_fn(self, num_oov_buckets: int):
        """The fully global model as a TFF `VariableModel` (for TFF's FedAvg)."""

        def build():
            return tff.learning.models.from_keras_model(
                self.keras_model(num_oov_buckets)[0],
                loss=nwp.loss_fn(),
                input_spec=nwp.input_spec(self.config.max_sequence_length),
                metrics=nwp.metrics_fn(self.layout(num_oov_buckets))(),
            )

        return build

    def partially_local_weights(self, num_oov_buckets: int, keras_order_trainable: list[np.ndarray]):
        """Weights of a fully global Keras model, rearranged as (globals, OOV table) for ReconEval with a learned init."""
        with tf.Graph().as_default():
            keras_model, global_layers, local_layers = self.keras_model(num_oov_buckets)
            by_name = {v.name: value for v, value in zip(keras_model.trainable_variables, keras_order_trainable)}
            ordered = [by_name[v.name] for layer in global_layers for v in layer.trainable_variables]
            ordered += [by_name[v.name] for layer in local_layers for v in layer.trainable_variables]
        if len(ordered) != len(keras_order_trainable):
            raise RuntimeError('Global/local layer split does not cover the Keras model exactly.')
        return tff.learning.models.ModelWeights(trainable=ordered, non_trainable=[])

    # ----- evaluation -----------------------------------------------------
    def evaluation(
        self,
        num_oov_buckets: int,
        *,
        oov_local: bool,
        learn_local_init: bool = False,
        finetune: bool = False,
        split: algorithms.ReconstructionSplit | None = None,
    ) -> tff.Computation:
        cfg = self.config
        split = split or cfg.split
        key = (num_oov_buckets, oov_local, learn_local_init, finetune, split)
        if key not in self._evaluations:
            self._evaluations[key] = evaluation.build_recon_eval(
                self.model_fn(num_oov_buckets, oov_local),
                loss_fn=nwp.loss_fn,
                metrics_fn=nwp.metrics_fn(self.layout(num_oov_buckets)),
                # The OOV table is reconstructed (FedRecon) or fine-tuned (from trained values) with the same optimizer.
                reconstruction_optimizer=cfg.build_reconstruction_optimizer(),
                dataset_split=split,
                finetune_optimizer=(
                    optimizers.build_optimizer(cfg.client_optimizer, cfg.finetune_learning_rate) if finetune else None
                ),
                learn_local_init=learn_local_init,
                simulation=cfg.simulation,
                group_size=cfg.group_size,
            )
        return self._evaluations[key]

    def evaluate(self, computation, weights, num_oov_buckets: int, split: str, limit: int | None) -> dict:
        data = self.client_data(num_oov_buckets, split)
        result = evaluation.evaluate_clients(
            computation,
            weights,
            self.eval_clients(num_oov_buckets, split, limit),
            lambda c: self.dataset_fn(data.create_tf_dataset_for_client(c)),
            cache_key=f'{split}/{num_oov_buckets}',
        )
        return {
            'metrics': {k: float(v) for k, v in result['eval'].items()},
            'per_client': metrics_lib.summarize_per_client(result['per_client']),
        }

    # ----- training -------------------------------------------------------
    def build_fed_recon(self, num_oov_buckets: int, split: algorithms.ReconstructionSplit | None = None):
        """FedRecon training with `split` (default: the config's), overlapping if `train_support_overlap`."""
        cfg = self.config
        split = split or cfg.split
        split = dataclasses.replace(split, allow_overlap=split.allow_overlap or cfg.train_support_overlap)
        model_fn = self.model_fn(num_oov_buckets, oov_local=True)
        return algorithms.build_fed_recon(
            model_fn,
            loss_fn=nwp.loss_fn,
            metrics_fn=nwp.metrics_fn(self.layout(num_oov_buckets)),
            server_optimizer=cfg.build_server_optimizer(),
            client_optimizer=cfg.build_client_optimizer(),
            reconstruction_optimizer=cfg.build_reconstruction_optimizer(),
            dataset_split=split,
            simulation=cfg.simulation,
            group_size=cfg.group_size,
            **self._measured_communication(model_fn),
        )

    def _measured_communication(self, model_fn) -> dict[str, Any]:
        """`build_fed_recon` arguments that measure what the clients receive and send (`communication/...`).

        The per-client path measures inside TFF with the measured broadcast and aggregator
        (`fedpersonal.metrics.communication`); the engine refuses those (it pre-aggregates groups of clients) and
        measures the same quantities, under the same metric keys, per logical client in its round runner.
        """
        if self.config.simulation == 'engine':
            return {'measure_communication': True}
        return {
            'model_distributor': communication.build_measured_broadcast(fed_recon.server_weights_type(model_fn)),
            'model_aggregator': communication.MeasuredAggregationFactory(),
        }

    def global_model_fn(self, num_oov_buckets: int):
        """The fully global model as a `ReconstructionModel`, its variables in the Keras model's order (as the
        `VariableModel` of `tff_model_fn` has them), for the engine's FedAvg."""

        def build():
            keras_model = self.keras_model(num_oov_buckets)[0]
            return models.from_keras_model(
                keras_model,
                input_spec=nwp.input_spec(self.config.max_sequence_length),
                global_variables=list(keras_model.trainable_variables) + list(keras_model.non_trainable_variables),
            )

        return build

    def build_fed_yogi(self, num_oov_buckets: int):
        """FedAvg of the fully global model with the configured server optimizer (Yogi in the paper): the engine's
        `algorithms.build_fed_avg`, or TFF's `build_weighted_fed_avg` with ``simulation='per_client'``; both
        measure the communication."""
        cfg = self.config
        if cfg.simulation == 'engine':
            return algorithms.build_fed_avg(
                self.global_model_fn(num_oov_buckets),
                loss_fn=nwp.loss_fn,
                metrics_fn=nwp.metrics_fn(self.layout(num_oov_buckets)),
                client_optimizer=cfg.build_client_optimizer(),
                server_optimizer=cfg.build_server_optimizer(),
                simulation='engine',
                group_size=cfg.group_size,
                measure_communication=True,
            )
        model_fn = self.tff_model_fn(num_oov_buckets)
        return tff.learning.algorithms.build_weighted_fed_avg(
            model_fn,
            client_optimizer_fn=cfg.build_client_optimizer(),
            server_optimizer_fn=cfg.build_server_optimizer(),
            model_distributor=communication.build_measured_broadcast(
                tff.learning.models.weights_type_from_model(model_fn)
            ),
            model_aggregator=communication.MeasuredAggregationFactory(),
        )


def train(
    task: NextWordPredictionTask,
    process: Any,
    name: str,
    outputs: program.ExperimentOutputs,
    num_oov_buckets: int,
    eval_fn: Callable[[Any], dict[str, Any]] | None,
) -> tuple[Any, dict[str, Any]]:
    """Trains `process` on the task's training clients (resuming from `outputs`' checkpoints).

    Args:
      task: The task (its config gives the rounds, sampling and early stopping).
      process: A learning process (FedRecon's or FedAvg's).
      name: The run's name in log lines.
      outputs: Where the rounds' metrics and checkpoints go.
      num_oov_buckets: The OOV buckets of the training data's token ids.
      eval_fn: Validation metrics of the model weights, or None (no evaluation, no early stopping).

    Returns:
      ``(state, summary)``: the state of the best validation round (of the last round without `eval_fn`) and the
      training summary (``seconds_per_round``, ``rounds``, the best round and the median communication).
    """
    cfg = task.config
    stopping = None
    if eval_fn is not None:
        stopping = program.EarlyStopping(
            'accuracy_no_oov_no_eos',
            mode='max',
            patience=cfg.early_stopping_patience,
            min_delta=cfg.early_stopping_min_delta,
        )
    state, history = program.run_process(
        process,
        cfg,
        outputs=outputs,
        client_data=task.client_data(num_oov_buckets, 'train'),
        dataset_fn=task.dataset_fn,
        evaluation_fn=eval_fn,
        name=name,
        stopping=stopping,
    )
    del history  # Only this process' rounds; metrics.csv has every round, also those of a resumed run.
    rows = outputs.read_metrics()
    seconds = [r['round_seconds'] for r in rows if 'round_seconds' in r]
    summary = {'seconds_per_round': float(np.median(seconds)) if seconds else None}
    summary['rounds'] = max([int(r['round']) for r in rows] or [0])
    if stopping is not None:
        summary.update(best_round=stopping.best_round, best_validation_accuracy_no_oov_no_eos=stopping.best_value)
        if stopping.best_state is not None:
            state = stopping.best_state
    for key in COMMUNICATION_KEYS:
        values = [r[f'communication/{key}'] for r in rows if f'communication/{key}' in r]
        if values:
            summary[key] = float(np.median(values))
    return state, summary
