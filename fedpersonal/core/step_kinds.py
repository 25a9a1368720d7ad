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

The per-client backend (`client_plan.build_client_update`) runs a step kind through `meta_batch_loss`: a batch loss
whose gradient with respect to the trained variables is the step's direction, so `client_work.optimizer_steps`, the
loop of every phase, applies it with the phase's optimizer unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work


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


def step_batch_loss(
    phase: Any,
    model: tff.learning.models.ReconstructionModel,
    trained: Sequence[tf.Variable],
    other: tff.learning.models.ReconstructionModel,
    loss: tf.keras.losses.Loss,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of `phase`'s step kind on `trained` (its variables of `model`, by `phase.trains`): `other` is
    the plan's personal copy (`InnerProblem`: theta, set here to the received weights) or a scratch instance of the
    model (`MetaStep`)."""
    if isinstance(phase.step, InnerProblem):
        client_work.assign_weights(client_work.global_weights(other), client_work.global_weights(model))
        return inner_problem_batch_loss(phase.step, trained, other, loss, metrics)
    scratch_parts = {'global': other.global_trainable_variables, 'local': other.local_trainable_variables}
    scratch_trained = [v for part in phase.trains for v in scratch_parts[part]]
    return meta_batch_loss(phase.step, model, trained, other, scratch_trained, loss, metrics)


def inner_problem_batch_loss(
    step: InnerProblem,
    trained: Sequence[tf.Variable],
    personal: tff.learning.models.ReconstructionModel,
    loss: tf.keras.losses.Loss,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of `step` for `client_work.optimizer_steps` on `trained` (w): its value is theta's loss
    before its steps (the metrics see its predictions there), its gradient ``lam * (w - theta)`` after them. theta is
    `personal`'s global trainable variables (matching `trained`), carried from batch to batch."""
    theta = list(personal.global_trainable_variables)

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def inner(*values):
            def theta_step():
                with tf.GradientTape() as tape:
                    output = personal.forward_pass(batch, training=True)
                    value = loss(output.labels, output.predictions)
                g = tape.gradient(value, theta)
                pull = [gi + step.lam * (t - w) + step.mu * t for gi, t, w in zip(g, theta, values)]
                client_work.assign(theta, [t - step.learning_rate * d for t, d in zip(theta, pull)])
                return output, value

            output, first = theta_step()  # Unrolled: the metrics see theta's first predictions.
            for metric in metrics:
                metric.update_state(output.labels, output.predictions)

            def body(k):
                with tf.control_dependencies([theta_step()[1]]):
                    return k + 1

            with tf.control_dependencies([first]):
                done = tf.while_loop(lambda k: k < step.steps, body, [tf.constant(1)])
            with tf.control_dependencies([done]):
                direction = [step.lam * (w - t.read_value()) for w, t in zip(values, theta)]

            def grad(upstream, variables=None):
                return [upstream * d for d in direction], [None] * len(variables or [])

            return first, grad

        value = inner(*[v.read_value() for v in trained])
        return client_work.BatchLoss(value, tf.shape(tf.nest.flatten(batch)[0])[0])

    return batch_loss


def batch_part(batch: Any, index: int, parts: int) -> Any:
    """The `index`-th of `parts` consecutive parts of `batch` (each ``ceil(n / parts)`` examples, the last the rest)."""
    n = tf.shape(tf.nest.flatten(batch)[0])[0]
    size = (n + parts - 1) // parts
    start, end = tf.minimum(index * size, n), tf.minimum((index + 1) * size, n)
    return tf.nest.map_structure(lambda t: t[start:end], batch)


def meta_batch_loss(
    step: MetaStep,
    model: tff.learning.models.ReconstructionModel,
    trained: Sequence[tf.Variable],
    scratch: tff.learning.models.ReconstructionModel,
    scratch_trained: Sequence[tf.Variable],
    loss: tf.keras.losses.Loss,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of `step` for `client_work.optimizer_steps` on `trained` (variables of `model`): its value is
    the second part's loss at the trial weights (the metrics see that part's predictions there), its gradient the
    step's direction. `scratch` is a second instance of the model (`scratch_trained` its variables matching
    `trained`) where the trial weights are evaluated; `model` itself is not changed."""
    everything, scratch_everything = _all_variables(model), _all_variables(scratch)
    a = step.inner_learning_rate

    def part_loss(batch: Any) -> tf.Tensor:
        output = scratch.forward_pass(batch, training=True)
        return loss(output.labels, output.predictions), output

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def meta(*values):
            client_work.assign(scratch_everything, everything)
            client_work.assign(scratch_trained, values)
            with tf.GradientTape() as tape:
                first, _ = part_loss(batch_part(batch, 0, step.parts))
            g1 = tape.gradient(first, scratch_trained)
            client_work.assign(scratch_trained, [v - a * g for v, g in zip(values, g1)])
            with tf.GradientTape() as tape:
                second, output = part_loss(batch_part(batch, 1, step.parts))
            direction = tape.gradient(second, scratch_trained)
            for metric in metrics:
                metric.update_state(output.labels, output.predictions)
            if step.hessian_free:
                client_work.assign(scratch_trained, values)
                fixed = [tf.stop_gradient(d) for d in direction]
                with tf.GradientTape() as outer:
                    with tf.GradientTape() as inner:
                        third, _ = part_loss(batch_part(batch, 2, step.parts))
                    g3 = inner.gradient(third, scratch_trained)
                    product = tf.add_n([tf.reduce_sum(g * d) for g, d in zip(g3, fixed)])
                hessian_vector = outer.gradient(product, scratch_trained)
                direction = [d - a * h for d, h in zip(direction, hessian_vector)]

            def grad(upstream, variables=None):
                return [upstream * d for d in direction], [None] * len(variables or [])

            return second, grad

        value = meta(*[v.read_value() for v in trained])
        return client_work.BatchLoss(value, tf.shape(tf.nest.flatten(batch)[0])[0])

    return batch_loss


def _all_variables(model: tff.learning.models.ReconstructionModel) -> list[tf.Variable]:
    parts = ('global_trainable', 'global_non_trainable', 'local_trainable', 'local_non_trainable')
    return [v for part in parts for v in getattr(model, f'{part}_variables')]
