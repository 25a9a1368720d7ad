"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

FedAvg whose local objective adds the proximal term ``mu / 2 * ||w - w_t||^2`` to the received global model w_t
(every batch's loss; the reported loss is the model's), which keeps heterogeneous clients' local models near the
global one. ``mu = 0`` is FedAvg. (TFF 0.87's `build_weighted_fed_prox` adds ``mu * (w_t - w)`` to the gradient, the
opposite sign, which pushes local models away from w_t: tests/algorithms/fedprox_lg_fedavg_test.py shows both
against a plain loop.) The client work is one phase of a `ClientPlan`, run by every backend
(`fedpersonal.backends`); the model's weights are all global.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib


def fedprox_plan(
    *, mu: float, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer
) -> client_plan.ClientPlan:
    """FedProx's client work: the global model with the proximal term (none when ``mu == 0``: FedAvg)."""
    if mu < 0:
        raise ValueError(f'mu must be >= 0, got {mu}')
    penalty = client_plan.ProximalPenalty(client_plan.GLOBAL, mu) if mu else None
    return client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer, penalty),))


def build_fedprox(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    mu: float,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_epochs: int = 1,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds FedProx for a Keras classifier on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: `OrderedDict(x=..., y=[None] int)` of the client datasets.
      mu: The proximal weight (0: FedAvg).
      client_optimizer: The local optimizer (fresh state every round).
      server_optimizer: Applied to the example-weighted mean update (SGD 1.0: plain averaging).
      client_epochs: Local epochs per round.
      group_size: Engine only: the most clients per compiled group.

    Returns:
      A `PersonalizedProcess` (its private state is empty).

    Example:

    >>> import collections
    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = algorithms.build_fedprox(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...     element_spec=spec, mu=0.01, client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    >>> len(process.get_model_weights(process.initialize()).trainable)
    2
    """
    plan = fedprox_plan(mu=mu, client_epochs=client_epochs, client_optimizer=client_optimizer)
    return backends.build_classifier_process(
        plan,
        model_fn,
        element_spec=element_spec,
        server_optimizer=server_optimizer,
        group_size=group_size,
        name='FedProx',
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """FedProx's options in the benchmark binary (`fedpersonal.registry`)."""

    mu: float = registry.option(0.01, "FedProx's proximal weight mu.", minimum=0.0)


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return fedprox_plan(mu=options.mu, client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (registry.Row('fedprox', 'FedProx', _benchmark_plan, leaderboard=2),)
