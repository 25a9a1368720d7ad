"""HPFL's experiment (Wu et al., WWW 2021): centralized baselines, federated baselines, HPFL and its ablations.

One row per method, all on the same data, splits and GUM (`fedpersonal.models.gum`):

* centralized, on the pooled data of all silos (global user and item ids): NCD (binary task) or NCF (rating task)
  and the GUM (`fedpersonal.models.user_modeling_baselines`);
* federated (`fedpersonal.algorithms.hpfl.baselines`): Distributed (local only), FedSGD, FedAvg, Fednoise, FedProx,
  FedAtt;
* HPFL (`fedpersonal.algorithms.hpfl`): HPFL-K (public components only), HPFL-R (private components only), HPFL with
  the published distance weighting of the global centres and HPFL with inverse-distance weighting (the issue asks
  for both).

Every federated row is a configuration of the one HPFL-family builder (`hpfl.build_method(method, ...)`) run by the
shared training loop (`fedpersonal.program.run_learning_process`: every silo every round, silo client states in an
SQLite client state store, checkpoints every ``rounds_per_checkpoint`` rounds).

**Model selection** never looks at test data: federated methods are evaluated on the validation split every
``rounds_per_eval`` rounds and the client states of the round with the lowest validation RMSE are kept (each silo
predicts with its own personalized model); centralized models keep the epoch with the lowest validation loss.

**Metrics** on the TEST split pooled over silos (`fedpersonal.metrics.user_modeling_metrics`): binary task ACC, AUC,
RMSE; rating task ACC (rounded rating equals the true one), MAE, RMSE (ratings on the 1..5 scale); for both DOA and
NDCG@``ndcg_k`` (gain ``ndcg_gain``: linear = the label itself, 0/1 or the rating). DOA pairs are formed between
records of the same item **within one silo** (every method sees exactly the same pairs; a federated model's user
scores are only comparable inside its silo), with per-attribute user scores: for GUM rows the model-implied
proficiency `gum_attribute_proficiency` (with each silo's own public components; DOA on raw theta is reported too,
as ``doa_theta``), sigmoid(theta) for NCD, NCF's mean predicted score over the items of the attribute. NDCG ranks
each user's test items by predicted score.
``seconds_per_round`` is the median wall time of a round (federated rows, over every round in ``metrics.csv``;
centralized rows give ``seconds_per_epoch``).

**Resuming**: rerunning with the same ``output_dir`` and configuration (``run_config.json``; a different one is
refused, `fedpersonal.program.run_record`; ``configurations``, the rows, may change) reads the rows that finished back from ``<method>/results.json`` instead of training them again, resumes
an interrupted federated method from its latest checkpoint (server state, client states and the model selection)
and ends with the numbers of an uninterrupted run; a finished run returns its ``results.json`` without evaluating
anything again. Every random choice derives from ``seed`` (data generation and silo split, GUM/NCD/NCF
initializers, shuffles of the train splits, Fednoise's noise).

**Private components analysis** (`private_components_analysis`): after training, are the clients distinguishable
from the user embeddings theta (private components) of their users? For each federated method: the 5-fold
cross-validated accuracy of a multinomial logistic-regression probe predicting a user's client from their theta row
(chance: the largest client's share of users) and the silhouette score of theta with the client as the cluster
label; a 2-D PCA projection of Distributed vs HPFL thetas coloured by client (the largest 10 clients).

Outputs under ``output_dir``: per method ``<method>/metrics.csv`` (per round or epoch; `program.ExperimentOutputs`),
``<method>/results.json`` (the row), federated methods' ``<method>/checkpoints/`` and ``<method>/theta.npy`` (the
selected users' theta, for the analysis; the client state store ``client_states.sqlite`` is deleted once the row is
written); ``results.json`` (all rows, statistics, analysis), ``learning_curves.png``,
``attribute_distribution.png`` and ``private_components.png``.

Configuration flows one way: flags -> `HpflConfig` -> builders.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from fedpersonal import client_state
from fedpersonal import core
from fedpersonal import errors
from fedpersonal import program
from fedpersonal import wording
from fedpersonal.algorithms import hpfl
from fedpersonal.data import user_modeling
from fedpersonal.metrics import user_modeling_metrics as um_metrics
from fedpersonal.models import gum
from fedpersonal.program import run_record
from fedpersonal.runtime import engine_workers
from fedpersonal.tasks import hpfl_centralized
from fedpersonal.tasks.hpfl_analysis import ROW_NAMES
from fedpersonal.tasks.hpfl_analysis import evaluate_predictions
from fedpersonal.tasks.hpfl_analysis import format_accuracy_table
from fedpersonal.tasks.hpfl_analysis import format_private_table
from fedpersonal.tasks.hpfl_analysis import format_ranking_table
from fedpersonal.tasks.hpfl_analysis import format_statistics_table
from fedpersonal.tasks.hpfl_analysis import gum_attribute_proficiency
from fedpersonal.tasks.hpfl_analysis import private_components_analysis
from fedpersonal.tasks.hpfl_centralized import PooledIndex
from fedpersonal.tasks.hpfl_user_modeling_config import CENTRALIZED as CENTRALIZED
from fedpersonal.tasks.hpfl_user_modeling_config import DATASETS as DATASETS
from fedpersonal.tasks.hpfl_user_modeling_config import HPFL_METHODS as HPFL_METHODS
from fedpersonal.tasks.hpfl_user_modeling_config import METHODS as METHODS
from fedpersonal.tasks.hpfl_user_modeling_config import NDCG_GAINS as NDCG_GAINS
from fedpersonal.tasks.hpfl_user_modeling_config import HpflConfig as HpflConfig

__all__ = [
    'DATASETS',
    'METHODS',
    'ROW_NAMES',
    'HpflConfig',
    'load_data',
    'PooledIndex',
    'evaluate_predictions',
    'gum_attribute_proficiency',
    'run',
    'private_components_analysis',
    'format_statistics_table',
    'format_accuracy_table',
    'format_ranking_table',
    'format_private_table',
]

_STATE_STORE = 'client_states.sqlite'
_THETA = 'theta.npy'


def load_data(config: HpflConfig) -> user_modeling.UserModelingData:
    """The dataset named by `config.dataset` (generated, or read from `config.data_dir`), without the silos that
    have more than `config.max_items_per_silo` items."""
    data = _load_all(config)
    if config.max_items_per_silo is None:
        return data
    kept = [s for s in data.silos if s.num_items <= config.max_items_per_silo]
    if not kept:
        raise errors.ConfigError(
            f'max_items_per_silo={config.max_items_per_silo} leaves no silo of {data.name} '
            f'(smallest: {min(s.num_items for s in data.silos)} items).'
        )
    left_out = [f'{s.client_id} ({s.num_items} items)' for s in data.silos if s.num_items > config.max_items_per_silo]
    if not left_out:
        return data
    logging.info(
        'Leaving out %s with more than %d items: %s',
        wording.count(len(left_out), 'silos'),
        config.max_items_per_silo,
        ', '.join(left_out),
    )
    return dataclasses.replace(
        data,
        silos=kept,
        source=f'{data.source}; left out (more than {config.max_items_per_silo} items): {", ".join(left_out)}',
    )


def _load_all(config: HpflConfig) -> user_modeling.UserModelingData:
    if config.dataset == 'synthetic':
        from fedpersonal.data import synthetic_user_modeling  # pylint: disable=g-import-not-at-top

        return synthetic_user_modeling.generate_user_modeling(
            num_clients=config.synthetic_num_clients,
            users_per_client=config.synthetic_users_per_client,
            task=config.synthetic_task,
            seed=config.seed,
        )
    if config.dataset == 'assistments':
        from fedpersonal.data import hpfl_assistments  # pylint: disable=g-import-not-at-top

        assert config.data_dir is not None  # HpflConfig requires it for this dataset.
        return hpfl_assistments.load_assist_silos(
            config.data_dir,
            num_clients=config.assist_num_clients,
            seed=config.seed,
            grouping=config.assist_grouping,
            split_order=config.split_order or 'file',
        )
    if config.dataset == 'csv':
        from fedpersonal.data import csv_tasks  # pylint: disable=g-import-not-at-top

        assert config.data_path is not None  # HpflConfig requires it for this dataset.
        return csv_tasks.load_csv_silos(
            config.data_path,
            grouping=config.assist_grouping,
            num_clients=config.assist_num_clients,
            split_order=config.split_order,
            seed=config.seed,
            binarize_threshold=config.binarize_threshold,
        )
    from fedpersonal.data import hpfl_movielens  # pylint: disable=g-import-not-at-top

    assert config.data_dir is not None  # HpflConfig requires it for this dataset.
    return hpfl_movielens.load_movielens_silos(config.data_dir)


# ------------------------------------------------------------------------------------------------ federated
def _build_process(
    method: str, config: HpflConfig, gum_config: gum.GumConfig, num_silos: int
) -> core.PersonalizedProcess:
    """The method's configuration of the one HPFL-family builder (`hpfl.round_spec` names them)."""
    assert config.accuracy_threshold is not None  # `run` derives it from the data when it is None.
    return hpfl.build_method(
        method,
        gum_config,
        client_optimizer=config.build_client_optimizer(),
        client_epochs=config.client_epochs,
        proximal_strength=config.proximal_strength,
        noise_stddev=config.noise_stddev,
        attention_step=config.attention_step,
        accuracy_threshold=config.accuracy_threshold,
        center_weighting=config.center_weighting,
        public_seed=config.seed,
        row_updates=config.row_updates,
        max_clients=max(num_silos, 1),
        max_local_clusters=config.max_local_clusters,
        max_global_clusters=config.max_global_clusters,
        kmeans_iterations=config.kmeans_iterations,
        simulation=config.simulation,
    )


