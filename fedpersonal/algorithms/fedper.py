"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019).

The model is a shared body (base layers) and a personal head (personalization layers): every round, each sampled
client trains body and head together on its data; the body's change is averaged on the server (FedAvg), the head
never leaves the client. Here the head is the model's local layers (`fedpersonal.models.from_keras_model(...,
local_layers=[head])`), kept per client as the process's CLIENTS-placed private state.

The client work is one phase of a `ClientPlan`, run by every backend (`fedpersonal.backends`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib


def fedper_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedPer's client work: body and head trained together for `client_epochs` epochs."""
    return client_plan.ClientPlan((client_plan.Phase(('global', 'local'), client_epochs, client_optimizer),))


def build_fedper(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    model_aggregator: Any = None,
) -> process_lib.PersonalizedProcess:
    """Builds FedPer on the context's backend.

    Args:
      model_fn: No-arg function returning a new partially local model: global body, local head.
      loss_fn: No-arg function returning the Keras loss.
      metrics_fn: Optional no-arg function returning Keras metrics.
      client_optimizer: The local optimizer of body and head (fresh state every round).
      server_optimizer: Applied to the averaged body update.
      client_epochs: Local epochs per round.
      model_aggregator: A weighted `tff.aggregators` factory for the body update (default: example-weighted mean).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's head.
    """
    return backends.build_process(
        fedper_plan(client_epochs=client_epochs, client_optimizer=client_optimizer),
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        name='FedPer',
    )
