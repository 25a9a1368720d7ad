"""Many clients' tf.data datasets read in one pass: their batches as numpy, as each dataset's own iterator gives them.

Iterating one client's dataset costs an iterator and a call per batch from Python (about 4 ms a client on the
dense MLP workload of ``benchmarks/peer_speed.py``), which dominates a round whose clients are all new. `materialize`
reads many datasets through one compiled pipeline instead: the datasets' variant tensors are stacked, a
``flat_map`` walks them in order, tagging each batch with its client, its index and each leaf's shape, and
``padded_batch`` brings every batch back in one element; numpy then cuts each batch out of its padding. A batch is
yielded exactly as the dataset's own iterator yields it (same values, shapes and order, empty batches too), and a
dataset iterated this way starts from its first iteration, as a fresh iterator does (a shuffle with a seed gives its
first order).

Datasets are read together when their element specs are equal; others are read in a pass of their own. An array
pipeline (``from_tensor_slices`` then ``batch``, ``repeat``, ...: `fedpersonal.simulation.sliced`) is not run at
all: numpy cuts its batches from its arrays.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal.simulation import sliced

_BATCHES_PER_CALL = 1 << 15  # `padded_batch` reserves room for this many batches; more take further calls.


def _collector(spec: Any, tagged: bool) -> Any:
    """The compiled pass over datasets of `spec` (variant tensors), from their `skip`-th batch on: per batch each
    leaf's shape (`tagged`: and its client) and the leaves padded to the largest batch, for up to `_BATCHES_PER_CALL`
    batches; and whether batches remain. Untagged, the batches' clients follow from the datasets' cardinalities
    (`_counter`): tagging each batch in the datasets' own pipelines instantiates a function per dataset, which
    doubled the pass's time."""
    leaves = tf.nest.flatten(spec)

    def shapes_and_leaves(batch: Any) -> Any:
        flat = tf.nest.flatten(batch)
        return tuple(tf.shape(leaf, out_type=tf.int64) for leaf in flat), tuple(flat)

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.variant), tf.TensorSpec([], tf.int64)],
        autograph=False,
    )
    def collect(variants: tf.Tensor, skip: tf.Tensor) -> Any:
        indices = tf.range(tf.size(variants, out_type=tf.int64))  # Not `enumerate`: it logs a line per call.
        if tagged:

            def client(i: tf.Tensor, variant: tf.Tensor) -> tf.data.Dataset:
                def tag(*batch: Any) -> Any:  # A tuple element comes as arguments: only its leaves matter here.
                    shapes, flat = shapes_and_leaves(batch)
                    return (i, shapes), flat

                return tf.data.experimental.from_variant(variant, spec).map(tag)

            batches = tf.data.Dataset.from_tensor_slices((indices, variants)).flat_map(client)
        else:

            def untagged(*batch: Any) -> Any:  # One function for the whole pass; the client is read from counts.
                shapes, flat = shapes_and_leaves(batch)
                return (tf.constant(-1, tf.int64), shapes), flat

            batches = (
                tf.data.Dataset.from_tensor_slices(variants)
                .flat_map(lambda variant: tf.data.experimental.from_variant(variant, spec))
                .map(untagged)
            )
        iterator = iter(batches.skip(skip).padded_batch(_BATCHES_PER_CALL))
        found = iterator.get_next_as_optional()
        empty = (
            (tf.zeros([0], tf.int64), tuple(tf.zeros([0, len(s.shape)], tf.int64) for s in leaves)),
            tuple(tf.zeros([0] + [0] * len(s.shape), s.dtype) for s in leaves),
        )
        value = tf.cond(found.has_value(), found.get_value, lambda: empty)
        return value, iterator.get_next_as_optional().has_value()

    return collect


def _counter(spec: Any) -> Any:
    """Each dataset's number of batches (`tf.data.Dataset.cardinality`: negative where unknown), variants in."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.variant)], autograph=False)
    def count(variants: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(
            lambda variant: tf.data.experimental.from_variant(variant, spec).cardinality(),
            variants,
            fn_output_signature=tf.int64,
        )

    return count


# The compiled passes and counters by element spec (its repr: specs of equal structure, dtypes and shapes share one).
_COLLECTORS: dict[tuple[str, bool], Any] = {}
_COUNTERS: dict[str, Any] = {}


def _read(spec: Any, key: str, variants: tf.Tensor, clients: np.ndarray | None) -> list[tuple[int, Any]] | None:
    """``(client, batch)`` pairs of one spec's datasets in order; `clients` (each batch's client, from the
    cardinalities) untagged, else tagged. None if the batches read are not as many as `clients` says."""
    tagged = clients is None
    if (key, tagged) not in _COLLECTORS:
        _COLLECTORS[key, tagged] = _collector(spec, tagged)
    read: list[tuple[int, Any]] = []
    more = True
    while more:
        ((found, shapes), values), more = _COLLECTORS[key, tagged](variants, tf.constant(len(read), tf.int64))
        shapes, values = [s.numpy() for s in shapes], [v.numpy() for v in values]
        owners = found.numpy() if clients is None else clients[len(read) : len(read) + len(values[0])]
        if len(owners) != len(values[0]):
            return None
        for b, c in enumerate(owners):  # Batches arrive in client order, each client's in its own order.
            # Copied out of the padded array, which is not kept alive by a cached client.
            leaves = [v[b][tuple(slice(0, int(d)) for d in shape[b])].copy() for v, shape in zip(values, shapes)]
            read.append((int(c), tf.nest.pack_sequence_as(spec, leaves)))
    return read if clients is None or len(read) == len(clients) else None


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
        batches = sliced.array_batches(dataset)
        if batches is not None:
            out[k] = batches
        else:
            by_spec[repr(dataset.element_spec)].append(k)
    for key, members in by_spec.items():
        spec = datasets[members[0]].element_spec
        if not all(type(s) is tf.TensorSpec for s in tf.nest.flatten(spec)):  # Ragged or sparse: one at a time.
            for k in members:
                out[k] = list(datasets[k].as_numpy_iterator())
            continue
        variants = tf.stack([tf.data.experimental.to_variant(datasets[k]) for k in members])
        if key not in _COUNTERS:
            _COUNTERS[key] = _counter(spec)
        counts = _COUNTERS[key](variants).numpy()
        read = None
        if np.all(counts >= 0):  # Every cardinality known: each batch's client follows from them.
            read = _read(spec, key, variants, np.repeat(np.arange(len(members)), counts))
        if read is None:  # Some unknown (a filter, ...), or not what they said: each batch tagged with its client.
            read = _read(spec, key, variants, None)
        assert read is not None
        for c, batch in read:
            out[members[c]].append(batch)
    return out
