"""The centralized baseline: the best epoch's weights however training ends, patience, and exact resumption."""

import json
import logging
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.baselines import centralized


def _model(seed=0):
    inputs = tf.keras.Input(shape=(3,))
    hidden = tf.keras.layers.Dense(8, activation='tanh', kernel_initializer=tf.keras.initializers.GlorotUniform(seed))
    output = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 1))
    return tf.keras.Model(inputs, output(hidden(inputs)))


def _line(slope):
    """y = slope * x on a 1-D input: trained towards 2, validated at 1, the validation loss falls then rises."""
    x = np.linspace(-1, 1, 16, dtype=np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((x, slope * x))


def _scalar_model():
    inputs = tf.keras.Input(shape=(1,))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')(inputs))


def _train_line(patience, epochs=12, mode='min', checkpoint_dir=None, min_delta=0.0):
    model, weights = _scalar_model(), []
    history = centralized.train_centralized(
        model,
        train_dataset=_line(2.0).batch(16),
        validation_dataset=_line(1.0).batch(16),
        optimizer=tf.keras.optimizers.SGD(0.3),
        loss=tf.keras.losses.MeanSquaredError(),
        metrics=[],
        max_epochs=epochs,
        patience=patience,
        mode=mode,
        min_delta=min_delta,
        on_epoch_end=lambda epoch, logs: weights.append(model.get_weights()[0].item()),
        checkpoint_dir=checkpoint_dir,
    )
    return model.get_weights()[0].item(), weights, history['val_loss']


def test_ends_with_the_best_epochs_weights_when_it_does_not_stop_early():
    final, per_epoch, val_loss = _train_line(patience=0)
    assert len(val_loss) == 12  # Patience 0: every epoch.
    best = int(np.argmin(val_loss))
    assert 0 < best < 11 and val_loss[-1] > val_loss[best]  # The validation loss fell, then rose.
    assert final == per_epoch[best] and final != per_epoch[-1]


def test_stops_after_patience_epochs_without_a_lower_validation_loss():
    final, per_epoch, val_loss = _train_line(patience=2)
    best = int(np.argmin(val_loss))
    assert len(val_loss) == best + 1 + 2
    assert final == per_epoch[best]


def test_improvements_smaller_than_min_delta_do_not_count_and_training_stops(caplog):
    _, _, falling = _train_line(patience=0, epochs=3)
    assert falling[0] - falling[1] > 0.01 and falling[1] - falling[2] > 0.01  # Real improvements, but small ones...
    min_delta = max(falling) + 1.0  # ... below a min_delta larger than any change.
    with caplog.at_level(logging.INFO, logger='absl'):
        final, per_epoch, val_loss = _train_line(patience=2, min_delta=min_delta)
    assert len(val_loss) == 3  # Epoch 1, then 2 epochs of patience.
    assert final == per_epoch[0]  # Epoch 1 stays the best: the later lower losses did not improve by min_delta.
    assert centralized.best_epoch({'val_loss': val_loss}, min_delta=min_delta) == 1
    assert centralized.best_epoch({'val_loss': val_loss}) == 3
    lines = [r.getMessage() for r in caplog.records if '] epoch ' in r.getMessage()]
    assert [re.search(r'epoch (\d+/\d+)  eta <=\d+s', line).group(1) for line in lines] == ['1/12', '2/12', '3/12']
    _, _, unlimited = _train_line(patience=2)
    assert len(unlimited) > 3  # The same run with min_delta 0 keeps training.


def test_a_validation_auc_creeping_up_is_no_improvement_with_min_delta():
    auc = [0.70 + 1e-4 * epoch for epoch in range(4)]  # What a patience of 3 ran with min_delta=1e-3.
    assert centralized.best_epoch({'val_auc': auc}, monitor='val_auc', mode='max') == 4
    assert centralized.best_epoch({'val_auc': auc}, monitor='val_auc', mode='max', min_delta=1e-3) == 1
    assert centralized.improves(0.7011, 0.70, mode='max', min_delta=1e-3)
    assert not centralized.improves(0.7009, 0.70, mode='max', min_delta=1e-3)
    assert centralized.improves(0.79, 0.80, mode='min', min_delta=1e-3)
    assert not centralized.improves(0.7995, 0.80, mode='min', min_delta=1e-3)
    with pytest.raises(ValueError, match='min_delta must be >= 0'):
        _train_line(patience=2, min_delta=-0.1)


def test_max_mode_ends_with_the_epoch_of_the_highest_monitor():
    final, per_epoch, val_loss = _train_line(patience=0, epochs=6, mode='max')
    best = int(np.argmax(val_loss))
    assert val_loss[best] > min(val_loss) and final == per_epoch[best] and final != per_epoch[int(np.argmin(val_loss))]
    assert centralized.best_epoch({'val_loss': val_loss}, mode='max') == best + 1
    assert centralized.best_epoch({'val_loss': val_loss}) == int(np.argmin(val_loss)) + 1


def test_checkpoints_of_another_selection_are_refused(tmp_path):
    directory = str(tmp_path / 'checkpoints')
    _train_line(patience=0, epochs=2, checkpoint_dir=directory)
    with pytest.raises(
        ValueError, match=re.escape(f'checkpoints in {directory} select the best epoch by val_loss (min)')
    ):
        _train_line(patience=0, epochs=3, mode='max', checkpoint_dir=directory)
    # Checkpoints written before the selection was recorded selected on the lowest validation loss.
    state_path = os.path.join(directory, 'epoch_2', 'state.json')
    with open(state_path) as f:
        state = json.load(f)
    with open(state_path, 'w') as f:
        json.dump({k: v for k, v in state.items() if k not in ('monitor', 'mode')}, f)
    with pytest.raises(ValueError, match=re.escape('by val_loss (min), this run by val_loss (max)')):
        _train_line(patience=0, epochs=3, mode='max', checkpoint_dir=directory)
    _, per_epoch, val_loss = _train_line(patience=0, epochs=3, checkpoint_dir=directory)  # Resumes at epoch 3.
    assert len(per_epoch) == 1 and len(val_loss) == 3


def _examples():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None] + 0.1 * rng.normal(size=(40, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices({'x': x, 'y': y})


def _train_shuffled(checkpoint_dir, optimizer, max_epochs=6, fail_at=None, terminate_at=None):
    model, logged = _model(), []

    def on_epoch_end(epoch, logs):
        if epoch == fail_at:
            raise KeyboardInterrupt('killed')
        if epoch == terminate_at:
            os.kill(os.getpid(), signal.SIGTERM)
        logged.append(epoch)

    history = centralized.train_centralized(
        model,
        train_dataset=centralized.epoch_shuffled(_examples(), 8, seed=3),
        validation_dataset=_examples().take(10).batch(8),
        optimizer=optimizer,
        loss=tf.keras.losses.MeanSquaredError(),
        metrics=[tf.keras.metrics.MeanAbsoluteError()],
        max_epochs=max_epochs,
        patience=0,
        on_epoch_end=on_epoch_end,
        checkpoint_dir=checkpoint_dir,
    )
    return model.get_weights(), history, logged


@pytest.mark.parametrize(
    'optimizer',
    [
        lambda: tf.keras.optimizers.Adam(0.05),
        lambda: tf.keras.optimizers.get({'class_name': 'adam', 'config': {'learning_rate': 0.05}}),  # Legacy.
    ],
    ids=['adam', 'legacy_adam'],
)
def test_a_killed_run_resumes_to_the_same_weights_and_history(tmp_path, optimizer):
    uninterrupted, history, logged = _train_shuffled(str(tmp_path / 'once'), optimizer())
    assert logged == [1, 2, 3, 4, 5, 6]
    with pytest.raises(KeyboardInterrupt):
        _train_shuffled(str(tmp_path / 'twice'), optimizer(), fail_at=4)  # Epochs 1-3 written; 4 lost.
    resumed, resumed_history, logged = _train_shuffled(str(tmp_path / 'twice'), optimizer())
    assert logged == [4, 5, 6]
    assert resumed_history == history  # Bit-identical: optimizer state and each epoch's shuffle restored.
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(a, b)


def test_sigterm_stops_after_the_epoch_in_flight_is_written(tmp_path):
    uninterrupted, history, _ = _train_shuffled(str(tmp_path / 'once'), tf.keras.optimizers.Adam(0.05))
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        _train_shuffled(str(tmp_path / 'twice'), tf.keras.optimizers.Adam(0.05), terminate_at=3)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler  # Restored.
    resumed, resumed_history, logged = _train_shuffled(str(tmp_path / 'twice'), tf.keras.optimizers.Adam(0.05))
    assert logged == [4, 5, 6] and resumed_history == history  # Epoch 3 was written before stopping.
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(a, b)


def test_each_epoch_has_its_own_order_reproducible_from_the_seed():
    epochs = centralized.epoch_shuffled(_examples(), 40, seed=3)
    first, second = [next(iter(epochs(e)))['y'].numpy().ravel() for e in (1, 2)]
    assert not np.array_equal(first, second)
    again = next(iter(centralized.epoch_shuffled(_examples(), 40, seed=3)(1)))['y'].numpy().ravel()
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(np.sort(first), np.sort(next(iter(_examples().batch(40)))['y'].numpy().ravel()))


def test_an_unlogged_monitor_is_named():
    with pytest.raises(ValueError, match="monitor 'val_rmse' is not logged"):
        centralized.train_centralized(
            _scalar_model(),
            train_dataset=_line(2.0).batch(16),
            validation_dataset=_line(1.0).batch(16),
            optimizer=tf.keras.optimizers.SGD(0.1),
            loss=tf.keras.losses.MeanSquaredError(),
            metrics=[],
            max_epochs=1,
            monitor='val_rmse',
        )
