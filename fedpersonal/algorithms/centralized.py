"""Centralized (server-side) training baseline with validation early stopping."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def train_centralized(
    keras_model: tf.keras.Model,
    *,
    train_dataset: tf.data.Dataset,
    validation_dataset: tf.data.Dataset,
    optimizer: tf.keras.optimizers.Optimizer,
    loss: tf.keras.losses.Loss,
    metrics: list[tf.keras.metrics.Metric],
    max_epochs: int,
    patience: int = 3,
    monitor: str = 'val_loss',
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, list[float]]:
    """Trains `keras_model` on pooled data; keeps the weights of the best epoch.

    Args:
      keras_model: An uncompiled Keras model (it is compiled here).
      train_dataset: Batched `(x, y)` or `{"x", "y"}` training data.
      validation_dataset: Batched validation data for early stopping.
      optimizer: A Keras optimizer.
      loss: The training loss.
      metrics: Keras metrics reported per epoch.
      max_epochs: Upper bound on epochs.
      patience: Epochs without improvement of `monitor` before stopping.
      monitor: The validation quantity to minimize.
      on_epoch_end: Called with `(epoch, logs)` after each epoch.

    Returns:
      The Keras history dict.
    """
    to_pair = lambda d: d.map(lambda b: (b['x'], b['y'])) if isinstance(d.element_spec, dict) else d
    keras_model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
    callbacks = [tf.keras.callbacks.EarlyStopping(monitor=monitor, patience=patience, restore_best_weights=True)]
    if on_epoch_end is not None:
        callbacks.append(tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: on_epoch_end(e + 1, logs)))
    history = keras_model.fit(
        to_pair(train_dataset),
        validation_data=to_pair(validation_dataset),
        epochs=max_epochs,
        callbacks=callbacks,
        verbose=0,
    )
    return history.history
