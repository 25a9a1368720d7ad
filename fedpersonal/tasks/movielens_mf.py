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

Configuration flows one way: flags -> `MovieLensMFConfig` -> builders.

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
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import algorithms
from fedpersonal import data as data_lib
from fedpersonal import evaluation
from fedpersonal import metrics as metrics_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.algorithms import centralized
from fedpersonal.algorithms import optimizers
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.privacy import dp as dp_lib
from fedpersonal.program import run_record
from fedpersonal.tasks.movielens_mf_config import CONFIGURATIONS as CONFIGURATIONS
from fedpersonal.tasks.movielens_mf_config import DATASETS as DATASETS
from fedpersonal.tasks.movielens_mf_config import MovieLensMFConfig as MovieLensMFConfig

ROW_NAMES = {
    'centralized_standard': 'Centralized + StandardEval',
    'centralized_recon': 'Centralized + ReconEval',
    'fedavg_standard': 'FedAvg + StandardEval',
    'fedavg_recon': 'FedAvg + ReconEval',
    'fedrecon': 'FedRecon (ReconEval)',
}
METRIC_KEYS = ('rmse', 'mae', 'accuracy', 'loss', 'num_examples')


@dataclasses.dataclass
class PreparedData:
    """The two splits the table needs, as `ClientData`."""

    data: data_lib.MovieLensData
    description: str
    user_train: tff.simulation.datasets.ClientData
    user_val: tff.simulation.datasets.ClientData
    user_test: tff.simulation.datasets.ClientData
    time_train: tff.simulation.datasets.ClientData
    time_val: tff.simulation.datasets.ClientData
    time_test: tff.simulation.datasets.ClientData
    user_split_ratings: dict[str, Any]
    time_split_ratings: dict[str, Any]


