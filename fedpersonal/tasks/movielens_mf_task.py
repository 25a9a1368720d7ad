"""MovieLens matrix factorization (`fedpersonal.tasks.movielens_mf`): the data splits and the task (datasets, models,
evaluations and processes of every Table 1 row).

Split from `fedpersonal.tasks.movielens_mf` (which runs the rows) so each module keeps one job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import data as data_lib
from fedpersonal import evaluation
from fedpersonal import metrics as metrics_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.privacy import dp as dp_lib
from fedpersonal.program import optimizers
from fedpersonal.tasks.movielens_mf_config import MovieLensMFConfig


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
