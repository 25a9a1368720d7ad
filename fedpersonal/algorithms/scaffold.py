"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020).

The server keeps a control variate c beside the global weights x, each client one of its own, c_i (zeros at
first). A client starts from x and corrects every local SGD step of learning rate lr by the drift of its gradient
from the mean: ``y <- y - lr * (g(y) + c - c_i)``. After its K steps it sets (the paper's option II)
``c_i+ = c_i - c + (x - y) / (K * lr)``, uploads ``y - x`` and ``c_i+ - c_i``; the server moves x by its
learning rate times the mean of the former, and c by ``|S| / N`` (the sampled share of clients) times the mean of
the latter. The client's c_i never leaves it; what it uploads about it is the change.

As PFLlib (``serverscaffold.py``, ``clientscaffold.py``: the uniform mean over clients, its server learning rate on
x only, K counted as its batches times its epochs). The math is one `fedpersonal.core.shared_values.SharedValues`,
`ControlVariates`, defined here and called by every backend: c rides the model's update (the server's SGD of
learning rate eta moves it by eta times the mean of ``upload - c``, so each client uploads
``c + scale * (c_i+ - c_i)`` with ``scale = participation / eta``) and c_i follows the client's local weights.
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


@dataclasses.dataclass(frozen=True)
class ControlVariates:
    """SCAFFOLD's control variates (module docstring), a `fedpersonal.core.shared_values.SharedValues`.

    Attributes:
      learning_rate: The clients' SGD learning rate lr (``(x - y) / (K * lr)`` estimates the mean gradient).
      scale: The factor of the clients' mean change of c_i that the server adds to c, divided by the server's
        learning rate on the model: ``participation / server_learning_rate``.
    """

    learning_rate: float
    scale: float = 1.0

    def __post_init__(self):
        if not self.learning_rate > 0 or not self.scale > 0:
            raise ValueError(f'ControlVariates needs learning_rate > 0 and scale > 0, got {self}.')

    def initial(self, weights: list[Any]) -> tuple[list[Any], list[Any]]:
        """c and c_i: zeros."""
        return [tf.zeros_like(w) for w in weights], [tf.zeros_like(w) for w in weights]

    def offset(self, shared: list[Any], kept: list[Any]) -> list[Any]:
        """``c - c_i``, added to every step's gradient."""
        return [c - ci for c, ci in zip(shared, kept)]

    def finish(
        self, received: list[Any], trained: list[Any], shared: list[Any], kept: list[Any], steps: tf.Tensor
    ) -> tuple[list[Any], list[Any]]:
        """``c + scale * (c_i+ - c_i)`` to upload and ``c_i+``; a client that made no step keeps c_i (and uploads
        c)."""
        stepped = steps > 0
        # As PFLlib, 1 / K / lr in double precision, then the float32 arithmetic of its tensors.
        inverse = tf.math.divide_no_nan(tf.constant(1.0, tf.float64), tf.cast(steps, tf.float64) * self.learning_rate)
        new, uploaded = [], []
        for x, y, c, ci in zip(received, trained, shared, kept):
            drift = tf.cast(inverse, y.dtype) * (x - y)
            new.append(tf.where(stepped, ci - c + drift, ci))
            uploaded.append(tf.where(stepped, c + self.scale * (drift - c), c))  # c_i+ - c_i = drift - c.
        return uploaded, new


def scaffold_plan(*, client_learning_rate: float, client_epochs: int, scale: float = 1.0) -> client_plan.ClientPlan:
    """SCAFFOLD's client work: the global (and any local) weights by SGD corrected by the control variates."""
    phase = client_plan.Phase(
        (client_plan.GLOBAL, client_plan.LOCAL), client_epochs, tff.learning.optimizers.build_sgdm(client_learning_rate)
    )
    return client_plan.ClientPlan((phase,), shared=ControlVariates(client_learning_rate, scale))


def build_scaffold(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    client_learning_rate: float,
    client_epochs: int = 1,
    server_learning_rate: float = 1.0,
    participation: float = 1.0,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds SCAFFOLD for a Keras classifier (logits; all its weights global) on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_learning_rate: The clients' SGD learning rate.
      client_epochs: Local epochs per round.
      server_learning_rate: The server's learning rate on the mean model update (PFLlib's default 1).
      participation: The share of all clients that a round samples (``|S| / N``; 1: all of them, as PFLlib's
        default join ratio).
      group_size: Engine only: the most clients per compiled group.

    Returns:
      A stateful `PersonalizedProcess`: the server's weights hold c after the model's trainable weights, each
      client's private state is its c_i.

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_scaffold(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...     element_spec=spec, client_learning_rate=0.1)
    >>> [w.shape for w in process.get_model_weights(process.initialize()).trainable]  # x, then c
    [(4, 3), (3,), (4, 3), (3,)]
    >>> [w.shape for w in process.initial_private_state().trainable]  # c_i
    [(4, 3), (3,)]
    """
    if not 0 < participation <= 1 or not server_learning_rate > 0:
        raise ValueError(
            f'participation must be in (0, 1] and server_learning_rate > 0, got {participation}, '
            f'{server_learning_rate}.'
        )
    plan = scaffold_plan(
        client_learning_rate=client_learning_rate,
        client_epochs=client_epochs,
        scale=participation / server_learning_rate,
    )
    return backends.build_classifier_process(
        plan,
        model_fn,
        element_spec=element_spec,
        server_optimizer=tff.learning.optimizers.build_sgdm(server_learning_rate),
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
        group_size=group_size,
        name='SCAFFOLD',
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return scaffold_plan(client_learning_rate=settings.client_learning_rate, client_epochs=settings.client_epochs)


# The uniform mean over clients, as PFLlib's.
BENCHMARK_ROWS = (registry.Row('scaffold', 'SCAFFOLD', _benchmark_plan, uniform_weighting=True),)
