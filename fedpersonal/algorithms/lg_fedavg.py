"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020).

The mirror image of FedPer: each client keeps its own representation layers (the model's local layers, e.g. the
convolutions and the first dense layer) and shares the top layers (its global layers, e.g. the classifier); every
round the sampled clients train both on their data, the shared layers' change is averaged on the server, the local
representation never leaves the client (the process's CLIENTS-placed private state). The client work is FedPer's
plan (`fedpersonal.algorithms.fedper.fedper_plan`: both parts step together); what differs is which layers the model
declares local, so this module only builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib


def build_lg_fedavg(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    model_aggregator: Any = None,
) -> process_lib.PersonalizedProcess:
    """Builds LG-FedAvg on the context's backend.

    Args:
      model_fn: No-arg function returning a new partially local model: local representation layers, global top.
      loss_fn: No-arg function returning the Keras loss.
      metrics_fn: Optional no-arg function returning Keras metrics.
      client_optimizer: The local optimizer of both parts (fresh state every round).
      server_optimizer: Applied to the averaged update of the global layers.
      client_epochs: Local epochs per round.
      model_aggregator: A weighted `tff.aggregators` factory for the global update (default: example-weighted
        mean).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's representation layers.
    """
    return backends.build_process(
        fedper.fedper_plan(client_epochs=client_epochs, client_optimizer=client_optimizer),
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        name='LG-FedAvg',
    )
