"""FURL's four configurations (Bui et al., Table 2/3): Global/Personalized x Server/FL.

* `global_server`: the document model without user embedding, trained centrally (SGD).
* `personalized_server`: with a user-embedding *table* (`user_id` lookup), trained centrally.
* `global_fl`: without user embedding, trained with TFF's FedAvg.
* `personalized_fl`: FURL -- the user embedding is a private parameter kept in a
  client state store between rounds (`fedpersonal.algorithms.build_furl`).

FL settings as in the paper: `clients_per_round` users per round (10), one local
epoch; an "epoch" of FL is `num_users / clients_per_round` rounds. Every
configuration is evaluated on each user's held-out test examples (the same
users are seen in training, as in the paper); Personalized FL is also
evaluated with the default private state (as for a never-seen user).
The analysis compares the user embeddings learned on the server and in FL
(t-SNE projection, k-nearest-neighbour overlap).

Configuration flows one way: flags -> `FurlConfig` -> builders.

Every random choice derives from `FurlConfig.seed`, so two runs with the same config give bit-identical metrics
(on CPU): the generated data and the 'random' split order, every model's initial weights (`furl_models` with
``seed``), the server rows' shuffling (each epoch's `tf.data` shuffle seeded from (``seed``, epoch)), the clients
sampled each round ((``seed``, round)), the clients' default private state
(`client_state.seeded_uniform_default` with ``seed``) and the t-SNE projection. `run` also sets TensorFlow's global seed to ``seed``, so the op-level seeds combine with the same
graph-level seed whatever ran earlier in the process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import algorithms
from fedpersonal import client_state
from fedpersonal import core
from fedpersonal import errors
from fedpersonal import evaluation
from fedpersonal import program
from fedpersonal.algorithms import furl
from fedpersonal.baselines import centralized
from fedpersonal.data import furl_tasks
from fedpersonal.models import furl_models
from fedpersonal.privacy import dp as dp_lib
from fedpersonal.program import run_record
from fedpersonal.program import training_loop
from fedpersonal.tasks import furl_embeddings
from fedpersonal.tasks.furl_personalization_config import CONFIGURATIONS as CONFIGURATIONS
from fedpersonal.tasks.furl_personalization_config import DATASETS as DATASETS
from fedpersonal.tasks.furl_personalization_config import FurlConfig as FurlConfig

ROW_NAMES = {
    'global_server': 'Global Server',
    'personalized_server': 'Personalized Server',
    'global_fl': 'Global FL',
    'personalized_fl': 'Personalized FL',
}


def load_data(config: FurlConfig) -> furl_tasks.FurlData:
    """The dataset named by `config.dataset` (generated or read from `config.data_dir`)."""
    if config.dataset == 'synthetic_subreddit':
        from fedpersonal.data import synthetic_subreddit  # pylint: disable=g-import-not-at-top

        return synthetic_subreddit.generate_subreddit_like(
            num_users=config.synthetic_num_users, max_chars=config.max_chars, seed=config.seed
        )
    if config.dataset == 'csv':
        from fedpersonal.data import csv_tasks  # pylint: disable=g-import-not-at-top

        assert config.data_path is not None  # FurlConfig requires it for this dataset.
        return csv_tasks.load_csv_furl(
            config.data_path,
            split_order=config.split_order,
            seed=config.seed,
            binarize_threshold=config.binarize_threshold,
            like_threshold=config.like_threshold,
        )
    assert config.data_dir is not None  # FurlConfig requires it for every dataset but synthetic_subreddit and csv.
    if config.dataset == 'movielens_likes':
        from fedpersonal.data import movielens_likes  # pylint: disable=g-import-not-at-top

        return movielens_likes.load_movielens_likes(
            config.data_dir,
            max_chars=config.max_chars,
            seed=config.seed,
            split_order='random' if config.split_order == 'shuffle' else 'time',  # 'file' is refused (config).
        )
    from fedpersonal.data import assistments  # pylint: disable=g-import-not-at-top

    split_order = {None: 'time', 'file': 'time', 'shuffle': 'random'}[config.split_order]
    return assistments.load_assistments(config.data_dir, seed=config.seed, split_order=split_order)


class FurlTask:
    """Models, datasets and evaluations for one `FurlConfig` and dataset."""

    def __init__(self, config: FurlConfig, data: furl_tasks.FurlData):
        self.config = config
        self.data = data
        self.binary = data.num_classes == 2
        self.loss_fn = furl_models.loss_fn
        self.metrics_fn = functools.partial(furl_models.metrics_fn, num_classes=data.num_classes)
        self._evaluations: dict[str, evaluation.Evaluation] = {}

    def model_fn(self, personalization: str):
        cfg = self.config
        return furl_models.furl_model_fn(
            **self.data.model_kwargs(),
            personalization=personalization,
            char_embedding_dim=cfg.char_embedding_dim,
            lstm_units=cfg.lstm_units,
            user_embedding_dim=cfg.user_embedding_dim,
            mlp_units=(cfg.mlp_units,),
            seed=cfg.seed,
        )

    def dataset_fn(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return furl_models.batch_dataset(dataset, batch_size=self.config.batch_size)

    def total_rounds(self) -> int:
        cfg = self.config
        if cfg.total_rounds is not None:
            return cfg.total_rounds
        return max(1, int(round(cfg.epochs * self.data.num_users / cfg.clients_per_round)))

    def make_dataset(self, split: str) -> Any:
        """A client id -> its batched dataset of `split` ('train', 'eval' or 'test')."""
        client_data = self.data.client_data(split)
        return lambda c: self.dataset_fn(client_data.create_tf_dataset_for_client(c))

    def evaluate(self, evaluate: evaluation.Evaluation, weights, split: str, private_states=None) -> dict[str, float]:
        """Every user's `split` examples, with `evaluate` from `fedpersonal.evaluation` (engine or per-client)."""
        result = evaluation.evaluate_clients(
            evaluate, weights, self.data.client_ids, self.make_dataset(split), private_states, cache_key=split
        )
        return {k: float(v) for k, v in result['eval'].items()}

    # --- evaluation of fully global models (the same StandardEval as every other row) ---
    def evaluate_global(self, personalization: str, weights, split: str = 'test') -> dict[str, float]:
        if personalization not in self._evaluations:  # Built (and traced) once, reused every evaluation.
            self._evaluations[personalization] = evaluation.build_standard_eval(
                self.model_fn(personalization),
                loss_fn=self.loss_fn,
                metrics_fn=self.metrics_fn,
                simulation=self.config.simulation,
                group_size=self.config.group_size,
            )
        return self.evaluate(self._evaluations[personalization], weights, split)