def _client_data(config: HpflConfig, data: user_modeling.UserModelingData, gum_config: gum.GumConfig) -> dict[str, Any]:
    ids = [silo.client_id for silo in data.silos]
    return dict(zip(ids, hpfl.federated_data(data, gum_config, batch_size=config.batch_size, seed=config.seed)))


def worker_setup(method: str, config: HpflConfig) -> engine_workers.WorkerSetup:
    """What an engine worker (``--engine_workers``) builds for federated `method`: the same data (read where the
    worker runs, from `config` with its accuracy threshold set, as `run` passes it) and process."""
    tf.random.set_seed(config.seed)  # As `run`: the silos' shuffles draw their seeds from it.
    data = user_modeling.validate(load_data(config))
    gum_config = gum.GumConfig.for_data(data, hidden_dim=config.hidden_dim)
    process = _build_process(method, config, gum_config, len(data.silos))
    return engine_workers.WorkerSetup(process, _client_data(config, data, gum_config).__getitem__)


def _stacked_theta(states: Sequence[hpfl.ClientState], data: user_modeling.UserModelingData) -> np.ndarray:
    return np.concatenate(
        [np.asarray(state.model.private.theta)[: silo.num_users] for state, silo in zip(states, data.silos)]
    ).astype(np.float64)


