"""The configuration of the HPFL user-modeling experiment (`fedpersonal.tasks.hpfl_user_modeling`).

Kept apart from the task so that defining and parsing the binary's flags imports neither TensorFlow nor TFF
(`experiments/hpfl_user_modeling.py --help`); `fedpersonal.tasks.hpfl_user_modeling` re-exports every name.

Example:

>>> config = HpflConfig(configurations=('gum', 'hpfl'), ncd_hidden_units=('8', '4'))
>>> config.ncd_hidden_units, config.total_rounds
((8, 4), 20)
"""

from __future__ import annotations

import dataclasses

from fedpersonal import errors
from fedpersonal.program import config_parts as parts
from fedpersonal.program import csv_config
from fedpersonal.program import dataset_inference

DATASETS = ('synthetic', 'assistments', 'movielens', csv_config.CSV)
# The files of every dataset read from --data_dir (for --dataset inferred from them).
DATA_LAYOUTS = {'assistments': dataset_inference.ASSISTMENTS, 'movielens': dataset_inference.MOVIELENS_USERS}
# Deprecated --dataset values (kept for one release): the name FURL uses for the same data.
DATASET_ALIASES = {'assist': 'assistments'}
CENTRALIZED = ('ncd', 'ncf', 'gum')
NDCG_GAINS = ('linear', 'exponential')
# The names of `fedpersonal.algorithms.hpfl` and `fedpersonal.models.gum` (TensorFlow modules) the config accepts,
# kept here so that defining the flags imports neither TensorFlow nor TFF; tests/program/help_test.py checks
# that they equal the originals.
BASELINES = ('distributed', 'fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt')  # hpfl.BASELINES
HPFL_METHODS = ('hpfl_k', 'hpfl_r', 'hpfl', 'hpfl_inverse')  # hpfl.HPFL_VARIANTS
METHODS = CENTRALIZED + BASELINES + HPFL_METHODS
ROW_UPDATES = ('lazy', 'dense')  # hpfl.ROW_UPDATES
CENTER_WEIGHTINGS = ('distance', 'inverse_distance')  # hpfl.CENTER_WEIGHTINGS
TASKS = ('binary', 'rating')  # gum.TASKS
# fedpersonal.data.hpfl_assistments.GROUPINGS (tests/data/csv_interactions_test.py checks they agree).
GROUPINGS = ('exercises', 'concepts', 'random', 'column')