def _keras_weights(keras_model: tf.keras.Model) -> tff.learning.models.ModelWeights:
    return tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in keras_model.trainable_variables],
        non_trainable=[v.numpy() for v in keras_model.non_trainable_variables],
    )


def _user_table(keras_model: tf.keras.Model) -> np.ndarray | None:
    """The `[num_users, dim]` user-embedding table of a 'table' model (None for models without one)."""
    try:
        return keras_model.get_layer(furl_models.USER_EMBEDDING_LAYER).get_weights()[0]
    except ValueError:
        return None


def run_server(
    task: FurlTask, name: str, outputs: program.ExperimentOutputs
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Centralized SGD on the pooled training examples: up to `epochs` epochs, early-stopped after
    `centralized_patience` epochs without a better validation metric (the federated rows' one: AUC for binary
    tasks, else accuracy; better by more than `centralized_min_delta`), ending with the best epoch's weights;
    resumes from its epoch checkpoints."""
    cfg, data = task.config, task.data
    personalization = 'table' if name == 'personalized_server' else 'none'
    model = task.model_fn(personalization)()
    examples = lambda split: tf.data.Dataset.from_tensor_slices(data.arrays(split)).map(furl_models.to_model_input)
    monitor = f'val_{_validation_metric(task)}'
    history = centralized.train_centralized(
        model.keras_model,
        train_dataset=centralized.epoch_shuffled(examples('train'), cfg.batch_size, seed=cfg.seed),
        validation_dataset=examples('eval').batch(cfg.batch_size),
        optimizer=tf.keras.optimizers.get(
            {'class_name': cfg.centralized_optimizer, 'config': {'learning_rate': cfg.centralized_learning_rate}}
        ),
        loss=task.loss_fn(),
        metrics=task.metrics_fn(),
        max_epochs=cfg.epochs,
        patience=cfg.centralized_patience,
        monitor=monitor,
        mode='max',
        min_delta=cfg.centralized_min_delta,
        on_epoch_end=lambda epoch, logs: outputs.release_metrics(epoch, centralized.split_logs(logs)),
        checkpoint_dir=outputs.path('checkpoints'),
        name=name,
    )
    best = centralized.best_epoch(history, monitor=monitor, mode='max', min_delta=cfg.centralized_min_delta)
    row: dict[str, Any] = {
        **task.evaluate_global(personalization, _keras_weights(model.keras_model)),
        'selected_by': monitor,
        'best_epoch': best,
        'epochs': len(history[monitor]),
        'early_stopped': len(history[monitor]) < cfg.epochs,
        f'best_validation_{monitor[4:]}': history[monitor][best - 1],
    }
    return row, _user_table(model.keras_model)


def _validation_metric(task: FurlTask) -> str:
    """The validation metric every row selects on: AUC for binary tasks, else accuracy."""
    return 'auc' if task.binary else 'accuracy'


def _stopping(task: FurlTask, keep_client_states: bool = False) -> program.EarlyStopping:
    """Early stopping of a federated row on its validation metric (AUC for binary tasks, else accuracy)."""
    cfg = task.config
    return program.EarlyStopping(
        _validation_metric(task),
        mode='max',
        keep_client_states=keep_client_states,
        patience=cfg.early_stopping_patience,
        min_delta=cfg.early_stopping_min_delta,
    )


def _selection(
    stopping: program.EarlyStopping, outputs: program.ExperimentOutputs, dp: dp_lib.DifferentialPrivacy | None = None
) -> dict[str, Any]:
    """What the run's early stopping saw: its best validation round and value, and the rounds run (with `dp`, the
    privacy report of every round run)."""
    rounds = max([int(r['round']) for r in outputs.read_metrics()] or [0])
    selection: dict[str, Any] = {
        'best_round': stopping.best_round,
        f'best_validation_{stopping.metric}': stopping.best_value,
        'rounds': rounds,
        'early_stopped': stopping.stopped,
    }
    if dp is not None:
        selection['privacy'] = dp.report(rounds)
    return selection


def _differential_privacy(task: FurlTask, name: str) -> tuple[dp_lib.DifferentialPrivacy | None, dict[str, Any]]:
    """A federated row's DP (None without --dp_noise_multiplier) and the builder arguments it sets: the DP
    aggregator of the federated parameters, uniform client weights, and the per-client path for adaptive clipping."""
    cfg = task.config
    dp = dp_lib.DifferentialPrivacy.from_config(cfg, num_clients=len(task.data.train.client_ids))
    if dp is None:
        return None, dict(simulation=cfg.simulation)
    return dp, dict(
        model_aggregator=dp.aggregator(),
        client_weighting=dp.client_weighting,
        simulation=dp.simulation(cfg.simulation, name, engine_clips_per_client=True),
    )


def run_global_fl(task: FurlTask, outputs: program.ExperimentOutputs) -> dict[str, Any]:
    """FedAvg of the model without user embedding (`algorithms.build_fed_avg`, equal to TFF's
    `build_weighted_fed_avg`), tested with its best validation round's model."""
    cfg = task.config
    dp, dp_kwargs = _differential_privacy(task, 'global_fl')
    process = algorithms.build_fed_avg(
        task.model_fn('none'),
        loss_fn=task.loss_fn,
        metrics_fn=task.metrics_fn,
        client_optimizer=cfg.build_client_optimizer(),
        server_optimizer=cfg.build_server_optimizer(),
        epochs=cfg.client_epochs,
        group_size=cfg.group_size,
        **dp_kwargs,
    )
    stopping = _stopping(task)
    state, history = program.run_process(
        process,
        cfg,
        outputs=outputs,
        client_data=task.data.train,
        total_rounds=task.total_rounds(),
        dataset_fn=task.dataset_fn,
        evaluation_fn=lambda w: task.evaluate_global('none', w, 'eval'),
        name='global_fl',
        stopping=stopping,
        round_metrics_fn=dp.round_metrics if dp is not None else None,
    )
    best = stopping.best_state if stopping.best_state is not None else state
    row: dict[str, Any] = task.evaluate_global('none', process.get_model_weights(best))
    del history  # Only this process' rounds; metrics.csv has every round, also those of a resumed run.
    row['seconds_per_round'] = outputs.median_round_seconds()
    row.update(_selection(stopping, outputs, dp))
    return row


