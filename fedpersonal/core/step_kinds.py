"""Step kinds of a `fedpersonal.core.client_plan.Phase`: what one batch's step computes, where it is not the plain
gradient of the batch loss.

`MetaStep` is Per-FedAvg's (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020): a batch is cut into two consecutive parts
(three, Hessian-free), the weights take a trial step of `inner_learning_rate` on the first part, and the phase's
optimizer steps the weights from where they were with the gradient of the second part's loss at the trial weights
(first-order, as PFLlib), or that gradient ``g`` less ``inner_learning_rate * H g`` with H the Hessian of the third
part's loss at the weights (the paper's Hessian-free variant, a Hessian-vector product).

`InnerProblem` is pFedMe's (T. Dinh, Tran and Nguyen, NeurIPS 2020): on each batch the client's personalized
weights theta (the plan's personal copy, starting each round at the received weights) take `steps` gradient steps of
``f(theta) + lam / 2 * ||theta - w||^2 (+ mu / 2 * ||theta||^2)`` around the current local weights w, and w steps
with the direction ``lam * (w - theta)`` (PFLlib's ``clientpFedMe.py``: w <- w - lr * lam * (w - theta) by SGD).

Each step's math is stated once, here, as a pure function of weight tensors and a batch's parts: `meta_direction`
and `inner_problem`. They evaluate the model only through a `Derivatives` pair (the loss's gradient at given weights
on a part, and for the Hessian-free step a Hessian-vector product), which each backend supplies: the per-client
backend (`client_plan.build_client_update`) from a model's variables (`variable_derivatives`), wrapped by
`step_batch_loss` in a batch loss whose gradient with respect to the trained variables is the step's direction (so
`client_work.optimizer_steps`, the loop of every phase, applies it with the phase's optimizer unchanged); the grouped
engine (`fedpersonal.simulation.step_kind_engine`) from the model as a pure function of its weights
(`pure_derivatives`), for every client of a group at once. The parts of a batch are consecutive and as equal in size
as can be (`part_bounds`). The loss differentiated is the model's loss plus its Keras
regularization losses; the loss reported (and seen by the metrics) is the model's loss alone, as for a plain step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.models import partially_local_model


@dataclasses.dataclass(frozen=True)
class MetaStep:
    """Per-FedAvg's step (module docstring): a trial step of `inner_learning_rate` on a batch's first part, the
    gradient of its second part there; with `hessian_free`, corrected by the Hessian-vector product on a third part.
    """

    inner_learning_rate: float
    hessian_free: bool = False

    def __post_init__(self):
        if not self.inner_learning_rate > 0:
            raise ValueError(f'MetaStep.inner_learning_rate must be > 0, got {self.inner_learning_rate!r}.')

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless a phase that trains `trains` can take this step."""
        if 'personal' in trains:
            raise ValueError(f'A MetaStep trains the model (global or local), not the personal copy, got {trains!r}.')

    @property
    def parts(self) -> int:
        """How many consecutive parts a batch is cut into."""
        return 3 if self.hessian_free else 2