@dataclasses.dataclass(frozen=True, kw_only=True)
class HpflConfig(
    parts.OutputConfig,
    parts.DataConfig,
    parts.RoundsConfig,
    parts.EvaluationConfig,
    parts.BatchConfig,
    parts.ClientEpochsConfig,
    parts.ClientOptimizerConfig,
    parts.SimulationConfig,
    parts.EarlyStoppingConfig,
    csv_config.CsvDataConfig,
    parts.DifferentialPrivacyConfig,
):
    """Everything an HPFL experiment needs (shared options from `fedpersonal.program.config_parts`; cross-silo:
    every client takes part in every round, so there is no --clients_per_round)."""

    dataset: str = parts.option(
        dataset_inference.AUTO, dataset_inference.dataset_help(DATASETS, 'synthetic'), value_aliases=DATASET_ALIASES
    )
    data_dir: str | None = parts.option(
        None,
        'assistments: dir with record.csv/item.csv; movielens: dir with u.data/u.item/u.user (without --dataset, '
        "the one of the two whose files are there); 'none': generated data (or --data_path for csv).",
        is_path=True,
    )
    configurations: tuple[str, ...] = parts.option(
        METHODS,
        f'Rows (methods) to run, a subset of {METHODS} (ncd runs on binary, ncf on rating data); may change when '
        'a run resumes (finished rows are read back, the others run).',
        aliases=('methods',),
        may_change_on_resume=True,
    )
    # HPFL's --rounds before it joined the shared vocabulary: a deprecated name for one release.
    total_rounds: int = parts.option(20, parts.help_text(parts.RoundsConfig, 'total_rounds') or '', aliases=('rounds',))
    rounds_per_checkpoint: int = 1
    rounds_per_eval: int = 1
    batch_size: int = 64
    client_optimizer: str = 'adam'
    client_learning_rate: float = 0.01
    row_updates: str = parts.option(
        'dense',
        "Local steps update the full padded tables ('dense') or only the table rows a batch touches ('lazy', "
        'lazy Adam).',
    )
    hidden_dim: int = parts.option(16, 'GUM width h of skill_W/know_W.')
    accuracy_threshold: float | None = parts.option(
        0.5,
        "HPFL's p: a client's attribute k is aggregated only if Acc_ki > p. Data-dependent: p must lie below the "
        "clients' typical accuracy (configs/: 0.6 for ASSIST a0910, 0.3 for MovieLens ratings); 'none': derived "
        'from the training data, the majority-class accuracy of the pooled training labels (logged).',
    )
    center_weighting: str = parts.option(
        'distance',
        "Weighting of the global centres for HPFL-R ('distance' as published or 'inverse_distance'); the HPFL rows "
        'run both.',
    )
    proximal_strength: float = parts.option(0.01, "FedProx's mu.")
    noise_stddev: float = parts.option(0.01, "Fednoise's upload noise stddev.")
    attention_step: float = parts.option(1.0, "FedAtt's server step eps.")
    max_local_clusters: int = parts.option(32, "Cap on a client's k-means clusters (per table).")
    max_global_clusters: int = parts.option(64, "Cap on the server's k-means clusters (per table).")
    kmeans_iterations: int = parts.option(10, 'Lloyd iterations of every k-means.')
    centralized_epochs: int = parts.option(10, 'Epochs of the centralized rows (NCD, NCF, GUM).')
    centralized_learning_rate: float = parts.option(0.01, 'Learning rate of the centralized rows.')
    centralized_batch_size: int = parts.option(256, 'Batch size of the centralized rows.')
    ncd_hidden_units: tuple[int, ...] = parts.option((64, 32), "NCD's hidden layer widths.")
    ncf_embedding_dim: int = parts.option(16, "NCF's embedding dimension.")
    eval_batch_size: int = parts.option(1024, 'Batch size of evaluation.')
    ndcg_k: int = parts.option(10, 'k of NDCG@k.')
    ndcg_gain: str = parts.option('linear', f'One of {NDCG_GAINS}.')
    assist_num_clients: int = parts.option(
        40, "assist / csv: number of silos formed by --assist_grouping (not 'column')."
    )
    assist_grouping: str = parts.option(
        'exercises',
        f'assist / csv: how students are grouped into silos, one of {GROUPINGS}: clustered by the exercises they '
        "answered ('exercises') or by their concept mix ('concepts'), dealt at random ('random', seeded), or the "
        "silo column of a --dataset=csv responses table ('column').",
    )
    max_items_per_silo: int | None = parts.option(
        None,
        'Silos with more items than this are left out (the GUM tables of every client are padded to the largest '
        'silo, so one huge silo makes every step slow).',
    )
    synthetic_task: str = parts.option('binary', f'Generated data: task, one of {TASKS}.')
    synthetic_num_clients: int = parts.option(8, 'Generated data: silos.')
    synthetic_users_per_client: int = parts.option(40, 'Generated data: users per silo.')

    def __post_init__(self):
        parts.run_post_inits(self)
        csv_config.resolve_csv_dataset(self, untimed_split_order=('assistments',))
        parts.refuse_dp(
            self,
            "HPFL aggregates the silos' models weighted by their validation accuracy, a data-dependent weighting "
            'that the DP aggregator (clipped, uniformly weighted, noised mean) would replace, so it is not wired to '
            'one; DP is available for FedRecon/FedAvg (experiments/movielens_mf.py) and FURL.',
        )
        dataset_inference.resolve_dataset(self, generated='synthetic', layouts=DATA_LAYOUTS)
        if self.dataset not in DATASETS:
            raise errors.ConfigError(f'dataset must be one of {DATASETS}, got {self.dataset!r}.')
        if self.assist_grouping not in GROUPINGS:
            raise errors.ConfigError(f'--assist_grouping must be one of {GROUPINGS}, got {self.assist_grouping!r}.')
        if self.assist_grouping == 'column' and self.dataset != csv_config.CSV:
            raise errors.ConfigError(
                '--assist_grouping=column takes the silo column of a --dataset=csv responses table (docs/DATA.md).'
            )
        if self.dataset not in ('synthetic', csv_config.CSV) and not self.data_dir:
            raise errors.ConfigError(f'dataset {self.dataset!r} needs --data_dir (the generated default is synthetic).')
        unknown = [m for m in self.configurations if m not in METHODS]
        if unknown or not self.configurations:
            raise errors.ConfigError(f'configurations must be a non-empty subset of {METHODS}; unknown: {unknown}.')
        for name in (
            'hidden_dim',
            'max_local_clusters',
            'max_global_clusters',
            'centralized_epochs',
            'centralized_batch_size',
            'ncf_embedding_dim',
            'eval_batch_size',
            'ndcg_k',
            'assist_num_clients',
            'synthetic_num_clients',
            'synthetic_users_per_client',
        ):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')
        if any(int(h) < 1 for h in self.ncd_hidden_units) or not self.ncd_hidden_units:
            raise errors.ConfigError(f'ncd_hidden_units must be positive widths, got {self.ncd_hidden_units!r}.')
        if self.row_updates not in ROW_UPDATES:
            raise errors.ConfigError(f'row_updates must be one of {ROW_UPDATES}, got {self.row_updates!r}.')
        if not self.centralized_learning_rate > 0:
            raise errors.ConfigError(
                f'centralized_learning_rate must be positive, got {self.centralized_learning_rate}.'
            )
        if self.accuracy_threshold is not None and not 0.0 <= self.accuracy_threshold < 1.0:
            raise errors.ConfigError(f'accuracy_threshold must be in [0, 1), got {self.accuracy_threshold}.')
        if self.center_weighting not in CENTER_WEIGHTINGS:
            raise errors.ConfigError(
                f'center_weighting must be one of {CENTER_WEIGHTINGS}, got {self.center_weighting!r}.'
            )
        if self.ndcg_gain not in NDCG_GAINS:
            raise errors.ConfigError(f'ndcg_gain must be one of {NDCG_GAINS}, got {self.ndcg_gain!r}.')
        if self.max_items_per_silo is not None and self.max_items_per_silo < 1:
            raise errors.ConfigError(f'max_items_per_silo must be >= 1 or None, got {self.max_items_per_silo}.')
        if self.synthetic_task not in TASKS:
            raise errors.ConfigError(f'synthetic_task must be one of {TASKS}, got {self.synthetic_task!r}.')
        object.__setattr__(self, 'ncd_hidden_units', tuple(int(h) for h in self.ncd_hidden_units))