def _open_store(task: FurlTask, process: core.PersonalizedProcess, outputs: program.ExperimentOutputs):
    assert process.private_state_type is not None  # Only personalized (stateful) processes have a store.
    spec = [
        (tuple(t.shape), t.dtype)
        for t in list(process.private_state_type.trainable) + list(process.private_state_type.non_trainable)
    ]
    default = client_state.seeded_uniform_default(spec, scale=0.05, seed=task.config.seed)
    return program.open_store(task.config.state_store, outputs, spec, default), default


def run_personalized_fl(task: FurlTask, outputs: program.ExperimentOutputs) -> tuple[dict[str, Any], np.ndarray]:
    cfg, data = task.config, task.data
    model_fn = task.model_fn('private')
    dp, dp_kwargs = _differential_privacy(task, 'personalized_fl')  # The federated parameters only.
    process = furl.build_furl(
        model_fn,
        loss_fn=task.loss_fn,
        metrics_fn=task.metrics_fn,
        client_optimizer=cfg.build_client_optimizer(),
        server_optimizer=cfg.build_server_optimizer(),
        client_epochs=cfg.client_epochs,
        private_norm_regularization=cfg.private_norm_regularization,
        group_size=cfg.group_size,
        **dp_kwargs,
    )
    evaluate = evaluation.build_private_state_eval(
        model_fn,
        loss_fn=task.loss_fn,
        metrics_fn=task.metrics_fn,
        simulation=cfg.simulation,
        group_size=cfg.group_size,
    )
    ids = data.client_ids
    to_weights = lambda arrays: training_loop.to_model_weights(arrays, process.private_state_type)

    store, default = _open_store(task, process, outputs)
    # Tested like the other rows with its best validation round: the server state and every user's private state
    # of that round (the loop keeps them in the store).
    stopping = _stopping(task, keep_client_states=True)
    with store:

        def eval_fn(weights, split='eval', states=None):
            states = store.get(ids) if states is None else states
            return task.evaluate(evaluate, weights, split, [to_weights(s) for s in states])

        state, history = program.run_process(
            process,
            cfg,
            outputs=outputs,
            client_data=data.train,
            total_rounds=task.total_rounds(),
            dataset_fn=task.dataset_fn,
            evaluation_fn=eval_fn,
            name='personalized_fl',
            client_state_store=store,
            stopping=stopping,
            round_metrics_fn=dp.round_metrics if dp is not None else None,
        )
        weights = process.get_model_weights(stopping.best_state if stopping.best_state is not None else state)
        best_states = stopping.best_client_states(store, ids)
        row = eval_fn(weights, 'test', best_states)
        default_metrics = eval_fn(weights, 'test', [default(c) for c in ids])
        row.update({f'default_state_{k}': v for k, v in default_metrics.items()})
        del history  # Only this process' rounds; metrics.csv has every round, also those of a resumed run.
        row['seconds_per_round'] = outputs.median_round_seconds()
        row['clients_with_trained_state'] = int(sum(store.contains(c) for c in ids))
        row.update(_selection(stopping, outputs, dp))
        embeddings = np.stack([s[0].reshape(-1) for s in best_states])
    return row, embeddings


