"""Which clients take part in a round: sampled (cross-device, with simulated dropouts) or every client (cross-silo).

Sampling is deterministic in ``(seed, round)``, so a resumed run samples the clients an uninterrupted run would;
simulated dropouts draw from a stream of their own, so turning them on does not change which clients are sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff


def surviving_clients(
    sampled: Sequence[str], clients_per_round: int, round_num: int, seed: int, dropout_rate: float
) -> tuple[list[str], int]:
    """The sampled clients that report back in a round with simulated dropouts (at most `clients_per_round`), and
    how many of the sampled failed.

    Each sampled client fails (drops out or times out) with probability `dropout_rate`, drawn from ``(seed,
    round_num)`` in sampling order, independently of the sampling itself; of the survivors, the first
    `clients_per_round` are used (over-selection: sample more than needed, use the first that report).

    Example:

    >>> surviving_clients(['a', 'b', 'c'], 2, 1, 0, 0.0)
    (['a', 'b'], 0)
    """
    if not dropout_rate:
        return list(sampled[:clients_per_round]), 0
    failed = np.random.default_rng([seed, round_num, 1]).random(len(sampled)) < dropout_rate
    return [c for c, f in zip(sampled, failed) if not f][:clients_per_round], int(failed.sum())


def sample_clients(client_ids: list[str], clients_per_round: int, round_num: int, seed: int) -> list[str]:
    """Deterministic uniform sample without replacement for `round_num`."""
    rng = np.random.default_rng([seed, round_num])
    size = min(clients_per_round, len(client_ids))
    return [client_ids[i] for i in rng.choice(len(client_ids), size=size, replace=False)]


def participation(client_data: Any, clients_per_round: int | None):
    """``(client ids, every_client, inputs by id)`` of the two participation modes."""
    if isinstance(client_data, tff.simulation.datasets.ClientData):
        if clients_per_round is None or clients_per_round < 1:
            raise ValueError('Sampled participation (client_data is a ClientData) needs clients_per_round >= 1.')
        return list(client_data.client_ids), False, None
    if clients_per_round is not None:
        raise ValueError(
            'clients_per_round applies to a ClientData; with a sequence or mapping of client inputs every '
            'client participates in every round.'
        )
    if isinstance(client_data, Mapping):
        inputs = dict(client_data)
    elif isinstance(client_data, Sequence):
        inputs = {str(i): value for i, value in enumerate(client_data)}
    else:
        raise TypeError(
            f'client_data must be a tff.simulation.datasets.ClientData, a sequence or a mapping, got '
            f'{type(client_data).__name__}.'
        )
    if not inputs:
        raise ValueError('client_data has no clients.')
    return list(inputs), True, inputs