def load_data(config: MovieLensMFConfig) -> PreparedData:
    """Loads MovieLens from `config.data_dir` (or generates the default) and splits it."""
    if config.dataset == 'csv':
        from fedpersonal.data import csv_tasks  # pylint: disable=g-import-not-at-top

        assert config.data_path is not None  # MovieLensMFConfig requires it for this dataset.
        # The timestamp column is each row's position in --split_order: the time split and the cap follow it.
        ratings, description = csv_tasks.load_csv_ratings(
            config.data_path, split_order=config.split_order, seed=config.seed
        )
    elif config.dataset == 'movielens':
        assert config.data_dir is not None  # MovieLensMFConfig requires it for this dataset.
        ratings = data_lib.load_ratings(config.data_dir, variant=config.variant)
        description = f'MovieLens ({config.variant}) from {config.data_dir}'
    else:
        # Small catalogues (tests, quick demos) cap the per-user activity at half the items.
        mean = min(config.synthetic_mean_ratings_per_user, config.synthetic_num_items // 2)
        ratings = data_lib.generate_movielens_like(
            num_users=config.synthetic_num_users,
            num_items=config.synthetic_num_items,
            mean_ratings_per_user=mean,
            min_ratings_per_user=min(20, mean),
            seed=config.synthetic_seed,
        )
        description = (
            f'generated MovieLens-like data ({config.synthetic_num_users} users, '
            f'{config.synthetic_num_items} items, seed {config.synthetic_seed})'
        )
    data = data_lib.preprocess_ratings(ratings, max_examples_per_user=config.max_examples_per_client, seed=config.seed)
    train_users, val_users, test_users = data_lib.split_by_user(
        data, train_fraction=config.train_fraction, val_fraction=config.validation_fraction, seed=config.split_seed
    )
    time_train, time_val, time_test = data_lib.split_by_time(
        data, train_fraction=config.train_fraction, val_fraction=config.validation_fraction
    )
    frame = data.ratings
    if config.dataset == 'csv':
        _warn_unseen_items(config.data_path, frame, train_users, test_users, time_train, time_test)
    return PreparedData(
        data=data,
        description=description,
        user_train=data_lib.to_client_data(frame, train_users),
        user_val=data_lib.to_client_data(frame, val_users),
        user_test=data_lib.to_client_data(frame, test_users),
        time_train=data_lib.to_client_data(time_train),
        time_val=data_lib.to_client_data(time_val),
        time_test=data_lib.to_client_data(time_test),
        user_split_ratings={
            'train': frame[frame.user_id.isin(train_users)],
            'val': frame[frame.user_id.isin(val_users)],
            'test': frame[frame.user_id.isin(test_users)],
        },
        time_split_ratings={'train': time_train, 'val': time_val, 'test': time_test},
    )


def _warn_unseen_items(source, frame, train_users, test_users, time_train, time_test) -> None:
    """`interaction_splits.warn_unseen_in_training` for the time split and the user split."""
    from fedpersonal.data import interaction_splits  # pylint: disable=g-import-not-at-top

    for name, train, test in (
        ('per-user time split', time_train, time_test),
        ('user split', frame[frame.user_id.isin(train_users)], frame[frame.user_id.isin(test_users)]),
    ):
        items = np.concatenate([train['item_id'].to_numpy(), test['item_id'].to_numpy()])
        split = np.concatenate([np.zeros(len(train), np.int64), np.full(len(test), 2, np.int64)])
        interaction_splits.warn_unseen_in_training(items, split, source=f'{source} ({name})')


class MovieLensMFTask:
    """Builds models, processes and evaluations for one `MovieLensMFConfig`."""

    def __init__(self, config: MovieLensMFConfig, prepared: PreparedData):
        self.config = config
        self.prepared = prepared
        self.num_items = prepared.data.num_items
        self.num_users = prepared.data.num_users
        self.loss_fn = tf.keras.losses.MeanSquaredError
        self.metrics_fn = metrics_lib.rating_metrics_fn(config.accuracy_threshold)
        self.personal_model_fn = mf.personal_model_fn(
            self.num_items,
            config.num_latent_factors,
            add_biases=config.add_biases,
            l2_regularization=config.l2_regularization,
            seed=config.seed,
        )
        self._evaluations: dict[str, evaluation.Evaluation] = {}
        self._eval_data: dict[int, tuple[Any, str]] = {}

    # ----- datasets -------------------------------------------------------
    def personal_dataset_fn(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.map(mf.personal_example).batch(self.config.batch_size)

    def table_dataset_fn_eval(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.map(mf.table_example).batch(self.config.batch_size)

    def table_dataset_fn(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        dataset = self.table_dataset_fn_eval(dataset)
        if self.config.post_recon_steps_max is not None:
            dataset = dataset.take(self.config.post_recon_steps_max)  # Same k_u cap as FedRecon's update.
        return dataset

    def _eval_clients(self, client_data, limit: int | None = None) -> list[str]:
        ids = list(client_data.client_ids)
        if limit is not None and limit < len(ids):
            ids = program.sample_clients(ids, limit, round_num=0, seed=self.config.seed + 1)
        return ids

    # ----- models ---------------------------------------------------------
    def table_keras_model(self) -> tf.keras.Model:
        return mf.table_keras_model(
            self.num_users,
            self.num_items,
            self.config.num_latent_factors,
            add_biases=self.config.add_biases,
            l2_regularization=self.config.l2_regularization,
            seed=self.config.seed,
        )

    def table_model_fn(self) -> models.PartiallyLocalModel:
        keras_model = self.table_keras_model()
        return models.from_keras_model(
            keras_model,
            input_spec=mf.table_input_spec(),
            global_variables=list(keras_model.trainable_variables) + list(keras_model.non_trainable_variables),
        )

    def personal_globals_from_table(self, table_trainable: list[np.ndarray]) -> tff.learning.models.ModelWeights:
        """Item-side weights of a trained table model as personal-model global weights."""
        keras_model = self.table_keras_model()
        for variable, value in zip(keras_model.trainable_variables, table_trainable):
            variable.assign(value)
        return tff.learning.models.ModelWeights(
            trainable=mf.item_weights_from_table_model(keras_model), non_trainable=[]
        )

    # ----- evaluation -----------------------------------------------------
    def recon_eval(self) -> evaluation.Evaluation:
        if 'recon' not in self._evaluations:
            cfg = self.config
            self._evaluations['recon'] = evaluation.build_recon_eval(
                self.personal_model_fn,
                loss_fn=self.loss_fn,
                metrics_fn=self.metrics_fn,
                reconstruction_optimizer=cfg.build_reconstruction_optimizer(),
                dataset_split=cfg.split,
                finetune_optimizer=(
                    optimizers.build_optimizer(cfg.client_optimizer, cfg.finetune_learning_rate)
                    if cfg.finetune_learning_rate > 0
                    else None
                ),
                learn_local_init=cfg.learn_local_init,
                simulation=cfg.simulation,
                group_size=cfg.group_size,
            )
        return self._evaluations['recon']

    def standard_eval(self) -> evaluation.Evaluation:
        if 'standard' not in self._evaluations:
            self._evaluations['standard'] = evaluation.build_standard_eval(
                self.table_model_fn,
                loss_fn=self.loss_fn,
                metrics_fn=self.metrics_fn,
                simulation=self.config.simulation,
                group_size=self.config.group_size,
            )
        return self._evaluations['standard']

    def periodic_metrics(self, kind: str, weights, client_data, dataset_fn) -> dict[str, Any]:
        """Aggregate metrics and per-client RMSE/accuracy quantiles on up to `eval_clients` clients."""
        result = self.evaluate(kind, weights, client_data, dataset_fn, self.config.eval_clients)
        per_client = {name: result['per_client'][name] for name in ('rmse', 'accuracy') if name in result['per_client']}
        return {**result['metrics'], 'per_client': per_client}

    def evaluate(self, kind: str, weights, client_data, dataset_fn, limit: int | None = None) -> dict[str, Any]:
        computation = self.recon_eval() if kind == 'recon' else self.standard_eval()
        # The engine packs each client's data once per client data object (kept alive here, so its id is not reused).
        key = self._eval_data.setdefault(id(client_data), (client_data, f'data{len(self._eval_data)}'))[1]
        result = evaluation.evaluate_clients(
            computation,
            weights,
            self._eval_clients(client_data, limit),
            lambda c: dataset_fn(client_data.create_tf_dataset_for_client(c)),
            cache_key=key,
        )
        return {
            'metrics': {k: float(v) for k, v in result['eval'].items()},
            'per_client': metrics_lib.summarize_per_client(result['per_client']),
        }

    # ----- training -------------------------------------------------------
    def differential_privacy(self, client_data) -> dp_lib.DifferentialPrivacy | None:
        """The DP of a federated row trained on `client_data` (None without --dp_noise_multiplier)."""
        return dp_lib.DifferentialPrivacy.from_config(self.config, num_clients=len(client_data.client_ids))

    def build_fed_recon(self, dp: dp_lib.DifferentialPrivacy | None = None) -> tff.learning.templates.LearningProcess:
        """FedRecon; with `dp`, its global update is aggregated by the DP aggregator (uniform weights; on the engine
        with a fixed clip, else on the per-client path)."""
        cfg = self.config
        kwargs: dict[str, Any] = dict(loss_fn=self.loss_fn, metrics_fn=self.metrics_fn)
        weighting = (
            tff.learning.ClientWeighting.NUM_EXAMPLES
            if cfg.client_weighting == 'num_examples'
            else tff.learning.ClientWeighting.UNIFORM
        )
        simulation = cfg.simulation
        if dp is not None:
            weighting = dp.client_weighting
            simulation = dp.simulation(
                cfg.simulation, 'fedrecon', engine_clips_per_client=cfg.fedrecon_implementation != 'tff'
            )
        server = cfg.build_server_optimizer()
        client = cfg.build_client_optimizer()
        recon = cfg.build_reconstruction_optimizer()
        if cfg.fedrecon_implementation == 'tff':
            return tff.learning.algorithms.build_fed_recon(
                self.personal_model_fn,
                server_optimizer_fn=server,
                client_optimizer_fn=client,
                reconstruction_optimizer_fn=recon,
                dataset_split_fn=tff.learning.models.ReconstructionModel.build_dataset_split_fn(
                    recon_epochs=cfg.recon_epochs,
                    recon_steps_max=cfg.recon_steps_max,
                    post_recon_epochs=cfg.post_recon_epochs,
                    post_recon_steps_max=cfg.post_recon_steps_max,
                    split_dataset=not cfg.allow_overlap,
                ),
                client_weighting=weighting,
                model_aggregator_factory=dp.aggregator() if dp is not None else None,
                **kwargs,
            )
        return algorithms.build_fed_recon(
            self.personal_model_fn,
            server_optimizer=server,
            client_optimizer=client,
            reconstruction_optimizer=recon,
            dataset_split=cfg.split,
            jointly_train_locals=cfg.jointly_train_locals,
            learn_local_init=cfg.learn_local_init,
            client_weighting=weighting,
            model_aggregator=dp.aggregator() if dp is not None else None,
            simulation=simulation,
            group_size=cfg.group_size,
            **kwargs,
        )

    def build_fed_avg(self, dp: dp_lib.DifferentialPrivacy | None = None) -> Any:
        """FedAvg of the table model: `algorithms.build_fed_avg` (tested equal to TFF's
        `build_weighted_fed_avg`), on the engine unless ``simulation='per_client'`` (with `dp`: the DP aggregator,
        uniform weights; adaptive clipping on the per-client path)."""
        cfg = self.config
        return algorithms.build_fed_avg(
            self.table_model_fn,
            loss_fn=self.loss_fn,
            metrics_fn=self.metrics_fn,
            client_optimizer=cfg.build_client_optimizer(),
            server_optimizer=cfg.build_server_optimizer(),
            client_weighting=dp.client_weighting if dp is not None else tff.learning.ClientWeighting.NUM_EXAMPLES,
            model_aggregator=dp.aggregator() if dp is not None else None,
            simulation=(
                dp.simulation(cfg.simulation, 'fedavg', engine_clips_per_client=True)
                if dp is not None
                else cfg.simulation
            ),
            group_size=cfg.group_size,
        )


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


def mean_rating_baseline(prepared: PreparedData, *, accuracy_threshold: float = 0.5) -> dict[str, Any]:
    """The score of predicting the training users' mean rating for every rating of the test users.

    The floor every row must beat: a model that learned nothing about users or items scores this. It is scored on
    every rating of the held-out test users (the ReconEval rows score the part of them left after reconstruction,
    a hash-based half: the same distribution).

    Args:
      prepared: The splits (`load_data`).
      accuracy_threshold: A prediction is accurate when within this distance of the rating (the rows' accuracy).

    Returns:
      ``{'name', 'mean_rating', 'rmse', 'mae', 'accuracy', 'ratings'}``.
    """
    mean = float(prepared.user_split_ratings['train'].rating.mean())
    errors_ = prepared.user_split_ratings['test'].rating.to_numpy(np.float64) - mean
    return {
        'name': 'Mean rating (baseline)',
        'mean_rating': mean,
        'rmse': float(np.sqrt(np.mean(errors_**2))),
        'mae': float(np.mean(np.abs(errors_))),
        'accuracy': float(np.mean(np.abs(errors_) < accuracy_threshold)),
        'ratings': int(errors_.size),
    }


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
