"""An in-memory table and a partition as a `tff.simulation.datasets.ClientData`.

`from_partition` gives client ``client_ids[c]`` the rows ``partition[c]`` of every column, in that order, as
unbatched ``OrderedDict(column=value)`` elements (column order and dtypes as given). Its dataset function serves
both of TFF's paths: a python ``str`` client id (``create_tf_dataset_for_client``) slices views of the rows
gathered once in client order; a ``tf.string`` tensor (``dataset_computation``, ``create_tf_dataset_from_all_clients``
when traced) looks the id up among the ids and slices constant tensors of those rows, which are then embedded in
the traced graph.

Example:

>>> import numpy as np
>>> cd = from_partition({'x': np.arange(5.0), 'y': np.arange(5)}, [np.array([4, 0]), np.array([2])])
>>> cd.client_ids
['0', '1']
>>> [int(e['y']) for e in cd.create_tf_dataset_for_client('0')]
[4, 0]
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedpersonal import errors

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow_federated as tff

__all__ = ['from_partition']


def from_partition(
    columns: Mapping[str, np.ndarray],
    partition: Sequence[np.ndarray],
    client_ids: Sequence[str] | None = None,
) -> tff.simulation.datasets.ClientData:
    """A `ClientData` whose client ``client_ids[c]`` holds the rows ``partition[c]`` of `columns`, in that order.

    Args:
        columns: Column name -> array ``[N, ...]`` (all with the same first dimension).
        partition: One int array of row indices per client (e.g. from `fedpersonal.data.partition`).
        client_ids: One id per client (default ``'0'``, ``'1'``, ...).

    Returns:
        The ClientData.

    Raises:
        DataError: No columns, columns of different lengths, a row index out of range, or no clients.
        ConfigError: `client_ids` of the wrong length or with a repeat.
    """
    import tensorflow as tf  # Lazy: partitioning does not need TensorFlow.
    import tensorflow_federated as tff

    arrays = collections.OrderedDict((str(k), np.asarray(v)) for k, v in columns.items())
    if not arrays:
        raise errors.DataError('columns is empty')
    lengths = {name: a.shape[0] if a.ndim else -1 for name, a in arrays.items()}
    if len(set(lengths.values())) != 1 or -1 in lengths.values():
        raise errors.DataError(f'columns must be arrays with the same first dimension, got lengths {lengths}')
    num_rows = next(iter(lengths.values()))
    parts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in partition]
    if not parts:
        raise errors.DataError('the partition has no clients')
    for c, rows in enumerate(parts):
        if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
            raise errors.DataError(f'client {c}: row indices must be in 0..{num_rows - 1}')
    ids = [str(i) for i in range(len(parts))] if client_ids is None else [str(i) for i in client_ids]
    if len(ids) != len(parts) or len(set(ids)) != len(ids):
        raise errors.ConfigError(
            f'client_ids must be {len(parts)} distinct ids, got {len(ids)} ({len(set(ids))} distinct)'
        )

    counts = np.array([p.size for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rows = np.concatenate(parts)
    if np.array_equal(rows, np.arange(num_rows)):  # Already in client order: no copy.
        gathered = arrays
    else:
        gathered = collections.OrderedDict((name, a[rows]) for name, a in arrays.items())
    per_client = {
        cid: collections.OrderedDict((name, a[o : o + n]) for name, a in gathered.items())
        for cid, o, n in zip(ids, offsets, counts)
    }

    def serializable_dataset_fn(client_id):
        if isinstance(client_id, bytes):
            client_id = client_id.decode('utf-8')
        if isinstance(client_id, str):
            try:
                return tf.data.Dataset.from_tensor_slices(per_client[client_id])
            except KeyError:
                raise errors.ConfigError(f'unknown client id {client_id!r}') from None
        match = tf.where(tf.equal(tf.constant(ids), client_id))
        with tf.control_dependencies([tf.debugging.assert_equal(tf.size(match), 1, message='unknown client id')]):
            index = tf.reshape(match, [-1])[0]
        start = tf.gather(tf.constant(offsets), index)
        stop = start + tf.gather(tf.constant(counts), index)
        return tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict((name, tf.constant(a)[start:stop]) for name, a in gathered.items())
        )

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(ids, serializable_dataset_fn)
