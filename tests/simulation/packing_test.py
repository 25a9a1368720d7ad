"""`packing.as_tensors`: a packed group's arrays become tensors without a copy, any other value as before."""

import numpy as np
import tensorflow as tf

from fedpersonal.simulation import packing


def test_aligned_arrays_are_shared_and_everything_else_is_converted():
    shared = packing.aligned_zeros([3, 4, 5], np.float32)
    assert shared.ctypes.data % 64 == 0 and shared.shape == (3, 4, 5) and not shared.any()
    shared[1, 2] = np.arange(5)
    misaligned = np.zeros(33, np.uint8)[1:].view(np.int32)  # Not on a 64-byte boundary: TF would abort on it.
    misaligned[:] = np.arange(8)
    others = {
        'misaligned': misaligned,
        'bool': np.array([True, False]),
        'empty': packing.aligned_zeros([2, 0, 3], np.float32),
        'strided': np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2],
        'scalar': np.int32(7),
        'float': 1.5,
    }
    tensors = packing.as_tensors({'shared': shared, **others})
    np.testing.assert_array_equal(tensors['shared'].numpy(), shared)
    for name, value in others.items():
        np.testing.assert_array_equal(tensors[name].numpy(), np.asarray(value), err_msg=name)
        assert tensors[name].dtype == tf.convert_to_tensor(value).dtype, name
    shared[0, 0, 0] = 9.0  # The tensor is a view of the packed array (zero copy), which is why groups are immutable.
    assert float(tensors['shared'][0, 0, 0]) == 9.0
    copied = np.zeros([2], np.float64)  # A plain numpy array may be aligned by chance; then it is shared too.
    assert float(packing.as_tensors(copied)[0]) == 0.0
