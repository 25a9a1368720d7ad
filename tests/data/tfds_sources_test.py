"""TFDS reads equal local-file reads, in order, on small datasets prepared by TFDS's own builders offline.

The builders (``mnist``, ``fashion_mnist``, ``movielens/100k-ratings``) prepare from files the test writes in the
original formats: their download manager is patched to hand over those files (as TFDS's own builder tests do),
the example counts of the MNIST builders are set to the small files' (as ``mnist_test.py`` in TFDS does), and
TFDS's GCS lookups are off (nothing here reaches the network).
"""

import gzip
import os
import struct
from unittest import mock

import numpy as np
import pytest

from fedpersonal import errors
from fedpersonal.data import image_datasets
from fedpersonal.data import movielens
from fedpersonal.data import pfllib
from fedpersonal.data import tfds_sources

tfds = pytest.importorskip('tensorflow_datasets')
from tensorflow_datasets.core.utils import gcs_utils  # noqa: E402
from tensorflow_datasets.image_classification import mnist as tfds_mnist  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(gcs_utils, '_is_gcs_disabled', True)


def _write_idx(path, array, gz):
    header = struct.pack('>HBB', 0, 0x08, array.ndim) + struct.pack('>' + 'I' * array.ndim, *array.shape)
    with (gzip.open if gz else open)(path, 'wb') as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _prepare_images(tmp_path, monkeypatch, name, n_train=40, n_test=15):
    """IDX files (gzipped, as distributed) in tmp/raw, and TFDS `name` prepared from them in tmp/tfds."""
    rng = np.random.default_rng(7)
    raw, extracted = tmp_path / 'raw', tmp_path / 'extracted'
    raw.mkdir()
    extracted.mkdir()
    files = {}
    for split, n in (('train', n_train), ('test', n_test)):
        images = rng.integers(0, 256, [n, 28, 28], dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        stem = 'train' if split == 'train' else 't10k'
        for kind, array, dims in (('images', images, 3), ('labels', labels, 1)):
            _write_idx(raw / f'{stem}-{kind}-idx{dims}-ubyte.gz', array, gz=True)
            _write_idx(extracted / f'{stem}-{kind}-idx{dims}-ubyte', array, gz=False)
            files[f'{split}_{"data" if kind == "images" else "labels"}'] = str(
                extracted / f'{stem}-{kind}-idx{dims}-ubyte'
            )
    monkeypatch.setattr(tfds_mnist, '_TRAIN_EXAMPLES', n_train)
    monkeypatch.setattr(tfds_mnist, '_TEST_EXAMPLES', n_test)
    with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract', return_value=files):
        tfds.builder(name, data_dir=str(tmp_path / 'tfds')).download_and_prepare()
    return str(raw), str(tmp_path / 'tfds')


@pytest.mark.parametrize('name', ['fashion_mnist', 'mnist'])
def test_tfds_images_equal_idx_files_in_file_order(tmp_path, monkeypatch, name):
    raw, tfds_dir = _prepare_images(tmp_path, monkeypatch, name)
    path = tfds_sources.prepared_path(name, tfds_dir)
    assert path is not None and path.endswith(os.path.join(name, '3.0.1'))
    stored = tfds.as_numpy(tfds.builder_from_directory(path).as_dataset(split='train', batch_size=-1))
    local = image_datasets.load_idx_dataset(raw, name)
    assert not np.array_equal(stored['label'], local.train_labels)  # TFDS stores them shuffled...
    via_tfds = tfds_sources.load_image_dataset(name, data_dir=raw, tfds_data_dir=tfds_dir)
    for field in ('train_images', 'train_labels', 'test_images', 'test_labels'):  # ...the reader restores the order.
        np.testing.assert_array_equal(getattr(via_tfds, field), getattr(local, field))
        assert getattr(via_tfds, field).dtype == getattr(local, field).dtype
    # Hence the same seed gives the same partition from either source.
    a = pfllib.federate(via_tfds, 'dirichlet', num_clients=2, alpha=1.0)
    b = pfllib.federate(local, 'dirichlet', num_clients=2, alpha=1.0)
    for x, y in zip(a.partition.train + a.partition.test, b.partition.train + b.partition.test):
        np.testing.assert_array_equal(x, y)


def test_fallback_to_local_files(tmp_path, monkeypatch):
    raw, tfds_dir = _prepare_images(tmp_path, monkeypatch, 'fashion_mnist')
    empty = tmp_path / 'empty'
    empty.mkdir()
    local = image_datasets.load_idx_dataset(raw, 'fashion_mnist')
    for tfds_data_dir in (str(empty), ''):  # Not prepared there; TFDS off.
        got = tfds_sources.load_image_dataset('fashion_mnist', data_dir=raw, tfds_data_dir=tfds_data_dir)
        np.testing.assert_array_equal(got.train_labels, local.train_labels)
    monkeypatch.setenv('TFDS_DATA_DIR', tfds_dir)  # TFDS's default directory.
    assert tfds_sources.default_data_dir() == tfds_dir
    got = tfds_sources.load_image_dataset('fashion_mnist', data_dir='/nonexistent')
    np.testing.assert_array_equal(got.test_images, local.test_images)
    with pytest.raises(errors.ConfigError, match="dataset 'mnist' needs --data_dir"):
        tfds_sources.load_image_dataset('mnist', tfds_data_dir=str(empty))
    missing = mock.patch.object(tfds_sources, '_tfds_installed', return_value=False)  # Prepared, package missing.
    with missing, pytest.raises(image_datasets.ImageFormatError, match='/nonexistent: no such directory'):
        tfds_sources.load_image_dataset('fashion_mnist', data_dir='/nonexistent')


def test_prepared_path_takes_the_highest_version(tmp_path):
    for version in ('1.0.0', '3.0.1', '10.0.0', 'not-a-version'):
        (tmp_path / 'mnist' / version).mkdir(parents=True)
        (tmp_path / 'mnist' / version / 'dataset_info.json').write_text('{}')
    assert tfds_sources.prepared_path('mnist', str(tmp_path)).endswith(os.path.join('mnist', '10.0.0'))
    assert tfds_sources.prepared_path('fashion_mnist', str(tmp_path)) is None
    with pytest.raises(errors.ConfigError, match='no TFDS dataset'):
        tfds_sources.prepared_path('cifar10', str(tmp_path))


def test_tfds_movielens_equals_grouplens_files(tmp_path):
    ml = tmp_path / 'ml-100k'
    ml.mkdir()
    rng = np.random.default_rng(1)
    users, items = np.arange(1, 7), np.arange(1, 9)
    pairs = [(u, i) for u in users for i in items if rng.random() < 0.6]
    lines = [f'{u}\t{i}\t{rng.integers(1, 6)}\t{880000000 + rng.integers(0, 10**6)}' for u, i in pairs]
    (ml / 'u.data').write_text('\n'.join(lines) + '\n')
    (ml / 'u.item').write_text(
        ''.join(
            f'{i}|Movie {i} (1995)|01-Jan-1995||http://x|' + '|'.join('01'[(i + g) % 2] for g in range(19)) + '\n'
            for i in items
        )  # fmt: skip
    )
    (ml / 'u.user').write_text(''.join(f'{u}|{20 + u}|M|student|0000{u}\n' for u in users))
    with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract', return_value=str(tmp_path)):
        tfds.builder('movielens/100k-ratings', data_dir=str(tmp_path / 'tfds')).download_and_prepare()
    local = movielens.load_ratings(str(ml))
    got = tfds_sources.load_movielens_ratings(data_dir=str(ml), tfds_data_dir=str(tmp_path / 'tfds'))
    assert list(got.columns) == list(movielens.RATING_COLUMNS)
    for column in movielens.RATING_COLUMNS:  # Same rows, file order, dtypes.
        np.testing.assert_array_equal(got[column].to_numpy(), local[column].to_numpy())
        assert got[column].dtype == local[column].dtype
    assert len(got) == len(lines)
    with pytest.raises(errors.ConfigError, match='needs --data_dir'):
        tfds_sources.load_movielens_ratings(tfds_data_dir='')
