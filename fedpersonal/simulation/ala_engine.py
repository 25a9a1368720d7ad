"""FedALA's adaptive local aggregation on the grouped engine (`fedpersonal.core.local_aggregation`).

Each client of a group learns its element-wise weights W on its own packed examples, client after client inside
the group's compiled program, by the rules `local_aggregation` defines once (the slice, the projected step, the
stopping rule): the per-client backend's `aggregate_locally`, iterating packed examples instead of a dataset. A
client after client loop, not a lockstep, because each client learns for as many epochs as its own losses decide
(up to `max_epochs` the first time, one epoch later).

The examples come from a phase of their own (`PHASE`: the client's whole dataset, once), packed with the plan's
phases; a client's slice is gathered from them as fixed-size batches with an example mask (the last one partial), so
the program's shapes stay static.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from fedpersonal.core import local_aggregation
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep

PHASE = 'ala'  # The packed phase W learns from.


@tf.autograph.experimental.do_not_convert
def aggregated_starts(
    ala: local_aggregation.AdaptiveLocalAggregation,
    model: functional.FunctionalModel,
    loss: tf.keras.losses.Loss,
    received: Sequence[tf.Tensor],
    own: Sequence[tf.Tensor],
    mixing: Sequence[tf.Tensor],
    aggregations: tf.Tensor,
    non_trainable: Sequence[tf.Tensor],
    phase: Any,
) -> tuple[list[tf.Tensor], list[tf.Tensor], list[tf.Tensor], tf.Tensor]:
    """Every client's start of the global phase (call inside the group's `tf.function`).

    Args:
      ala: The aggregation's hyperparameters.
      model: The model (no local weights) as a pure function of its weights.
      loss: The Keras loss (a batch's loss: its mean over the batch's real examples, plus regularization).
      received: The received global trainable weights (shared by the group).
      own: Each client's own trainable weights, the model it trained last (``[clients, ...]``).
      mixing: Each client's W, one per aggregated (last) trainable tensor (``[clients, ...]``).
      aggregations: ``[clients]`` int32: each client's count of aggregations.
      non_trainable: Each client's own non-trainable weights (``[clients, ...]``; batch norm's statistics learn on).
      phase: The packed `PHASE`.

    Returns:
      ``(start, non_trainable, mixing, aggregations)``: the start's trainable weights (the lower ones shared, the
      aggregated ones per client), the non-trainable ones, W and the counts after the aggregation, per client.
    """
    k, bs = len(mixing), ala.batch_size
    stateful = [i for g, i in model.stateful_slots if g == functional.GLOBAL_NON_TRAINABLE]
    clients = tf.shape(phase['mask'])[0]
    capacity = tf.size(phase['mask'][0])

    def flat(a: tf.Tensor) -> tf.Tensor:  # One client's [steps, batch, ...] -> [steps * batch, ...].
        return tf.reshape(a, tf.concat([[-1], tf.shape(a)[2:]], 0))

    def client_loss(parts: functional.Parts, batch: Any, mask: tf.Tensor, _: Any):
        x, y = partially_local_model.split_batch(batch)
        predictions, regularization, updates = model.apply(
            parts, x, training=True, example_mask=mask if stateful else None
        )
        return lockstep.masked_loss(loss, y, predictions, mask) + regularization, updates

    def client(c, out):
        mask = flat(phase['mask'][c])
        order = tf.argsort(-mask, stable=True)  # Its real examples first, in their order.
        examples = tf.nest.map_structure(lambda a: tf.gather(flat(a[c]), order), phase['batch'])
        count = aggregations[c]
        start, size = local_aggregation.slice_bounds(ala, tf.reduce_sum(mask), count)
        v, w = [t[c] for t in own[-k:]], list(received[-k:])

        def step(j, m, statistics, last):
            offsets = tf.cast(j * bs + tf.range(bs), tf.int64)
            indices = tf.cast(tf.minimum(start + offsets, tf.cast(capacity - 1, tf.int64)), tf.int32)
            batch = tf.nest.map_structure(lambda e: tf.gather(e, indices), examples)
            upper = local_aggregation.mix(v, w, m)
            parts = functional.Parts(list(received[:-k]) + upper, statistics, [], [])
            value, _, _, gradients, updates = lockstep.client_gradients(
                model, parts, upper, batch, tf.cast(offsets < size, tf.float32), (), None, client_loss, None, [], False
            )
            statistics = [
                tf.stop_gradient(updates.get((functional.GLOBAL_NON_TRAINABLE, i), s)) for i, s in enumerate(statistics)
            ]
            return j + 1, local_aggregation.mixing_step(ala, m, gradients, v, w), statistics, value

        batches = tf.cast((size + bs - 1) // bs, tf.int32)
        first = tf.equal(count, 0)

        def epoch(i, m, statistics, losses, done):
            _, m, statistics, last = tf.while_loop(
                lambda j, *_: j < batches, step, (tf.constant(0), m, statistics, tf.constant(0.0))
            )
            losses = tf.tensor_scatter_nd_update(losses, [[i]], [last])
            return i + 1, m, statistics, losses, local_aggregation.settled(ala, losses, i, first)

        learning = local_aggregation.learns([t[c] for t in own], received)
        _, m, statistics, _, _ = tf.while_loop(
            lambda i, *args: tf.logical_and(tf.logical_not(args[-1]), i < ala.max_epochs),
            epoch,
            (
                tf.constant(0),
                [t[c] for t in mixing],
                [t[c] for t in non_trainable],
                tf.zeros([ala.max_epochs]),
                tf.logical_not(learning),
            ),
        )
        upper = [tf.where(learning, a, b) for a, b in zip(local_aggregation.mix(v, w, m), w)]
        written = upper + m + statistics + [count + tf.cast(learning, count.dtype)]
        return c + 1, [a.write(c, x) for a, x in zip(out, written)]

    kinds = [t.dtype for t in received[-k:]] + [t.dtype for t in mixing] + [t.dtype for t in non_trainable]
    out = [tf.TensorArray(kind, size=clients) for kind in kinds + [aggregations.dtype]]
    _, out = tf.while_loop(lambda c, _: c < clients, client, (tf.constant(0), out))
    stacked = [a.stack() for a in out]
    upper, new_mixing = stacked[:k], stacked[k : 2 * k]
    statistics, counts = stacked[2 * k : -1], stacked[-1]
    return list(received[:-k]) + upper, statistics, new_mixing, counts
