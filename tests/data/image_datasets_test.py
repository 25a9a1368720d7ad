"""IDX and CIFAR-10 pickle loaders on tiny files written in the exact formats; the real MNIST/Fashion-MNIST copies."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest

from fedpersonal.data import image_datasets
from tests import tolerances

MNIST_DIR = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared', 'data', 'mnist')


def idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack('>HBB', 0, 0x08, array.ndim) + struct.pack('>' + 'I' * array.ndim, *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_dir(directory, n_train=3, n_test=2, sep='-', gz=True, labels=None):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (('train', n_train), ('t10k', n_test)):
        images = rng.integers(0, 256, size=[n, 28, 28], dtype=np.uint8)
        y = np.arange(n, dtype=np.uint8) % 10 if labels is None else labels
        arrays[split] = (images, y)
        for kind, array, dims in (('images', images, 3), ('labels', y, 1)):
            name = f'{split}-{kind}{sep}idx{dims}-ubyte' + ('.gz' if gz else '')
            data = idx_bytes(array)
            with (gzip.open if gz else open)(os.path.join(directory, name), 'wb') as f:
                f.write(data)
    return arrays


@pytest.mark.parametrize('sep,gz', [('-', True), ('.', True), ('-', False)])
def test_idx_round_trip(tmp_path, sep, gz):
    arrays = write_idx_dir(str(tmp_path), sep=sep, gz=gz)
    data = image_datasets.load_idx_dataset(str(tmp_path), 'tiny')
    assert data.train_images.shape == (3, 28, 28, 1) and data.test_images.shape == (2, 28, 28, 1)
    assert data.train_images.dtype == np.float32
    # float32 pixels against float64 quotients: one float32 rounding.
    np.testing.assert_allclose(data.train_images[..., 0], arrays['train'][0] / 255.0, rtol=tolerances.U32, atol=0)
    np.testing.assert_array_equal(data.test_labels, [0, 1])
    assert data.train_labels.dtype == np.int32


def test_read_idx_other_types(tmp_path):
    path = tmp_path / 'x.idx'
    values = np.arange(6, dtype='>i4').reshape(2, 3)
    path.write_bytes(struct.pack('>HBB', 0, 0x0C, 2) + struct.pack('>II', 2, 3) + values.tobytes())
    np.testing.assert_array_equal(image_datasets.read_idx(str(path)), np.arange(6).reshape(2, 3))


def test_idx_errors_name_the_file(tmp_path):
    bad = tmp_path / 'bad.idx'
    bad.write_bytes(b'\x12\x34\x08\x01' + b'\x00' * 8)
    with pytest.raises(image_datasets.ImageFormatError, match=r'bad\.idx: not an IDX file'):
        image_datasets.read_idx(str(bad))
    short = tmp_path / 'short.idx'
    short.write_bytes(struct.pack('>HBB', 0, 0x08, 1) + struct.pack('>I', 10) + b'\x00' * 3)
    with pytest.raises(
        image_datasets.ImageFormatError, match=r'short\.idx: header shape \(10,\) needs 10 data bytes, found 3'
    ):
        image_datasets.read_idx(str(short))
    with pytest.raises(image_datasets.ImageFormatError, match='no train images file'):
        image_datasets.load_idx_dataset(str(tmp_path))
    write_idx_dir(str(tmp_path), n_train=3, labels=np.array([1, 2], np.uint8))
    with pytest.raises(image_datasets.ImageFormatError, match=r'train-labels-idx1-ubyte\.gz: 2 labels for 3 images'):
        image_datasets.load_idx_dataset(str(tmp_path))


def write_cifar(directory, n=2, corrupt=None):
    rng = np.random.default_rng(1)
    batches = {}
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
        data = rng.integers(0, 256, size=[n, 3072], dtype=np.uint8)
        batch = {b'data': data, b'labels': [int(v) for v in rng.integers(0, 10, size=n)], b'batch_label': b'x'}
        if corrupt == name:
            batch = {b'data': data[:, :100], b'labels': batch[b'labels']}
        batches[name] = batch
        with open(os.path.join(directory, name), 'wb') as f:
            pickle.dump(batch, f)
    return batches


def test_cifar10_pickle_layout(tmp_path):
    batches = write_cifar(str(tmp_path))
    data = image_datasets.load_cifar10(str(tmp_path))
    assert data.train_images.shape == (10, 32, 32, 3) and data.test_images.shape == (2, 32, 32, 3)
    raw = batches['data_batch_1'][b'data'][1]
    # Channel-major planes: red plane first, row-major within a plane.
    rel = tolerances.U32  # float32 pixels against float64 quotients: one float32 rounding.
    assert data.train_images[1, 0, 5, 0] == pytest.approx(raw[5] / 255.0, rel=rel)
    assert data.train_images[1, 2, 3, 1] == pytest.approx(raw[1024 + 2 * 32 + 3] / 255.0, rel=rel)
    assert data.train_images[1, 31, 31, 2] == pytest.approx(raw[3071] / 255.0, rel=rel)
    np.testing.assert_array_equal(data.test_labels, batches['test_batch'][b'labels'])


def test_cifar10_errors(tmp_path):
    write_cifar(str(tmp_path), corrupt='data_batch_3')
    with pytest.raises(image_datasets.ImageFormatError, match=r"data_batch_3: b'data' must be uint8 \[n, 3072\]"):
        image_datasets.load_cifar10(str(tmp_path))
    (tmp_path / 'data_batch_3').write_bytes(b'not a pickle')
    with pytest.raises(image_datasets.ImageFormatError, match='data_batch_3: not a CIFAR-10 python pickle'):
        image_datasets.load_cifar10(str(tmp_path))
    os.remove(tmp_path / 'test_batch')
    (tmp_path / 'data_batch_3').unlink()
    with pytest.raises(image_datasets.ImageFormatError, match='data_batch_3: no such file'):
        image_datasets.load_cifar10(str(tmp_path))


@pytest.mark.skipif(not os.path.isdir(MNIST_DIR), reason='MNIST copy not found at ../shared/data/mnist')
def test_real_mnist():
    data = image_datasets.load_idx_dataset(MNIST_DIR)
    assert data.train_images.shape == (60000, 28, 28, 1) and data.test_images.shape == (10000, 28, 28, 1)
    assert data.train_images.max() == 1.0 and data.train_images.min() == 0.0
    assert np.bincount(data.train_labels).tolist()[:2] == [5923, 6742]


@pytest.mark.skipif(
    not os.path.isdir(image_datasets.FASHION_MNIST_DIR),
    reason='Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)',
)
def test_real_fashion_mnist():
    data = image_datasets.load_idx_dataset(image_datasets.FASHION_MNIST_DIR, 'fashion_mnist')
    assert data.train_images.shape == (60000, 28, 28, 1) and data.test_labels.shape == (10000,)
    assert np.bincount(data.train_labels).tolist() == [6000] * 10
