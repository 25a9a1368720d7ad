"""A term of the global phase's batch loss read from the model's representation of the batch at three sets of
weights: the ones training, the received global weights and weights the client keeps (`ClientPlan.reference`;
e.g. MOON's model-contrastive loss against the global and the client's previous model,
`fedpersonal.algorithms.moon`): an algorithm's own math, pure functions of one client's tensors that every backend
calls.

The kept weights are shaped as the model's global trainable weights and follow its local trainable weights in the
client's private state (never aggregated). At every step of the global phase the backends add to the minimized
batch loss (not to the reported one) the mean over the batch's real examples of
``ReferenceTerm.per_example(represent(trained), represent(received), represent(kept))``, the last two constants;
after the phase, ``ReferenceTerm.finish`` gives the new kept weights from the trained ones. ``represent`` runs on
the Keras model at those weights, so the model's weights must all be global and trainable.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol
from typing import runtime_checkable

import tensorflow as tf


@runtime_checkable
class ReferenceTerm(Protocol):
    """The representation term and the client's kept weights (module docstring)."""

    def initial(self, weights: list[Any]) -> list[Any]:
        """The kept weights at first, from the model's initial global trainable `weights`."""

    def represent(self, model: tf.keras.Model, x: Any) -> tf.Tensor:
        """The representation ``[batch, ...]`` of the inputs `x` by the Keras `model` (at the weights it holds)."""

    def per_example(self, features: tf.Tensor, received: tf.Tensor, kept: tf.Tensor) -> tf.Tensor:
        """Each example's term ``[batch]`` from its representations at the trained, the received and the kept
        weights."""

    def finish(self, trained: list[Any], kept: list[Any]) -> list[Any]:
        """The new kept weights after the global phase, from the `trained` global trainable weights."""


def batch_mean(values: tf.Tensor, mask: Any = None) -> tf.Tensor:
    """The mean of the per-example `values` over the real examples (`mask` 1; None: all of them)."""
    if mask is None:
        return tf.reduce_mean(values)
    mask = tf.cast(mask, values.dtype)
    return tf.math.divide_no_nan(tf.reduce_sum(values * mask), tf.reduce_sum(mask))
