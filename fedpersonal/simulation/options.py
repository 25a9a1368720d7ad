"""The engine's options shared by every builder: which simulation path, how many clients per group, and how many
bytes of materialized clients the packer keeps between rounds."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fedpersonal import errors

SIMULATIONS = ('engine', 'per_client')
# How the engine runs a group's client work (`fedpersonal.simulation.plan_engine`): 'auto' picks one of the fixed
# strategies from the workload's shape (`client_loop.auto_strategy`), 'measure' times them on the first rounds.
AUTO, LOCKSTEP, CLIENT_LOOP, LOW_RANK, SPREAD, MEASURE = (
    'auto',
    'lockstep',
    'client_loop',
    'low_rank',
    'spread',
    'measure',
)
ENGINE_STRATEGIES = (AUTO, LOCKSTEP, CLIENT_LOOP, LOW_RANK, SPREAD, MEASURE)
DEFAULT_MEMORY_BUDGET_BYTES = 1 << 30  # Per group: the per-client copies of the trained weights.
MAX_GROUP_SIZE = 128
CACHE_SHARE_OF_MEMORY = 8  # The packer's client cache defaults to 1/8 of the machine's physical memory.


def check_simulation(simulation: str) -> None:
    if simulation not in SIMULATIONS:
        raise errors.ConfigError(f'simulation must be one of {SIMULATIONS}, got {simulation!r}.')


def check_engine_strategy(strategy: str) -> None:
    """Raises `ConfigError` for a strategy not in `ENGINE_STRATEGIES`."""
    if strategy not in ENGINE_STRATEGIES:
        raise errors.ConfigError(f'engine_strategy must be one of {ENGINE_STRATEGIES}, got {strategy!r}.')


def default_group_size(
    per_client_arrays: Sequence[np.ndarray], *, memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
) -> int:
    """The largest group (at most `MAX_GROUP_SIZE`) whose per-client weight copies fit the memory budget.

    Each logical client of a group holds its own copy of the weights it trains (plus their gradients and the
    optimizer's state, counted as 3 copies); a round with more clients than this runs several groups.
    """
    per_client = 3 * sum(int(np.prod(a.shape)) * 4 for a in per_client_arrays)
    return int(max(1, min(MAX_GROUP_SIZE, memory_budget_bytes // max(per_client, 1))))


def default_cache_bytes() -> int:
    """The default bound of a `packing.ClientPacker`'s client cache: 1/`CACHE_SHARE_OF_MEMORY` of the machine's
    physical memory (so a long run over many clients keeps its hot clients without growing without bound)."""
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // CACHE_SHARE_OF_MEMORY


def cache_bytes(packed_cache_mb: float | None) -> int | None:
    """The packer's cache bound in bytes for the ``packed_cache_mb`` option (None: the machine's default)."""
    if packed_cache_mb is None:
        return None
    if packed_cache_mb < 0:
        raise errors.ConfigError(f'packed_cache_mb must be >= 0, got {packed_cache_mb}.')
    return round(packed_cache_mb * (1 << 20))


def check_engine_parts(*, model_distributor: object = None, metrics_aggregator: object = None) -> None:
    """Raises `ConfigError` for parts the engine's round runner would not apply as TFF does."""
    import tensorflow_federated as tff  # Lazy: options are read before TFF is imported.

    if model_distributor is not None:
        raise errors.ConfigError(
            "The fast simulation engine runs TFF's default broadcast; a custom model_distributor needs "
            "simulation='per_client'."
        )
    if metrics_aggregator not in (None, tff.learning.metrics.sum_then_finalize):
        raise errors.ConfigError(
            'The fast simulation engine finalizes metrics as tff.learning.metrics.sum_then_finalize; a custom '
            "metrics_aggregator needs simulation='per_client'."
        )


def parallel_parts() -> int:
    """How many compiled group programs a round may run at once (one per core): the CPUs this process may use, at
    most TensorFlow's intra-op threads where they are pinned (``tf.config.threading`` or ``TF_NUM_INTRAOP_THREADS``),
    so a run pinned to one thread stays on one core."""
    from fedpersonal.runtime import engine_workers  # Lazy: options are read before TensorFlow is imported.

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    return max(1, min(cpus, engine_workers.driver_threads()))