def _stacked_proficiency(states: Sequence[hpfl.ClientState], data: user_modeling.UserModelingData) -> np.ndarray:
    """`gum_attribute_proficiency` of every silo's users with the silo's own (personalized) public components."""
    return np.concatenate(
        [
            gum_attribute_proficiency(
                gum.PublicWeights(*[np.asarray(v) for v in state.model.public]),
                np.asarray(state.model.private.theta)[: silo.num_users],
            )
            for state, silo in zip(states, data.silos)
        ]
    )


def _evaluate_states(
    config: HpflConfig,
    gum_config: gum.GumConfig,
    data: user_modeling.UserModelingData,
    index: PooledIndex,
    states,
    split: str,
    full: bool,
) -> dict[str, float]:
    predictions = hpfl.predict_silos(gum_config, states, data, split=split, batch_size=config.eval_batch_size)
    records = index.split(split)
    prediction = np.concatenate([p.prediction for p in predictions])
    if not full:
        return evaluate_predictions(data.task, data.rating_range, records['label'], prediction)
    out = evaluate_predictions(
        data.task,
        data.rating_range,
        records['label'],
        prediction,
        user=records['user'],
        item=records['item'],
        user_scores=_stacked_proficiency(states, data),
        item_attributes=index.stacked_item_attributes,
        ndcg_k=config.ndcg_k,
        ndcg_gain=config.ndcg_gain,
    )
    out['doa_theta'] = um_metrics.doa(
        records['user'], records['item'], records['label'], _stacked_theta(states, data), index.stacked_item_attributes
    )
    return out


