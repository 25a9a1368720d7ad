"""Step kinds of a `fedpersonal.core.client_plan.Phase`: what one batch's step computes, where it is not the plain
gradient of the batch loss: an algorithm's own math, which every backend calls.

A step kind (`StepKind`) is an object an algorithm module defines (Per-FedAvg's meta step in
`fedpersonal.algorithms.per_fedavg`, pFedMe's inner problem in `fedpersonal.algorithms.pfedme`). Its `direction` is
a pure function of weight tensors, the batch's parts (`StepKind.parts` consecutive parts, as equal in size as can
be: `part_bounds`) and, optionally, values it carries from batch to batch (the plan's personal copy, e.g. pFedMe's
theta, starting each round at the received weights). It evaluates the model only through a `Derivatives` pair (the
loss's gradient at given weights on a part, and a Hessian-vector product), which each backend supplies: the
per-client backend (`per_client_plan.build_client_update`) from a model's variables (`variable_derivatives`),
wrapped by `step_batch_loss` in a batch loss whose gradient with respect to the trained variables is the step's
direction (so `client_work.optimizer_steps`, the loop of every phase, applies it with the phase's optimizer
unchanged); the grouped engine (`fedpersonal.simulation.step_kind_engine`) from the model as a pure function of its
weights (`pure_derivatives`), for every client of a group at once. The loss differentiated is the model's loss plus
its Keras regularization losses; the loss reported (and seen by the metrics) is the one the step returns.
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

from fedpersonal.core import client_work
from fedpersonal.models import partially_local_model

Weights = Sequence[tf.Tensor]
RECEIVED, KEPT = 'received', 'kept'  # `StepKind.carried_start`.
# (weights, part) -> (loss, gradient of the loss plus regularization, model output)
GradientFn = Callable[[Weights, Any], tuple[tf.Tensor, list[tf.Tensor], Any]]
# (weights, part, vector) -> the Hessian of the loss (plus regularization) at the weights, times the vector
HessianVectorFn = Callable[[Weights, Any, Weights], list[tf.Tensor]]


class Derivatives(NamedTuple):
    """How a step kind evaluates the model: a backend's `GradientFn` and `HessianVectorFn`."""

    gradient: GradientFn
    hessian_vector: HessianVectorFn | None = None


class Step(NamedTuple):
    """One batch's step (`StepKind.direction`): the loss reported, the model output the metrics see (labels and
    predictions, or the model's output structure), the carried values after the step, and the direction the
    phase's optimizer applies to the trained weights."""

    loss: tf.Tensor
    output: Any
    carried: list[tf.Tensor]
    direction: list[tf.Tensor]


