"""Issue 62: a new user's mistakes through the Python API stop with a clear error instead of silent numbers.

Labels outside the model's outputs (1-based labels on a 10-way output, a 5-output model for 10 classes) are refused
before the round on both backends, naming the client, the labels and the width; a non-finite training loss stops
`run_round` naming the round's metrics, and ``non_finite='ignore'`` keeps the old behaviour; the binaries'
training loop still stops naming the client, or zeroes and counts it (``non_finite_clients='zero'``).
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import client_state
from fedpersonal import errors
from fedpersonal import models
from fedpersonal import program
from fedpersonal.core import input_checks
from fedpersonal.core import process as process_lib
from fedpersonal.program import non_finite as program_non_finite

DIM, CLASSES, ROWS, BATCH = 4, 10, 12, 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))
IDS = ['a', 'b', 'c']


def _keras(width):
    inputs = tf.keras.Input([DIM])
    body = tf.keras.layers.Dense(8, activation='relu', kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(width, kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    return tf.keras.Model(inputs, head(body(inputs))), body, head


def _fedper(width, backend, loss_fn=None):
    def model_fn():
        keras_model, body, head = _keras(width)
        return models.from_keras_model(keras_model, input_spec=SPEC, global_layers=[body], local_layers=[head])

    with backends.use(backend):
        return algorithms.build_fedper(
            model_fn,
            loss_fn=loss_fn or (lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
            client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        )


def _arrays(seed, labels, x_scale=1.0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=[ROWS, DIM]) * x_scale).astype(np.float32)
    return collections.OrderedDict(x=x, y=np.asarray(labels, np.int32))


def _dataset(arrays):
    return tf.data.Dataset.from_tensor_slices(arrays).batch(BATCH)


def _clients(first_label=0):
    """Three clients; client 'b' holds every class, from `first_label` on."""
    labels = {
        'a': [first_label + k % 3 for k in range(ROWS)],
        'b': [first_label + k % CLASSES for k in range(ROWS)],
        'c': [first_label + 2] * ROWS,
    }
    return {c: _arrays(i, labels[c]) for i, c in enumerate(IDS)}


def _round(process, arrays, ids=IDS, **kwargs):
    privates = [process.initial_private_state()] * len(ids)
    data = process_lib.LazyDatasets(ids, lambda c: _dataset(arrays[c]))
    return process.run_round(process.initialize(), data, privates, client_ids=ids, **kwargs)


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_one_based_labels_on_a_ten_way_output_are_refused_naming_client_labels_and_width(backend):
    process = _fedper(CLASSES, backend)
    assert process.input_check == input_checks.LabelCheck(CLASSES)
    with pytest.raises(input_checks.LabelRangeError) as raised:
        _round(process, _clients(first_label=1))
    error = raised.value
    assert isinstance(error, errors.InputError)
    assert (error.client_id, error.labels, error.width) == ('b', [10], 10)
    assert "client 'b': labels [10]" in str(error) and 'outside [0, 10)' in str(error) and '1-based' in str(error)


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_five_outputs_for_ten_classes_are_refused(backend):
    process = _fedper(5, backend)
    with pytest.raises(input_checks.LabelRangeError, match=r"client 'b': labels \[5, 6, 7, 8, 9\] \(5 of its 12"):
        _round(process, _clients())


def test_labels_in_range_train_and_each_client_is_read_once():
    """In range nothing is refused; the check reads a client's data where the engine materializes it anyway: a known
    client's pipeline is not built again."""
    process = _fedper(CLASSES, 'engine')
    arrays, built = _clients(), []

    def make(client_id):
        built.append(client_id)
        return _dataset(arrays[client_id])

    state, privates = process.initialize(), [process.initial_private_state()] * 3
    for _ in range(2):
        output = process.run_round(state, process_lib.LazyDatasets(IDS, make), privates, client_ids=IDS)
        state, privates = output.state, list(output.private_states)
    assert built == IDS
    assert np.isfinite(output.metrics['client_work']['train']['loss'])


def test_other_losses_and_labels_are_not_class_indices():
    assert input_checks.label_check(lambda: None, tf.keras.losses.MeanSquaredError) is None
    check = input_checks.LabelCheck(3, ignore_class=-1)
    check.check_labels('x', np.array([0, 2, -1]))  # Keras' ignore_class is allowed.
    with pytest.raises(input_checks.LabelRangeError, match=r"client 'x': labels \[0.5\]"):
        check.check_labels('x', np.array([0.0, 0.5, 2.0], np.float32))
    with pytest.raises(input_checks.LabelRangeError, match=r'labels \[-2, 3\]'):
        check.check_labels('x', np.array([-2, 0, 3]))


def test_a_width_other_than_the_declared_classes_names_both_numbers():
    process = _fedper(5, 'engine')
    with pytest.raises(input_checks.OutputWidthError, match='has 5 outputs but the data has 10 classes'):
        input_checks.check_num_classes(process, 10, source='the data')
    input_checks.check_num_classes(process, 5, source='the data')


def _with_nan_features(arrays):
    """Client 'c' with a NaN feature: a non-finite loss whatever the model."""
    arrays['c']['x'][0, 0] = np.nan
    return arrays


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_non_finite_loss_stops_run_round_and_ignore_keeps_the_round(backend):
    process = _fedper(CLASSES, backend)
    arrays = _with_nan_features(_clients())
    with pytest.raises(program_non_finite.NonFiniteLossError) as raised:
        _round(process, arrays)
    error = raised.value
    assert error.round_num is None and error.client_ids == IDS
    assert list(error.losses) == ['client_work/train/loss'] and np.isnan(error.losses['client_work/train/loss'])
    assert 'client_work/train/accuracy=' in str(error) and "non_finite='ignore'" in str(error)
    assert error.metrics is not None
    # The opt-out: today's behaviour, the round returned with its NaN loss and a plausible accuracy.
    output = _round(process, arrays, non_finite='ignore')
    assert np.isnan(output.metrics['client_work']['train']['loss'])
    assert 0.0 <= output.metrics['client_work']['train']['accuracy'] <= 1.0
    with pytest.raises(errors.ConfigError, match="non_finite must be one of \\('stop', 'ignore'\\), got 'zero'"):
        _round(process, arrays, non_finite='zero')


def _store(process):
    initial = program.training_loop.from_model_weights(process.initial_private_state())
    return client_state.InMemoryClientStateStore(client_state.spec_of(initial), lambda _: [a.copy() for a in initial])


def test_the_training_loop_still_names_the_client_or_zeroes_and_counts_it(tmp_path):
    process = _fedper(CLASSES, 'engine')
    arrays = _with_nan_features(_clients())
    common = dict(client_data={c: _dataset(arrays[c]) for c in IDS}, total_rounds=2)
    with pytest.raises(program.NonFiniteLossError) as raised:
        program.run_learning_process(
            process,
            outputs=program.ExperimentOutputs(str(tmp_path), 'stop'),
            client_state_store=_store(process),
            **common,
        )
    assert raised.value.round_num == 1 and raised.value.client_ids == ['c']
    _, history = program.run_learning_process(
        process,
        outputs=program.ExperimentOutputs(str(tmp_path), 'zero'),
        client_state_store=_store(process),
        non_finite_clients='zero',
        **common,
    )
    assert [row['train/non_finite_clients'] for row in history] == [1, 1]