def _run_federated(
    method: str,
    config: HpflConfig,
    data: user_modeling.UserModelingData,
    index: PooledIndex,
    outputs: program.ExperimentOutputs,
) -> tuple[dict[str, Any], np.ndarray]:
    """Trains one federated method on the shared training loop (every silo every round; server state and client
    states checkpointed every ``rounds_per_checkpoint`` rounds, so a killed run resumes), selects the round with the
    lowest validation RMSE and evaluates its client states on the test split."""
    gum_config = gum.GumConfig.for_data(data, hidden_dim=config.hidden_dim)
    process = _build_process(method, config, gum_config, len(data.silos))
    ids = [silo.client_id for silo in data.silos]
    client_data = _client_data(config, data, gum_config)
    initial = dict(
        zip(
            ids,
            (
                program.flatten_private_state(s)
                for s in hpfl.initial_client_states(data, gum_config, public_seed=config.seed, seed=config.seed)
            ),
        )
    )
    selection = program.ModelSelection('rmse')
    # Training stops after `early_stopping_patience` validation evaluations without a lower RMSE (0: never); the
    # selection keeps the clients' states of the best one either way.
    stopping = program.EarlyStopping(
        'rmse', patience=config.early_stopping_patience, min_delta=config.early_stopping_min_delta
    )
    template = process.initial_private_state()
    # Always SQLite: a killed run resumes (the row's store is removed once its results are written).
    store = program.open_store(
        'sqlite',
        outputs,
        client_state.spec_of(initial[ids[0]]),
        lambda cid: [a.copy() for a in initial[cid.removeprefix(selection.prefix)]],
        filename=_STATE_STORE,
    )
    # With --engine_workers, every worker builds this process and reads its silos itself (the same recipe).
    workers = engine_workers.serve(functools.partial(worker_setup, method, config), process, ROW_NAMES[method])
    with store, workers:
        # Every silo every round (HpflConfig has no sampling part), so no sampling arguments or seed.
        program.run_process(
            process,
            config,
            outputs=outputs,
            client_data=client_data,
            client_state_store=store,
            client_evaluation_fn=lambda weights, states: _evaluate_states(
                config, gum_config, data, index, states, 'validation', full=False
            ),
            selection=selection,
            stopping=stopping,
            evaluation_name='validation',
            train_metrics_fn=lambda metrics: metrics,
            config=_guarded_config(config),
            name=method,
            log_keys=('train/client_work/train_loss', 'validation/accuracy', 'validation/auc', 'validation/rmse'),
        )
        best_states = [program.unflatten_private_state(s, template) for s in selection.best_states(store, ids)]
    row: dict[str, Any] = dict(_evaluate_states(config, gum_config, data, index, best_states, 'test', full=True))
    row.update(
        best_round=selection.best_round,
        best_validation_rmse=float(selection.best_value),
        seconds_per_round=outputs.median_round_seconds(),
        rounds=max([int(r['round']) for r in outputs.read_metrics()] or [0]),
        early_stopped=stopping.stopped,
    )
    return row, _stacked_theta(best_states, data)


# ------------------------------------------------------------------------------------------------ run
def _with_accuracy_threshold(config: HpflConfig, data: user_modeling.UserModelingData) -> HpflConfig:
    """`config` with HPFL's p derived from the training data when ``accuracy_threshold`` is None (logged)."""
    if config.accuracy_threshold is not None:
        return config
    threshold = user_modeling.majority_class_accuracy(data)
    if threshold >= 1.0:
        raise errors.DataError(
            f'{data.name}: every training label is the same, so --accuracy_threshold=none (the majority-class '
            'accuracy) would be 1 and no attribute could be aggregated; pass --accuracy_threshold explicitly.'
        )
    logging.info(
        "--accuracy_threshold=none: HPFL's p = %.4f, the majority-class accuracy of %s's training labels.",
        threshold,
        data.name,
    )
    return dataclasses.replace(config, accuracy_threshold=threshold)


def _applicable(method: str, task: str) -> bool:
    return not ((method == 'ncd' and task != 'binary') or (method == 'ncf' and task != 'rating'))


def _guarded_config(config: HpflConfig) -> dict[str, Any]:
    """The configuration a finished row or a checkpoint belongs to: the fields a resume must not change (not
    ``output_dir``, ``rounds_per_checkpoint`` and ``configurations``; `run_record.recorded_config`)."""
    return run_record.recorded_config(config)