# A row's runner: `(task, name, outputs) -> (metrics, user embeddings or None)`.
RUNNERS: dict[str, Callable[[FurlTask, str, program.ExperimentOutputs], tuple[dict[str, Any], np.ndarray | None]]] = {
    'global_server': run_server,
    'personalized_server': run_server,
    'global_fl': lambda task, name, outputs: (run_global_fl(task, outputs), None),
    'personalized_fl': lambda task, name, outputs: run_personalized_fl(task, outputs),
}
_EMBEDDINGS = {'personalized_server': 'server', 'personalized_fl': 'fl'}  # Rows with user embeddings to compare.
_EMBEDDINGS_FILE = 'user_embeddings.npy'


def _finished_row(
    task: FurlTask, name: str, outputs: program.ExperimentOutputs
) -> tuple[dict[str, Any], np.ndarray | None] | None:
    """The row a run finished earlier in `outputs` and its user embeddings (None: the row has not finished).

    Raises:
      errors.ConfigError: A server row finished by an older version, which selected its epoch on validation loss.
    """
    path = outputs.path('results.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        row = json.load(f)
    monitor = f'val_{_validation_metric(task)}'
    if name.endswith('_server') and row.get('selected_by') != monitor:
        raise errors.ConfigError(
            f'{path}: this {name} row was selected by another rule than {monitor} (an older version selected the '
            f'epoch on validation loss); delete {os.path.dirname(path)} to train it again, or pass --fresh_start.'
        )
    embeddings = outputs.path(_EMBEDDINGS_FILE)
    return row, (np.load(embeddings) if os.path.exists(embeddings) else None)


def run(config: FurlConfig) -> dict[str, Any]:
    """Runs the configured FURL configurations; writes results.json, curves and the embedding plot."""
    run_record.check_output_dir(config)  # Also when called directly; a binary has checked (same config).
    tf.random.set_seed(config.seed)
    data = load_data(config)
    task = FurlTask(config, data)
    program.write_json(os.path.join(config.output_dir, 'config.json'), dataclasses.asdict(config))
    logging.info('FURL data: %s; %s', data.description, data.statistics())
    rows, embeddings = [], {}
    for name in config.configurations:
        outputs = program.ExperimentOutputs(config.output_dir, name)
        finished = _finished_row(task, name, outputs)
        if finished is not None:  # A rerun after an interruption in a later row.
            row, table = finished
        else:
            started = time.time()
            metrics, table = program.runner_for(RUNNERS, name)(task, name, outputs)
            row = {'name': ROW_NAMES[name], 'configuration': name, **metrics, 'wall_seconds': time.time() - started}
            if table is not None:
                np.save(outputs.path(_EMBEDDINGS_FILE), table)
            outputs.write_json('results.json', row)
            outputs.plot_learning_curve(['train/loss', 'eval/loss', 'eval/accuracy', 'eval/auc'], title=ROW_NAMES[name])
        if table is not None:
            embeddings[_EMBEDDINGS[name]] = table
        rows.append(row)
    results = {
        'dataset': data.description,
        'statistics': data.statistics(),
        'rows': rows,
        'rounds': task.total_rounds(),
    }
    if 'server' in embeddings and 'fl' in embeddings:
        results['embeddings'] = furl_embeddings.embedding_analysis(
            embeddings['server'],
            embeddings['fl'],
            data.user_positive_rate,
            os.path.join(config.output_dir, 'user_embeddings.png'),
            config.knn,
            config.seed,
            rate_label='user positive rate' if data.num_classes == 2 else "share of the user's top class",
        )
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    metrics = {
        r['configuration']: program.ExperimentOutputs(config.output_dir, r['configuration']).read_metrics()
        for r in rows
    }
    # The server rows train in epochs, not rounds: each is drawn at its selected epoch (best validation metric).
    selected = f'eval/{_validation_metric(task)}'
    references = {
        f'{ROW_NAMES[name]} (selected epoch)': max(epochs, key=lambda row: row.get(selected, -np.inf))
        for name, epochs in metrics.items()
        if name in ('global_server', 'personalized_server') and epochs
    }
    program.plot_curves(
        {ROW_NAMES[name]: rounds for name, rounds in metrics.items() if name in ('global_fl', 'personalized_fl')},
        ['eval/loss', 'eval/accuracy', 'eval/auc'],
        os.path.join(config.output_dir, 'learning_curves.png'),
        title=f'{data.name}: validation metrics of the FL rows per round (server rows: their selected epoch)',
        references=references,
    )
    return results


def format_table(rows: list[dict[str, Any]], binary: bool) -> str:
    """Markdown table in the paper's Table 3 shape (AUC for binary tasks, accuracy otherwise); a row averaged over
    seeds shows ``mean +- std`` and the federated rows their early-stopping rounds; then the differential privacy of
    the rows that have it."""
    metrics = ['auc', 'accuracy'] if binary else ['accuracy']
    head = ' | '.join(m.upper() if m == 'auc' else m for m in metrics)
    lines = [
        f'| configuration | {head} | loss | default-state {metrics[0]} | best round or epoch (of) | seeds | s/round |',
        '|---' * (len(metrics) + 6) + '|',
    ]

    def value(r: dict[str, Any], key: str) -> str:
        if r.get(key) is None:
            return ''
        std = r.get(f'{key}_std')
        return f'{r[key]:.4f}' + (f' +- {std:.4f}' if std is not None and len(r.get('seeds', [])) > 1 else '')

    for r in rows:
        values = ' | '.join(value(r, m) for m in metrics)
        if r.get('best_round') is not None:
            rounds = f'{r["best_round"]:.0f} ({r["rounds"]:.0f})'
        else:
            rounds = f'epoch {r["best_epoch"]:.0f} ({r["epochs"]:.0f})' if r.get('best_epoch') is not None else ''
        spr = r.get('seconds_per_round')
        lines.append(
            f'| {r["name"]} | {values} | {value(r, "loss")} | {value(r, f"default_state_{metrics[0]}")} | {rounds} | '
            f'{len(r.get("seeds", [0]))} | {"" if spr is None else f"{spr:.3f}"} |'
        )
    lines += [f'{r["name"]}: {dp_lib.format_report(r["privacy"])}' for r in rows if r.get('privacy')]
    return '\n'.join(lines)
