"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021).

FedAvg whose clients add a model-contrastive loss to every batch: with z, z_glob and z_prev the representations of
an example by the model training, the received global model and the client's model after its previous round
(the initial model before its first),
``l_con = -log(exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)))`` (``sim`` the
cosine similarity), and the batch's loss is its cross-entropy plus ``mu`` times the batch's mean ``l_con``. The
previous model stays on the client; the server averages the models as FedAvg.

As PFLlib (``clientmoon.py``: the representation is its ``BaseHeadSplit``'s base, the model without its last
layer; the previous model is the one the client trained last). The math is one
`fedpersonal.core.reference_terms.ReferenceTerm`, `Contrast`, defined here and called by every backend.
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

Represent = Callable[[tf.keras.Model, Any], tf.Tensor]


def last_layer_input(model: tf.keras.Model, x: Any) -> tf.Tensor:
    """The input of the Keras model's last layer for inputs `x` (PFLlib's base: the model without its head)."""
    if isinstance(model, tf.keras.Sequential):
        for layer in model.layers[:-1]:
            x = layer(x)
        return x
    return tf.keras.Model(model.inputs, model.layers[-1].input)(x)


def cosine_similarity(a: tf.Tensor, b: tf.Tensor, eps: float = 1e-8) -> tf.Tensor:
    """Per example, the cosine of the flattened representations, each norm at least `eps` (as PyTorch's)."""
    a, b = tf.reshape(a, [tf.shape(a)[0], -1]), tf.reshape(b, [tf.shape(b)[0], -1])
    unit = lambda v: v / tf.maximum(tf.norm(v, axis=1, keepdims=True), eps)
    return tf.reduce_sum(unit(a) * unit(b), axis=1)


@dataclasses.dataclass(frozen=True)
class Contrast:
    """MOON's model-contrastive term (module docstring), a `fedpersonal.core.reference_terms.ReferenceTerm`.

    Attributes:
      mu: The term's weight in the batch loss.
      tau: The temperature.
      representation: ``(Keras model, x) -> representation``; default: the input of its last layer.
    """

    mu: float
    tau: float
    representation: Represent = last_layer_input

    def __post_init__(self):
        if not self.mu >= 0 or not self.tau > 0:
            raise ValueError(f'MOON needs mu >= 0 and tau > 0, got mu={self.mu}, tau={self.tau}.')

    def initial(self, weights: list[Any]) -> list[Any]:
        """The previous model before the first round: the initial model."""
        return [tf.identity(w) for w in weights]

    def represent(self, model: tf.keras.Model, x: Any) -> tf.Tensor:
        return self.representation(model, x)

    def per_example(self, features: tf.Tensor, received: tf.Tensor, kept: tf.Tensor) -> tf.Tensor:
        """``mu * l_con``; ``-log(e^a / (e^a + e^b)) = softplus(b - a)``."""
        to_global, to_previous = cosine_similarity(features, received), cosine_similarity(features, kept)
        return self.mu * tf.nn.softplus((to_previous - to_global) / self.tau)

    def finish(self, trained: list[Any], kept: list[Any]) -> list[Any]:
        """The previous model of the next round: the one just trained."""
        del kept
        return list(trained)


def moon_plan(
    *, client_optimizer: tff.learning.optimizers.Optimizer, client_epochs: int, mu: float, tau: float
) -> client_plan.ClientPlan:
    """MOON's client work: one phase on all the model's weights with the contrastive term."""
    phase = client_plan.Phase((client_plan.GLOBAL, client_plan.LOCAL), client_epochs, client_optimizer)
    return client_plan.ClientPlan((phase,), reference=Contrast(mu, tau))


def build_moon(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    client_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    mu: float = 1.0,
    tau: float = 0.5,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds MOON for a Keras classifier (logits; all its weights global) on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier on `element_spec['x']`; its representation is the
        input of its last layer.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The clients' TFF optimizer (the paper's SGD).
      client_epochs: Local epochs per round.
      mu: The contrastive term's weight (the paper's 1 for CIFAR-100, 5 for CIFAR-10).
      tau: The temperature (the paper's 0.5).
      server_optimizer: Default SGD at learning rate 1 (the weighted mean of the models).
      group_size: Engine only: the most clients per compiled group.

    Returns:
      A stateful `PersonalizedProcess`: each client's private state is its previous model.

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_moon(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(5),
    ...     tf.keras.layers.Dense(3)]), element_spec=spec, client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    >>> [w.shape for w in process.initial_private_state().trainable]  # The previous model.
    [(4, 5), (5,), (5, 3), (3,)]
    """
    plan = moon_plan(client_optimizer=client_optimizer, client_epochs=client_epochs, mu=mu, tau=tau)
    return backends.build_classifier_process(
        plan,
        model_fn,
        element_spec=element_spec,
        server_optimizer=server_optimizer or tff.learning.optimizers.build_sgdm(1.0),
        group_size=group_size,
        name='MOON',
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """MOON's options in the benchmark binary (`fedpersonal.registry`)."""

    mu: float = registry.option(
        1.0,
        "MOON's weight of the model-contrastive loss (the paper's 1 for CIFAR-100; PFLlib's --mu default 0).",
        minimum=0.0,
    )
    tau: float = registry.option(0.5, "MOON's temperature (the paper's 0.5; PFLlib's --tau default 1).", above=0.0)


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return moon_plan(
        client_optimizer=settings.sgd(), client_epochs=settings.client_epochs, mu=options.mu, tau=options.tau
    )


BENCHMARK_ROWS = (registry.Row('moon', 'MOON', _benchmark_plan),)