def _finished_run(config: HpflConfig, methods: Sequence[str], skipped: Sequence[str]) -> dict[str, Any] | None:
    """The results of a finished run of exactly these rows in ``output_dir``, else None."""
    path = os.path.join(config.output_dir, 'results.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        results = json.load(f)
    if [r['method'] for r in results['rows']] != list(methods) or results['skipped'] != list(skipped):
        return None
    return results


def _remove_state_store(outputs: program.ExperimentOutputs) -> None:
    """Deletes a finished method's client state store (its selected thetas are in ``theta.npy``)."""
    for suffix in ('', '-wal', '-shm'):
        if os.path.exists(outputs.path(_STATE_STORE + suffix)):
            os.remove(outputs.path(_STATE_STORE + suffix))


def _run_method(
    method: str,
    config: HpflConfig,
    data: user_modeling.UserModelingData,
    index: PooledIndex,
    outputs: program.ExperimentOutputs,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """One row and (federated methods) the stacked selected theta: read back if the row finished earlier."""
    row_path, theta_path = outputs.path('results.json'), outputs.path(_THETA)
    federated = method not in CENTRALIZED
    if os.path.exists(row_path):
        logging.info('[%s] finished earlier: row read back from %s', method, row_path)
        with open(row_path) as f:
            return json.load(f), np.load(theta_path) if federated else None
    started = time.time()
    theta: np.ndarray | None = None  # The analysis compares federated methods only.
    if federated:
        metrics, theta = _run_federated(method, config, data, index, outputs)
        np.save(theta_path + '.tmp.npy', theta)
        os.replace(theta_path + '.tmp.npy', theta_path)
    else:
        metrics, _ = hpfl_centralized.run_centralized(method, config, data, index, outputs)
    row = {'name': ROW_NAMES[method], 'method': method, **metrics, 'wall_seconds': time.time() - started}
    outputs.write_json('results.json', row)  # Written last: the row is finished.
    if federated:
        _remove_state_store(outputs)
    logging.info('[%s] %s', method, row)
    with open(row_path) as f:  # As a rerun reads it back.
        return json.load(f), theta


def run(config: HpflConfig) -> dict[str, Any]:
    """Runs the configured methods; writes the outputs described in the module docstring and returns the results.

    Rerunning with the same ``output_dir`` (and the same configuration, `program.guard_config`) resumes: rows that
    finished are read back (not retrained), a federated method resumes from its latest checkpoint, and a finished
    run returns its results without evaluating anything again.

    Returns:
      ``{'dataset', 'task', 'statistics', 'rows', 'private_components', 'rounds', 'ndcg_k', 'ndcg_gain',
      'skipped'}``; one row per method run, in `METHODS` order, each with ``name``, ``method`` and the metrics.
    """
    data = user_modeling.validate(load_data(config))
    os.makedirs(config.output_dir, exist_ok=True)
    # As the binary does, with the configuration as given (the same one passes again): a p derived from the data
    # (--accuracy_threshold=none) is not a flag, and recording it would make the rerun's none a change of flag.
    run_record.check_output_dir(config)
    config = _with_accuracy_threshold(config, data)
    tf.random.set_seed(config.seed)
    requested = [m for m in METHODS if m in config.configurations]
    skipped = [m for m in requested if not _applicable(m, data.task)]
    methods = [m for m in requested if m not in skipped]
    for method in skipped:
        logging.info('Skipping %s: it is the baseline of the other task (data task: %s).', method, data.task)
    finished = _finished_run(config, methods, skipped)
    if finished is not None:
        logging.info('%s holds the finished run: results read back, nothing evaluated again.', config.output_dir)
        return finished
    program.write_json(os.path.join(config.output_dir, 'config.json'), dataclasses.asdict(config))
    statistics = user_modeling.statistics(data)
    logging.info('HPFL data %s: %s', data.name, statistics)
    user_modeling.plot_attribute_distribution(data, os.path.join(config.output_dir, 'attribute_distribution.png'))
    index = PooledIndex(data)
    rows, thetas = [], {}
    for method in methods:
        row, theta = _run_method(method, config, data, index, program.ExperimentOutputs(config.output_dir, method))
        if theta is not None:
            thetas[method] = theta
        rows.append(row)
    analysis = None
    if thetas:
        analysis = private_components_analysis(
            thetas,
            index.silo_of_user,
            [s.client_id for s in data.silos],
            os.path.join(config.output_dir, 'private_components.png'),
            seed=config.seed,
        )
    results = {
        'dataset': data.name,
        'task': data.task,
        'source': data.source,
        'statistics': statistics,
        'rows': rows,
        'private_components': analysis,
        'rounds': config.total_rounds,
        'ndcg_k': config.ndcg_k,
        'ndcg_gain': config.ndcg_gain,
        'skipped': skipped,
    }
    results_path = os.path.join(config.output_dir, 'results.json')
    program.write_json(results_path, results)
    curves = {r['name']: program.ExperimentOutputs(config.output_dir, r['method']).read_metrics() for r in rows}
    # The legend is drawn on the last panel: validation RMSE, which every row (centralized too) has.
    program.plot_curves(
        curves,
        ['train/client_work/train_loss', 'validation/accuracy', 'validation/rmse'],
        os.path.join(config.output_dir, 'learning_curves.png'),
        title=f'{data.name}: validation metrics per round (centralized rows: per epoch)',
    )
    with open(results_path) as f:  # As a rerun reads it back.
        return json.load(f)
