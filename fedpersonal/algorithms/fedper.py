"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019).

The model is a shared body (base layers) and a personal head (personalization layers): every round, each sampled
client trains body and head together on its data; the body's change is averaged on the server (FedAvg), the head
never leaves the client. Here the head is the model's local layers (`fedpersonal.models.from_keras_model(...,
local_layers=[head])`), kept per client as the process's CLIENTS-placed private state.

The client work is one phase of a `ClientPlan`, run by every backend (`fedpersonal.backends`). The builder's
keyword arguments (`Options`) and body (`build_with_plan`) are also LG-FedAvg's, FedBN's and FedBABU's. Like every
other builder they take a Keras model function with the datasets' ``element_spec`` (the head, by default the
model's last layer with weights, or the layers named by ``local_layers``, kept on the clients: `keras_model_fn`),
or a function returning a partially local model that declares its local layers itself.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Required
from typing import TypedDict
from typing import Unpack

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import models
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
      element_spec: The client datasets' element spec when the model function returns a Keras classifier
        (`keras_model_fn`); None when it returns a partially local model.
      local_layers: With ``element_spec``: the names of the Keras model's layers kept on the clients (default: the
        algorithm's, e.g. FedPer's head: the last layer with weights).
    """

    loss_fn: Required[client_work.LossFn]
    metrics_fn: client_work.MetricsFn | None
    client_optimizer: Required[tff.learning.optimizers.Optimizer]
    server_optimizer: Required[tff.learning.optimizers.Optimizer]
    client_epochs: int
    model_aggregator: Any
    element_spec: Any
    local_layers: Sequence[str] | None


LayersFn = Callable[[tf.keras.Model], list[tf.keras.layers.Layer]]


def head_layers(keras_model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """The model's head: its last layer with weights."""
    return [layer for layer in keras_model.layers if layer.weights][-1:]


def body_layers(keras_model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """The model's body: its layers with weights but the last."""
    return [layer for layer in keras_model.layers if layer.weights][:-1]


def no_layers(keras_model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """No local layer: every weight global."""
    return []


def keras_model_fn(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    local_layers: Sequence[str] | None = None,
    default_local: LayersFn = head_layers,
) -> Callable[[], tff.learning.models.ReconstructionModel]:
    """The partially local model of a Keras classifier: the layers named `local_layers` (default:
    ``default_local(model)``, the head) kept on the clients, every other weight global.

    `element_spec` is the client datasets' spec with ``x`` and ``y``, or an ``(x, y)`` pair of specs.

    Raises (when called):
      TypeError: `model_fn` returns no Keras model.
      ValueError: A name in `local_layers` is no layer of the model, or those layers hold no weights.
    """
    # A mapping may hold more than the model's input and label; an (x, y) pair is taken as it is.
    spec = (
        collections.OrderedDict(x=element_spec['x'], y=element_spec['y'])
        if isinstance(element_spec, Mapping)
        else element_spec
    )

    def wrapped() -> tff.learning.models.ReconstructionModel:
        keras_model = model_fn()
        if not isinstance(keras_model, tf.keras.Model):
            raise TypeError(
                f'With element_spec, model_fn must return a tf.keras.Model, got {type(keras_model).__name__}.'
            )
        if local_layers is None:
            local = default_local(keras_model)
        else:
            names = [layer.name for layer in keras_model.layers]
            missing = [name for name in local_layers if name not in names]
            if missing:
                raise ValueError(f'local_layers {missing} are no layers of model {keras_model.name!r}: {names}.')
            local = [keras_model.get_layer(name) for name in local_layers]
            if not any(layer.weights for layer in local):
                raise ValueError(f'local_layers {list(local_layers)} of model {keras_model.name!r} hold no weights.')
        local_ids = {id(v) for layer in local for v in layer.weights}
        shared = [v for v in keras_model.weights if id(v) not in local_ids]
        return models.from_keras_model(keras_model, input_spec=spec, global_variables=shared, local_layers=local)

    return wrapped


def partially_local(
    model_fn: Callable[[], Any],
    element_spec: Any,
    local_layers: Sequence[str] | None,
    default_local: LayersFn = head_layers,
) -> Callable[[], Any]:
    """`model_fn` as the builders take it: a Keras model function with `element_spec` (`keras_model_fn`), or one
    returning a partially local model (`element_spec` None)."""
    if element_spec is None:
        if local_layers is not None:
            raise ValueError('local_layers names layers of a Keras model: pass element_spec with it.')
        return model_fn
    return keras_model_fn(model_fn, element_spec=element_spec, local_layers=local_layers, default_local=default_local)


def fedper_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedPer's client work: body and head trained together for `client_epochs` epochs."""
    return client_plan.ClientPlan((client_plan.Phase(('global', 'local'), client_epochs, client_optimizer),))


def build_fedper(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel], **options: Unpack[Options]
) -> process_lib.PersonalizedProcess:
    """Builds FedPer on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with ``element_spec``; its head, the last layer
        with weights, local unless ``local_layers`` names others) or a partially local model (global body, local
        head).
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
    element_spec: Any = None,
    local_layers: Sequence[str] | None = None,
    default_local: LayersFn = head_layers,
) -> process_lib.PersonalizedProcess:
    """The process of the plan ``plan_fn(client_epochs=..., client_optimizer=...)`` (`fedper_plan`, or another of
    the same arguments) with the `Options`, built by `fedpersonal.backends.build_process`; `name` names it in log
    lines, `default_local` picks a Keras model's local layers when ``local_layers`` is None."""
    return backends.build_process(
        plan_fn(client_epochs=client_epochs, client_optimizer=client_optimizer),
        partially_local(model_fn, element_spec, local_layers, default_local),
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        name=name,
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return fedper_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (registry.Row('fedper', 'FedPer', _benchmark_plan, leaderboard=5, local_layers=registry.HEAD),)
