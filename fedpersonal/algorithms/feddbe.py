"""FedDBE (Zhang et al., "Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023):
its personalized representation bias memory (PRBM).

The model is a body (the representation: the input of its last layer) and a head (the last layer). Each client adds
a vector of its own, the representation bias ``b_i`` (zeros at first, shaped as one example's representation),
between them: it predicts with ``head(body(x) + b_i)``. Every round a sampled client trains body, head and ``b_i``
together by SGD on its data; body and head are averaged on the server as FedAvg's, ``b_i`` never leaves the client
(it is the model's one local layer, `RepresentationBias`, kept as the process's CLIENTS-placed private state), and
the client is evaluated with it.

As PFLlib (``clientdbe.py``, ``serverdbe.py``) with its ``main.py`` default ``--kl_weight 0``: the paper's second
module, the mean regularization (MR: the distance of a running mean of the client's representations from a global
mean gathered in a warm-up round), then weighs nothing, and PFLlib's warm-up round only sets that unused mean. MR
is not implemented here. The math is FedPer's plan on a model with one more local layer: no hook of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib

LAYER_NAME = 'representation_bias'


class RepresentationBias(tf.keras.layers.Layer):
    """Adds a trainable vector (zeros at first) to every example's representation: a client's ``b_i``."""

    def build(self, input_shape: Any) -> None:
        shape = tf.TensorShape(input_shape)[1:]
        if not shape.is_fully_defined():
            raise ValueError(f'FedDBE: the representation needs a known shape per example, got {input_shape}.')
        self.bias = self.add_weight(name='bias', shape=shape, initializer='zeros', trainable=True)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return inputs + self.bias


def with_representation_bias(keras_model: tf.keras.Model) -> tf.keras.Model:
    """`keras_model` (a built classifier) with a `RepresentationBias` layer before its last layer, which it shares
    (the same layer objects: body, then the bias, then the head)."""
    if not keras_model.built or not keras_model.inputs or len(keras_model.layers) < 2:
        raise ValueError(
            'FedDBE needs a built Keras model with inputs and at least two layers (a body and a head: its last '
            f'layer), got {keras_model.name!r} with layers {[layer.name for layer in keras_model.layers]}.'
        )
    head = keras_model.layers[-1]
    representation = head.input
    if isinstance(representation, (list, tuple)):
        raise ValueError(f'FedDBE: the head {head.name!r} must take one input (the representation).')
    outputs = head(RepresentationBias(name=LAYER_NAME)(representation))
    return tf.keras.Model(keras_model.inputs, outputs, name=f'{keras_model.name}_dbe')


def feddbe_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedDBE's client work: body, head and the representation bias trained together (FedPer's plan: the bias is
    the model's local layer)."""
    return fedper.fedper_plan(client_epochs=client_epochs, client_optimizer=client_optimizer)


def partially_local_model_fn(
    keras_model_fn: Callable[[], tf.keras.Model], element_spec: Any
) -> Callable[[], tff.learning.models.ReconstructionModel]:
    """The partially local model of FedDBE: `keras_model_fn`'s model with the bias, the bias its one local layer."""
    return fedper.keras_model_fn(
        lambda: with_representation_bias(keras_model_fn()), element_spec=element_spec, local_layers=[LAYER_NAME]
    )


def build_feddbe(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    client_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds FedDBE for a Keras classifier (logits) on the context's backend.

    Args:
      model_fn: No-arg function returning a new, built Keras classifier on `element_spec['x']`; its last layer is
        the head, that layer's input the representation.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The clients' TFF optimizer (PFLlib's SGD, for the model and the bias alike).
      client_epochs: Local epochs per round.
      server_optimizer: Default SGD at learning rate 1 (the weighted mean of the models).
      group_size: Engine only: the most clients per compiled group.

    Returns:
      A stateful `PersonalizedProcess`: each client's private state is its representation bias.

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_feddbe(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(5),
    ...     tf.keras.layers.Dense(3)]), element_spec=spec, client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    >>> [w.shape for w in process.initial_private_state().trainable]  # The representation bias.
    [(5,)]
    """
    return backends.build_process(
        feddbe_plan(client_epochs=client_epochs, client_optimizer=client_optimizer),
        partially_local_model_fn(model_fn, element_spec),
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
        server_optimizer=server_optimizer or tff.learning.optimizers.build_sgdm(1.0),
        group_size=group_size,
        name='FedDBE',
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return feddbe_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


# The representation bias local; PFLlib's default weight of the mean regularizer, 0.
BENCHMARK_ROWS = (
    registry.Row(
        'feddbe',
        'FedDBE',
        _benchmark_plan,
        local_layers=(LAYER_NAME,),
        keras_transform=with_representation_bias,
    ),
)
