"""Values the server keeps beside the global weights and each client keeps of its own, which correct the global
phase's every step: an algorithm's own math (`ClientPlan.shared`; e.g. SCAFFOLD's control variates,
`fedpersonal.algorithms.scaffold`), pure functions of one client's tensors that every backend calls.

Both kinds of values are shaped as the model's global trainable weights, one per tensor:

- the server's *shared* values are broadcast after the global trainable weights (the server's weights hold them
  there) and ride the model's update: each client uploads values for them, and the server moves them by its
  optimizer's step of the aggregated ``shared - uploaded``, as it moves the weights (with SGD at learning rate 1 and
  the mean over clients: the mean of the uploads);
- a client's *kept* values follow its local trainable weights in its private state (never aggregated).

In the global phase each step's gradient of a global trainable tensor gets ``SharedValues.offset(shared, kept)``
added (the backends add the linear term ``sum <w, offset>`` to the minimized batch loss, not to the reported one);
after the phase, ``SharedValues.finish`` gives the uploaded shared values and the new kept ones from the received and
the trained weights and the phase's count of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import tensorflow as tf


@runtime_checkable
class SharedValues(Protocol):
    """The server's shared and the clients' kept values (module docstring)."""

    def initial(self, weights: list[Any]) -> tuple[list[Any], list[Any]]:
        """The initial shared and kept values, from the model's initial global trainable `weights`."""

    def offset(self, shared: list[Any], kept: list[Any]) -> list[Any]:
        """What a client adds to the gradient of each global trainable tensor at every step of its global phase."""

    def finish(
        self, received: list[Any], trained: list[Any], shared: list[Any], kept: list[Any], steps: tf.Tensor
    ) -> tuple[list[Any], list[Any]]:
        """The uploaded shared values and the new kept ones, from the `received` and the `trained` global trainable
        weights and the global phase's `steps` (int32: optimizer steps)."""


def linear_term(weights: Sequence[Any], offsets: Sequence[Any]) -> tf.Tensor:
    """``sum <w, offset>``: added to a batch loss, its gradient adds `offsets` (constants) to the weights'."""
    return tf.add_n([tf.reduce_sum(w * tf.stop_gradient(o)) for w, o in zip(weights, offsets)])


def check_shapes(values: Sequence[Any], weights: Sequence[Any], what: str) -> None:
    """Raises ValueError unless `values` are shaped as the global trainable `weights`, one per tensor."""
    shapes = [tuple(tf.convert_to_tensor(v).shape) for v in values]
    expected = [tuple(tf.convert_to_tensor(w).shape) for w in weights]
    if shapes != expected:
        raise ValueError(
            f'SharedValues: the {what} values must be shaped as the global trainable weights {expected}, got {shapes}.'
        )
