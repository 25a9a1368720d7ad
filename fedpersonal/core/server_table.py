"""A server that keeps the round's uploaded models as rows of a table instead of their mean, and clients that each
derive their own centre from it: an algorithm's own math (`ClientPlan.table`; e.g. FedAMP's attention-weighted
combination of the clients' models, `fedpersonal.algorithms.fedamp`), one pure function of one client's tensors
that every backend calls.

The server's weights are the table: one tensor ``[capacity, *shape]`` per global trainable tensor of the model,
and ``filled`` (float32 ``[capacity]``, 1 for a row holding an upload; the filled rows come first). A round
broadcasts them; each client computes ``ServerTable.centre(rows, filled, kept)`` from them and the model it trained
last (its private state), trains from that model, with the phase's penalty centred at the centre instead of at
received weights, keeps the trained model and uploads it as a row (`Rows`). The server's new table is the round's
rows, in the clients' order (a client whose model is not finite, or that has no examples, uploads none). Nothing is
averaged: TFF's ``federated_aggregate`` concatenates the rows (`server_step`), and the engine the same `append`.
`fedpersonal.backends.build_process` sets the process's ``max_clients`` to `ServerTable.capacity`, so ``run_round``
refuses a round of more clients; ``next`` called directly drops the rows beyond it and counts them in the round's
``table`` metrics.
"""

from __future__ import annotations

import collections
from typing import Any
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import compose


@runtime_checkable
class ServerTable(Protocol):
    """The server's table of uploads and each client's centre (module docstring)."""

    @property
    def capacity(self) -> int:
        """The most rows the table holds: at least the most clients a round samples."""

    def centre(self, rows: list[Any], filled: tf.Tensor, kept: list[Any]) -> list[Any]:
        """The client's centre, shaped as the model's global trainable weights, from the table's `rows` (a
        ``[capacity, *shape]`` tensor per weight tensor), its `filled` mask and the client's `kept` model."""


class Rows(NamedTuple):
    """What clients upload to a table: ``values``, a ``[n, *shape]`` tensor per global trainable tensor (one
    client: n = 1; a group on the engine: its clients), and ``valid``, float32 ``[n]``, 1 for a row to keep."""

    values: list[Any]
    valid: Any


def empty(weights: list[Any], capacity: int) -> tff.learning.models.ModelWeights:
    """The server's weights before any upload: zero rows shaped as `weights`, nothing filled."""
    rows = [tf.zeros([capacity, *tf.convert_to_tensor(w).shape], tf.convert_to_tensor(w).dtype) for w in weights]
    return tff.learning.models.ModelWeights(rows, [tf.zeros([capacity], tf.float32)])


def append(table: list[Any], filled: Any, rows: list[Any], valid: Any) -> tuple[list[Any], Any, Any]:
    """`table` (its first ``sum(filled)`` rows filled) with the `valid` ones of `rows` written after its filled
    rows, in order: ``(new table, new filled, rows dropped for want of capacity)``."""
    capacity = tf.shape(filled)[0]
    keep = tf.convert_to_tensor(valid) > 0
    position = tf.cast(tf.reduce_sum(filled), tf.int32) + tf.cumsum(tf.cast(keep, tf.int32)) - 1
    fits = tf.logical_and(keep, position < capacity)
    index = tf.boolean_mask(position, fits)[:, tf.newaxis]
    new = [tf.tensor_scatter_nd_update(t, index, tf.boolean_mask(r, fits)) for t, r in zip(table, rows)]
    new_filled = tf.tensor_scatter_nd_update(filled, index, tf.ones([tf.shape(index)[0]], filled.dtype))
    return new, new_filled, tf.reduce_sum(tf.cast(tf.logical_and(keep, tf.logical_not(fits)), tf.int32))


def measurements(filled: Any, dropped: Any) -> collections.OrderedDict:
    """The round's ``table`` metrics: the rows kept and dropped."""
    return collections.OrderedDict(rows=tf.cast(tf.reduce_sum(filled), tf.int32), rows_dropped=dropped)


def from_rows(weights: tff.learning.models.ModelWeights, rows: Rows) -> tuple[Any, collections.OrderedDict]:
    """The new table from every client's `rows` stacked in order (the engine's server step), and its metrics."""
    zero = [tf.zeros_like(t) for t in weights.trainable]
    table, filled, dropped = append(zero, tf.zeros_like(weights.non_trainable[0]), list(rows.values), rows.valid)
    return tff.learning.models.ModelWeights(table, [filled]), measurements(filled, dropped)


def server_step(weights_type: Any) -> Any:
    """The `fedpersonal.core.compose.ServerStep` that replaces the table (`weights_type`: the server's weights) by
    the clients' rows (TFF's ``federated_aggregate`` concatenating them, in the clients' order)."""
    zero_type = tff.StructType([(None, weights_type.trainable), (None, weights_type.non_trainable[0])])
    accumulator_type = tff.StructType([(None, zero_type), (None, tff.TensorType(np.int32))])

    @tff.tensorflow.computation
    def zero():
        table = [tf.zeros(t.shape, t.dtype) for t in weights_type.trainable]
        return (table, tf.zeros(weights_type.non_trainable[0].shape, tf.float32)), tf.constant(0)

    @tff.tensorflow.computation(accumulator_type, accumulator_type)
    def merge(a, b):
        (table, filled), dropped = a
        (rows, valid), more = b
        table, filled, extra = append(list(table), filled, list(rows), valid)
        return (table, filled), dropped + more + extra

    @tff.tensorflow.computation(accumulator_type)
    def report(accumulator):
        (table, filled), dropped = accumulator
        return tff.learning.models.ModelWeights(list(table), [filled]), measurements(filled, dropped)

    @tff.federated_computation
    def initialize():
        return tff.federated_value((), tff.SERVER)

    def next_fn(state, weights, uploads, client_metrics):
        del weights, client_metrics

        @tff.tensorflow.computation(accumulator_type, uploads.type_signature.member)
        def accumulate(accumulator, rows):
            (table, filled), dropped = accumulator
            table, filled, more = append(list(table), filled, list(rows.values), rows.valid)
            return (table, filled), dropped + more

        aggregated = tff.federated_aggregate(uploads, zero(), accumulate, merge, report)
        return aggregated[0], state, collections.OrderedDict(table=aggregated[1])

    return compose.ServerStep(initialize, next_fn)
