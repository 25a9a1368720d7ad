"""`ArrayDatasets`: its numpy batches are what its pipelines yield; bad arrays are refused naming the client."""

import collections

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.core import array_data
from fedpersonal.simulation import sliced
from tests import batches


@hypothesis.settings(max_examples=80, deadline=None, derandomize=True)
@hypothesis.given(
    rows=st.lists(st.integers(0, 11), min_size=1, max_size=3),
    batch=st.integers(1, 5),
    epochs=st.integers(1, 3),
    drop=st.booleans(),
    structure=st.sampled_from(['dict', 'tuple', 'array']),
)
def test_numpy_batches_are_the_pipelines_batches(rows, batch, epochs, drop, structure):
    def arrays(client_id):
        n = rows[int(client_id)]
        rng = np.random.default_rng(n)
        x, y = rng.normal(size=[n, 2, 3]), rng.integers(0, 9, n).astype(np.int32)
        return {'dict': dict(x=x, y=y), 'tuple': (x.astype(np.float32), y), 'array': y}[structure]

    data = array_data.ArrayDatasets(
        [str(k) for k in range(len(rows))], arrays, batch, epochs=epochs, drop_remainder=drop
    )
    assert len(data) == len(rows) and len(data[:2]) == min(2, len(rows))
    for k in range(len(rows)):
        want = list(data[k].as_numpy_iterator())
        batches.assert_same_batches(data.numpy_batches(k), want)
        batches.assert_same_batches(sliced.array_batches(data[k]), want)  # Its pipeline is read by numpy too.


def test_a_mapping_of_arrays_is_taken_as_is():
    data = array_data.ArrayDatasets(['b'], {'b': collections.OrderedDict(y=np.arange(3))}, 2)
    assert [b['y'].tolist() for b in data.numpy_batches(0)] == [[0, 1], [2]]
    assert data.client_ids == ['b']


def test_bad_arrays_and_settings_are_refused_naming_them():
    with pytest.raises(errors.ConfigError, match='batch_size must be at least 1, got 0'):
        array_data.ArrayDatasets(['a'], {}, 0)
    with pytest.raises(errors.ConfigError, match='epochs must be at least 1, got 0'):
        array_data.ArrayDatasets(['a'], {}, 2, epochs=0)
    data = array_data.ArrayDatasets(['a', 'u7'], {'u7': dict(x=np.zeros([3, 2]), y=np.zeros([4]))}, 2)
    with pytest.raises(errors.ConfigError, match=r"client 'u7' has arrays of shapes \[\(3, 2\), \(4,\)\]"):
        data.numpy_batches(1)
    with pytest.raises(errors.ConfigError, match="client 'u7'"):
        data[1]
    scalar = array_data.ArrayDatasets(['s'], {'s': np.float32(1.0)}, 2)
    with pytest.raises(errors.ConfigError, match="client 's' has arrays of shapes \\[\\(\\)\\]"):
        scalar.numpy_batches(0)
