"""`materialize` reads many datasets in one pass exactly as each dataset's own iterator does."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.simulation import materialize
from tests import batches


def _assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        batches.assert_same_batches(a, b)


def _clients(seed=0):
    """Clients of unequal sizes (partial last batches, one empty), a dict element with a string and an int leaf,
    each shuffled with a seed, then mapped."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (23, 0, 7, 10, 1):
        data = collections.OrderedDict(
            x=rng.normal(size=[n, 5]).astype(np.float32),
            y=rng.integers(0, 10, size=n).astype(np.int32),
            tag=np.array([f'r{i}'.encode() for i in range(n)], dtype=object),
        )
        dataset = tf.data.Dataset.from_tensor_slices(data).shuffle(50, seed=3).batch(4)
        out.append(dataset.map(lambda b: collections.OrderedDict(b, x=b['x'] * 2.0)))
    return out


def test_the_batches_of_each_dataset_as_its_own_iterator_yields_them():
    _assert_same_batches(materialize.materialize(_clients()), [list(d.as_numpy_iterator()) for d in _clients()])


def test_inner_shapes_that_differ_per_batch_are_kept_and_specs_that_differ_read_apart():
    """Padded sequences whose length differs per batch (as text pipelines give) and a second element spec."""
    sequences = [
        tf.data.Dataset.from_tensor_slices(tf.ragged.constant(r)).map(lambda t: t)
        for r in (
            [[1, 2, 3], [4], [5, 6]],
            [[7]],
        )
    ]
    padded = [d.padded_batch(2) for d in sequences]
    scalars = [tf.data.Dataset.range(5).batch(3), tf.data.Dataset.range(0).batch(3)]
    pairs = [tf.data.Dataset.from_tensor_slices((np.arange(5.0), np.arange(5))).batch(2)]  # A tuple element.
    mixed = [padded[0], scalars[0], padded[1], scalars[1], *pairs]
    _assert_same_batches(materialize.materialize(mixed), [list(d.as_numpy_iterator()) for d in mixed])


def test_empty_batches_and_no_batches_at_all():
    empty_batches = tf.data.Dataset.range(6).batch(2).map(lambda b: b[:0])  # Three batches of 0 rows.
    data = [empty_batches, tf.data.Dataset.range(0).batch(2)]
    got = materialize.materialize(data)
    assert [len(b) for b in got] == [3, 0]
    _assert_same_batches(got, [list(d.as_numpy_iterator()) for d in data])
    assert materialize.materialize([tf.data.Dataset.range(0).batch(2)]) == [[]]
    assert materialize.materialize([]) == []


def test_sparse_elements_are_read_by_the_datasets_own_iterator():
    sparse = tf.data.Dataset.from_tensor_slices(tf.sparse.from_dense([[1, 0], [0, 2], [3, 0]])).batch(2)
    (batches,) = materialize.materialize([sparse, tf.data.Dataset.range(3).batch(2)])[:1]
    want = list(sparse.as_numpy_iterator())
    assert len(batches) == len(want) == 2
    for got, expected in zip(batches, want):  # As that iterator gives them (TF 2.14: dense arrays).
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize('seed', [0, 1])
def test_a_reshuffling_dataset_gives_its_first_order(seed):
    """A dataset reshuffled every iteration, read fresh: the order of its first iteration, as a fresh iterator's."""

    def fresh():
        return [tf.data.Dataset.range(20).shuffle(20, seed=seed, reshuffle_each_iteration=True).batch(6)]

    _assert_same_batches(materialize.materialize(fresh()), [list(fresh()[0].as_numpy_iterator())])


def test_datasets_of_unknown_cardinality_are_read_with_each_batch_tagged():
    """A filter leaves a dataset's number of batches unknown until read: its batches still go to their own client,
    beside datasets of known cardinality of the same spec."""
    filtered = [tf.data.Dataset.range(n).filter(lambda v: v % 3 > 0).batch(2) for n in (7, 0, 4)]
    mixed = [filtered[0], tf.data.Dataset.range(5).batch(2), filtered[1], filtered[2]]
    assert int(filtered[0].cardinality()) < 0
    _assert_same_batches(materialize.materialize(mixed), [list(d.as_numpy_iterator()) for d in mixed])
