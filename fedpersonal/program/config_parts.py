"""Shared, typed parts of every experiment config: one definition (name, type, meaning, help) per option.

A task's config is a frozen dataclass that inherits the parts it uses and adds its own fields, so a flag means
the same in every binary (`config_flags` turns the fields into flags, the help text comes from here):

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MyConfig(config_parts.OutputConfig, config_parts.RoundsConfig, config_parts.ClientOptimizerConfig):
        total_rounds: int = 60          # a task may change a default; the meaning and help stay the part's
        my_option: float = option(0.5, 'What it does.')

Parts: `OutputConfig` (where results go), `DataConfig` (where data comes from), `RoundsConfig` (rounds, seed,
checkpoints), `SamplingConfig` (clients per round), `EvaluationConfig`, `EvalClientsConfig`, `BatchConfig`, `ClientEpochsConfig`,
`ClientOptimizerConfig`, `ServerOptimizerConfig`, `ReconstructionOptimizerConfig`, `DifferentialPrivacyConfig`
(user-level DP of the global parameters, `fedpersonal.privacy.dp`); `CrossDeviceRunConfig` bundles the first six. Every part validates its own
fields; a task's `__post_init__` calls `run_post_inits(self)` first.

**Deprecated names.** A field renamed for one vocabulary across binaries keeps its old flag name for one release:
``option(..., aliases=('methods',))`` (the old flag still works, with a deprecation warning naming the new one; both
at once is an error, `config_flags`), and a renamed value ``option(..., value_aliases={'assist': 'assistments'})``
(mapped to the new value with a warning by `run_post_inits`, also when the config is built in Python).

**Resuming.** Rerunning a binary with the same ``--output_dir`` resumes its run only under the same configuration
(`fedpersonal.program.run_record`, checked by `experiment_main` before the task runs): every field must equal the
recorded one except those declared ``option(..., may_change_on_resume=True)``, which cannot change the results:
``output_dir`` (the directory may be moved) and ``rounds_per_checkpoint`` (a resumed run ends with the numbers of an
uninterrupted one whatever the checkpoint period). ``total_rounds`` may NOT change: the shorter run evaluated (and
may have selected its model or stopped early at) its last round, which a longer uninterrupted run would not have,
and its finished rows are read back, so an extended run would report numbers that no single run gives; use another
``--output_dir`` or ``--fresh_start`` instead. A task may declare more such fields (HPFL's ``configurations``: its
rows are independent and each is read back from its own directory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from absl import logging

from fedpersonal import errors

# The names `fedpersonal.program.optimizers.build_optimizer` accepts (kept here so that defining flags imports
# neither TensorFlow nor TFF; tests/program/config_parts_test.py checks the two agree).
OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'adagrad', 'yogi')
# `fedpersonal.simulation.options.ENGINE_STRATEGIES`, named here without importing TensorFlow (a test keeps them equal).
ENGINE_STRATEGIES = ('auto', 'lockstep', 'client_loop', 'low_rank', 'spread', 'measure')


def build_optimizer(name: str, learning_rate: float) -> Any:
    """`fedpersonal.program.optimizers.build_optimizer` (imported on use)."""
    from fedpersonal.program import optimizers  # pylint: disable=g-import-not-at-top

    return optimizers.build_optimizer(name, learning_rate)


def option(
    default: Any,
    help_text: str,
    *,
    aliases: Sequence[str] = (),
    value_aliases: Mapping[str, str] | None = None,
    may_change_on_resume: bool = False,
    is_path: bool = False,
) -> Any:
    """A config field with a default and the help text its flag shows.

    Args:
      default: The default (immutable).
      help_text: The flag's help.
      aliases: Deprecated flag names of the field, kept for one release (`config_flags`).
      value_aliases: Deprecated values of the field (or of its tuple's items), ``{old: new}``.
      may_change_on_resume: The field may differ from the recorded one when a run resumes (it cannot change the
        results; see the module docstring).
      is_path: The field names a file or directory: recorded as an absolute path and, on resume, the same file
        under another spelling (relative, through ``..`` or a symlink) is the same value (`run_record`).
    """
    if isinstance(default, (list, dict, set)):
        raise TypeError('Use an immutable default (a tuple) for config fields.')
    metadata: dict[str, Any] = {'help': help_text}
    if aliases:
        metadata['aliases'] = tuple(aliases)
    if value_aliases:
        metadata['value_aliases'] = dict(value_aliases)
    if may_change_on_resume:
        metadata['may_change_on_resume'] = True
    if is_path:
        metadata['is_path'] = True
    return dataclasses.field(default=default, metadata=metadata)


def field_metadata(config_cls: type, name: str, key: str, default: Any = None) -> Any:
    """Metadata `key` of field `name`: its own, or that of the first class in the MRO that sets it.

    A task that only changes a part's default (``total_rounds: int = 60``) redefines the field without metadata;
    its help, aliases and resume rule stay the part's.
    """
    for cls in config_cls.__mro__:
        fields = getattr(cls, '__dataclass_fields__', {})
        if name in fields and key in fields[name].metadata:
            return fields[name].metadata[key]
    return default


def help_text(config_cls: type, name: str) -> str | None:
    """The help of field `name`: its own, or that of the first class in the MRO that documents it."""
    return field_metadata(config_cls, name, 'help') or None


def aliases(config_cls: type, name: str) -> tuple[str, ...]:
    """The deprecated flag names of field `name` (`option(..., aliases=...)`)."""
    return tuple(field_metadata(config_cls, name, 'aliases', ()))


def may_change_on_resume(config_cls: type, name: str) -> bool:
    """Whether field `name` may differ from the recorded configuration when a run resumes."""
    return bool(field_metadata(config_cls, name, 'may_change_on_resume', False))


def is_path(config_cls: type, name: str) -> bool:
    """Whether field `name` names a file or directory (`option(..., is_path=True)`)."""
    return bool(field_metadata(config_cls, name, 'is_path', False))


def canonical_value(config_cls: type, name: str, value: Any) -> Any:
    """`value` of field `name` with every deprecated value (or tuple item) replaced by its new one."""
    mapping = field_metadata(config_cls, name, 'value_aliases', {})
    if not mapping:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(mapping.get(v, v) if isinstance(v, str) else v for v in value)
    return mapping.get(value, value) if isinstance(value, str) else value


def canonical_record(config_cls: type, record: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded configuration (JSON field values) with deprecated field names and values replaced by new ones.

    A record written before a rename (e.g. HPFL's ``methods``, now ``configurations``; ``dataset='assist'``, now
    ``'assistments'``) compares with the current configuration under the new names.
    """
    fields = {field.name for field in dataclasses.fields(config_cls)}
    renamed = {old: name for name in fields for old in aliases(config_cls, name)}
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = renamed.get(key, key)
        if name != key and name in record:
            continue  # Both spellings recorded: the new one's value wins.
        out[name] = canonical_value(config_cls, name, value) if name in fields else value
    return out


def _joined(value: Any) -> str:
    return ','.join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _canonicalize_values(config: Any) -> None:
    """Replaces deprecated values of `config`'s fields by their new ones, with one warning naming both."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        new = canonical_value(type(config), field.name, value)
        if new != value:
            logging.warning(
                '--%s=%s is deprecated and will be removed in the next release: use --%s=%s.',
                field.name,
                _joined(value),
                field.name,
                _joined(new),
            )
            object.__setattr__(config, field.name, new)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise errors.ConfigError(message)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """Where an experiment writes everything it reports."""

    output_dir: str = option(
        'output',
        'Directory for metrics (CSV, TensorBoard), checkpoints, results and plots; rerunning with the '
        'same directory resumes the run (under the same configuration; see --fresh_start).',
        may_change_on_resume=True,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from."""

    data_dir: str | None = option(
        None,
        "Directory (or file) of the real dataset (without --dataset: the dataset whose files are there); 'none': "
        'generated data.',
        is_path=True,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundsConfig:
    """Federated rounds, the run's seed and checkpointing."""

    total_rounds: int = option(100, 'Federated training rounds.')
    seed: int = option(0, 'Seed of every random choice of the run (initializers, sampling, shuffles).')
    rounds_per_checkpoint: int = option(
        10, 'Rounds between checkpoints (the last round is always saved).', may_change_on_resume=True
    )
    non_finite_clients: str = option(
        'stop',
        "A round whose training loss is NaN or infinite: 'stop' (the run ends with an error naming the round and the "
        "clients, before that round is checkpointed) or 'zero' (those clients' updates are zeroed and their number "
        'is reported as train/non_finite_clients). May change on resume (a run stopped on a NaN loss can go on '
        'with zero).',
        may_change_on_resume=True,
    )

    def __post_init__(self):
        _require(
            self.non_finite_clients in ('stop', 'zero'),
            f"non_finite_clients must be 'stop' or 'zero', got {self.non_finite_clients!r}.",
        )
        _require(
            self.rounds_per_checkpoint >= 1, f'rounds_per_checkpoint must be >= 1, got {self.rounds_per_checkpoint}.'
        )
        if self.total_rounds is not None:
            _require(self.total_rounds >= 1, f'total_rounds must be >= 1, got {self.total_rounds}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Client sampling (cross-device)."""

    clients_per_round: int = option(10, 'Clients sampled per round (uniformly without replacement, seeded).')
    client_dropout_rate: float = option(
        0.0,
        'Simulated failures: the probability that a sampled client drops out or times out in a round (seeded); '
        'it contributes nothing and its private state stays as it was.',
    )
    overselection: float = option(
        1.0,
        'Sample ceil(overselection * clients_per_round) clients and use the first clients_per_round that report '
        '(1: no over-selection).',
    )

    def __post_init__(self):
        _require(self.clients_per_round >= 1, f'clients_per_round must be >= 1, got {self.clients_per_round}.')
        _require(
            0.0 <= self.client_dropout_rate < 1.0,
            f'client_dropout_rate must be in [0, 1), got {self.client_dropout_rate}.',
        )
        _require(self.overselection >= 1.0, f'overselection must be >= 1, got {self.overselection}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluationConfig:
    """Periodic evaluation during training."""

    rounds_per_eval: int = option(10, 'Rounds between validation evaluations (and after the last round).')

    def __post_init__(self):
        _require(self.rounds_per_eval >= 1, f'rounds_per_eval must be >= 1, got {self.rounds_per_eval}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlyStoppingConfig:
    """Early stopping of federated training on the periodic validation evaluation (`program.EarlyStopping`)."""

    early_stopping_patience: int = option(
        0,
        'Stop federated training after this many validation evaluations (every rounds_per_eval rounds) without '
        'improvement (0: run total_rounds). Either way the model of the best validation round is the one tested.',
    )
    early_stopping_min_delta: float = option(0.0, 'The least validation improvement that counts (early stopping).')

    def __post_init__(self):
        _require(
            self.early_stopping_patience >= 0,
            f'early_stopping_patience must be >= 0, got {self.early_stopping_patience}.',
        )
        _require(
            self.early_stopping_min_delta >= 0,
            f'early_stopping_min_delta must be >= 0, got {self.early_stopping_min_delta}.',
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalClientsConfig:
    """How many validation clients a periodic evaluation uses (cross-device)."""

    eval_clients: int = option(100, 'Validation clients evaluated periodically (a fixed seeded sample).')

    def __post_init__(self):
        _require(self.eval_clients >= 1, f'eval_clients must be >= 1, got {self.eval_clients}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Client-side batching."""

    batch_size: int = option(16, 'Client batch size.')

    def __post_init__(self):
        _require(self.batch_size >= 1, f'batch_size must be >= 1, got {self.batch_size}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientEpochsConfig:
    """Local epochs of client training per round."""

    client_epochs: int = option(1, 'Local epochs per round.')

    def __post_init__(self):
        _require(self.client_epochs >= 1, f'client_epochs must be >= 1, got {self.client_epochs}.')


def _check_optimizer(name: str, value: str, learning_rate: float) -> None:
    _require(value in OPTIMIZERS, f'{name} must be one of {OPTIMIZERS}, got {value!r}.')
    _require(learning_rate > 0, f'{name.replace("optimizer", "learning_rate")} must be positive, got {learning_rate}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientOptimizerConfig:
    """The optimizer of local training."""

    client_optimizer: str = option('sgd', f'Client optimizer, one of {OPTIMIZERS}.')
    client_learning_rate: float = option(0.1, 'Client learning rate.')

    def __post_init__(self):
        _check_optimizer('client_optimizer', self.client_optimizer, self.client_learning_rate)

    def build_client_optimizer(self) -> Any:
        """The `tff.learning.optimizers.Optimizer` of this config."""
        return build_optimizer(self.client_optimizer, self.client_learning_rate)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerOptimizerConfig:
    """The optimizer the server applies the aggregated update with."""

    server_optimizer: str = option('sgd', f'Server optimizer, one of {OPTIMIZERS}.')
    server_learning_rate: float = option(1.0, 'Server learning rate (SGD 1.0: plain averaging).')

    def __post_init__(self):
        _check_optimizer('server_optimizer', self.server_optimizer, self.server_learning_rate)

    def build_server_optimizer(self) -> Any:
        """The `tff.learning.optimizers.Optimizer` of this config."""
        return build_optimizer(self.server_optimizer, self.server_learning_rate)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReconstructionOptimizerConfig:
    """FedRecon's reconstruction: the optimizer of the local variables and the step caps."""

    reconstruction_optimizer: str = option('sgd', f'Reconstruction optimizer, one of {OPTIMIZERS}.')
    reconstruction_learning_rate: float = option(0.1, 'Reconstruction learning rate.')
    recon_epochs: int = option(1, 'Reconstruction epochs over the support set.')
    recon_steps_max: int | None = option(None, "Cap on reconstruction steps ('none': no cap).")
    post_recon_epochs: int = option(1, 'Update epochs over the query set.')
    post_recon_steps_max: int | None = option(None, "Cap on update steps ('none': no cap).")

    def __post_init__(self):
        _check_optimizer('reconstruction_optimizer', self.reconstruction_optimizer, self.reconstruction_learning_rate)

    def build_reconstruction_optimizer(self) -> Any:
        """The `tff.learning.optimizers.Optimizer` of the reconstruction steps."""
        return build_optimizer(self.reconstruction_optimizer, self.reconstruction_learning_rate)


DP_ADAPTIVE_CLIP = 'adaptive'


@dataclasses.dataclass(frozen=True, kw_only=True)
class DifferentialPrivacyConfig:
    """User-level differential privacy of the global parameters (`fedpersonal.privacy.dp`: DP-FedAvg with TFF's
    DP aggregators and an RDP epsilon; local/private parameters never reach the aggregator).

    Off by default (``dp_noise_multiplier=None``). Validation needs no TensorFlow; a config with
    `clients_per_round` also checks the adaptive clip's count noise against it (TFF's constraint).
    """

    dp_noise_multiplier: float | None = option(
        None,
        "User-level DP of the global parameters: the Gaussian noise's stddev over the clip norm ('none': no DP; "
        '0: clipping and uniform client weighting without noise, epsilon infinite). Under DP the global update '
        'is the unweighted mean of clipped client updates plus noise, run on the per-client TFF path.',
    )
    dp_clip: str = option(
        DP_ADAPTIVE_CLIP,
        "DP: the L2 clip norm of each client's update (a positive number), or 'adaptive' (clip adapted to the "
        '--dp_target_quantile of the update norms, privately).',
    )
    dp_initial_clip: float = option(0.1, "DP with --dp_clip=adaptive: the initial clip norm (TFF's default).")
    dp_target_quantile: float = option(
        0.5, 'DP with --dp_clip=adaptive: the fraction of client updates the clip aims to leave unclipped.'
    )
    dp_clip_learning_rate: float = option(
        0.2, 'DP with --dp_clip=adaptive: the learning rate of the (geometric) clip update.'
    )
    dp_clipped_count_stddev: float | None = option(
        None,
        "DP with --dp_clip=adaptive: the noise stddev of the clipped-client count ('none': TFF's 0.05 * "
        'clients_per_round); must exceed dp_noise_multiplier / 2.',
    )
    dp_target_delta: float | None = option(
        None, "DP: the delta epsilon is reported at ('none': 1 / num_clients**1.1, below 1 / num_clients)."
    )

    def __post_init__(self):
        noise = self.dp_noise_multiplier
        _require(
            noise is None or noise >= 0,
            f"dp_noise_multiplier must be >= 0 ('none': no DP), got {noise}.",
        )
        if self.dp_clip != DP_ADAPTIVE_CLIP:
            try:
                clip = float(self.dp_clip)
            except ValueError:
                clip = float('nan')
            _require(
                clip > 0 and clip != float('inf'),
                f'dp_clip must be a positive number or {DP_ADAPTIVE_CLIP!r}, got {self.dp_clip!r}.',
            )
        _require(self.dp_initial_clip > 0, f'dp_initial_clip must be > 0, got {self.dp_initial_clip}.')
        _require(
            0 <= self.dp_target_quantile <= 1,
            f'dp_target_quantile must be in [0, 1], got {self.dp_target_quantile}.',
        )
        _require(
            self.dp_clip_learning_rate >= 0, f'dp_clip_learning_rate must be >= 0, got {self.dp_clip_learning_rate}.'
        )
        stddev = self.dp_clipped_count_stddev
        _require(stddev is None or stddev >= 0, f'dp_clipped_count_stddev must be >= 0, got {stddev}.')
        delta = self.dp_target_delta
        _require(delta is None or 0 < delta < 1, f'dp_target_delta must be in (0, 1), got {delta}.')
        clients = getattr(self, 'clients_per_round', None)
        if noise and self.dp_clip == DP_ADAPTIVE_CLIP and clients:
            stddev = stddev if stddev is not None else 0.05 * clients
            _require(
                noise < 2 * stddev,
                f'dp_noise_multiplier {noise} needs a clipped-count noise stddev above {noise / 2} with '
                f'--dp_clip=adaptive (got {stddev}: dp_clipped_count_stddev, default 0.05 * clients_per_round = '
                f'{0.05 * clients}): raise --dp_clipped_count_stddev or --clients_per_round, or use a fixed --dp_clip.',
            )

    @property
    def dp_enabled(self) -> bool:
        """Whether the global parameters are aggregated with a DP aggregator (`dp_noise_multiplier` not None)."""
        return self.dp_noise_multiplier is not None

    @property
    def dp_fixed_clip(self) -> float | None:
        """The fixed clip norm, or None for adaptive clipping."""
        return None if self.dp_clip == DP_ADAPTIVE_CLIP else float(self.dp_clip)


def refuse_dp(config: Any, reason: str) -> None:
    """Raises `ConfigError` naming --dp_noise_multiplier when `config` asks for DP that its task cannot apply."""
    _require(
        getattr(config, 'dp_noise_multiplier', None) is None,
        f'--dp_noise_multiplier={config.dp_noise_multiplier} is not supported here: {reason}',
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulationConfig:
    """How a round's clients are simulated (algorithms on the fast simulation engine)."""

    simulation: str = option(
        'engine',
        "'engine': a round's clients in groups, each one XLA-compiled program (fast); 'per_client': one TFF "
        'client computation per client (the reference path; same results).',
    )
    group_size: int | None = option(
        None, "Engine: most clients per compiled group ('none': as many as fit 1 GiB of per-client weights)."
    )
    engine_strategy: str = option(
        'auto',
        "Engine: how a group's clients run. 'auto': a fixed rule from the model ('low_rank' for models of dense "
        "layers, a compiled loop over clients for convolutional and recurrent models, 'lockstep' for embedding-only "
        "models, their phases with a proximal penalty the loop); 'lockstep' (every client's step at once, vectorized), 'client_loop', 'low_rank' (a dense model's "
        "few plain SGD steps as the shared weights' products plus low-rank updates; other phases run the loop), "
        "'spread' (the loop, a group's clients split over the cores) pin one; 'measure' times them on the first rounds and keeps the fastest "
        '(not bit-reproducible: the strategies agree to float rounding). Same results to float precision.',
    )
    packed_cache_mb: float | None = option(
        None,
        "Engine: most MiB of clients' materialized data kept between rounds (least recently used clients are read "
        "again when sampled again; 'none': 1/8 of the machine's memory). Never changes the results.",
        may_change_on_resume=True,
    )

    def __post_init__(self):
        _require(
            self.simulation in ('engine', 'per_client'),
            f"simulation must be 'engine' or 'per_client', got {self.simulation!r}.",
        )
        _require(self.group_size is None or self.group_size >= 1, f'group_size must be >= 1, got {self.group_size}.')
        _require(
            self.engine_strategy in ENGINE_STRATEGIES,
            f'engine_strategy must be one of {ENGINE_STRATEGIES}, got {self.engine_strategy!r}.',
        )
        _require(
            self.packed_cache_mb is None or self.packed_cache_mb >= 0,
            f'packed_cache_mb must be >= 0, got {self.packed_cache_mb}.',
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossDeviceRunConfig(OutputConfig, DataConfig, RoundsConfig, SamplingConfig, EvaluationConfig, BatchConfig):
    """The parts every cross-device experiment has: output, data, rounds, client sampling, evaluation, batching."""


def run_post_inits(config: Any) -> None:
    """Maps deprecated values to their new ones (with a warning), then runs every part's `__post_init__` validation
    (dataclass inheritance runs only the most derived one)."""
    _canonicalize_values(config)
    for cls in reversed(type(config).__mro__[1:]):
        post_init = cls.__dict__.get('__post_init__')
        if post_init is not None:
            post_init(config)
