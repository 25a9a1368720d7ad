"""Centralized (server-side) training baseline: early stopping on validation, the best epoch's weights, and
epoch checkpoints a killed run resumes from."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from absl import logging

from fedpersonal import errors
from fedpersonal import progress
from fedpersonal.program import stop_signals

_EPOCH_PREFIX = 'epoch_'


def train_centralized(
    keras_model: tf.keras.Model,
    *,
    train_dataset: tf.data.Dataset | Callable[[int], tf.data.Dataset],
    validation_dataset: tf.data.Dataset,
    optimizer: tf.keras.optimizers.Optimizer,
    loss: tf.keras.losses.Loss,
    metrics: list[tf.keras.metrics.Metric],
    max_epochs: int,
    patience: int = 3,
    monitor: str = 'val_loss',
    mode: str = 'min',
    min_delta: float = 0.0,
    on_epoch_end: Callable[[int, dict[str, float]], object] | None = None,
    checkpoint_dir: str | None = None,
    name: str = 'centralized',
) -> dict[str, list[float]]:
    """Trains `keras_model` on pooled data; ends with the weights of the best epoch (by `monitor`).

    Unlike Keras' `EarlyStopping(restore_best_weights=True)`, which restores them only when it stops early, the
    best epoch's weights are restored however training ends.

    Args:
      keras_model: An uncompiled Keras model (it is compiled here).
      train_dataset: Batched `(x, y)` or `{"x", "y"}` training data, or ``epoch -> dataset`` (epochs from 1), e.g.
        shuffled with a seed of the epoch so that a resumed run sees the same order as an uninterrupted one.
      validation_dataset: Batched validation data for early stopping.
      optimizer: A Keras optimizer.
      loss: The training loss.
      metrics: Keras metrics reported per epoch.
      max_epochs: Upper bound on epochs.
      patience: Epochs without a better `monitor` before stopping (0: train `max_epochs` epochs).
      monitor: The logged validation quantity that selects the best epoch, e.g. ``'val_loss'`` or ``'val_auc'``.
      mode: ``'min'`` (the best epoch has the lowest `monitor`) or ``'max'`` (the highest); ties keep the earlier.
      min_delta: The least improvement of `monitor` on the best epoch so far that makes an epoch the new best (and
        restarts the patience count): with 0, a validation AUC creeping up by 1e-4 an epoch keeps training going
        until `max_epochs` (`improves`).
      on_epoch_end: Called with `(epoch, logs)` after each epoch (epochs from 1; not again for the epochs a resumed
        run restored).
      checkpoint_dir: If set, the model, the optimizer and the early-stopping state are written there after every
        epoch, and a run started again with the same arguments continues after the last epoch written (a
        checkpoint written under another `monitor` or `mode` is refused: its best epoch is another one). A SIGINT
        or SIGTERM stops training after the epoch in flight is written (`KeyboardInterrupt` / `SystemExit(143)`).
      name: The run's name in the log line of each epoch.

    Returns:
      The history: each logged quantity per epoch, over all epochs run (restored ones included).
    """
    if mode not in ('min', 'max'):
        raise ValueError(f"train_centralized: mode must be 'min' or 'max', got {mode!r}.")
    if not min_delta >= 0:
        raise errors.ConfigError(f'train_centralized: min_delta must be >= 0, got {min_delta}.')
    to_pair = lambda d: d.map(lambda b: (b['x'], b['y'])) if isinstance(d.element_spec, dict) else d
    keras_model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
    if hasattr(optimizer, 'build'):  # Its variables exist before a checkpoint is restored into them.
        optimizer.build(keras_model.trainable_variables)
    else:  # A legacy (v2) optimizer, e.g. from `tf.keras.optimizers.get`.
        optimizer._create_all_weights(keras_model.trainable_variables)  # pylint: disable=protected-access
    state: dict = {'epoch': 0, 'best': None, 'best_epoch': 0, 'history': {}, 'monitor': monitor, 'mode': mode}
    best_weights = keras_model.get_weights()
    checkpoint = tf.train.Checkpoint(model=keras_model, optimizer=optimizer)
    if checkpoint_dir is not None:
        restored = _restore(checkpoint_dir, checkpoint)
        if restored is not None:
            state, best_weights = restored
            # Checkpoints written before the selection was recorded selected on the lowest validation loss.
            recorded = (state.setdefault('monitor', 'val_loss'), state.setdefault('mode', 'min'))
            if recorded != (monitor, mode):  # A ConfigError: the binaries print it without a traceback.
                raise errors.ConfigError(
                    f'train_centralized: the checkpoints in {checkpoint_dir} select the best epoch by {recorded[0]} '
                    f'({recorded[1]}), this run by {monitor} ({mode}); delete that directory to start over.'
                )
            logging.info(
                'Resumed centralized training after epoch %d (best epoch %d).', state['epoch'], state['best_epoch']
            )
    validation = to_pair(validation_dataset)
    epoch_seconds: list[float] = []  # This process's epochs (restored ones were timed by another).
    # SIGINT / SIGTERM stop after the epoch in flight, once it is checkpointed (`fedpersonal.program.stop_signals`).
    with stop_signals.deferred():
        while state['epoch'] < max_epochs and not (0 < patience <= state['epoch'] - state['best_epoch']):
            epoch = state['epoch'] + 1
            started = time.monotonic()
            data = train_dataset(epoch) if callable(train_dataset) else train_dataset
            logs = keras_model.fit(to_pair(data), validation_data=validation, epochs=1, verbose=0).history
            logs = {k: float(v[-1]) for k, v in logs.items()}
            if monitor not in logs:
                raise ValueError(f'train_centralized: monitor {monitor!r} is not logged; it logs {sorted(logs)}.')
            for key, value in logs.items():
                state['history'].setdefault(key, []).append(value)
            state['epoch'] = epoch
            if improves(logs[monitor], state['best'], mode=mode, min_delta=min_delta):
                state['best'], state['best_epoch'] = logs[monitor], epoch
                best_weights = keras_model.get_weights()
            epoch_seconds.append(time.monotonic() - started)
            logging.info(
                '[%s] %s  %s',
                name,
                progress.epoch_text(epoch, max_epochs, epoch_seconds, early_stopping=patience > 0),
                '  '.join(f'{k}={v:.4f}' for k, v in logs.items()),
            )
            if on_epoch_end is not None:
                on_epoch_end(epoch, logs)
            if checkpoint_dir is not None:
                _save(checkpoint_dir, checkpoint, state, best_weights)
            if stop_signals.pending():
                stop_signals.stop(name, epoch, unit='epoch')
    keras_model.set_weights(best_weights)
    return state['history']


def improves(value: float, best: float | None, *, mode: str = 'min', min_delta: float = 0.0) -> bool:
    """Whether an epoch's `value` of the monitor makes it the new best epoch (`best`: None before the first).

    Better than `best` by more than `min_delta`, as `fedpersonal.program.EarlyStopping` rules on federated rounds.

    >>> improves(0.7004, 0.7, mode='max'), improves(0.7004, 0.7, mode='max', min_delta=1e-3)
    (True, False)
    """
    if best is None:
        return True
    return value < best - min_delta if mode == 'min' else value > best + min_delta


def best_epoch(
    history: dict[str, list[float]], *, monitor: str = 'val_loss', mode: str = 'min', min_delta: float = 0.0
) -> int:
    """The epoch (from 1) `train_centralized` ended with, given its returned `history` and selection."""
    best, epoch = None, 0
    for i, value in enumerate(history[monitor], start=1):
        if improves(value, best, mode=mode, min_delta=min_delta):
            best, epoch = value, i
    return epoch


def epoch_shuffled(examples: tf.data.Dataset, batch_size: int, *, seed: int) -> Callable[[int], tf.data.Dataset]:
    """``epoch -> batches``: the (unbatched, finite) `examples` fully shuffled with a seed derived from (`seed`,
    epoch), so the order of every epoch is the same in a resumed run as in an uninterrupted one."""
    size = int(examples.cardinality())
    if size < 0:
        raise ValueError('epoch_shuffled needs a dataset of known, finite size (e.g. from_tensor_slices).')
    return lambda epoch: examples.shuffle(
        max(size, 1), seed=seed * 100_003 + epoch, reshuffle_each_iteration=False
    ).batch(batch_size)


def split_logs(logs: dict[str, float]) -> dict[str, dict[str, float]]:
    """Keras epoch logs as ``{'train': ..., 'eval': ...}`` (the ``val_`` quantities under 'eval', unprefixed), the
    shape of a federated round's metrics."""
    return {
        'train': {k: v for k, v in logs.items() if not k.startswith('val_')},
        'eval': {k[4:]: v for k, v in logs.items() if k.startswith('val_')},
    }


