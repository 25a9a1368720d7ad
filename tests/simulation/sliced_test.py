"""`sliced.array_batches` gives exactly what an array pipeline's own iterator yields, and None for anything else."""

import collections

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from hypothesis import strategies as st

from fedpersonal.data import client_data
from fedpersonal.simulation import materialize
from fedpersonal.simulation import sliced
from tests import batches

_STAGE = st.one_of(
    st.tuples(st.just('repeat'), st.integers(0, 3)),
    st.tuples(st.just('take'), st.integers(-1, 12)),
    st.tuples(st.just('skip'), st.integers(-1, 12)),
    st.tuples(st.just('prefetch'), st.integers(1, 2)),
)


def _apply(dataset, stages):
    for name, arg in stages:
        dataset = getattr(dataset, name)(arg)
    return dataset


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.example(rows=7, before=[('skip', -1)], batch=2, drop=False, after=[], structure='dict')
@hypothesis.example(rows=7, before=[('take', -1), ('repeat', 0)], batch=2, drop=False, after=[], structure='single')
@hypothesis.example(rows=7, before=[('repeat', 2)], batch=3, drop=True, after=[('skip', -1)], structure='tuple')
@hypothesis.example(
    rows=7, before=[('repeat', 3)], batch=4, drop=False, after=[('take', 2), ('skip', 1)], structure='nested'
)
@hypothesis.given(
    rows=st.integers(0, 13),
    before=st.lists(_STAGE, max_size=3),
    batch=st.integers(1, 5),
    drop=st.booleans(),
    after=st.lists(_STAGE, max_size=2),
    structure=st.sampled_from(['dict', 'tuple', 'nested', 'single']),
)
def test_any_array_pipeline_gives_its_iterators_batches(rows, before, batch, drop, after, structure):
    rng = np.random.default_rng(rows)
    x = rng.normal(size=[rows, 3, 2]).astype(np.float32)
    y = rng.integers(-5, 5, size=rows).astype(np.int64)
    flag = rng.random(rows) < 0.5
    arrays = {
        'dict': collections.OrderedDict(x=x, y=y),
        'tuple': (x, y.astype(np.int32)),
        'nested': collections.OrderedDict(a=(x.astype(np.float64), flag), b=y),
        'single': y,
    }[structure]
    dataset = _apply(_apply(tf.data.Dataset.from_tensor_slices(arrays), before).batch(batch, drop), after)
    batches.assert_same_batches(sliced.array_batches(dataset), list(dataset.as_numpy_iterator()))


def _source():
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=np.arange(6.0), y=np.arange(6)))


@pytest.mark.parametrize(
    'make',
    [
        lambda: _source().map(lambda e: e).batch(2),
        lambda: _source().shuffle(6, seed=1).batch(2),
        lambda: _source().filter(lambda e: e['y'] > 1).batch(2),
        lambda: _source().repeat().batch(2).take(2),  # Forever, then cut: left to tf.data.
        lambda: _source().batch(2).batch(2),
        lambda: _source().padded_batch(2),
        lambda: _source().batch(2, num_parallel_calls=2),
        lambda: _source().with_options(tf.data.Options()).batch(2),
        lambda: _source(),  # Examples, not batches.
        lambda: tf.data.Dataset.range(5).batch(2),
        lambda: tf.data.Dataset.from_tensors(np.arange(4)).batch(2),
        lambda: tf.data.Dataset.from_tensor_slices(np.array([b'a', b'b'], dtype=object)).batch(2),
        lambda: tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]])).batch(2),
    ],
)
def test_other_pipelines_are_left_to_their_iterator(make):
    assert sliced.array_batches(make()) is None


def test_a_pipeline_traced_in_a_function_is_left_to_its_iterator():
    seen = []

    @tf.function
    def build():
        dataset = tf.data.Dataset.from_tensor_slices(tf.range(4)).batch(2)
        seen.append(sliced.array_batches(dataset))
        return dataset.reduce(tf.constant(0), lambda a, b: a + tf.reduce_sum(b))

    assert int(build()) == 6
    assert seen == [None]


def test_the_clients_of_the_packages_client_data_and_tffs_are_recognized():
    """The fast path is taken where users' data come from (else it would silently never apply)."""
    columns = collections.OrderedDict(x=np.arange(10.0).astype(np.float32), y=np.arange(10).astype(np.int32))
    ours = client_data.from_partition(columns, [np.array([3, 1, 4, 7, 9]), np.array([0, 2])])
    theirs = tff.simulation.datasets.TestClientData({'a': columns})
    for dataset in (ours.create_tf_dataset_for_client('0'), theirs.create_tf_dataset_for_client('a')):
        batched = dataset.repeat(2).batch(3)
        batches.assert_same_batches(sliced.array_batches(batched), list(batched.as_numpy_iterator()))


def test_materialize_cuts_array_pipelines_without_running_a_pass(monkeypatch):
    def no_pass(*args, **kwargs):
        raise AssertionError('an array pipeline was run through tf.data')

    monkeypatch.setattr(materialize, '_read', no_pass)
    data = [tf.data.Dataset.from_tensor_slices(np.arange(n)).batch(2) for n in (3, 0, 4)]
    batches.assert_same_batches(
        [b for d in materialize.materialize(data) for b in d], [b for d in data for b in d.as_numpy_iterator()]
    )
