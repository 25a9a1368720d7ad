"""Next-word prediction with local OOV embeddings: the FedRecon paper's Table 2 and Figure 3, end to end.

Rows (the paper's Table 2; B = `num_oov_buckets`, default 500):

* `fedyogi`: a fully global model with 1 OOV bucket trained with FedAvg and a
  Yogi server optimizer (TFF's `build_weighted_fed_avg`) on all of each
  client's data;
* `fedrecon_1oov` / `fedrecon`: FedRecon with a local OOV table of 1 / B rows,
  reconstructed from the support set (first half of the client's examples in
  time order) each round; only the global part is broadcast and aggregated;
* `oov_finetuning`: a fully global model with B OOV buckets trained like
  `fedyogi`; at evaluation the OOV table (starting from its trained value) is
  fine-tuned on the support set;
* `full_finetuning`: the same trained model; the OOV table and then all global
  variables are fine-tuned on the support set;
* `fedrecon_finetune`: FedRecon (B buckets); at evaluation the OOV table is
  reconstructed and then the global variables fine-tuned on the support set.

Every row is evaluated on the same held-out clients' query sets (second half
in time order). Communication per client per round is measured from the
values each process broadcasts and aggregates
(`fedpersonal.metrics.communication`; FedRecon on the fast simulation engine, the
default `--simulation=engine`, measures the same values per logical client in its
round runner, `build_fed_recon(measure_communication=True)`). FedYogi rows run TFF's
`build_weighted_fed_avg` per client.

Configuration flows one way: flags -> `NextWordPredictionConfig` -> builders.

Every random choice derives from `NextWordPredictionConfig.seed`, so two runs with the same config give
bit-identical metrics (on CPU): the generated corpus and the train/test client split, the validation clients
(``seed + 7``), every model's initial weights (`next_word_prediction.model_fn` / `build_keras_model` with ``seed``:
FedRecon's clients reconstruct the OOV table from the same initial value every round), the clients sampled each
round ((``seed``, round)) and the evaluation clients (``seed + 1``). `run` also sets TensorFlow's global seed to
``seed``, so the op-level seeds combine with the same graph-level seed whatever ran earlier in the process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any
from typing import ClassVar

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import algorithms
from fedpersonal import evaluation
from fedpersonal import metrics as metrics_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.algorithms import fed_recon
from fedpersonal.algorithms import optimizers
from fedpersonal.data import shakespeare
from fedpersonal.data import stackoverflow
from fedpersonal.data import synthetic_text
from fedpersonal.data import text_corpus
from fedpersonal.data import text_pipeline
from fedpersonal.metrics import communication
from fedpersonal.models import next_word_prediction as nwp
from fedpersonal.program import run_record
from fedpersonal.tasks.next_word_prediction_config import CONFIGURATIONS as CONFIGURATIONS
from fedpersonal.tasks.next_word_prediction_config import DATASETS as DATASETS
from fedpersonal.tasks.next_word_prediction_config import NextWordPredictionConfig as NextWordPredictionConfig

METRIC_KEYS = nwp.METRIC_NAMES + ('loss', 'num_examples')
COMMUNICATION_KEYS = (
    'scalars_down_per_client',
    'scalars_up_per_client',
    'bytes_down_per_client',
    'bytes_up_per_client',
)


def row_name(configuration: str, num_oov_buckets: int) -> str:
    return {
        'fedyogi': 'FedYogi (1 OOV)',
        'fedrecon_1oov': 'FedRecon (1 OOV)',
        'fedrecon': f'FedRecon ({num_oov_buckets} OOV)',
        'oov_finetuning': f'OOV Finetuning ({num_oov_buckets} OOV)',
        'full_finetuning': f'Full Finetuning ({num_oov_buckets} OOV)',
        'fedrecon_finetune': f'FedRecon+Finetune ({num_oov_buckets} OOV)',
    }[configuration]


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


@dataclasses.dataclass
class PreparedVocab:
    """One vocabulary size's encoded clients."""

    vocab_size: int
    coverage: float
    layouts: dict[int, text_pipeline.TokenLayout]
    train: dict[int, tff.simulation.datasets.ClientData]
    validation: dict[int, tff.simulation.datasets.ClientData]
    test: dict[int, tff.simulation.datasets.ClientData]
    token_statistics: dict[str, float]


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


def _train(task: NextWordPredictionTask, process, name: str, outputs, num_oov_buckets: int, eval_fn):
    """Trains `process`; with an evaluation, early-stopped on validation accuracy (without OOV and EOS targets) and
    returning the best validation round's state."""
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