def _save(directory: str, checkpoint: tf.train.Checkpoint, state: dict, best_weights: list[np.ndarray]) -> None:
    """Writes epoch ``state['epoch']`` as ``epoch_<N>`` (complete once renamed from its temporary name), then
    deletes the older ones."""
    name = f'{_EPOCH_PREFIX}{state["epoch"]}'
    temporary = os.path.join(directory, f'.{name}')
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    checkpoint.write(os.path.join(temporary, 'last'))
    np.savez(os.path.join(temporary, 'best_weights.npz'), *best_weights)
    with open(os.path.join(temporary, 'state.json'), 'w') as f:
        json.dump(state, f)
    os.replace(temporary, os.path.join(directory, name))
    for entry in os.listdir(directory):
        if entry != name and (entry.startswith(_EPOCH_PREFIX) or entry.startswith(f'.{_EPOCH_PREFIX}')):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def _restore(directory: str, checkpoint: tf.train.Checkpoint) -> tuple[dict, list[np.ndarray]] | None:
    """The state and best weights of the latest complete epoch in `directory` (None if there is none); restores
    the model and the optimizer to the end of that epoch."""
    if not os.path.isdir(directory):
        return None
    epochs = [int(e[len(_EPOCH_PREFIX) :]) for e in os.listdir(directory) if e.startswith(_EPOCH_PREFIX)]
    if not epochs:
        return None
    path = os.path.join(directory, f'{_EPOCH_PREFIX}{max(epochs)}')
    checkpoint.read(os.path.join(path, 'last')).assert_consumed()
    with open(os.path.join(path, 'state.json')) as f:
        state = json.load(f)
    with np.load(os.path.join(path, 'best_weights.npz')) as best:
        best_weights = [best[f'arr_{i}'] for i in range(len(best.files))]
    return state, best_weights
