"""Many clients' tf.data datasets read in one pass: their batches as numpy, as each dataset's own iterator gives them.

Iterating one client's dataset costs an iterator and a call per batch from Python (about 4 ms a client on the
dense MLP workload of ``benchmarks/peer_speed.py``), which dominates a round whose clients are all new. `materialize`
reads many datasets through one compiled pipeline instead: the datasets' variant tensors are stacked, a
``flat_map`` walks them in order, tagging each batch with its client, its index and each leaf's shape, and
``padded_batch`` brings every batch back in one element; numpy then cuts each batch out of its padding. A batch is
yielded exactly as the dataset's own iterator yields it (same values, shapes and order, empty batches too), and a
dataset iterated this way starts from its first iteration, as a fresh iterator does (a shuffle with a seed gives its
first order).

Datasets are read together when their element specs are equal; others are read in a pass of their own.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

_BATCHES_PER_CALL = 1 << 15  # `padded_batch` reserves room for this many batches; more take further calls.


def _collector(spec: Any) -> Any:
    """The compiled pass over datasets of `spec` (variant tensors), from their `skip`-th batch on: per batch its
    client, each leaf's shape and the leaves padded to the largest batch, for up to `_BATCHES_PER_CALL` batches; and
    whether batches remain."""
    leaves = tf.nest.flatten(spec)

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.variant), tf.TensorSpec([], tf.int64)],
        autograph=False,
    )
    def collect(variants: tf.Tensor, skip: tf.Tensor) -> Any:
        def client(i: tf.Tensor, variant: tf.Tensor) -> tf.data.Dataset:
            def tag(*batch: Any) -> Any:  # A tuple element comes as arguments: only its leaves matter here.
                flat = tf.nest.flatten(batch)
                return (i, tuple(tf.shape(leaf, out_type=tf.int64) for leaf in flat)), tuple(flat)

            return tf.data.experimental.from_variant(variant, spec).map(tag)

        indices = tf.range(tf.size(variants, out_type=tf.int64))  # Not `enumerate`: it logs a line per call.
        batches = tf.data.Dataset.from_tensor_slices((indices, variants)).flat_map(client).skip(skip)
        iterator = iter(batches.padded_batch(_BATCHES_PER_CALL))
        found = iterator.get_next_as_optional()
        empty = (
            (tf.zeros([0], tf.int64), tuple(tf.zeros([0, len(s.shape)], tf.int64) for s in leaves)),
            tuple(tf.zeros([0] + [0] * len(s.shape), s.dtype) for s in leaves),
        )
        value = tf.cond(found.has_value(), found.get_value, lambda: empty)
        return value, iterator.get_next_as_optional().has_value()

    return collect


# The compiled passes by element spec (its repr: specs of equal structure, dtypes and shapes share one).
_COLLECTORS: dict[str, Any] = {}


def materialize(datasets: Sequence[tf.data.Dataset]) -> list[list[Any]]:
    """Each dataset's batches as numpy structures, what ``list(dataset.as_numpy_iterator())`` gives, in one pass.

    Args:
      datasets: tf.data datasets (a new iteration of each is read).

    Returns:
      One list of batches per dataset, in order; each batch has the dataset's element structure, numpy leaves.

    Example:

    >>> import tensorflow as tf
    >>> data = [tf.data.Dataset.range(n).batch(2) for n in (3, 0, 2)]
    >>> [[b.tolist() for b in batches] for batches in materialize(data)]
    [[[0, 1], [2]], [], [[0, 1]]]
    """
    out: list[list[Any]] = [[] for _ in datasets]
    by_spec: dict[str, list[int]] = collections.defaultdict(list)
    for k, dataset in enumerate(datasets):
        by_spec[repr(dataset.element_spec)].append(k)
    for key, members in by_spec.items():
        spec = datasets[members[0]].element_spec
        if not all(type(s) is tf.TensorSpec for s in tf.nest.flatten(spec)):  # Ragged or sparse: one at a time.
            for k in members:
                out[k] = list(datasets[k].as_numpy_iterator())
            continue
        if key not in _COLLECTORS:
            _COLLECTORS[key] = _collector(spec)
        variants = tf.stack([tf.data.experimental.to_variant(datasets[k]) for k in members])
        more, skip = True, 0
        while more:
            ((clients, shapes), values), more = _COLLECTORS[key](variants, tf.constant(skip, tf.int64))
            clients, shapes, values = clients.numpy(), [s.numpy() for s in shapes], [v.numpy() for v in values]
            skip += len(clients)
            for b, c in enumerate(clients):  # Batches arrive in client order, each client's in its own order.
                # Copied out of the padded array, which is not kept alive by a cached client.
                leaves = [v[b][tuple(slice(0, int(d)) for d in shape[b])].copy() for v, shape in zip(values, shapes)]
                out[members[int(c)]].append(tf.nest.pack_sequence_as(spec, leaves))
    return out
