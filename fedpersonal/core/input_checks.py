"""Checks of a round's client data against the process's model and loss, before the data reaches TensorFlow.

A sparse categorical cross-entropy takes integer labels in ``[0, width)``, ``width`` the model's outputs. TensorFlow
does not check them on CPU: a label at or past the width gives a NaN loss, and accuracy is still computed and
reported, so the numbers look plausible (issue 62: labels 1-10 on a 10-way output reported 71% accuracy).
`LabelCheck` refuses such labels with `LabelRangeError`, naming the client, the offending values and the width.

`label_check(model_fn, loss_fn)` is the check of a process built from a model and a Keras loss
(`fedpersonal.backends.build_process` sets it as `PersonalizedProcess.input_check`), or None when the loss is not a
sparse categorical cross-entropy or the model's output width is not static. `PersonalizedProcess.run_round` runs it
on each client's data once per client id: the engine on the batches it materializes anyway
(`fedpersonal.simulation.packing.ClientPacker`), the per-client backend by one pass over the client's labels.

`check_num_classes` compares the model's width with the number of classes a task's data declares (e.g. the
PFLlib benchmark's), naming both numbers.

Example:

>>> import numpy as np
>>> LabelCheck(width=10).check_labels('7', np.array([0, 3, 9]))  # In range: nothing happens.
>>> try:
...     LabelCheck(width=10).check_labels('7', np.array([1, 10, 10]))
... except LabelRangeError as error:
...     print(error.client_id, error.labels, error.width)
7 [10] 10
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import errors
from fedpersonal.models import partially_local_model

_SHOWN = 10  # Offending label values named in a message.


class LabelRangeError(errors.DataError):
    """A client's labels are not integers in ``[0, width)`` of the model's classification loss.

    Attributes:
      client_id: The client (or ``'#<position>'`` in the round when run without client ids).
      labels: The offending label values (sorted, at most 10).
      width: The model's number of outputs.
    """

    def __init__(self, message: str, *, client_id: str, labels: list[Any], width: int):
        super().__init__(message)
        self.client_id, self.labels, self.width = client_id, labels, width


class OutputWidthError(errors.ConfigError):
    """The model's number of outputs differs from the number of classes the task's data declares."""


@dataclasses.dataclass(frozen=True)
class LabelCheck:
    """Integer class labels in ``[0, width)`` (a sparse categorical cross-entropy's), checked per client.

    Attributes:
      width: The model's number of outputs (the last dimension of its predictions).
      ignore_class: A label value the loss ignores (Keras' ``ignore_class``), allowed too.
    """

    width: int
    ignore_class: int | None = None

    def check_labels(self, client_id: str, labels: Any) -> None:
        """Raises `LabelRangeError` unless every value of `labels` is an integer in ``[0, width)``.

        Args:
          client_id: Named in the message.
          labels: The client's labels (any shape).
        """
        values = np.asarray(labels).reshape(-1)
        if not values.size:
            return
        if values.dtype.kind not in 'iuf':  # Strings or booleans: no class index at all.
            raise LabelRangeError(
                f'client {client_id!r}: labels of dtype {values.dtype} cannot be the classes of a sparse categorical '
                f'cross-entropy; give integer labels in [0, {self.width}).',
                client_id=client_id,
                labels=[],
                width=self.width,
            )
        bad = ~((values >= 0) & (values < self.width))  # NaN compares False: bad.
        if values.dtype.kind == 'f':
            bad |= np.not_equal(values, np.floor(values))
        if self.ignore_class is not None:
            bad &= values != self.ignore_class
        if not bad.any():
            return
        offending = np.unique(values[bad])
        shown = [v.item() for v in offending[:_SHOWN]]
        more = f' and {offending.size - _SHOWN} more values' if offending.size > _SHOWN else ''
        hint = (
            'Labels 1..K look 1-based: subtract 1. '
            if offending.min() == self.width and np.min(values) >= 1
            else 'Give the model as many outputs as classes, or map the labels to 0..K-1. '
        )
        raise LabelRangeError(
            f'client {client_id!r}: labels {shown}{more} ({int(bad.sum())} of its {values.size} examples) are outside '
            f"[0, {self.width}), the classes of the model's {self.width} outputs: a sparse categorical cross-entropy "
            f'gives a NaN loss for them (TensorFlow does not check) while accuracy is still reported. {hint}'
            '(Labels must be integers in [0, number of outputs).)',
            client_id=client_id,
            labels=shown,
            width=self.width,
        )

    def check_batches(self, client_id: str, batches: Iterable[Any]) -> None:
        """`check_labels` on the labels of a client's batches (numpy ``(x, y)`` pairs or ``{'x', 'y'}`` mappings)."""
        labels = [np.asarray(partially_local_model.split_batch(b)[1]).reshape(-1) for b in batches]
        if labels:
            self.check_labels(client_id, np.concatenate(labels))

    def check_dataset(self, client_id: str, dataset: tf.data.Dataset) -> None:
        """`check_labels` on a client's `tf.data.Dataset` of batches: one pass over its labels."""
        labels = dataset.map(lambda batch: tf.reshape(partially_local_model.split_batch(batch)[1], [-1]))
        values = [np.asarray(y) for y in labels.as_numpy_iterator()]
        if values:
            self.check_labels(client_id, np.concatenate(values))


def _is_sparse_categorical(loss: Any) -> bool:
    return isinstance(loss, tf.keras.losses.SparseCategoricalCrossentropy) or (
        getattr(loss, 'fn', None) is tf.keras.losses.sparse_categorical_crossentropy
    )


def label_check(model_fn: Callable[[], Any], loss_fn: Callable[[], Any]) -> LabelCheck | None:
    """The `LabelCheck` of a model trained with a Keras loss, or None where there is nothing to check.

    Nothing to check: the loss is not a sparse categorical cross-entropy, the model's predictions are not one
    tensor with a static last dimension, or its input spec is not ``(x, y)``. The model is built once, in a graph
    of its own (its predictions' shape from the input spec, nothing run).

    Args:
      model_fn: No-arg function returning a `tff.learning.models.ReconstructionModel` (``input_spec`` and
        ``predict_on_batch``), e.g. `fedpersonal.models.from_keras_model`'s.
      loss_fn: No-arg function returning the Keras loss.
    """
    with tf.Graph().as_default():
        try:
            loss = loss_fn()
        except TypeError:  # A bad loss_fn is named where the loss is built (`check_loss_and_metrics_fns`).
            return None
        if not _is_sparse_categorical(loss):
            return None
        model = model_fn()
        try:
            x_spec, _ = partially_local_model.split_batch(model.input_spec)
        except (AttributeError, KeyError, IndexError, TypeError):
            return None
        placeholders = tf.nest.map_structure(lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), x_spec)
        predictions = model.predict_on_batch(placeholders, training=False)
    if not isinstance(predictions, tf.Tensor) or predictions.shape.rank is None or predictions.shape.rank < 1:
        return None
    width = predictions.shape[-1]
    if width is None:
        return None
    ignore_class = getattr(loss, '_fn_kwargs', {}).get('ignore_class')
    return LabelCheck(int(width), None if ignore_class is None else int(ignore_class))


def check_num_classes(process: Any, num_classes: int, *, source: str) -> None:
    """Raises `OutputWidthError` when the model of `process` (its `input_check`) has not `num_classes` outputs.

    Args:
      process: A `PersonalizedProcess` (a process without a label check passes).
      num_classes: The classes the task's data declares.
      source: What declares them, named in the message (e.g. ``"fashion_mnist's labels"``).
    """
    check = getattr(process, 'input_check', None)
    if isinstance(check, LabelCheck) and check.width != num_classes:
        raise OutputWidthError(
            f'The model has {check.width} outputs but {source} has {num_classes} classes: with fewer outputs the '
            'labels past them give NaN losses, with more the extra outputs never match a label. Build the model with '
            f'{num_classes} outputs.'
        )
