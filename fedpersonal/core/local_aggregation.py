"""FedALA's adaptive local aggregation (Zhang et al., AAAI 2023): where a plan's global phase starts
(`fedpersonal.core.client_plan.ClientPlan.local_aggregation`).

The client keeps the model it trained last (the plan's personal copy v) and element-wise weights W in [0, 1] for the
last `layer_idx` trainable tensors; a round starts from the received weights w on the lower tensors and from
``v + (w - v) * W`` on those, after W has learned, by projected SGD of learning rate `eta` on a random contiguous
`rand_percent`% of the client's examples, to lower the loss of that start. The rules (`slice_bounds`, `mix`,
`mixing_step`, `settled`, `learns`) are defined here once; the per-client backend's loop over the client's dataset is
`aggregate_locally`, the engine's over its packed examples `fedpersonal.simulation.ala_engine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work


@dataclasses.dataclass(frozen=True)
class AdaptiveLocalAggregation:
    """FedALA's adaptive local aggregation (the module docstring; PFLlib's ``system/utils/ALA.py``, its defaults).

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
        if not plan.personal_copy or plan.personalization is not None or plan.split is not None:
            raise ValueError('Adaptive local aggregation needs personal_copy=True, no personalization and no split.')
        if len(phases) != 1 or phases[0].trains != ('global',) or phases[0].step is not None or phases[0].data:
            raise ValueError(
                f'Adaptive local aggregation starts one phase that trains the global weights, got {phases}.'
            )

    def count(self, num_trainable: int) -> int:
        """How many of `num_trainable` trainable tensors are aggregated element-wise."""
        if self.layer_idx > num_trainable:
            raise ValueError(f"layer_idx {self.layer_idx} exceeds the model's {num_trainable} trainable tensors.")
        return self.layer_idx or num_trainable


def slice_bounds(ala: AdaptiveLocalAggregation, num_examples: tf.Tensor, aggregations: tf.Tensor):
    """``(start, size)`` (int64) of the contiguous slice of a client's `num_examples` examples that W learns on, drawn
    from the seed and the client's count of aggregations."""
    n = tf.cast(num_examples, tf.int64)
    size = n * ala.rand_percent // 100
    seed = tf.stack([tf.constant(ala.seed, tf.int64), tf.cast(aggregations, tf.int64)])
    return tf.random.stateless_uniform([], seed, 0, n - size + 1, dtype=tf.int64), size


def mix(own: Sequence[Any], received: Sequence[Any], mixing: Sequence[Any]) -> list[tf.Tensor]:
    """The aggregated tensors ``v + (w - v) * W`` of the client's own `v` and the received `w`."""
    return [v + (w - v) * m for v, w, m in zip(own, received, mixing)]


def mixing_step(
    ala: AdaptiveLocalAggregation, mixing: Sequence[Any], gradients: Sequence[Any], own: Sequence[Any], received
) -> list[tf.Tensor]:
    """W after one projected SGD step, from the loss's `gradients` at the aggregated tensors (W's gradient is
    theirs times ``w - v``)."""
    return [
        tf.clip_by_value(m - ala.eta * g * (w - v), 0.0, 1.0) for m, g, w, v in zip(mixing, gradients, received, own)
    ]


def settled(ala: AdaptiveLocalAggregation, losses: tf.Tensor, epoch: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
    """Whether W's learning stops after `epoch` (from 0) with the epochs' last batch losses `losses`
    (``[max_epochs]``): after one epoch unless it is the client's `first` aggregation; then once the standard
    deviation of the last `num_pre_loss` losses is below the threshold (the caller stops at `max_epochs`)."""
    window = tf.slice(losses, [tf.maximum(epoch + 1 - ala.num_pre_loss, 0)], [ala.num_pre_loss])
    calm = tf.logical_and(epoch + 1 > ala.num_pre_loss, tf.math.reduce_std(window) < ala.threshold)
    return tf.logical_or(tf.logical_not(first), calm)


def learns(own: Sequence[Any], received: Sequence[Any]) -> tf.Tensor:
    """Whether a client aggregates: as PFLlib (``sum(w[0] - v[0]) != 0``), not while its copy equals the received
    weights (before its first round; it then starts from them, W unchanged)."""
    return tf.reduce_any(tf.not_equal(own[0], received[0]))


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
    """FedALA's start (module docstring), in a client's `tf.function` (the per-client backend): `model`'s global
    weights, holding `received`, become the start; `mixing` (W) and `aggregations` (the client's count of
    aggregations) are set from `private` (the personal copy's trainable weights then W, its non-trainable ones then
    the count) and learned."""
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
        weights = mixing_step(ala, mixing, tape.gradient(value, upper), v, w)
        client_work.assign(mixing, weights)
        client_work.assign(upper, mix(v, w, weights))
        return value

    def learn() -> tf.Tensor:
        examples = dataset.unbatch()
        start, size = slice_bounds(ala, examples.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1), aggregations)
        subset = examples.skip(start).take(size).batch(ala.batch_size)
        client_work.assign(upper, mix(v, w, mixing))
        first = tf.equal(aggregations, 0)

        def epoch(i, losses, done):
            losses = tf.tensor_scatter_nd_update(losses, [[i]], [subset.reduce(tf.constant(0.0), step)])
            return i + 1, losses, settled(ala, losses, i, first)

        i, _, _ = tf.while_loop(
            lambda i, _, done: tf.logical_and(tf.logical_not(done), i < ala.max_epochs),
            epoch,
            (tf.constant(0), tf.zeros([ala.max_epochs]), tf.constant(False)),
        )
        with tf.control_dependencies([i]):
            return aggregations.assign_add(1)

    tf.cond(learns(own, received.trainable), learn, lambda: tf.identity(aggregations))
