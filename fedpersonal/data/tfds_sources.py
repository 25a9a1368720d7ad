"""Datasets read through TensorFlow Datasets from a prepared TFDS data directory, local files as the fallback.

Where TFDS has a dataset the package reads -- ``mnist``, ``fashion_mnist``, ``movielens/100k-ratings``,
``movielens/1m-ratings`` -- and it is prepared (``tfds build`` or ``tfds.load``) in the TFDS data directory, it is
read from there with ``tfds.builder_from_directory`` (nothing is downloaded; a dataset that is not prepared is not
looked up on the network); otherwise the local-file readers (`image_datasets.load_idx_dataset`,
`movielens.load_ratings`) read the original files. The TFDS data directory is ``tfds_data_dir``, or when that is
None TFDS's own default (``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``, as ``tfds.load``); ``''`` turns TFDS
off. Which source was read is logged.

Both sources give the same arrays in the same order. TFDS stores a split's examples sorted by an md5 hash of their
key salted with the split name (``tfds.core.hashing``); these builders key each example by its position in the
original file, so sorting the keys ``0..n-1`` by that hash gives every stored example's file position and restores
the files' order (a dataset prepared with shuffling disabled is already in it). Hence the same seed gives the same
partition from either source (`fedpersonal.data.pfllib` depends on the order). ``tests/data/tfds_sources_test.py``
prepares small datasets with TFDS's own builders from files in the original formats and compares.

The ``tensorflow-datasets`` package is optional: without it the local files are read.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import numpy as np
import pandas as pd
from absl import logging

from fedpersonal import errors
from fedpersonal.data import image_datasets
from fedpersonal.data import movielens

__all__ = [
    'TFDS_NAMES',
    'default_data_dir',
    'prepared_path',
    'read_images',
    'read_ratings',
    'load_image_dataset',
    'load_movielens_ratings',
]

TFDS_NAMES = {
    'mnist': 'mnist',
    'fashion_mnist': 'fashion_mnist',
    'movielens_100k': 'movielens/100k-ratings',
    'movielens_1m': 'movielens/1m-ratings',
}
"""This package's dataset name -> the TFDS name (with config)."""


def default_data_dir() -> str:
    """TFDS's default data directory: ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``."""
    return os.environ.get('TFDS_DATA_DIR') or os.path.join(os.path.expanduser('~'), 'tensorflow_datasets')


def _tfds_installed() -> bool:
    return importlib.util.find_spec('tensorflow_datasets') is not None


def prepared_path(name: str, data_dir: str) -> str | None:
    """The version directory of the prepared TFDS dataset `name` (a key of `TFDS_NAMES`) in `data_dir`, or None.

    The highest version present is chosen (versions compared numerically).
    """
    if name not in TFDS_NAMES:
        raise errors.ConfigError(f'no TFDS dataset for {name!r}; expected one of {sorted(TFDS_NAMES)}')
    infos = glob.glob(os.path.join(glob.escape(data_dir), *TFDS_NAMES[name].split('/'), '*', 'dataset_info.json'))

    def version(path: str) -> tuple[int, ...]:
        parts = os.path.basename(os.path.dirname(path)).split('.')
        return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (-1,)

    infos = [p for p in infos if version(p) != (-1,)]
    return os.path.dirname(max(infos, key=version)) if infos else None


def _read_split(path: str, split: str) -> dict[str, np.ndarray]:
    """All examples of `split` as numpy arrays, in the original files' order (see the module docstring)."""
    # Lazy and optional (and without type information: imported as Any).
    tfds = importlib.import_module('tensorflow_datasets')
    hashing = importlib.import_module('tensorflow_datasets.core.hashing')

    builder = tfds.builder_from_directory(path)
    if split not in builder.info.splits:
        raise errors.DataError(f'{path}: no {split!r} split (has {sorted(builder.info.splits)})')
    arrays = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False, batch_size=-1))
    n = int(builder.info.splits[split].num_examples)
    with open(os.path.join(path, 'dataset_info.json'), encoding='utf-8') as f:
        shuffled = not json.load(f).get('disableShuffling', False)
    if shuffled:
        hasher = hashing.Hasher(split)
        keys = [hasher.hash_key(i) for i in range(n)]
        file_position = np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        inverse[file_position] = np.arange(n)
        arrays = {k: np.asarray(v)[inverse] for k, v in arrays.items()}
    return arrays


