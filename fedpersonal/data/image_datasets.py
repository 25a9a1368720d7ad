"""Image dataset loaders: IDX (MNIST, Fashion-MNIST) and the CIFAR-10 python-pickle batches.

The loaders read the standard formats from a directory the caller names; nothing is downloaded.

* IDX (MNIST, Fashion-MNIST): `train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`, `t10k-*` (the
  separator before `idx` may be `-` or `.`, both spellings exist). A file is a big-endian header -- two zero bytes,
  a type code (0x08 = unsigned byte), the number of dimensions, then one uint32 per dimension -- followed by the
  data in C order.
* CIFAR-10 python version: `data_batch_1` .. `data_batch_5` and `test_batch`, each a pickled dict with `b'data'`
  (uint8 `[n, 3072]`, channel-major 32x32 planes) and `b'labels'` (n ints in 0..9).

Problems raise `ImageFormatError` naming the file and what is wrong. Images are returned as float32 in [0, 1] with a
trailing channel axis (`[n, 28, 28, 1]` or `[n, 32, 32, 3]`), labels as int32.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import os
import pickle
import struct
import zlib

import numpy as np

from fedpersonal import errors

__all__ = [
    'ImageFormatError',
    'ImageDataset',
    'read_idx',
    'load_idx_dataset',
    'load_cifar10',
    'FASHION_MNIST_DIR',
]

FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
"""Where the Debian package `dataset-fashion-mnist` installs Fashion-MNIST."""

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype('>u1'),
    0x09: np.dtype('>i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


class ImageFormatError(errors.DataError):
    """An image dataset file is missing or malformed (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    """Train and test images of one dataset.

    Attributes:
      name: e.g. 'mnist'.
      train_images: float32 `[n, h, w, c]` in [0, 1].
      train_labels: int32 `[n]`.
      test_images: float32 `[m, h, w, c]` in [0, 1].
      test_labels: int32 `[m]`.
      num_classes: Number of label values.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int = 10


def _open(path: str):
    with open(path, 'rb') as f:
        magic = f.read(2)
    return gzip.open(path, 'rb') if magic == b'\x1f\x8b' else open(path, 'rb')


def read_idx(path: str) -> np.ndarray:
    """Reads one IDX file (gzipped or not; detected from the content).

    Args:
      path: The file.

    Returns:
      The array, in native byte order.

    Raises:
      ImageFormatError: Naming `path`, for a missing file, a bad header or a wrong data length.
    """
    if not os.path.isfile(path):
        raise ImageFormatError(f'{path}: no such file')
    try:
        with _open(path) as f:
            raw = f.read()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:  # zlib.error: a corrupt compressed stream.
        raise ImageFormatError(f'{path}: cannot read ({e})') from e
    if len(raw) < 4:
        raise ImageFormatError(f'{path}: too short for an IDX header ({len(raw)} bytes)')
    zero, code, ndim = struct.unpack('>HBB', raw[:4])
    if zero != 0 or code not in _IDX_DTYPES:
        raise ImageFormatError(f'{path}: not an IDX file (magic bytes {raw[:4].hex()}; expected 0000 then a type code)')
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise ImageFormatError(f'{path}: IDX header declares {ndim} dimensions but the file has {len(raw)} bytes')
    shape = struct.unpack('>' + 'I' * ndim, raw[4:header])
    dtype = _IDX_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge header shape cannot overflow.
    if len(raw) - header != expected:
        raise ImageFormatError(
            f'{path}: header shape {tuple(shape)} needs {expected} data bytes, found {len(raw) - header}'
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder('='))


def _find(directory: str, split: str, kind: str) -> str:
    dims = 3 if kind == 'images' else 1
    candidates = [f'{split}-{kind}{sep}idx{dims}-ubyte{ext}' for sep in ('-', '.') for ext in ('.gz', '')]
    for name in candidates:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise ImageFormatError(f'{directory}: no {split} {kind} file (looked for {", ".join(candidates)})')


def load_idx_dataset(directory: str, name: str = 'mnist') -> ImageDataset:
    """Loads an MNIST-layout IDX dataset (MNIST, Fashion-MNIST) from `directory`.

    Args:
      directory: Holds `train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]` and the `t10k-*` pair.
      name: Recorded in the result.

    Returns:
      An `ImageDataset` with `[n, h, w, 1]` float32 images in [0, 1].

    Raises:
      ImageFormatError: Naming the file, for missing files, malformed files, or image/label count mismatches.
    """
    if not os.path.isdir(directory):
        raise ImageFormatError(f'{directory}: no such directory')
    arrays = {}
    for split in ('train', 't10k'):
        images_path, labels_path = _find(directory, split, 'images'), _find(directory, split, 'labels')
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3:
            raise ImageFormatError(f'{images_path}: expected 3 dimensions [n, rows, cols], got shape {images.shape}')
        if labels.ndim != 1:
            raise ImageFormatError(f'{labels_path}: expected 1 dimension [n], got shape {labels.shape}')
        if images.shape[0] != labels.shape[0]:
            raise ImageFormatError(
                f'{labels_path}: {labels.shape[0]} labels for {images.shape[0]} images in {images_path}'
            )
        if images.shape[0] == 0:
            raise ImageFormatError(f'{images_path}: no images (header shape {images.shape})')
        if labels.dtype.kind not in 'iu':
            raise ImageFormatError(f'{labels_path}: labels must be integers, got IDX type {labels.dtype.name}')
        if labels.min() < 0 or labels.max() > 9:
            raise ImageFormatError(f'{labels_path}: labels must be in 0..9, found {labels.min()}..{labels.max()}')
        if images.dtype != np.uint8 and not (np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1):
            raise ImageFormatError(
                f'{images_path}: {images.dtype.name} pixels must be finite and in [0, 1] (or use uint8 0..255), found '
                f'{images.min()}..{images.max()}'
            )
        scale = 255.0 if images.dtype == np.uint8 else 1.0
        arrays[split] = ((images.astype(np.float32) / scale)[..., None], labels.astype(np.int32))
    return ImageDataset(name, arrays['train'][0], arrays['train'][1], arrays['t10k'][0], arrays['t10k'][1])


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    if not os.path.isfile(path):
        raise ImageFormatError(f'{path}: no such file')
    try:
        with open(path, 'rb') as f:
            batch = pickle.load(f, encoding='bytes')
    except Exception as e:  # pylint: disable=broad-except  (any byte string: unpickling raises KeyError, IndexError...)
        raise ImageFormatError(f'{path}: not a CIFAR-10 python pickle ({e})') from e
    if not isinstance(batch, dict):
        raise ImageFormatError(f'{path}: expected a pickled dict, got {type(batch).__name__}')
    missing = [k for k in (b'data', b'labels') if k not in batch]
    if missing:
        raise ImageFormatError(f'{path}: missing key(s) {", ".join(repr(k) for k in missing)}')
    try:
        data, labels = np.asarray(batch[b'data']), np.asarray(batch[b'labels'])
    except (ValueError, TypeError) as e:  # Ragged nested lists.
        raise ImageFormatError(f"{path}: b'data' and b'labels' must be arrays ({e})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise ImageFormatError(f"{path}: b'data' must be uint8 [n, 3072], got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise ImageFormatError(f'{path}: {labels.size} labels for {data.shape[0]} images')
    if labels.dtype.kind not in 'iu':
        raise ImageFormatError(f"{path}: b'labels' must be integers, got {labels.dtype} values")
    if data.shape[0] == 0:
        raise ImageFormatError(f'{path}: no images')
    if labels.min() < 0 or labels.max() > 9:
        raise ImageFormatError(f'{path}: labels must be in 0..9, found {labels.min()}..{labels.max()}')
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32) / 255.0
    return images, labels.astype(np.int32)


def load_cifar10(directory: str) -> ImageDataset:
    """Loads the CIFAR-10 python version (`data_batch_1..5`, `test_batch`) from `directory`.

    Raises:
      ImageFormatError: Naming the file, for missing or malformed batches.
    """
    if not os.path.isdir(directory):
        raise ImageFormatError(f'{directory}: no such directory')
    train = [_read_cifar_batch(os.path.join(directory, f'data_batch_{i}')) for i in range(1, 6)]
    test_images, test_labels = _read_cifar_batch(os.path.join(directory, 'test_batch'))
    return ImageDataset(
        'cifar10',
        np.concatenate([t[0] for t in train]),
        np.concatenate([t[1] for t in train]),
        test_images,
        test_labels,
    )
