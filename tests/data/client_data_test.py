"""from_partition: a client's dataset is exactly its table rows, on TFF's python and traced paths."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.data import client_data
from fedpersonal.data import partition


def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        'x': rng.normal(size=[n, 3, 2]).astype(np.float32),
        'y': rng.integers(0, 5, n).astype(np.int32),
        'id': np.arange(n, dtype=np.int64),
    }


@settings(max_examples=10, deadline=None)
@given(num_rows=st.integers(5, 60), num_clients=st.integers(1, 5), seed=st.integers(0, 1000))
def test_client_datasets_equal_table_rows(num_rows, num_clients, seed):
    table = _table(num_rows, seed)
    rng = np.random.default_rng(seed)
    parts = [rng.permutation(p) for p in partition.iid(num_rows, num_clients, rng=rng)]  # Any order.
    ids = [f'c{i}' for i in range(num_clients)]
    cd = client_data.from_partition(table, parts, ids)
    assert cd.client_ids == ids
    for cid, rows in zip(ids, parts):
        got = list(cd.create_tf_dataset_for_client(cid).as_numpy_iterator())
        assert [int(e['id']) for e in got] == rows.tolist()
        for name in table:
            np.testing.assert_array_equal(np.stack([e[name] for e in got]), table[name][rows])


def test_traced_paths_serve_the_same_rows():
    table = _table(20)
    parts = [np.array([3, 1, 4]), np.array([15, 9]), np.array([2, 6, 5, 8])]
    cd = client_data.from_partition(table, parts, ['a', 'b', 'c'])
    assert cd.element_type_structure['x'] == tf.TensorSpec([3, 2], tf.float32)
    everyone = sorted(int(e['id']) for e in cd.create_tf_dataset_from_all_clients(seed=0).as_numpy_iterator())
    assert everyone == sorted(np.concatenate(parts).tolist())
    got = [int(e['id']) for e in cd.dataset_computation('c').as_numpy_iterator()]  # TFF-serialized function.
    assert got == [2, 6, 5, 8]

    @tf.function
    def total(client_id):
        return cd.serializable_dataset_fn(client_id).reduce(tf.constant(0, tf.int64), lambda a, e: a + e['id'])

    assert int(total(tf.constant('b'))) == 24
    with pytest.raises(tf.errors.InvalidArgumentError, match='unknown client id'):
        total(tf.constant('z'))
    with pytest.raises(errors.ConfigError, match="unknown client id 'z'"):
        cd.serializable_dataset_fn('z')


def test_bad_inputs_name_the_problem():
    table = _table(4)
    with pytest.raises(errors.DataError, match='same first dimension'):
        client_data.from_partition({'x': np.zeros(3), 'y': np.zeros(4)}, [np.array([0])])
    with pytest.raises(errors.DataError, match='client 1: row indices must be in 0..3'):
        client_data.from_partition(table, [np.array([0]), np.array([4])])
    with pytest.raises(errors.ConfigError, match='2 distinct ids'):
        client_data.from_partition(table, [np.array([0]), np.array([1])], ['a', 'a'])
    with pytest.raises(errors.DataError, match='no clients'):
        client_data.from_partition(table, [])