def read_images(name: str, data_dir: str) -> image_datasets.ImageDataset:
    """``mnist`` or ``fashion_mnist`` read through TFDS from `data_dir`, as `image_datasets.load_idx_dataset`.

    Raises:
        DataError: The dataset is not prepared in `data_dir`, the package is not installed, or an array has an
            unexpected shape.
    """
    if name not in ('mnist', 'fashion_mnist'):
        raise errors.ConfigError(f"read_images reads 'mnist' or 'fashion_mnist', got {name!r}")
    path = prepared_path(name, data_dir)
    if path is None or not _tfds_installed():
        raise errors.DataError(f'{name}: no prepared TFDS dataset in {data_dir} (or tensorflow-datasets missing)')
    out = {}
    for split in ('train', 'test'):
        arrays = _read_split(path, split)
        images, labels = arrays['image'], arrays['label']
        if images.ndim != 4 or images.shape[1:] != (28, 28, 1) or images.dtype != np.uint8:
            raise errors.DataError(
                f'{path} {split}: expected uint8 [n, 28, 28, 1] images, got {images.dtype} {images.shape}'
            )
        out[split] = (images.astype(np.float32) / 255.0, labels.astype(np.int32))
    return image_datasets.ImageDataset(name, out['train'][0], out['train'][1], out['test'][0], out['test'][1])


def read_ratings(data_dir: str, variant: str = '100k') -> pd.DataFrame:
    """MovieLens ratings read through TFDS (``movielens/<variant>-ratings``), as `movielens.load_ratings`.

    Returns:
        Columns ``user_id``, ``item_id`` (int64, GroupLens ids), ``rating`` (float32), ``timestamp`` (int64), in the
        rating file's order.
    """
    name = f'movielens_{variant}'
    if name not in TFDS_NAMES:
        raise errors.ConfigError(f"variant must be '100k' or '1m', got {variant!r}")
    path = prepared_path(name, data_dir)
    if path is None or not _tfds_installed():
        raise errors.DataError(f'{name}: no prepared TFDS dataset in {data_dir} (or tensorflow-datasets missing)')
    arrays = _read_split(path, 'train')
    return pd.DataFrame(
        {
            'user_id': arrays['user_id'].astype(np.int64),  # b'196' -> 196.
            'item_id': arrays['movie_id'].astype(np.int64),
            'rating': arrays['user_rating'].astype(np.float32),
            'timestamp': arrays['timestamp'].astype(np.int64),
        }
    )


def _tfds_dir(name: str, tfds_data_dir: str | None) -> str | None:
    """The prepared dataset's TFDS data directory if it is to be read through TFDS, else None."""
    data_dir = default_data_dir() if tfds_data_dir is None else tfds_data_dir
    if not data_dir:
        return None
    if prepared_path(name, data_dir) is None:
        logging.info('%s: not prepared in the TFDS data directory %s; reading the local files.', name, data_dir)
        return None
    if not _tfds_installed():
        logging.warning(
            '%s is prepared in %s but tensorflow-datasets is not installed; reading the local files.', name, data_dir
        )
        return None
    return data_dir


def load_image_dataset(
    name: str, *, data_dir: str | None = None, tfds_data_dir: str | None = None
) -> image_datasets.ImageDataset:
    """``mnist`` or ``fashion_mnist`` through TFDS if prepared, else from the IDX files.

    Args:
        name: ``'mnist'`` or ``'fashion_mnist'``.
        data_dir: The IDX files' directory (``fashion_mnist`` default: `image_datasets.FASHION_MNIST_DIR`).
        tfds_data_dir: The TFDS data directory (None: TFDS's default; ``''``: do not use TFDS).

    Raises:
        ConfigError: ``mnist`` with neither a prepared TFDS copy nor `data_dir`.
        ImageFormatError: The IDX files are missing or malformed.
    """
    tfds_dir = _tfds_dir(name, tfds_data_dir)
    if tfds_dir is not None:
        logging.info('%s: reading the prepared TFDS dataset in %s.', name, tfds_dir)
        return read_images(name, tfds_dir)
    if name == 'fashion_mnist':
        data_dir = data_dir or image_datasets.FASHION_MNIST_DIR
    if not data_dir:
        raise errors.ConfigError(
            f'dataset {name!r} needs --data_dir (a directory with the IDX files) or a prepared TFDS {name} in the '
            f'TFDS data directory ({default_data_dir() if tfds_data_dir is None else tfds_data_dir or "off"})'
        )
    logging.info('%s: reading the IDX files in %s.', name, data_dir)
    return image_datasets.load_idx_dataset(data_dir, name)


def load_movielens_ratings(
    *, data_dir: str | None = None, tfds_data_dir: str | None = None, variant: str = '100k'
) -> pd.DataFrame:
    """MovieLens ratings (original ids, file order) through TFDS if prepared, else `movielens.load_ratings`.

    Args:
        data_dir: The GroupLens directory (``u.data`` or ``ratings.dat``).
        tfds_data_dir: The TFDS data directory (None: TFDS's default; ``''``: do not use TFDS).
        variant: ``'100k'`` or ``'1m'``.
    """
    tfds_dir = _tfds_dir(f'movielens_{variant}', tfds_data_dir)
    if tfds_dir is not None:
        logging.info('movielens_%s: reading the prepared TFDS dataset in %s.', variant, tfds_dir)
        return read_ratings(tfds_dir, variant)
    if not data_dir:
        raise errors.ConfigError(
            f'MovieLens {variant} needs --data_dir (the GroupLens files) or a prepared TFDS movielens/{variant}-ratings'
        )
    return movielens.load_ratings(data_dir, variant=variant)
