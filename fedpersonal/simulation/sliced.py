"""The batches of an array-backed tf.data pipeline, cut from its arrays by numpy, without running the pipeline.

A client's dataset is most often its arrays sliced into examples and batched: ``from_tensor_slices(arrays)``
followed by ``repeat``, ``take``, ``skip``, ``batch`` or ``prefetch`` (TFF's ``TestClientData``,
`fedpersonal.data.client_data.from_partition`, the image and CSV loaders, README's loop). Iterating such a dataset
costs an iterator and a pass through tf.data for what is an index computation; `array_batches` reads the pipeline's
description instead (its source tensors and each stage's arguments) and gives the same batches, value for value, as
its iterator. Any other stage (``map``, ``shuffle``, ``filter``, options, ragged or string leaves, a pipeline from a
traced function) gives None: the caller then iterates the dataset as before.

The description is read from tf.data's dataset objects (their input and argument attributes, TF 2.14); a stage whose
attributes are not as expected is treated as unknown, so a change in TF costs speed, not numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal.core import array_data

# The stages understood, by the class names tf.data gives them (module `tensorflow.python.data.ops`).
_SOURCE = '_TensorSliceDataset'
_STAGES = frozenset({'_BatchDataset', '_RepeatDataset', '_TakeDataset', '_SkipDataset', '_PrefetchDataset'})


def _scalar(value: Any) -> int | None:
    """A stage argument as a Python int, or None if it is not a known scalar (e.g. a symbolic tensor)."""
    try:
        array = np.asarray(value.numpy() if hasattr(value, 'numpy') else value)
    except Exception:  # pylint: disable=broad-except
        return None
    if array.shape != () or array.dtype.kind not in 'iub':
        return None
    return int(array)


def _count(index: Any, stage: str, count: int) -> Any:
    """Rows or batches (an index array or a list of them) after a `repeat`, `take` or `skip` of `count`, or None."""
    size = len(index)
    if stage == '_RepeatDataset':
        if count < 0:  # Forever: not a finite list of batches.
            return None
        return np.tile(index, count) if isinstance(index, np.ndarray) else index * count
    if stage == '_TakeDataset':
        return index if count < 0 else index[: min(count, size)]
    return index[size:] if count < 0 else index[min(count, size) :]  # `_SkipDataset`: -1 skips everything.


def array_batches(dataset: tf.data.Dataset) -> list[Any] | None:
    """The batches `dataset`'s iterator yields, as numpy structures, if it is an array pipeline; else None.

    Args:
      dataset: Any tf.data dataset.

    Returns:
      What ``list(dataset.as_numpy_iterator())`` gives (same values, dtypes, shapes and order), computed from the
      arrays of its ``from_tensor_slices`` source, when every stage after that source is ``batch`` (not
      parallel), ``repeat`` (a finite count), ``take``, ``skip`` or ``prefetch``, and every leaf is a numeric or
      boolean dense tensor; else None.

    Example:

    >>> import numpy as np, tensorflow as tf
    >>> data = tf.data.Dataset.from_tensor_slices({'y': np.arange(5)}).repeat(2).skip(1).batch(4)
    >>> [b['y'].tolist() for b in array_batches(data)]
    [[1, 2, 3, 4], [0, 1, 2, 3], [4]]
    >>> array_batches(data.map(lambda e: e)) is None
    True
    """
    stages = []
    node = dataset
    while type(node).__name__ != _SOURCE:
        if type(node).__name__ not in _STAGES or not hasattr(node, '_input_dataset'):
            return None
        stages.append(node)
        node = node._input_dataset  # pylint: disable=protected-access
    spec = node.element_spec
    tensors = getattr(node, '_tensors', None)
    leaves_spec = tf.nest.flatten(spec)
    if tensors is None or len(tensors) != len(leaves_spec):
        return None
    if not all(
        type(s) is tf.TensorSpec and (s.dtype.is_floating or s.dtype.is_integer or s.dtype.is_bool) for s in leaves_spec
    ):
        return None
    if not all(isinstance(t, tf.Tensor) and hasattr(t, 'numpy') for t in tensors):  # Eager: a traced graph has none.
        return None
    arrays = [t.numpy() for t in tensors]
    if not arrays or any(a.ndim < 1 or len(a) != len(arrays[0]) for a in arrays):
        return None
    rows: Any = np.arange(len(arrays[0]))
    batched = False
    for stage in reversed(stages):
        name = type(stage).__name__
        if name == '_PrefetchDataset':
            continue
        if name == '_BatchDataset':
            size = _scalar(getattr(stage, '_batch_size', None))
            drop = _scalar(getattr(stage, '_drop_remainder', None))
            if batched or size is None or size < 1 or drop is None:
                return None
            rows = array_data.batch_rows(rows, size, bool(drop))
            batched = True
            continue
        count = _scalar(getattr(stage, '_count', None))
        if count is None:
            return None
        rows = _count(rows, name, count)
        if rows is None:
            return None
    if not batched:
        return None  # Examples, not batches: not what a client's training reads.
    return [tf.nest.pack_sequence_as(spec, [a[index] for a in arrays]) for index in rows]
