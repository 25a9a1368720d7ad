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
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedpersonal import errors

# The names `fedpersonal.algorithms.optimizers.build_optimizer` accepts (kept here so that defining flags imports
# neither TensorFlow nor TFF; tests/program/config_parts_test.py checks the two agree).
OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'adagrad', 'yogi')


def build_optimizer(name: str, learning_rate: float) -> Any:
    """`fedpersonal.algorithms.optimizers.build_optimizer` (imported on use)."""
    from fedpersonal.algorithms import optimizers  # pylint: disable=g-import-not-at-top

    return optimizers.build_optimizer(name, learning_rate)


def option(default: Any, help_text: str) -> Any:
    """A config field with a default and the help text its flag shows."""
    if isinstance(default, (list, dict, set)):
        raise TypeError('Use an immutable default (a tuple) for config fields.')
    return dataclasses.field(default=default, metadata={'help': help_text})


def help_text(config_cls: type, name: str) -> str | None:
    """The help of field `name`: its own, or that of the first class in the MRO that documents it."""
    for cls in config_cls.__mro__:
        fields = getattr(cls, '__dataclass_fields__', {})
        if name in fields and fields[name].metadata.get('help'):
            return fields[name].metadata['help']
    return None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise errors.ConfigError(message)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """Where an experiment writes everything it reports."""

    output_dir: str = option(
        'output',
        'Directory for metrics (CSV, TensorBoard), checkpoints, results and plots; rerunning with the '
        'same directory resumes the run.',
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from."""

    data_dir: str | None = option(
        None,
        "Directory (or file) of the real dataset (without --dataset: the dataset whose files are there); 'none': "
        'generated data.',
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundsConfig:
    """Federated rounds, the run's seed and checkpointing."""

    total_rounds: int = option(100, 'Federated training rounds.')
    seed: int = option(0, 'Seed of every random choice of the run (initializers, sampling, shuffles).')
    rounds_per_checkpoint: int = option(10, 'Rounds between checkpoints (the last round is always saved).')
    non_finite_clients: str = option(
        'stop',
        "A round whose training loss is NaN or infinite: 'stop' (the run ends with an error naming the round and the "
        "clients, before that round is checkpointed) or 'zero' (those clients' updates are zeroed and their number "
        'is reported as train/non_finite_clients).',
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

    def __post_init__(self):
        _require(
            self.simulation in ('engine', 'per_client'),
            f"simulation must be 'engine' or 'per_client', got {self.simulation!r}.",
        )
        _require(self.group_size is None or self.group_size >= 1, f'group_size must be >= 1, got {self.group_size}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossDeviceRunConfig(OutputConfig, DataConfig, RoundsConfig, SamplingConfig, EvaluationConfig, BatchConfig):
    """The parts every cross-device experiment has: output, data, rounds, client sampling, evaluation, batching."""


def run_post_inits(config: Any) -> None:
    """Runs every part's `__post_init__` validation (dataclass inheritance runs only the most derived one)."""
    for cls in reversed(type(config).__mro__[1:]):
        post_init = cls.__dict__.get('__post_init__')
        if post_init is not None:
            post_init(config)
