"""Support/query split of a client's dataset for reconstruction algorithms.

TFF 0.87's `ReconstructionModel.build_dataset_split_fn(split_dataset=True)`
sends even-indexed *batches* to reconstruction and odd-indexed ones to the
update. It iterates the client dataset twice, so a dataset that reshuffles on
each iteration puts some examples in both sets (and drops others).

`build_dataset_split_fn` here iterates the client dataset exactly once,
materializes its examples and assigns each one to the support or the query set:

* `strategy='hash'` (default): examples are ordered by a fingerprint of their
  content salted with a fingerprint of the client's whole set of examples, and
  the first `support_fraction` of that order is the support set. The split is
  therefore a deterministic function of the client's *set* of examples: the
  same examples land in the support set whatever order the dataset yields them
  in, and the two sets are always disjoint. The salt makes it independent
  between clients: unsalted, an example's rank depends on its content alone,
  so across users the same (item, rating) pairs fall in the support set (on
  MovieLens 100K, 10% of items were in almost no user's support set and 9% in
  almost every one), which left the support items' embeddings untrained and
  made FedRecon diverge at the paper's client learning rate 0.5.
* `strategy='order'`: the first `support_fraction` of the examples as the
  dataset yields them (e.g. the earliest half of a time-ordered client, as in
  the paper's Stack Overflow setup). Deterministic only if the order is.

`allow_overlap=True` uses every example for both reconstruction and the update
(the paper's Appendix D option for clients with very little data).

Both sets are re-batched with the client's original batch size; epochs and
step caps follow TFF's `build_dataset_split_fn`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import errors

DatasetSplitFn = Callable[[tf.data.Dataset], tuple[tf.data.Dataset, tf.data.Dataset]]

_STRATEGIES = ('hash', 'order')
_MAX_EXAMPLES = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ReconstructionSplit:
    """How a client's data is divided and iterated by reconstruction algorithms.

    Attributes:
      support_fraction: Fraction of a client's examples used for reconstruction
        (rounded; at least one example in each set when the client has two).
      strategy: `'hash'` (order-invariant, default) or `'order'`.
      allow_overlap: Use all examples for both phases (no split).
      recon_epochs: Passes over the support set during reconstruction (0: no reconstruction, as with TFF's
        `build_dataset_split_fn`).
      recon_steps_max: Cap on reconstruction steps (batches), after epochs.
      post_recon_epochs: Passes over the query set during the global update, and in
        `fedpersonal.evaluation.build_fed_recon_eval` over the evaluated query set (0: no update, resp. nothing
        evaluated, as in TFF, whose `build_dataset_split_fn` accepts 0 too). `build_recon_eval` evaluates the
        query set in one full pass whatever this is.
      post_recon_steps_max: Cap on update steps (batches), after epochs (likewise in `build_fed_recon_eval`).
    """

    support_fraction: float = 0.5
    strategy: str = 'hash'
    allow_overlap: bool = False
    recon_epochs: int = 1
    recon_steps_max: int | None = None
    post_recon_epochs: int = 1
    post_recon_steps_max: int | None = None

    def __post_init__(self):
        if not 0.0 < self.support_fraction < 1.0:
            raise errors.ConfigError(f'support_fraction must be in (0, 1), got {self.support_fraction}.')
        if self.strategy not in _STRATEGIES:
            raise errors.ConfigError(f'strategy must be one of {_STRATEGIES}, got {self.strategy!r}.')
        for name in ('recon_epochs', 'post_recon_epochs'):
            if getattr(self, name) < 0:
                raise errors.ConfigError(f'{name} must be >= 0, got {getattr(self, name)}.')
        for name in ('recon_steps_max', 'post_recon_steps_max'):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise errors.ConfigError(f'{name} must be None or >= 0, got {value}.')


def _first_leaf(structure: Any) -> tf.Tensor:
    return tf.nest.flatten(structure)[0]


def _materialize(dataset: tf.data.Dataset) -> tuple[Any, tf.Tensor]:
    """All examples of a batched dataset as one structure of `[n, ...]` tensors, plus the batch size."""
    examples = dataset.unbatch()

    def empty(spec: tf.TensorSpec) -> tf.Tensor:
        dims = [0] + [d if d is not None else 0 for d in spec.shape.as_list()]
        return tf.zeros(dims, spec.dtype)

    initial = tf.nest.map_structure(empty, examples.element_spec)
    stacked = examples.batch(_MAX_EXAMPLES).reduce(initial, lambda _, batch: batch)
    batch_size = dataset.take(1).reduce(tf.constant(1, tf.int64), lambda _, b: tf.shape(_first_leaf(b), tf.int64)[0])
    return stacked, tf.maximum(batch_size, 1)


def example_fingerprints(examples: Any) -> tf.Tensor:
    """An int64 fingerprint of each example's content (row of every leaf tensor)."""
    parts = []
    for leaf in tf.nest.flatten(examples):
        n = tf.shape(leaf)[0]
        if leaf.dtype == tf.bool:
            leaf = tf.cast(leaf, tf.uint8)
        parts.append(tf.fingerprint(tf.reshape(leaf, [n, -1])))
    combined = tf.fingerprint(tf.concat(parts, axis=1))
    return tf.bitcast(combined, tf.int64)


