"""The configuration of the FURL experiment (`fedpersonal.tasks.furl_personalization`).

Kept apart from the task so that defining and parsing the binary's flags imports neither TensorFlow nor TFF
(`experiments/furl_personalization.py --help`); `fedpersonal.tasks.furl_personalization` re-exports every name.

Example:

>>> config = FurlConfig(configurations=('global_fl',), synthetic_num_users=12)
>>> config.total_rounds is None, config.epochs  # Rounds derived from the epochs.
(True, 5)
"""

from __future__ import annotations

import dataclasses

from fedpersonal import errors
from fedpersonal.program import config_parts as parts
from fedpersonal.program import csv_config
from fedpersonal.program import dataset_inference

CONFIGURATIONS = ('global_server', 'personalized_server', 'global_fl', 'personalized_fl')
DATASETS = ('synthetic_subreddit', 'movielens_likes', 'assistments', csv_config.CSV)
# The files of every dataset read from --data_dir (for --dataset inferred from them).
DATA_LAYOUTS = {'movielens_likes': dataset_inference.MOVIELENS_LIKES, 'assistments': dataset_inference.ASSISTMENTS}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FurlConfig(
    parts.CrossDeviceRunConfig,
    parts.EvalClientsConfig,
    parts.ClientEpochsConfig,
    parts.ClientOptimizerConfig,
    parts.ServerOptimizerConfig,
    parts.SimulationConfig,
    parts.EarlyStoppingConfig,
    csv_config.CsvDataConfig,
    parts.DifferentialPrivacyConfig,
):
    """Everything a FURL experiment needs (shared options from `fedpersonal.program.config_parts`)."""

    dataset: str = parts.option(dataset_inference.AUTO, dataset_inference.dataset_help(DATASETS, 'synthetic_subreddit'))
    configurations: tuple[str, ...] = parts.option(CONFIGURATIONS, f'Rows to run, a subset of {CONFIGURATIONS}.')
    synthetic_num_users: int = parts.option(400, 'Generated data: users.')
    max_chars: int = parts.option(64, 'Characters of a document kept (0: no text).')
    char_embedding_dim: int = parts.option(16, 'Character embedding dimension.')
    lstm_units: int = parts.option(32, 'Units of each LSTM direction.')
    user_embedding_dim: int = parts.option(32, 'Dimension of the private user embedding.')
    mlp_units: int = parts.option(64, 'Units of the MLP head.')
    epochs: int = parts.option(
        5,
        'Passes over the training data of the server rows; with --total_rounds=none the '
        'federated rows run as many rounds as that many passes over the users take.',
    )
    # 'none': derived from --epochs (see its help). Widens RoundsConfig's int, which mypy rejects for a subclass
    # field; sound here because the config is frozen and every reader goes through FurlTask.total_rounds().
    total_rounds: int | None = None  # type: ignore[assignment]
    rounds_per_eval: int = 50
    rounds_per_checkpoint: int = 50
    centralized_optimizer: str = parts.option('sgd', 'Optimizer of the server (centralized) rows.')
    centralized_learning_rate: float = parts.option(0.1, 'Learning rate of the server (centralized) rows.')
    centralized_patience: int = parts.option(
        3,
        'Server rows: stop after this many epochs without a better validation AUC (accuracy for multi-class '
        'tasks; the federated rows select on it too) (0: train all --epochs); either way the row ends with the '
        'weights of its best epoch.',
    )
    centralized_min_delta: float = parts.option(
        1e-3,
        'Server rows: the least rise of the validation AUC (accuracy) over the best epoch so far that makes an epoch '
        'the new best and restarts the --centralized_patience count, so that an AUC creeping up by 1e-4 an epoch '
        "stops early. 0: any rise counts (the committed results' rule; their configs/*.flags pin it).",
    )
    private_norm_regularization: float = parts.option(0.0, 'lambda of the norm penalty on private parameters.')
    state_store: str = parts.option('sqlite', "Client state store: 'sqlite' (durable, resumable) or 'memory'.")
    knn: int = parts.option(10, 'Neighbours compared in the embedding analysis.')
    like_threshold: float | None = parts.option(
        None,
        '--dataset=csv with a ratings table: a rating >= this is a like (label 1), e.g. 4 on a 1..5 scale (required '
        'for ratings; responses tables use their correct column).',
    )

    def __post_init__(self):
        parts.run_post_inits(self)
        csv_config.resolve_csv_dataset(
            self,
            csv_only=('like_threshold',),
            untimed_split_order=('assistments',),
            timed_split_order=('movielens_likes',),
        )
        dataset_inference.resolve_dataset(self, generated='synthetic_subreddit', layouts=DATA_LAYOUTS)
        unknown = [c for c in self.configurations if c not in CONFIGURATIONS]
        if unknown or not self.configurations:
            raise errors.ConfigError(
                f'configurations must be a non-empty subset of {CONFIGURATIONS}; unknown: {unknown}.'
            )
        if self.dataset not in DATASETS:
            raise errors.ConfigError(f'dataset must be one of {DATASETS}, got {self.dataset!r}.')
        if self.dataset not in ('synthetic_subreddit', csv_config.CSV) and not self.data_dir:
            raise errors.ConfigError(
                f'dataset {self.dataset!r} needs --data_dir (the generated default is synthetic_subreddit).'
            )
        server_rows = [c for c in self.configurations if c.endswith('_server')]
        if self.dp_enabled and server_rows:
            raise errors.ConfigError(
                f'--dp_noise_multiplier applies to the federated rows; {server_rows} train on pooled data at the '
                'server, which differential privacy of the aggregated updates does not cover: pass '
                '--configurations=global_fl,personalized_fl.'
            )
        if self.state_store not in ('sqlite', 'memory'):
            raise errors.ConfigError(f"state_store must be 'sqlite' or 'memory', got {self.state_store!r}.")
        for name in ('epochs', 'knn'):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')
        if self.centralized_patience < 0:
            raise errors.ConfigError(f'centralized_patience must be >= 0, got {self.centralized_patience}.')
        if not self.centralized_min_delta >= 0:
            raise errors.ConfigError(f'centralized_min_delta must be >= 0, got {self.centralized_min_delta}.')
