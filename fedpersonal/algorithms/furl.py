"""FURL: Federated User Representation Learning (Bui et al., 2019).

Model parameters are split into *federated* parameters (the model's global
variables) and *private* parameters (its local variables, e.g. a user
embedding). Each round, every sampled client

1. receives the federated parameters;
2. starts its private parameters from the value its last participation left
   on the device (or a default on first participation) -- they are a
   `tff.CLIENTS`-placed *input* of the round;
3. trains federated and private parameters jointly on its data (optionally
   with a norm penalty on its own private parameters, which keeps the
   independent-local-training constraint, Eq. 1);
4. sends back only the federated update and a weight; its trained private
   parameters are a `tff.CLIENTS`-placed *output* of the round (global update
   rule a_p = identity, Eq. 7).

Federated parameters are aggregated with any `tff.aggregators` factory
(a_f = FedAvg by default, Eq. 4) and applied by a server optimizer. Private
parameters never reach a SERVER-placed intrinsic or the server state.

The client work is one phase of a `fedpersonal.core.client_plan.ClientPlan`
(FedPer's, with the norm penalty), run by every backend (`fedpersonal.backends`).
The process is a stateful `fedpersonal.core.PersonalizedProcess` (a
`LearningProcess` cannot return CLIENTS-placed values):

    initialize: ( -> state@SERVER)
    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> ->
           <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import partially_local_model

ReconstructionModel: TypeAlias = tff.learning.models.ReconstructionModel


def furl_plan(
    *, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer, private_norm_regularization: float
) -> client_plan.ClientPlan:
    """FURL's client work: federated and private parameters trained jointly, with the optional norm penalty."""
    penalty = None
    if private_norm_regularization > 0:
        penalty = client_plan.NormPenalty(client_plan.LOCAL, private_norm_regularization)
    phase = client_plan.Phase((client_plan.GLOBAL, client_plan.LOCAL), client_epochs, client_optimizer, penalty)
    return client_plan.ClientPlan((phase,))


def build_furl(
    model_fn: Callable[[], ReconstructionModel],
    *,
    loss_fn: Callable[[], tf.keras.losses.Loss],
    metrics_fn: Callable[[], list[tf.keras.metrics.Metric]] | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_epochs: int = 1,
    private_norm_regularization: float = 0.0,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_aggregator: compose.AggregationFactory | None = None,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    simulation: str | None = None,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds the FURL iterative process.

    Args:
      model_fn: No-arg function returning a new model whose local variables are
        the private parameters (e.g. `fedpersonal.models.from_keras_model` with
        the user-embedding layer declared local).
      loss_fn: No-arg function returning the training loss.
      metrics_fn: No-arg function returning Keras metrics computed during local
        training (`loss` and `num_examples` are added).
      client_optimizer: Optimizer for the joint local training.
      server_optimizer: Applied to the aggregated federated update.
      client_epochs: Local epochs per round (the paper: 1).
      private_norm_regularization: lambda of a `lambda * ||w_p||^2` penalty on
        the client's own private parameters (allowed by Eq. 1).
      client_weighting: `NUM_EXAMPLES` (FedAvg, Eq. 4), `UNIFORM`, or a callable.
      model_aggregator: Any `tff.aggregators` factory for the federated update.
      metrics_aggregator: As in TFF.
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context. Same results to float precision.
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB).

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess`: `next(state, client_datasets, private_states)` ->
      `ProcessOutput(state, metrics, private_states)`; `initial_private_state()` is a client's private state
      before its first participation (the model's local variables at their initializers).

    Example:

    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> from fedpersonal.models import matrix_factorization as mf
    >>> process = algorithms.build_furl(mf.personal_model_fn(num_items=20, num_latent_factors=4),
    ...                                 loss_fn=tf.keras.losses.MeanSquaredError)
    >>> process.stateful
    True
    """
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    with tf.Graph().as_default():
        partially_local_model.require_parts(model_fn(), algorithm='FURL', needs_global=True, needs_local=True)
    plan = furl_plan(
        client_epochs=client_epochs,
        client_optimizer=client_optimizer,
        private_norm_regularization=private_norm_regularization,
    )
    with backends.use(simulation or backends.current()):
        return backends.build_process(
            plan,
            model_fn,
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            server_optimizer=server_optimizer,
            model_aggregator=model_aggregator,
            client_weighting=client_weighting,
            metrics_aggregator=metrics_aggregator,
            group_size=group_size,
            name='FURL',
        )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """FURL's options in the benchmark binary (`fedpersonal.registry`)."""

    private_norm: float = registry.option(
        1e-3, "FURL-head: the norm penalty on the private head's weights.", minimum=0.0
    )


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return furl_plan(
        client_epochs=settings.client_epochs,
        client_optimizer=settings.sgd(),
        private_norm_regularization=options.private_norm,
    )


# A persistent private head with FURL's norm penalty.
BENCHMARK_ROWS = (registry.Row('furl_head', 'FURL-head', _benchmark_plan, leaderboard=11, local_layers=registry.HEAD),)
