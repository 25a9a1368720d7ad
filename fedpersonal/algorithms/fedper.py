"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019).

The model is a shared body (base layers) and a personal head (personalization layers): every round, each sampled
client trains body and head together on its data; the body's change is averaged on the server (FedAvg), the head
never leaves the client. Here the head is the model's local layers (`fedpersonal.models.from_keras_model(...,
local_layers=[head])`), kept per client as the process's CLIENTS-placed private state.

The client work is one phase of a `ClientPlan`, run by every backend (`fedpersonal.backends`). The builder's
keyword arguments (`Options`) and body (`build_with_plan`) are also LG-FedAvg's, FedBN's and FedBABU's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Required
from typing import TypedDict
from typing import Unpack

import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib


class Options(TypedDict, total=False):
    """The keyword arguments of FedPer's builder, also those of the builders that differ from it only in which
    layers the model declares local (LG-FedAvg, FedBN) or in the plan (FedBABU).

    Attributes:
      loss_fn: (Required.) No-arg function returning the Keras loss.
      metrics_fn: No-arg function returning Keras metrics (default: none besides the loss).
      client_optimizer: (Required.) The local optimizer of the trained layers (fresh state every round).
      server_optimizer: (Required.) Applied to the averaged update of the global layers.
      client_epochs: Local epochs per round (default 1).
      model_aggregator: A weighted `tff.aggregators` factory for the global update (default: example-weighted
        mean).
    """

    loss_fn: Required[client_work.LossFn]
    metrics_fn: client_work.MetricsFn | None
    client_optimizer: Required[tff.learning.optimizers.Optimizer]
    server_optimizer: Required[tff.learning.optimizers.Optimizer]
    client_epochs: int
    model_aggregator: Any


def fedper_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedPer's client work: body and head trained together for `client_epochs` epochs."""
    return client_plan.ClientPlan((client_plan.Phase(('global', 'local'), client_epochs, client_optimizer),))


def build_fedper(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel], **options: Unpack[Options]
) -> process_lib.PersonalizedProcess:
    """Builds FedPer on the context's backend.

    Args:
      model_fn: No-arg function returning a new partially local model: global body, local head.
      **options: `Options` (``loss_fn``, ``client_optimizer`` and ``server_optimizer`` required).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's head.
    """
    return build_with_plan(fedper_plan, model_fn, name='FedPer', **options)


def build_with_plan(
    plan_fn: Callable[..., client_plan.ClientPlan],
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    name: str,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    model_aggregator: Any = None,
) -> process_lib.PersonalizedProcess:
    """The process of the plan ``plan_fn(client_epochs=..., client_optimizer=...)`` (`fedper_plan`, or another of
    the same arguments) with the `Options`, built by `fedpersonal.backends.build_process`; `name` names it in log
    lines."""
    return backends.build_process(
        plan_fn(client_epochs=client_epochs, client_optimizer=client_optimizer),
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        name=name,
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return fedper_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (registry.Row('fedper', 'FedPer', _benchmark_plan, leaderboard=5, local_layers=registry.HEAD),)