class _Runner:
    """Trains each underlying model once per vocabulary size and derives the Table 2 rows from it."""

    def __init__(self, task: NextWordPredictionTask, output_dir: str):
        self.task = task
        self.output_dir = output_dir
        self._trained: dict[str, tuple] = {}

    def trained(self, kind: str, num_oov_buckets: int):
        """`(weights, training summary)` of `fedyogi` or `fedrecon` with `num_oov_buckets`."""
        key = f'{kind}_{num_oov_buckets}oov'
        if key in self._trained:
            return self._trained[key]
        task, cfg = self.task, self.task.config
        outputs = program.ExperimentOutputs(self.output_dir, key)
        if kind == 'fedrecon':
            process = task.build_fed_recon(num_oov_buckets)
            eval_computation = task.evaluation(num_oov_buckets, oov_local=True)
            eval_fn = lambda w: task.evaluate(eval_computation, w, num_oov_buckets, 'validation', cfg.eval_clients)[
                'metrics'
            ]
        else:
            process = task.build_fed_yogi(num_oov_buckets)
            eval_computation = task.evaluation(num_oov_buckets, oov_local=True, learn_local_init=True)
            eval_fn = lambda w: task.evaluate(
                eval_computation,
                task.partially_local_weights(num_oov_buckets, list(w.trainable)),
                num_oov_buckets,
                'validation',
                cfg.eval_clients,
            )['metrics']
        state, summary = _train(task, process, key, outputs, num_oov_buckets, eval_fn)
        weights = process.get_model_weights(state)
        outputs.plot_learning_curve(['train/loss', 'eval/accuracy_no_oov_no_eos'], title=key)
        self._trained[key] = (weights, summary)
        return self._trained[key]

    def _fedyogi(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedYogi with one OOV bucket, tested as is."""
        task, cfg = self.task, self.task.config
        weights, summary = self.trained('fedyogi', 1)
        # No local variables: "reconstruction" is a no-op, the trained OOV row is used as is.
        computation = task.evaluation(
            1, oov_local=True, learn_local_init=True, split=dataclasses.replace(cfg.split, recon_steps_max=0)
        )
        final = task.evaluate(
            computation, task.partially_local_weights(1, list(weights.trainable)), 1, 'test', cfg.test_clients
        )
        return final, summary

    def _fedrecon(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedRecon (one OOV bucket for 'fedrecon_1oov'; fine-tuned after reconstruction for 'fedrecon_finetune')."""
        task, cfg = self.task, self.task.config
        buckets = 1 if configuration == 'fedrecon_1oov' else cfg.num_oov_buckets
        weights, summary = self.trained('fedrecon', buckets)
        computation = task.evaluation(buckets, oov_local=True, finetune=configuration == 'fedrecon_finetune')
        return task.evaluate(computation, weights, buckets, 'test', cfg.test_clients), summary

    def _finetuning(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedYogi's model with local OOV rows learned per client ('full_finetuning': every variable fine-tuned)."""
        task, cfg = self.task, self.task.config
        b = cfg.num_oov_buckets
        weights, summary = self.trained('fedyogi', b)
        computation = task.evaluation(
            b, oov_local=True, learn_local_init=True, finetune=configuration == 'full_finetuning'
        )
        final = task.evaluate(
            computation, task.partially_local_weights(b, list(weights.trainable)), b, 'test', cfg.test_clients
        )
        return final, summary

    # A row's runner: `(runner, configuration) -> (final test evaluation, training summary)`.
    RUNNERS: ClassVar[dict[str, Callable[[Any, str], tuple[dict[str, Any], dict[str, Any]]]]] = {
        'fedyogi': _fedyogi,
        'fedrecon': _fedrecon,
        'fedrecon_1oov': _fedrecon,
        'fedrecon_finetune': _fedrecon,
        'oov_finetuning': _finetuning,
        'full_finetuning': _finetuning,
    }

    def row(self, configuration: str) -> dict[str, Any]:
        """Trains (once per model) and tests one Table 2 configuration; returns its result row."""
        b = self.task.config.num_oov_buckets
        started = time.time()
        final, summary = program.runner_for(self.RUNNERS, configuration)(self, configuration)
        row: dict[str, Any] = {'name': row_name(configuration, b), 'configuration': configuration}
        row.update({k: final['metrics'][k] for k in METRIC_KEYS if k in final['metrics']})
        row.update(summary)
        row['per_client'] = final['per_client']
        row['eval_seconds'] = time.time() - started
        return row


def run(config: NextWordPredictionConfig, corpus: text_corpus.TextCorpus | None = None) -> dict[str, Any]:
    """Runs every configuration for every vocabulary size; writes `results.json` and learning curves."""
    run_record.check_output_dir(config)  # Also when called directly; a binary has checked (same config).
    tf.random.set_seed(config.seed)
    corpus = corpus if corpus is not None else load_corpus(config)
    statistics = text_corpus.corpus_statistics(corpus, vocab_sizes=config.vocab_sizes)
    logging.info('NWP data %s: %s', corpus.name, statistics)
    program.write_json(f'{config.output_dir}/config.json', dataclasses.asdict(config))
    tables = []
    for vocab_size in config.vocab_sizes:
        task = NextWordPredictionTask(config, corpus, vocab_size)
        directory = f'{config.output_dir}/vocab_{vocab_size}'
        runner = _Runner(task, directory)
        rows = []
        for configuration in config.configurations:
            row = runner.row(configuration)
            row['vocab_size'] = vocab_size
            logging.info(
                '[vocab %d] %s: %s', vocab_size, row['name'], {k: row.get(k) for k in METRIC_KEYS + COMMUNICATION_KEYS}
            )
            rows.append(row)
        task.client_data(config.num_oov_buckets, 'train')
        tables.append(
            {
                'vocab_size': vocab_size,
                'vocabulary_coverage': task.coverage,
                'token_statistics': getattr(task, 'token_statistics', {}),
                'rows': rows,
            }
        )
        runs = {name: program.ExperimentOutputs(directory, name).read_metrics() for name in sorted(runner._trained)}
        program.plot_curves(
            runs,
            ['train/loss', 'eval/accuracy_no_oov_no_eos'],
            f'{directory}/learning_curves.png',
            title=f'{corpus.name}, vocabulary {vocab_size}: metrics per round',
        )
    results = {'dataset': corpus.name, 'source': corpus.source, 'statistics': statistics, 'tables': tables}
    program.write_json(f'{config.output_dir}/results.json', results)
    return results


def format_table(tables: list[dict[str, Any]], metric: str = 'accuracy_no_oov_no_eos') -> str:
    """The paper's Table 2 shape: rows x vocabulary sizes of `metric` (percent), plus measured communication."""
    sizes = [t['vocab_size'] for t in tables]
    names = [r['name'] for r in tables[0]['rows']]
    header = '| method | ' + ' | '.join(f'{s} vocab' for s in sizes) + ' | scalars down/up per client per round |'
    lines = [header, '|---' * (len(sizes) + 2) + '|']
    for i, name in enumerate(names):
        cells = []
        for t in tables:
            value, std = t['rows'][i].get(metric), t['rows'][i].get(f'{metric}_std')
            many = len(t['rows'][i].get('seeds', [])) > 1
            cells.append('' if value is None else f'{100 * value:.1f}' + (f' +- {100 * std:.1f}' if many else ''))
        last = tables[-1]['rows'][i]
        comm = (
            f'{last.get("scalars_down_per_client", float("nan")):,.0f} / '
            f'{last.get("scalars_up_per_client", float("nan")):,.0f}'
        )
        lines.append(f'| {name} | ' + ' | '.join(cells) + f' | {comm} (vocab {sizes[-1]}) |')
    return '\n'.join(lines)


def train_fed_recon(
    task: NextWordPredictionTask,
    split: algorithms.ReconstructionSplit,
    name: str,
    output_dir: str,
    num_oov_buckets: int | None = None,
) -> tuple[tff.learning.models.ModelWeights, dict[str, Any]]:
    """Trains FedRecon with `split` (k_r / k_u settings); returns the global weights and a training summary.

    Used by the reconstruction/update-steps sweeps (the paper's Figure 3). Resumes from `output_dir/name`'s
    checkpoints. With ``early_stopping_patience``, early-stopped on validation accuracy (ReconEval with `split` on
    ``eval_clients`` validation clients every ``rounds_per_eval`` rounds) and returning the best round's weights;
    otherwise the last round's.
    """
    cfg = task.config
    buckets = num_oov_buckets or cfg.num_oov_buckets
    outputs = program.ExperimentOutputs(output_dir, name)
    process = task.build_fed_recon(buckets, split)
    eval_fn = None
    if cfg.early_stopping_patience:
        computation = task.evaluation(buckets, oov_local=True, split=split)
        eval_fn = lambda w: task.evaluate(computation, w, buckets, 'validation', cfg.eval_clients)['metrics']
    state, summary = _train(task, process, name, outputs, buckets, eval_fn=eval_fn)
    return process.get_model_weights(state), summary


def evaluate_fed_recon(
    task: NextWordPredictionTask,
    weights: tff.learning.models.ModelWeights,
    split: algorithms.ReconstructionSplit,
    num_oov_buckets: int | None = None,
) -> dict[str, float]:
    """ReconEval of FedRecon `weights` on the test clients, reconstructing with `split`."""
    buckets = num_oov_buckets or task.config.num_oov_buckets
    final = task.evaluate(
        task.evaluation(buckets, oov_local=True, split=split), weights, buckets, 'test', task.config.test_clients
    )
    return {k: final['metrics'][k] for k in METRIC_KEYS if k in final['metrics']}


def run_fed_recon(
    task: NextWordPredictionTask,
    split: algorithms.ReconstructionSplit,
    name: str,
    output_dir: str,
    num_oov_buckets: int | None = None,
) -> dict[str, Any]:
    """Trains FedRecon with `split` and evaluates it on the test clients with the same split."""
    weights, summary = train_fed_recon(task, split, name, output_dir, num_oov_buckets)
    row = {'name': name, **evaluate_fed_recon(task, weights, split, num_oov_buckets), **summary}
    program.write_json(f'{output_dir}/{name}/results.json', row)
    return row
