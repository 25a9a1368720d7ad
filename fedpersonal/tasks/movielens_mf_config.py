"""The configuration of the MovieLens matrix-factorization experiment (`fedpersonal.tasks.movielens_mf`).

Kept apart from the task so that defining and parsing the binary's flags imports neither TensorFlow nor TFF
(`experiments/movielens_mf.py --help`); `fedpersonal.tasks.movielens_mf` re-exports every name.

Example:

>>> config = MovieLensMFConfig(configurations=('fedrecon',), total_rounds=2)
>>> config.clients_per_round, config.recon_steps_max
(100, 50)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedpersonal import errors
from fedpersonal.program import config_parts as parts
from fedpersonal.program import csv_config
from fedpersonal.program import dataset_inference

if TYPE_CHECKING:
    from fedpersonal import algorithms

CONFIGURATIONS = ('centralized_standard', 'centralized_recon', 'fedavg_standard', 'fedavg_recon', 'fedrecon')
DATASETS = ('synthetic', 'movielens', csv_config.CSV)
# The files of every dataset read from --data_dir (for --dataset inferred from them).
DATA_LAYOUTS = {'movielens': dataset_inference.MOVIELENS_RATINGS}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MovieLensMFConfig(
    parts.CrossDeviceRunConfig,
    parts.EvalClientsConfig,
    parts.EarlyStoppingConfig,
    parts.ClientOptimizerConfig,
    parts.ServerOptimizerConfig,
    parts.ReconstructionOptimizerConfig,
    parts.SimulationConfig,
    csv_config.CsvDataConfig,
    parts.DifferentialPrivacyConfig,
):
    """Everything a MovieLens MF experiment needs (defaults: the paper code's settings).

    Shared options (rounds, sampling, optimizers, evaluation, output) come from `fedpersonal.program.config_parts`;
    the defaults below that differ from the parts' are the paper's.
    """

    dataset: str = parts.option(
        dataset_inference.AUTO,
        dataset_inference.dataset_help(DATASETS, 'synthetic')
        + " 'csv': a ratings table (user,item,rating[,timestamp]) given by --data_path (docs/DATA.md).",
    )
    configurations: tuple[str, ...] = parts.option(('fedrecon',), f'Table 1 rows to run, a subset of {CONFIGURATIONS}.')
    variant: str = parts.option('auto', "MovieLens variant of --data_dir: '100k', '1m' or 'auto'.")
    synthetic_num_users: int = parts.option(943, 'Generated data: users.')
    synthetic_num_items: int = parts.option(1682, 'Generated data: items.')
    synthetic_mean_ratings_per_user: int = parts.option(106, 'Generated data: mean ratings per user.')
    synthetic_seed: int = parts.option(0, 'Generated data: seed.')
    max_examples_per_client: int | None = parts.option(
        300, "Ratings kept per user (client), the earliest ('none': all).", aliases=('max_examples_per_user',)
    )
    train_fraction: float = parts.option(0.8, "Fraction of users (or of each user's ratings by time) for training.")
    validation_fraction: float = parts.option(
        0.1, 'Fraction for validation (the rest is test).', aliases=('val_fraction',)
    )
    split_seed: int = parts.option(0, 'Seed of the user split.')
    num_latent_factors: int = parts.option(50, 'Embedding dimension.')
    add_biases: bool = parts.option(False, 'Add user and item biases.')
    l2_regularization: float = parts.option(0.0, 'L2 regularization of the embeddings.')
    accuracy_threshold: float = parts.option(0.5, 'A prediction is accurate when within this of the rating.')
    batch_size: int = 5
    clients_per_round: int = 100
    client_learning_rate: float = 0.5
    recon_epochs: int = 5
    recon_steps_max: int | None = 50
    post_recon_steps_max: int | None = 50
    support_fraction: float = parts.option(0.5, "Fraction of a client's examples in its support set.")
    split_strategy: str = parts.option('hash', "Support/query split: 'hash' (order-invariant) or 'order'.")
    allow_overlap: bool = parts.option(False, 'Support and query sets may overlap (tiny clients).')
    jointly_train_locals: bool = parts.option(False, 'Also train local variables during the update.')
    learn_local_init: bool = parts.option(False, 'Learn a global default for the local variables.')
    client_weighting: str = parts.option('num_examples', "Client weights: 'num_examples' or 'uniform'.")
    finetune_learning_rate: float = parts.option(0.0, 'FedRecon+Finetune learning rate at evaluation (0: off).')
    fedrecon_implementation: str = parts.option('fedpersonal', "'fedpersonal' or 'tff' (TFF 0.87's build_fed_recon).")
    centralized_optimizer: str = parts.option('adam', 'Optimizer of the centralized rows.')
    centralized_learning_rate: float = parts.option(0.001, 'Learning rate of the centralized rows.')
    centralized_batch_size: int = parts.option(64, 'Batch size of the centralized rows.')
    centralized_max_epochs: int = parts.option(100, 'Epoch cap of the centralized rows (early stopping).')
    centralized_patience: int = parts.option(
        3, 'Centralized rows: stop after this many epochs without a lower validation RMSE (0: all epochs).'
    )
    centralized_min_delta: float = parts.option(
        1e-3,
        'Centralized rows: the least fall of the validation RMSE below the best epoch so far that makes an epoch the '
        'new best and restarts the --centralized_patience count (a creeping RMSE stops early). 0: any fall counts '
        "(the committed results' rule; configs/movielens_100k_table1.flags pins it).",
    )

    def __post_init__(self):
        parts.run_post_inits(self)
        csv_config.resolve_csv_dataset(self)
        if self.dataset != csv_config.CSV:
            dataset_inference.resolve_dataset(self, generated='synthetic', layouts=DATA_LAYOUTS)
        if self.dataset not in DATASETS:
            raise errors.ConfigError(f'dataset must be one of {DATASETS}, got {self.dataset!r}.')
        if self.dataset == 'movielens' and not self.data_dir:
            raise errors.ConfigError(
                "dataset 'movielens' needs --data_dir (a directory with MovieLens 100K's u.data or 1M's ratings.dat)."
            )
        unknown = [c for c in self.configurations if c not in CONFIGURATIONS]
        if unknown or not self.configurations:
            raise errors.ConfigError(
                f'configurations must be a non-empty subset of {CONFIGURATIONS}; unknown: {unknown}.'
            )
        if self.fedrecon_implementation not in ('fedpersonal', 'tff'):
            raise errors.ConfigError(
                f"fedrecon_implementation must be 'fedpersonal' or 'tff', got {self.fedrecon_implementation!r}."
            )
        if self.client_weighting not in ('num_examples', 'uniform'):
            raise errors.ConfigError(
                f"client_weighting must be 'num_examples' or 'uniform', got {self.client_weighting!r}."
            )
        if not self.centralized_min_delta >= 0:
            raise errors.ConfigError(f'centralized_min_delta must be >= 0, got {self.centralized_min_delta}.')
        centralized = [c for c in self.configurations if c.startswith('centralized')]
        if self.dp_enabled and centralized:
            raise errors.ConfigError(
                f'--dp_noise_multiplier applies to federated rows; {centralized} train on pooled data at the server, '
                'which differential privacy of the aggregated updates does not cover: run them without DP.'
            )
        if self.num_latent_factors < 1:
            raise errors.ConfigError(f'num_latent_factors must be >= 1, got {self.num_latent_factors}.')

    @property
    def split(self) -> algorithms.ReconstructionSplit:
        """FedRecon's support/query split and reconstruction steps of this config."""
        from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top  # TensorFlow.

        return algorithms.ReconstructionSplit(
            support_fraction=self.support_fraction,
            strategy=self.split_strategy,
            allow_overlap=self.allow_overlap,
            recon_epochs=self.recon_epochs,
            recon_steps_max=self.recon_steps_max,
            post_recon_epochs=self.post_recon_epochs,
            post_recon_steps_max=self.post_recon_steps_max,
        )
