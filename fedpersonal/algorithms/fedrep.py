"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML 2021).

A shared representation (the body) and a personal head per client. Every round each sampled client first trains
its head for `head_epochs` epochs with the received body frozen, then the body for `body_epochs` epochs with its
new head frozen (Algorithm 1 of the paper); the body's change is averaged on the server, the head never leaves the
client. The head is the model's local layers (`fedpersonal.models.from_keras_model(..., local_layers=[head])`), the
process's CLIENTS-placed private state.

The client work is two phases of a `ClientPlan`, run by every backend (`fedpersonal.backends`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib


def fedrep_plan(
    *,
    head_epochs: int,
    body_epochs: int,
    head_optimizer: tff.learning.optimizers.Optimizer,
    body_optimizer: tff.learning.optimizers.Optimizer,
) -> client_plan.ClientPlan:
    """FedRep's client work: the head with the body frozen, then the body with the head frozen."""
    return client_plan.ClientPlan(
        (
            client_plan.Phase(('local',), head_epochs, head_optimizer),
            client_plan.Phase(('global',), body_epochs, body_optimizer),
        )
    )


def build_fedrep(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None = None,
    head_optimizer: tff.learning.optimizers.Optimizer,
    body_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    head_epochs: int = 10,
    body_epochs: int = 1,
    model_aggregator: Any = None,
    element_spec: Any = None,
    local_layers: Sequence[str] | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds FedRep on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with `element_spec`; its head, the last layer
        with weights, local unless `local_layers` names others) or a partially local model (global body, local
        head).
      loss_fn: No-arg function returning the Keras loss.
      metrics_fn: Optional no-arg function returning Keras metrics (updated in both phases).
      head_optimizer: The head's local optimizer (fresh state every round).
      body_optimizer: The body's local optimizer (fresh state every round).
      server_optimizer: Applied to the averaged body update.
      head_epochs: Epochs of the head per round (the paper's tau = 10 by default).
      body_epochs: Epochs of the body per round (the paper: 1).
      model_aggregator: A weighted `tff.aggregators` factory for the body update (default: example-weighted mean).
      element_spec: The client datasets' element spec when `model_fn` returns a Keras classifier.
      local_layers: With `element_spec`: the names of the Keras model's layers kept on the clients (the head).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's head.
    """
    plan = fedrep_plan(
        head_epochs=head_epochs,
        body_epochs=body_epochs,
        head_optimizer=head_optimizer,
        body_optimizer=body_optimizer,
    )
    return backends.build_process(
        plan,
        fedper.partially_local(model_fn, element_spec, local_layers),
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        name='FedRep',
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """FedRep's options in the benchmark binary (`fedpersonal.registry`)."""

    head_epochs: int = registry.option(1, "FedRep's head epochs per round (PFLlib: plocal_epochs).", minimum=1)


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return fedrep_plan(
        head_epochs=options.head_epochs,
        body_epochs=settings.client_epochs,
        head_optimizer=settings.sgd(),
        body_optimizer=settings.sgd(),
    )


BENCHMARK_ROWS = (registry.Row('fedrep', 'FedRep', _benchmark_plan, leaderboard=6, local_layers=registry.HEAD),)
