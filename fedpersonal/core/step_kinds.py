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

`AdaptiveLocalAggregation` is FedALA's (Zhang et al., AAAI 2023), a start of the plan's global phase rather than a
step: the client keeps the model it trained last (its personal copy v) and element-wise weights W in [0, 1] for the
last `layer_idx` trainable tensors; a round starts from the received weights w on the lower tensors and from
``v + (w - v) * W`` on those, after W has learned, by projected SGD of learning rate `eta` on a random contiguous
`rand_percent`% of the client's examples, to lower the loss of that start (`aggregate_locally`).

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


@dataclasses.dataclass(frozen=True)
class AdaptiveLocalAggregation:
    """FedALA's adaptive local aggregation (module docstring; PFLlib's ``system/utils/ALA.py``, its defaults).

    Attributes:
      layer_idx: How many trainable tensors, counted from the model's last, are aggregated element-wise (PFLlib's
        ``layer_idx``: 2, the head's kernel and bias); 0: all. The others take the received weights.
      eta: W's learning rate.
      rand_percent: The share (%) of the client's examples W learns on: a contiguous slice from a random start.
      batch_size: The batch size W learns with (PFLlib: the client's).
      threshold: The first time a client aggregates, W learns until the standard deviation of the last
        `num_pre_loss` epochs' last batch losses is below `threshold` (after more than `num_pre_loss` epochs);
        later, one epoch.
      num_pre_loss: See `threshold`.
      max_epochs: The most epochs of that first learning (PFLlib has no limit).
      seed: Seeds the slice's start, with the client's count of aggregations (clients that have aggregated as
        often and hold as many examples start their slices at the same example).
    """

    layer_idx: int = 2
    eta: float = 1.0
    rand_percent: int = 80
    batch_size: int = 10
    threshold: float = 0.1
    num_pre_loss: int = 10
    max_epochs: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.layer_idx < 0 or not self.eta > 0 or not 0 < self.rand_percent <= 100 or self.batch_size < 1:
            raise ValueError(
                f'AdaptiveLocalAggregation needs layer_idx >= 0, eta > 0, rand_percent in (0, 100] and '
                f'batch_size >= 1, got {self}.'
            )
        if self.threshold < 0 or self.num_pre_loss < 1 or self.max_epochs <= self.num_pre_loss:
            raise ValueError(
                f'AdaptiveLocalAggregation needs threshold >= 0, num_pre_loss >= 1 and max_epochs > '
                f'num_pre_loss, got {self}.'
            )

    def check(self, plan: Any) -> None:
        """Raises ValueError unless `plan` keeps a personal copy and its one phase trains the global weights."""
        phases = plan.phases
        if not plan.personal_copy or plan.initial_alpha is not None or plan.split is not None:
            raise ValueError('Adaptive local aggregation needs personal_copy=True, no initial_alpha and no split.')
        if len(phases) != 1 or phases[0].trains != ('global',) or phases[0].step is not None or phases[0].data:
            raise ValueError(
                f'Adaptive local aggregation starts one phase that trains the global weights, got {phases}.'
            )

    def count(self, num_trainable: int) -> int:
        """How many of `num_trainable` trainable tensors are aggregated element-wise."""
        if self.layer_idx > num_trainable:
            raise ValueError(f"layer_idx {self.layer_idx} exceeds the model's {num_trainable} trainable tensors.")
        return self.layer_idx or num_trainable


def aggregate_locally(
    ala: AdaptiveLocalAggregation,
    model: tff.learning.models.ReconstructionModel,
    private: Any,
    received: Any,
    dataset: tf.data.Dataset,
    loss: tf.keras.losses.Loss,
    mixing: Sequence[tf.Variable],
    aggregations: tf.Variable,
) -> None:
    """FedALA's start (module docstring), in a client's `tf.function`: `model`'s global weights, holding `received`,
    become the start; `mixing` (W) and `aggregations` (the client's count of aggregations) are set from `private`
    (the personal copy's trainable weights then W, its non-trainable ones then the count) and learned. As PFLlib, a
    client whose copy equals the received weights (before its first round) starts from them, W unchanged."""
    k = len(mixing)
    upper = list(model.global_trainable_variables)[-k:]
    own = list(private.trainable)[:-k]
    v, w = own[-k:], list(received.trainable)[-k:]
    client_work.assign(mixing, list(private.trainable)[-k:])
    aggregations.assign(private.non_trainable[-1])
    client_work.assign(model.global_non_trainable_variables, list(private.non_trainable)[:-1])
    batch_loss = client_work.model_batch_loss(model, loss)

    def step(last: tf.Tensor, batch: Any) -> tf.Tensor:
        with tf.GradientTape() as tape:
            value = batch_loss(batch).loss
        grads = tape.gradient(value, upper)  # At the start; W's gradient is it times (w - v).
        weights = [tf.clip_by_value(m - ala.eta * g * (wi - vi), 0.0, 1.0) for m, g, wi, vi in zip(mixing, grads, w, v)]
        client_work.assign(mixing, weights)
        client_work.assign(upper, [vi + (wi - vi) * m for vi, wi, m in zip(v, w, weights)])
        return value

    def learn() -> tf.Tensor:
        examples = dataset.unbatch()
        n = examples.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1)
        size = n * ala.rand_percent // 100
        seed = tf.stack([tf.constant(ala.seed, tf.int64), tf.cast(aggregations, tf.int64)])
        start = tf.random.stateless_uniform([], seed, 0, n - size + 1, dtype=tf.int64)
        subset = examples.skip(start).take(size).batch(ala.batch_size)
        client_work.assign(upper, [vi + (wi - vi) * m for vi, wi, m in zip(v, w, mixing)])
        first = tf.equal(aggregations, 0)

        def epoch(i, losses, done):
            last = subset.reduce(tf.constant(0.0), step)
            losses = tf.tensor_scatter_nd_update(losses, [[i]], [last])
            window = tf.slice(losses, [tf.maximum(i + 1 - ala.num_pre_loss, 0)], [ala.num_pre_loss])
            settled = tf.logical_and(i + 1 > ala.num_pre_loss, tf.math.reduce_std(window) < ala.threshold)
            return i + 1, losses, tf.logical_or(tf.logical_not(first), settled)

        i, _, _ = tf.while_loop(
            lambda i, _, done: tf.logical_and(tf.logical_not(done), i < ala.max_epochs),
            epoch,
            (tf.constant(0), tf.zeros([ala.max_epochs]), tf.constant(False)),
        )
        with tf.control_dependencies([i]):
            return aggregations.assign_add(1)

    differs = tf.reduce_any(tf.not_equal(own[0], received.trainable[0]))  # PFLlib: sum(w[0] - v[0]) != 0.
    tf.cond(differs, learn, lambda: tf.identity(aggregations))


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
