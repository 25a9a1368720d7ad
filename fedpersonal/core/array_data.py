"""Clients' data given as arrays: a tf.data dataset for whoever iterates it, numpy batches for whoever packs it.

Most clients' data is a few arrays (features, labels) that training reads in batches. Building a tf.data pipeline
for each client costs about half a millisecond, and iterating it more; a round whose clients are all new (FURL's
1M users, FedRecon's unseen users) pays that for each. `ArrayDatasets` holds, for each client id, a function giving
its arrays and how they are batched: indexed, it builds the pipeline any backend takes
(``from_tensor_slices(arrays).repeat(epochs).batch(batch_size, drop_remainder)``); `ArrayDatasets.numpy_batches`
gives the same batches, value for value, cut by numpy without building it, which the simulation engine reads.

Example:

>>> import numpy as np
>>> data = ArrayDatasets(['a', 'b'], lambda c: {'y': np.arange(3 if c == 'a' else 1)}, batch_size=2)
>>> [b['y'].tolist() for b in data.numpy_batches(0)]
[[0, 1], [2]]
>>> [b['y'].tolist() for b in data[0].as_numpy_iterator()]
[[0, 1], [2]]
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import errors


def batch_rows(rows: np.ndarray, batch_size: int, drop_remainder: bool) -> list[np.ndarray]:
    """`rows` (example indices) cut into batches as tf.data's ``batch(batch_size, drop_remainder)`` cuts them."""
    end = len(rows) - len(rows) % batch_size if drop_remainder else len(rows)
    return [rows[k : k + batch_size] for k in range(0, end, batch_size)]


class ArrayDatasets(Sequence):
    """Clients' arrays, batched: a sequence of tf.data datasets (what `PersonalizedProcess.run_round` takes) whose
    batches the simulation engine reads as numpy, without building a pipeline.

    Args:
      client_ids: The clients, in the order the sequence gives them.
      arrays: A client id's arrays: a structure (dict, tuple, ...) of numpy arrays of one length, its examples (a
        mapping from id to structure, or a function called when the client is read).
      batch_size: Examples per batch.
      epochs: Passes over the examples (batches run across the passes' boundary, as ``repeat`` then ``batch``).
      drop_remainder: Drop a last batch smaller than `batch_size`.

    Raises:
      ConfigError: `batch_size` or `epochs` below 1 (at construction); a client's arrays of different lengths, or
        of no examples dimension, when it is read (naming the client).
    """

    def __init__(
        self,
        client_ids: Sequence[str],
        arrays: Callable[[str], Any] | Mapping[str, Any],
        batch_size: int,
        *,
        epochs: int = 1,
        drop_remainder: bool = False,
    ):
        if int(batch_size) < 1:
            raise errors.ConfigError(f'ArrayDatasets: batch_size must be at least 1, got {batch_size}.')
        if int(epochs) < 1:
            raise errors.ConfigError(f'ArrayDatasets: epochs must be at least 1, got {epochs}.')
        self._client_ids = [str(c) for c in client_ids]
        self._arrays = arrays.__getitem__ if isinstance(arrays, Mapping) else arrays
        self.batch_size, self.epochs, self.drop_remainder = int(batch_size), int(epochs), bool(drop_remainder)

    @property
    def client_ids(self) -> list[str]:
        """The clients' ids, in order."""
        return list(self._client_ids)

    def __len__(self) -> int:
        return len(self._client_ids)

    def _leaves(self, index: int) -> tuple[Any, list[np.ndarray]]:
        client_id = self._client_ids[index]
        structure = self._arrays(client_id)
        leaves = [np.asarray(a) for a in tf.nest.flatten(structure)]
        if not leaves or any(a.ndim < 1 for a in leaves) or len({len(a) for a in leaves}) != 1:
            shapes = [a.shape for a in leaves]
            raise errors.ConfigError(
                f'ArrayDatasets: client {client_id!r} has arrays of shapes {shapes}; every array needs the same '
                'first (examples) dimension.'
            )
        return structure, leaves

    def numpy_batches(self, index: int) -> list[Any]:
        """Client `index`'s batches as numpy structures: what iterating ``self[index]`` yields."""
        structure, leaves = self._leaves(index)
        rows = np.tile(np.arange(len(leaves[0])), self.epochs)
        return [
            tf.nest.pack_sequence_as(structure, [a[r] for a in leaves])
            for r in batch_rows(rows, self.batch_size, self.drop_remainder)
        ]

    def _dataset(self, index: int) -> tf.data.Dataset:
        structure, leaves = self._leaves(index)
        dataset = tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(structure, leaves))
        return dataset.repeat(self.epochs).batch(self.batch_size, self.drop_remainder)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._dataset(i) for i in range(len(self))[index]]
        return self._dataset(index)
