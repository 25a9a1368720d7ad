"""MovieLens matrix factorization: the FedRecon paper's Table 1, end to end.

Configurations (names as in the paper's Table 1):

* `centralized_standard`: a user-table MF model trained on pooled data (each
  user's first 80% of ratings by time), StandardEval on the users' last 10%.
* `centralized_recon`: the same model trained on the train *users* (80/10/10
  split by user); user embeddings of held-out test users are reconstructed
  from their support set (ReconEval) with the trained item matrix.
* `fedavg_standard` / `fedavg_recon`: as above, but the user-table model is
  trained with TFF's FedAvg (user embeddings stored on the server, footnote 4).
* `fedrecon`: Federated Reconstruction on the train users, ReconEval on the
  test users (`implementation='tff'` runs TFF 0.87's own `build_fed_recon`
  instead of `fedpersonal.algorithms.build_fed_recon`, with the same model,
  data, hyperparameters and evaluation).

Configuration flows one way: flags -> `MovieLensMFConfig` -> builders. The data splits and the task (datasets, models,
evaluations, processes): `fedpersonal.tasks.movielens_mf_task`; this module runs the rows.

Randomness comes from the config's seeds only, so two runs with the same config give bit-identical metrics (on
CPU): the data from `synthetic_seed` (generated data) and `split_seed` (user split); everything else from `seed`:
every model's initial weights (`matrix_factorization` builders with `seed`: the personal model FedRecon's clients
build each round, whose user embedding therefore starts from the same value every round, and the table model of
the centralized and FedAvg rows), the centralized rows' shuffling (`tf.data` shuffle with `seed`), the clients
sampled each round (`seed`, round) and the evaluation clients (`seed + 1`). `run` also sets TensorFlow's global
seed to `seed`, so the op-level seeds combine with the same graph-level seed whatever ran earlier in the process.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import data as data_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.baselines import centralized
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.privacy import dp as dp_lib
from fedpersonal.program import run_record
from fedpersonal.runtime import engine_workers
from fedpersonal.tasks.movielens_mf_config import CONFIGURATIONS as CONFIGURATIONS
from fedpersonal.tasks.movielens_mf_config import DATASETS as DATASETS
from fedpersonal.tasks.movielens_mf_config import MovieLensMFConfig as MovieLensMFConfig
from fedpersonal.tasks.movielens_mf_task import MovieLensMFTask as MovieLensMFTask
from fedpersonal.tasks.movielens_mf_task import PreparedData as PreparedData
from fedpersonal.tasks.movielens_mf_task import load_data as load_data
from fedpersonal.tasks.movielens_mf_task import mean_rating_baseline as mean_rating_baseline

ROW_NAMES = {
    'centralized_standard': 'Centralized + StandardEval',
    'centralized_recon': 'Centralized + ReconEval',
    'fedavg_standard': 'FedAvg + StandardEval',
    'fedavg_recon': 'FedAvg + ReconEval',
    'fedrecon': 'FedRecon (ReconEval)',
}
METRIC_KEYS = ('rmse', 'mae', 'accuracy', 'loss', 'num_examples')


def _validate_personal(input_spec):
    def validate(client_id: str, dataset: tf.data.Dataset) -> None:
        models.check_dataset_matches(input_spec, dataset, client_id=client_id)

    return validate


def train_process(task, process, name, outputs, client_data, dataset_fn, eval_fn, validate_fn=None, dp=None):
    """Runs the configured rounds (resuming from `outputs`' checkpoints), early-stopped on validation RMSE with
    `early_stopping_patience`; returns the state of the best validation round, the selection record
    (``best_round``, ``best_validation_rmse``, ``rounds``, and with `dp` its ``privacy`` report) and the median
    seconds per round. With `dp`, every round also releases ``privacy/epsilon`` (and the clip norm)."""
    cfg = task.config
    stopping = program.EarlyStopping(
        'rmse', patience=cfg.early_stopping_patience, min_delta=cfg.early_stopping_min_delta
    )
    state, history = program.run_process(
        process,
        cfg,
        outputs=outputs,
        client_data=client_data,
        dataset_fn=dataset_fn,
        evaluation_fn=eval_fn,
        name=name,
        validate_fn=validate_fn,
        stopping=stopping,
        round_metrics_fn=dp.round_metrics if dp is not None else None,
    )
    del history  # Only this process' rounds; metrics.csv has every round, also those of a resumed run.
    selection = {
        'best_round': stopping.best_round,
        'best_validation_rmse': stopping.best_value,
        'rounds': max([int(r['round']) for r in outputs.read_metrics()] or [0]),
        'early_stopped': stopping.stopped,
    }
    if dp is not None:  # Every round run counts, also those after the best one.
        selection['privacy'] = dp.report(selection['rounds'])
    best = stopping.best_state if stopping.best_state is not None else state
    return best, selection, outputs.median_round_seconds()


def _run_fedrecon(
    task: MovieLensMFTask, name: str, outputs: program.ExperimentOutputs, row: dict[str, Any]
) -> dict[str, Any]:
    """FedRecon: trains (selection and timing into `row`); returns its final test evaluation."""
    prepared = task.prepared
    dp = task.differential_privacy(prepared.user_train)
    process = task.build_fed_recon(dp)
    eval_fn = lambda w: task.periodic_metrics('recon', w, prepared.user_val, task.personal_dataset_fn)
    # With --engine_workers, every worker builds this process and reads its clients itself (the same recipe).
    with engine_workers.serve(functools.partial(fedrecon_worker_setup, task.config), process, 'FedRecon'):
        state, selection, row['seconds_per_round'] = train_process(
            task,
            process,
            name,
            outputs,
            prepared.user_train,
            task.personal_dataset_fn,
            eval_fn,
            validate_fn=_validate_personal(mf.personal_input_spec()),
            dp=dp,
        )
    row.update(selection)
    return task.evaluate('recon', process.get_model_weights(state), prepared.user_test, task.personal_dataset_fn)


def fedrecon_worker_setup(config: MovieLensMFConfig) -> engine_workers.WorkerSetup:
    """What an engine worker builds for the FedRecon row: the same data (read where the worker runs), split and
    process as `_run_fedrecon`'s, and each training client's dataset by id."""
    tf.random.set_seed(config.seed)
    prepared = load_data(config)
    task = MovieLensMFTask(config, prepared)
    process = task.build_fed_recon(task.differential_privacy(prepared.user_train))
    train = prepared.user_train
    return engine_workers.WorkerSetup(
        process, lambda cid: task.personal_dataset_fn(train.create_tf_dataset_for_client(cid))
    )


def _run_fedavg(
    task: MovieLensMFTask, name: str, outputs: program.ExperimentOutputs, row: dict[str, Any]
) -> dict[str, Any]:
    """FedAvg of the table model, on the time split ('fedavg_standard') or the user split; trains
    (selection and timing into `row`); returns its final test evaluation."""
    prepared = task.prepared
    standard = name == 'fedavg_standard'
    train = prepared.time_train if standard else prepared.user_train
    dp = task.differential_privacy(train)
    process = task.build_fed_avg(dp)

    def eval_fn(weights):
        if standard:
            return task.periodic_metrics('standard', weights, prepared.time_val, task.table_dataset_fn_eval)
        return task.periodic_metrics(
            'recon',
            task.personal_globals_from_table(weights.trainable),
            prepared.user_val,
            task.personal_dataset_fn,
        )

    state, selection, row['seconds_per_round'] = train_process(
        task, process, name, outputs, train, task.table_dataset_fn, eval_fn, dp=dp
    )
    row.update(selection)
    weights = process.get_model_weights(state)
    if standard:
        final = task.evaluate('standard', weights, prepared.time_test, task.table_dataset_fn_eval)
    else:
        final = task.evaluate(
            'recon',
            task.personal_globals_from_table(weights.trainable),
            prepared.user_test,
            task.personal_dataset_fn,
        )
    return final


def _run_centralized(
    task: MovieLensMFTask, name: str, outputs: program.ExperimentOutputs, row: dict[str, Any]
) -> dict[str, Any]:
    """Centralized training of the table model, on the time split ('centralized_standard') or the
    user split; returns its final test evaluation."""
    cfg, prepared = task.config, task.prepared
    standard = name == 'centralized_standard'
    keras_model = task.table_keras_model()
    if standard:
        train_frame, val_frame = prepared.time_split_ratings['train'], prepared.time_split_ratings['val']
    else:
        # Early stopping needs held-out ratings of *train* users: their last 10% by time.
        pooled = prepared.user_split_ratings['train']
        ranks = pooled.groupby('user_id').cumcount()
        sizes = pooled.groupby('user_id')['user_id'].transform('size')
        holdout = ranks >= np.floor(sizes * 0.9)
        train_frame, val_frame = pooled[~holdout], pooled[holdout]

    def examples(frame):
        elements = {c: frame[c].to_numpy() for c in ('user_id', 'item_id', 'rating')}
        return tf.data.Dataset.from_tensor_slices(elements).map(mf.table_example)

    centralized.train_centralized(
        keras_model,
        train_dataset=centralized.epoch_shuffled(examples(train_frame), cfg.centralized_batch_size, seed=cfg.seed),
        validation_dataset=examples(val_frame).batch(cfg.centralized_batch_size),
        optimizer=tf.keras.optimizers.get(
            {'class_name': cfg.centralized_optimizer, 'config': {'learning_rate': cfg.centralized_learning_rate}}
        ),
        loss=task.loss_fn(),
        metrics=task.metrics_fn(),
        max_epochs=cfg.centralized_max_epochs,
        patience=cfg.centralized_patience,
        min_delta=cfg.centralized_min_delta,
        monitor='val_rmse',
        on_epoch_end=lambda epoch, logs: outputs.release_metrics(epoch, centralized.split_logs(logs)),
        checkpoint_dir=outputs.path('checkpoints'),
        name=name,
    )
    trainable = [v.numpy() for v in keras_model.trainable_variables]
    if standard:
        weights = tff.learning.models.ModelWeights(
            trainable=trainable + [v.numpy() for v in keras_model.non_trainable_variables], non_trainable=[]
        )
        final = task.evaluate('standard', weights, prepared.time_test, task.table_dataset_fn_eval)
    else:
        final = task.evaluate(
            'recon', task.personal_globals_from_table(trainable), prepared.user_test, task.personal_dataset_fn
        )
    return final


# A configuration's runner: `(task, name, outputs, row) -> final test evaluation` (its training record into `row`).
RUNNERS: dict[str, Callable[[MovieLensMFTask, str, program.ExperimentOutputs, dict[str, Any]], dict[str, Any]]] = {
    'fedrecon': _run_fedrecon,
    'fedavg_standard': _run_fedavg,
    'fedavg_recon': _run_fedavg,
    'centralized_standard': _run_centralized,
    'centralized_recon': _run_centralized,
}


def run_configuration(task: MovieLensMFTask, name: str) -> dict[str, Any]:
    """Trains and evaluates one Table 1 configuration; returns its result row."""
    cfg = task.config
    outputs = program.ExperimentOutputs(cfg.output_dir, name)
    started = time.time()
    row: dict[str, Any] = {'name': ROW_NAMES[name], 'configuration': name}
    final = program.runner_for(RUNNERS, name)(task, name, outputs, row)
    row.update({k: final['metrics'][k] for k in METRIC_KEYS if k in final['metrics']})
    row['per_client'] = final['per_client']
    row['wall_seconds'] = time.time() - started
    outputs.write_json('results.json', row)
    outputs.plot_learning_curve(['train/loss', 'eval/rmse', 'eval/accuracy'], title=ROW_NAMES[name])
    return row


def run(config: MovieLensMFConfig) -> dict[str, Any]:
    """Runs every configuration in `config.configurations`; writes `results.json` and plots."""
    run_record.check_output_dir(config)  # Also when called directly; a binary has checked (same config).
    tf.random.set_seed(config.seed)
    prepared = load_data(config)
    stats = data_lib.dataset_statistics(prepared.data)
    logging.info('Data: %s; %s', prepared.description, {k: v for k, v in stats.items() if not isinstance(v, dict)})
    program.write_json(f'{config.output_dir}/config.json', dataclasses.asdict(config))
    task = MovieLensMFTask(config, prepared)
    rows = [run_configuration(task, name) for name in config.configurations]
    baseline = mean_rating_baseline(prepared, accuracy_threshold=config.accuracy_threshold)
    logging.info('Mean-rating baseline: %s', baseline)
    results = {'dataset': prepared.description, 'statistics': stats, 'rows': rows, 'baseline': baseline}
    program.write_json(f'{config.output_dir}/results.json', results)
    runs = {
        ROW_NAMES[r['configuration']]: program.ExperimentOutputs(config.output_dir, r['configuration']).read_metrics()
        for r in rows
    }
    program.plot_curves(
        runs,
        ['train/loss', 'eval/rmse', 'eval/accuracy'],
        f'{config.output_dir}/learning_curves.png',
        title=f'{config.dataset}: metrics per round (centralized rows: per epoch)',
    )
    return results


def _number(value: Any) -> str:
    """A table cell: 3 decimals, or 'n/a' for a missing value (a non-finite metric reads back from JSON as None)."""
    return 'n/a' if value is None else f'{value:.3f}'


def format_table(rows: list[dict[str, Any]], baseline: dict[str, Any] | None = None) -> str:
    """A Markdown table of the rows (RMSE, MAE, accuracy, per-client RMSE median, s/round), then the baseline and
    the differential privacy of the rows that have it."""
    lines = [
        '| configuration | RMSE | MAE | accuracy | per-client RMSE p50 [p10, p90] | s/round |',
        '|---|---|---|---|---|---|',
    ]
    for r in rows:
        pc = r.get('per_client', {}).get('rmse', {})
        spr = r.get('seconds_per_round')
        lines.append(
            f'| {r["name"]} | {_number(r.get("rmse"))} | {_number(r.get("mae"))} | {_number(r.get("accuracy"))} | '
            f'{_number(pc.get("p50"))} [{_number(pc.get("p10"))}, {_number(pc.get("p90"))}] | '
            f'{"" if spr is None else f"{spr:.2f}"} |'
        )
    if baseline is not None:
        lines.append(
            f'| {baseline["name"]}: {baseline["mean_rating"]:.2f} for every rating | {_number(baseline["rmse"])} | '
            f'{_number(baseline["mae"])} | {_number(baseline["accuracy"])} |  |  |'
        )
    lines += [f'{r["name"]}: {dp_lib.format_report(r["privacy"])}' for r in rows if r.get('privacy')]
    return '\n'.join(lines)