@dataclasses.dataclass(frozen=True)
class InnerProblem:
    """pFedMe's step (module docstring): `steps` steps of `learning_rate` on theta's inner problem, then w's step."""

    steps: int
    learning_rate: float
    lam: float
    mu: float = 0.0

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 1 or not self.learning_rate > 0 or self.lam < 0:
            raise ValueError(f'InnerProblem needs steps >= 1, learning_rate > 0 and lam >= 0, got {self}.')

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless the phase trains the global weights only (theta is the personal copy)."""
        if trains != ('global',):
            raise ValueError(f"pFedMe's inner problem is a step of the global weights only, got {trains!r}.")


Weights = Sequence[tf.Tensor]
# (weights, part) -> (loss, gradient of the loss plus regularization, model output)
GradientFn = Callable[[Weights, Any], tuple[tf.Tensor, list[tf.Tensor], Any]]
# (weights, part, vector) -> the Hessian of the loss (plus regularization) at the weights, times the vector
HessianVectorFn = Callable[[Weights, Any, Weights], list[tf.Tensor]]


class Derivatives(NamedTuple):
    """How a step kind evaluates the model: a backend's `GradientFn` and, for the Hessian-free step, its
    `HessianVectorFn`."""

    gradient: GradientFn
    hessian_vector: HessianVectorFn | None = None


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


def meta_direction(
    step: MetaStep, weights: Weights, parts: Sequence[Any], derivatives: Derivatives
) -> tuple[tf.Tensor, Any, list[tf.Tensor]]:
    """Per-FedAvg's step at `weights` on a batch's `parts` (`step.parts` of them): ``(loss, output, direction)``,
    the second part's loss and model output at the trial weights ``weights - a * grad f(weights; part 0)`` and the
    direction the outer optimizer applies: the gradient of that loss there, less ``a * H(weights; part 2)`` times it
    if Hessian-free."""
    a = step.inner_learning_rate
    _, first, _ = derivatives.gradient(weights, parts[0])
    trial = [w - a * g for w, g in zip(weights, first)]
    loss, direction, output = derivatives.gradient(trial, parts[1])
    if step.hessian_free:
        if derivatives.hessian_vector is None:
            raise ValueError('The Hessian-free MetaStep needs Derivatives.hessian_vector.')
        product = derivatives.hessian_vector(weights, parts[2], [tf.stop_gradient(d) for d in direction])
        direction = [d - a * h for d, h in zip(direction, product)]
    return loss, output, direction


def inner_problem(
    step: InnerProblem, weights: Weights, theta: Weights, batch: Any, derivatives: Derivatives
) -> tuple[tf.Tensor, Any, list[tf.Tensor], list[tf.Tensor]]:
    """pFedMe's step on `batch`: theta's `step.steps` steps on ``f(theta) + lam / 2 ||theta - w||^2 + mu / 2
    ||theta||^2`` around the local weights w (`weights`), then w's direction. Returns ``(loss, output, theta,
    direction)``: theta's loss and model output before its steps, theta after them, and ``lam * (w - theta)``."""

    def theta_step(values: Weights) -> tuple[list[tf.Tensor], tf.Tensor, Any]:
        loss, gradient, output = derivatives.gradient(values, batch)
        pull = [g + step.lam * (t - w) + step.mu * t for g, t, w in zip(gradient, values, weights)]
        return [t - step.learning_rate * d for t, d in zip(values, pull)], loss, output

    theta, loss, output = theta_step(theta)  # Unrolled: the metrics see theta's first predictions.
    if step.steps <= _UNROLLED_STEPS:
        for _ in range(step.steps - 1):
            theta = theta_step(theta)[0]
    else:
        _, theta = tf.while_loop(
            lambda k, _: k < step.steps, lambda k, values: (k + 1, theta_step(values)[0]), (tf.constant(1), theta)
        )
    direction = [step.lam * (w - t) for w, t in zip(weights, theta)]
    return loss, output, list(theta), direction


# Up to this many inner steps run unrolled (the engine ran them faster than a `tf.while_loop`, vectorized over
# clients); more steps loop, keeping the program small.
_UNROLLED_STEPS = 10


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
) -> Callable[[Any], client_work.BatchLoss]:
    """The per-client backend's batch loss of `phase`'s step kind for `client_work.optimizer_steps` on `trained`
    (its variables of `model`, by `phase.trains`): its value is the step's loss (the metrics see the step's model
    output), its gradient the step's direction. `other` is the plan's personal copy (`InnerProblem`: theta, set
    here to the received weights and carried from batch to batch) or a scratch instance of the model (`MetaStep`:
    where the trial weights are evaluated; `model` itself is not changed)."""
    step = phase.step
    if isinstance(step, InnerProblem):
        client_work.assign_weights(client_work.global_weights(other), client_work.global_weights(model))
        theta = list(other.global_trainable_variables)
        derivatives = variable_derivatives(other, theta, loss)
    else:
        scratch_parts = {'global': other.global_trainable_variables, 'local': other.local_trainable_variables}
        derivatives = variable_derivatives(other, [v for part in phase.trains for v in scratch_parts[part]], loss)
        everything, scratch_everything = _all_variables(model), _all_variables(other)

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def stepped(*values):
            if isinstance(step, InnerProblem):
                value, output, new_theta, direction = inner_problem(
                    step, values, [t.read_value() for t in theta], batch, derivatives
                )
                client_work.assign(theta, new_theta)
            else:
                client_work.assign(scratch_everything, everything)
                parts = [batch_part(batch, k, step.parts) for k in range(step.parts)]
                value, output, direction = meta_direction(step, values, parts, derivatives)
            for metric in metrics:
                metric.update_state(output.labels, output.predictions)

            def grad(upstream, variables=None):
                return [upstream * d for d in direction], [None] * len(variables or [])

            return value, grad

        value = stepped(*[v.read_value() for v in trained])
        return client_work.BatchLoss(value, tf.shape(tf.nest.flatten(batch)[0])[0])

    return batch_loss


def _all_variables(model: tff.learning.models.ReconstructionModel) -> list[tf.Variable]:
    parts = ('global_trainable', 'global_non_trainable', 'local_trainable', 'local_non_trainable')
    return [v for part in parts for v in getattr(model, f'{part}_variables')]
