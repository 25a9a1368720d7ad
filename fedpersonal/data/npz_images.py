"""A user's own images from one ``.npz`` file (``--dataset=npz --data_path=FILE`` of the benchmark binary).

The file holds two arrays: ``x``, the images, numeric ``[N, H, W]`` (one channel) or ``[N, H, W, C]`` of any size
and channel count; and ``y``, the integer class of each image ``[N]``, from 0 (classes ``0..max(y)``). Written e.g.
with ``np.savez('digits.npz', x=images, y=labels)``. `load_npz` checks it up front and raises a `DataError` naming
the file and the problem (a missing array, a wrong rank or a channels-first layout, a length mismatch, non-numeric
or non-finite pixels, non-integer or negative labels, fewer than two classes) instead of letting it fail inside
TensorFlow.

Pixels are brought to [0, 1] as PFLlib's ``ToTensor`` does for its image datasets, then the partition normalizes
them to ``(x - 0.5) / 0.5`` as for MNIST and Fashion-MNIST (`fedpersonal.data.pfllib.federate`): ``uint8`` pixels
are divided by 255; other pixels already in [0, 1] stay; any other range is scaled by the file's global minimum and
maximum, ``(x - min) / (max - min)`` (e.g. scikit-learn's digits, 0..16). The dataset's name is the file's stem
(``digits`` for ``digits.npz``): the label of the results.

Example:

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), 'tiny.npz')
>>> np.savez(path, x=np.zeros((4, 8, 8), np.uint8), y=np.array([0, 1, 0, 1]))
>>> dataset = load_npz(path)
>>> dataset.name, dataset.train_images.shape, dataset.num_classes
('tiny', (4, 8, 8, 1), 2)
>>> np.savez(path, x=np.zeros((4, 8, 8)), y=np.array([0, 1, 0, -1]))
>>> load_npz(path)
Traceback (most recent call last):
...
fedpersonal.errors.DataError: ...tiny.npz: y has negative labels (-1 at row 3); classes are 0, 1, ..., K-1.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from fedpersonal import errors
from fedpersonal.data import image_datasets

__all__ = ['load_npz', 'to_unit_range']


def _fail(path: str, problem: str) -> errors.DataError:
    return errors.DataError(f'--data_path={path}: {problem}.')


def to_unit_range(x: np.ndarray) -> np.ndarray:
    """float32 pixels in [0, 1]: ``uint8 / 255``; others kept when already in [0, 1], else min-max scaled."""
    if x.dtype == np.uint8:
        return (x / np.float32(255)).astype(np.float32)
    x = x.astype(np.float32)
    low, high = float(x.min()), float(x.max())
    if low >= 0.0 and high <= 1.0:
        return x
    if high == low:
        return np.zeros_like(x)
    return ((x - np.float32(low)) / np.float32(high - low)).astype(np.float32)


def load_npz(path: str) -> image_datasets.ImageDataset:
    """The images and labels of `path` (format: the module docstring), all as train rows (the benchmark pools and
    partitions them), named by the file's stem.

    Raises:
      errors.DataError: The file cannot be read as ``.npz`` or its arrays are not images and integer labels; the
        message names the file and the problem.
    """
    if not os.path.isfile(path):
        raise _fail(path, 'is a directory' if os.path.isdir(path) else 'does not exist')
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise _fail(
            path, f'not readable as a .npz file (numpy: {error}); write it with np.savez(path, x=..., y=...)'
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _fail(path, 'is a single .npy array, not a .npz archive; write it with np.savez(path, x=..., y=...)')
    with archive:
        missing = [key for key in ('x', 'y') if key not in archive.files]
        if missing:
            raise _fail(
                path,
                f'no array {" or ".join(missing)} (it has {sorted(archive.files)}); the file needs x '
                '(images [N, H, W] or [N, H, W, C]) and y (integer labels [N])',
            )
        try:
            x, y = archive['x'], archive['y']
        except ValueError as error:  # Object arrays need pickle.
            raise _fail(path, f'an array is not numeric ({error})') from None
    if x.ndim not in (3, 4):
        raise _fail(path, f'x has shape {list(x.shape)}; expected images [N, H, W] or [N, H, W, C]')
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)) or x.dtype == np.bool_:
        raise _fail(path, f'x has dtype {x.dtype}; expected numeric pixels (integers or floats)')
    if x.ndim == 4 and x.shape[1] <= 4 < x.shape[3]:
        raise _fail(
            path,
            f"x has shape {list(x.shape)}, which looks channels-first (PyTorch's [N, C, H, W]); store "
            '[N, H, W, C], e.g. x.transpose(0, 2, 3, 1)',
        )
    if min(x.shape[1:]) < 1:
        raise _fail(path, f'x has shape {list(x.shape)}: an empty image dimension')
    if y.ndim != 1:
        raise _fail(path, f'y has shape {list(y.shape)}; expected one integer label per image [N]')
    if len(x) != len(y):
        raise _fail(path, f'x has {len(x)} images but y {len(y)} labels')
    if not len(x):
        raise _fail(path, 'no images (x and y are empty)')
    if np.issubdtype(x.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
        if bad.size:
            raise _fail(path, f'x has NaN or infinite pixels in {bad.size} images (first: row {bad[0]})')
    if np.issubdtype(y.dtype, np.floating):
        whole = np.isfinite(y) & (y == np.round(y))
        if not whole.all():
            row = int(np.flatnonzero(~whole)[0])
            raise _fail(path, f'y has non-integer labels ({y[row]!r} at row {row}); classes are 0, 1, ..., K-1')
    elif not np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        raise _fail(path, f'y has dtype {y.dtype}; expected integer labels')
    if (y < 0).any():
        row = int(np.flatnonzero(y < 0)[0])
        raise _fail(path, f'y has negative labels ({int(y[row])} at row {row}); classes are 0, 1, ..., K-1')
    labels = y.astype(np.int64)
    num_classes = int(labels.max()) + 1
    if num_classes < 2:
        raise _fail(path, f'y has a single class ({num_classes - 1}); classification needs at least two')
    images = to_unit_range(x if x.ndim == 4 else x[..., np.newaxis])
    name = os.path.splitext(os.path.basename(path))[0]
    empty = np.zeros((0, *images.shape[1:]), np.float32)
    return image_datasets.ImageDataset(
        name, images, labels.astype(np.int32), empty, np.zeros((0,), np.int32), num_classes
    )