def split_keys(examples: Any) -> tf.Tensor:
    """The `'hash'` strategy's sort key of each example: its fingerprint salted with the client's (a fingerprint
    of the sorted fingerprints of all its examples), so the order is independent between clients and invariant
    to the order of a client's examples."""
    fingerprints = example_fingerprints(examples)
    salt = tf.bitcast(tf.fingerprint(tf.sort(fingerprints)[tf.newaxis]), tf.int64)
    pairs = tf.stack([fingerprints, tf.broadcast_to(salt, tf.shape(fingerprints))], axis=1)
    return tf.bitcast(tf.fingerprint(pairs), tf.int64)


def split_examples(examples: Any, split: ReconstructionSplit) -> tuple[Any, Any]:
    """Splits a structure of `[n, ...]` example tensors into (support, query)."""
    n = tf.shape(_first_leaf(examples))[0]
    if split.strategy == 'hash':
        order = tf.argsort(split_keys(examples), stable=True)
    else:
        order = tf.range(n)
    if split.allow_overlap:
        return examples, examples
    n_float = tf.cast(n, tf.float32)
    n_support = tf.cast(tf.round(n_float * split.support_fraction), tf.int32)
    n_support = tf.where(n >= 2, tf.clip_by_value(n_support, 1, tf.maximum(n - 1, 1)), n)
    support_idx, query_idx = order[:n_support], order[n_support:]
    gather = lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), examples)
    return gather(support_idx), gather(query_idx)


def _iterate(examples: Any, batch_size: tf.Tensor, epochs: int, steps_max: int | None) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices(examples).batch(batch_size).repeat(epochs)
    if steps_max is not None:
        dataset = dataset.take(steps_max)
    return dataset


def build_dataset_split_fn(split: ReconstructionSplit = ReconstructionSplit()) -> DatasetSplitFn:
    """Returns a `tff.learning.models.ReconstructionDatasetSplitFn` for `split`.

    The function maps a batched client dataset to `(support, query)` datasets,
    iterating the input exactly once. It can also be passed to TFF's
    `tff.learning.algorithms.build_fed_recon`.
    """

    def dataset_split_fn(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, tf.data.Dataset]:
        examples, batch_size = _materialize(dataset)
        support, query = split_examples(examples, split)
        return (
            _iterate(support, batch_size, split.recon_epochs, split.recon_steps_max),
            _iterate(query, batch_size, split.post_recon_epochs, split.post_recon_steps_max),
        )

    return dataset_split_fn


def _numpy_batches(
    structure: Any, leaves: list[np.ndarray], batch_size: int, epochs: int, steps_max: int | None
) -> list[Any]:
    """`leaves` (the flat arrays of `structure`'s examples) cut into batches, `epochs` passes, at most `steps_max`."""
    n = len(leaves[0])
    one_pass = [
        tf.nest.pack_sequence_as(structure, [a[i : i + batch_size] for a in leaves]) for i in range(0, n, batch_size)
    ]
    batches = one_pass * epochs
    return batches if steps_max is None else batches[:steps_max]


def split_batches(batches: list[Any], split: ReconstructionSplit) -> tuple[list[Any], list[Any]]:
    """`build_dataset_split_fn(split)` on a client's batches held as numpy structures (no `tf.data`).

    Gives the same support and query batches as the dataset split function (the fast simulation engine packs
    every client's data with it, tested equal); used where a client's batches are already in memory.
    """
    if not batches:
        return [], []
    structure = batches[0]
    flat = [tf.nest.flatten(b) for b in batches]  # Worked on flat: `tf.nest` per batch costs ~15 us.
    batch_size = max(1, len(flat[0][0]))
    full = all(len(f[0]) == batch_size for f in flat[:-1]) and 1 <= len(flat[-1][0]) <= batch_size
    support: list[np.ndarray] | None = None  # None: the batches given (both parts every example, in full batches).
    query: list[np.ndarray] | None = None
    if not (split.allow_overlap and full):
        leaves = [np.concatenate(parts) for parts in zip(*flat)]
        n = len(leaves[0])
        if split.allow_overlap:  # Both parts are every example in order.
            support = query = leaves
        else:
            if split.strategy == 'hash':
                order = np.argsort(split_keys(tf.nest.pack_sequence_as(structure, leaves)).numpy(), kind='stable')
            else:
                order = np.arange(n)
            n_support = int(np.round(np.float32(n) * np.float32(split.support_fraction)))
            n_support = min(max(n_support, 1), max(n - 1, 1)) if n >= 2 else n
            support = [a[order[:n_support]] for a in leaves]
            query = [a[order[n_support:]] for a in leaves]

    def rebatch(part: list[np.ndarray] | None, epochs: int, steps_max: int | None) -> list[Any]:
        if part is None:
            out = list(batches) * epochs
            return out if steps_max is None else out[:steps_max]
        return _numpy_batches(structure, part, batch_size, epochs, steps_max)

    return (
        rebatch(support, split.recon_epochs, split.recon_steps_max),
        rebatch(query, split.post_recon_epochs, split.post_recon_steps_max),
    )


def build_support_only_fn(split: ReconstructionSplit = ReconstructionSplit()) -> Callable[[tf.data.Dataset], tuple]:
    """Like `build_dataset_split_fn`, but the query set is one plain pass (for evaluation)."""

    def dataset_split_fn(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, tf.data.Dataset]:
        examples, batch_size = _materialize(dataset)
        support, query = split_examples(examples, split)
        return (
            _iterate(support, batch_size, split.recon_epochs, split.recon_steps_max),
            _iterate(query, batch_size, 1, None),
        )

    return dataset_split_fn
