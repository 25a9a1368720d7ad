"""Where a client's global phase starts, when it is not the received weights: an algorithm's own math
(`ClientPlan.global_start`; e.g. FedALA's adaptive local aggregation, `fedpersonal.algorithms.fedala`), one pure
function of one client's tensors that every backend calls.

The client keeps the model it trained last (its personal copy) and extra values of the algorithm's (`extras`, after
the copy's trainable and non-trainable weights). At the start of its round, `ClientStart.start` computes, from the
received global weights, the kept model, the extras and the client's examples, the weights its global phase starts
from and the new extras. It reads the model only through a backend's `GradientFn` (the loss and its gradient at
given weights on a batch of the examples): the per-client backend's from a model's variables
(`per_client_plan`), the engine's from its functional model, client after client inside the group's program
(`fedpersonal.simulation.plan_program`). After training, the client keeps the trained model and the new extras; it
predicts with `ClientStart.predicts_with`.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import tensorflow as tf
import tensorflow_federated as tff


class Examples(NamedTuple):
    """A client's examples as one structure of tensors (leading axis: examples), its real examples first in their
    order, and ``mask`` (float32, 1 for a real example, 0 for padding)."""

    batch: Any
    mask: tf.Tensor


# (trainable weights, non-trainable weights, batch, mask of the batch's real examples, indices of the trainable
# weights to differentiate) -> (the batch loss, its gradients with respect to those, the non-trainable weights after
# the forward pass: batch normalization's moving statistics move on, others as given)
GradientFn = Callable[[Sequence[Any], Sequence[Any], Any, tf.Tensor, Sequence[int]], tuple[Any, list[Any], list[Any]]]


class Started(NamedTuple):
    """`ClientStart.start`'s result: the start's values of the trainable tensors `ClientStart.changes` names (the
    others start at the received weights), the start's non-trainable weights, and the new extras."""

    changed: list[Any]
    non_trainable: list[Any]
    extras: tff.learning.models.ModelWeights


@runtime_checkable
class ClientStart(Protocol):
    """Where the global phase starts (module docstring)."""

    def check(self, plan: Any) -> None:
        """Raises ValueError unless `plan` (a `ClientPlan`) can start this way."""

    def changes(self, num_trainable: int) -> list[int]:
        """The indices of the model's `num_trainable` trainable tensors whose start differs from the received."""

    def extras(self, weights: tff.learning.models.ModelWeights) -> tff.learning.models.ModelWeights:
        """The extras a client keeps before its first round, from the model's initial global weights."""

    def start(
        self,
        received: list[Any],
        kept: tff.learning.models.ModelWeights,
        extras: tff.learning.models.ModelWeights,
        examples: Examples,
        gradient: GradientFn,
    ) -> Started:
        """The client's start from the `received` trainable weights, its `kept` model and `extras`."""

    def predicts_with(
        self, received: list[Any], kept: tff.learning.models.ModelWeights, extras: tff.learning.models.ModelWeights
    ) -> tff.learning.models.ModelWeights:
        """The weights the client predicts with after its rounds (its start, without learning further)."""


def split_private(
    private: Any, num_trainable: int, num_non_trainable: int
) -> tuple[tff.learning.models.ModelWeights, tff.learning.models.ModelWeights]:
    """A private state's kept model and extras: its first `num_trainable` trainable and `num_non_trainable`
    non-trainable weights, and the rest."""
    trainable, non_trainable = list(private.trainable), list(private.non_trainable)
    return (
        tff.learning.models.ModelWeights(trainable[:num_trainable], non_trainable[:num_non_trainable]),
        tff.learning.models.ModelWeights(trainable[num_trainable:], non_trainable[num_non_trainable:]),
    )