@runtime_checkable
class StepKind(Protocol):
    """What a batch's step computes (module docstring).

    Attributes:
      parts: Consecutive parts a batch is cut into (`part_bounds`); 1: the whole batch.
      output_part: The part whose model output `direction` returns (the examples the metrics count).
      carries_personal: Whether the step carries values from batch to batch: the plan's personal copy (its
        trainable weights, then its `client_plan.Personalization`'s extras, if any), kept as the client's personal
        copy.
      carried_start: Where the carried values start each round: `RECEIVED` (the received weights; pFedMe's theta)
        or `KEPT` (the client's kept personal copy and extras).
    """

    @property
    def parts(self) -> int: ...

    @property
    def output_part(self) -> int: ...

    @property
    def carries_personal(self) -> bool: ...

    @property
    def carried_start(self) -> str: ...

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless a phase that trains `trains` can take this step."""

    def direction(self, weights: Weights, carried: Weights, parts: Sequence[Any], derivatives: Derivatives) -> Step:
        """The step at the trained `weights` on a batch's `parts`, with the `carried` values (empty unless
        `carries_personal`)."""


def part_bounds(n: Any, index: int, parts: int) -> tuple[Any, Any]:
    """``(start, end)`` of the `index`-th of `parts` consecutive parts of a batch of `n` examples: sizes as equal as
    can be, the first ``n % parts`` parts one example longer (none empty if ``n >= parts``).

    >>> [tuple(int(i) for i in part_bounds(tf.constant(7), k, 3)) for k in range(3)]
    [(0, 3), (3, 5), (5, 7)]
    """
    size, longer = n // parts, n % parts
    start = index * size + tf.minimum(index, longer)
    return start, start + size + tf.cast(index < longer, size.dtype)


def batch_part(batch: Any, index: int, parts: int) -> Any:
    """The `index`-th of `parts` consecutive parts of `batch` (`part_bounds`)."""
    start, end = part_bounds(tf.shape(tf.nest.flatten(batch)[0])[0], index, parts)
    return tf.nest.map_structure(lambda t: t[start:end], batch)


def pure_derivatives(loss_at: Callable[[Weights, Any], tuple[tf.Tensor, tf.Tensor, Any]]) -> Derivatives:
    """`Derivatives` of a pure function ``loss_at(weights, part) -> (loss, regularization, output)`` of weight
    tensors (e.g. a functional model's), by gradient tapes on the tensors."""

    def gradient(weights: Weights, part: Any) -> tuple[tf.Tensor, list[tf.Tensor], Any]:
        weights = list(weights)
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss, regularization, output = loss_at(weights, part)
            total = loss + regularization
        return loss, _dense(tape.gradient(total, weights, unconnected_gradients=_ZERO)), output

    def hessian_vector(weights: Weights, part: Any, vector: Weights) -> list[tf.Tensor]:
        weights = list(weights)
        with tf.GradientTape() as outer:
            outer.watch(weights)
            _, g, _ = gradient(weights, part)
            product = tf.add_n([tf.reduce_sum(gi * v) for gi, v in zip(g, vector)])
        return _dense(outer.gradient(product, weights, unconnected_gradients=_ZERO))

    return Derivatives(gradient, hessian_vector)


def variable_derivatives(
    model: tff.learning.models.ReconstructionModel, variables: Sequence[tf.Variable], loss: tf.keras.losses.Loss
) -> Derivatives:
    """`Derivatives` of `model`'s loss (plus its regularization) with respect to its `variables`: the weights are
    assigned to them (they keep the last weights evaluated), the model's other variables are read as they are."""
    variables = list(variables)
    regularized = bool(getattr(partially_local_model.keras_model_of(model), 'losses', None))

    def evaluate(weights: Weights, part: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
        client_work.assign(variables, weights)
        output = model.forward_pass(part, training=True)
        value = loss(output.labels, output.predictions)
        return value, (client_work.regularization_loss(model) if regularized else tf.constant(0.0)), output

    def gradient(weights: Weights, part: Any) -> tuple[tf.Tensor, list[tf.Tensor], Any]:
        with tf.GradientTape() as tape:
            value, regularization, output = evaluate(weights, part)
            total = value + regularization
        return value, _dense(tape.gradient(total, variables, unconnected_gradients=_ZERO)), output

    def hessian_vector(weights: Weights, part: Any, vector: Weights) -> list[tf.Tensor]:
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                value, regularization, _ = evaluate(weights, part)
                total = value + regularization
            g = inner.gradient(total, variables, unconnected_gradients=_ZERO)
            product = tf.add_n([tf.reduce_sum(gi * v) for gi, v in zip(_dense(g), vector)])
        return _dense(outer.gradient(product, variables, unconnected_gradients=_ZERO))

    return Derivatives(gradient, hessian_vector)


_ZERO = tf.UnconnectedGradients.ZERO


def _dense(gradients: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.convert_to_tensor(g) for g in gradients]


def step_batch_loss(
    phase: Any,
    model: tff.learning.models.ReconstructionModel,
    trained: Sequence[tf.Variable],
    other: tff.learning.models.ReconstructionModel,
    loss: tf.keras.losses.Loss,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
    extras: Sequence[tf.Variable] = (),
) -> Callable[[Any], client_work.BatchLoss]:
    """The per-client backend's batch loss of `phase`'s step kind for `client_work.optimizer_steps` on `trained`
    (its variables of `model`, by `phase.trains`): its value is the step's loss (the metrics see the step's model
    output), its gradient the step's direction. `other` is the plan's personal copy (a step that carries it, with
    the personalization's `extras` after its weights: set here to the received weights unless the step starts from
    the kept ones, and carried from batch to batch) or a scratch instance of the model (where other weights are
    evaluated; `model` itself is not changed)."""
    step: StepKind = phase.step
    if step.carries_personal:
        if step.carried_start == RECEIVED:
            client_work.assign_weights(client_work.global_weights(other), client_work.global_weights(model))
        theta = list(other.global_trainable_variables)
        carried = theta + list(extras)
        derivatives = variable_derivatives(other, theta, loss)
    else:
        carried = []
        scratch_parts = {'global': other.global_trainable_variables, 'local': other.local_trainable_variables}
        derivatives = variable_derivatives(other, [v for part in phase.trains for v in scratch_parts[part]], loss)
        everything, scratch_everything = _all_variables(model), _all_variables(other)

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def stepped(*values):
            if not step.carries_personal:
                client_work.assign(scratch_everything, everything)
            parts = [batch] if step.parts == 1 else [batch_part(batch, k, step.parts) for k in range(step.parts)]
            result = step.direction(values, [t.read_value() for t in carried], parts, derivatives)
            client_work.assign(carried, result.carried)
            for metric in metrics:
                metric.update_state(result.output.labels, result.output.predictions)

            def grad(upstream, variables=None):
                return [upstream * d for d in result.direction], [None] * len(variables or [])

            return result.loss, grad

        value = stepped(*[v.read_value() for v in trained])
        return client_work.BatchLoss(value, tf.shape(tf.nest.flatten(batch)[0])[0])

    return batch_loss


def _all_variables(model: tff.learning.models.ReconstructionModel) -> list[tf.Variable]:
    parts = ('global_trainable', 'global_non_trainable', 'local_trainable', 'local_non_trainable')
    return [v for part in parts for v in getattr(model, f'{part}_variables')]
