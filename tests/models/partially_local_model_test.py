"""The Keras wrapper: correct partition, and errors that name the problem."""

import collections

import pytest
import tensorflow as tf

from fedpersonal import models
from fedpersonal.models import matrix_factorization as mf


def _spec():
    return collections.OrderedDict(x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None, 1], tf.float32))


def _two_layer_model():
    inputs = tf.keras.Input(shape=[3], dtype=tf.float32)
    shared = tf.keras.layers.Dense(4, name='shared')
    head = tf.keras.layers.Dense(1, name='head')
    return tf.keras.Model(inputs, head(shared(inputs))), shared, head


def test_partition_by_layers_and_forward_pass():
    keras_model, shared, head = _two_layer_model()
    model = models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared], local_layers=[head])
    assert [v.name for v in model.global_trainable_variables] == ['shared/kernel:0', 'shared/bias:0']
    assert [v.name for v in model.local_trainable_variables] == ['head/kernel:0', 'head/bias:0']
    assert isinstance(model, tf.keras.Model) is False
    output = model.forward_pass(collections.OrderedDict(x=tf.ones([2, 3]), y=tf.zeros([2, 1])))
    assert output.predictions.shape == (2, 1)
    assert int(output.num_examples) == 2


def test_partition_by_variables_splits_trainable_and_non_trainable():
    inputs = tf.keras.Input(shape=[3])
    bn = tf.keras.layers.BatchNormalization(name='bn')
    dense = tf.keras.layers.Dense(1, name='dense')
    keras_model = tf.keras.Model(inputs, dense(bn(inputs)))
    model = models.from_keras_model(
        keras_model, input_spec=_spec(), global_layers=[dense], local_variables=bn.variables
    )
    assert {v.name for v in model.local_trainable_variables} == {'bn/gamma:0', 'bn/beta:0'}
    assert {v.name for v in model.local_non_trainable_variables} == {'bn/moving_mean:0', 'bn/moving_variance:0'}


def test_overlapping_variables_are_named():
    keras_model, shared, head = _two_layer_model()
    with pytest.raises(models.ModelSpecError, match=r'both global and local.*shared/kernel'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared, head], local_layers=[shared])


def test_missing_variables_are_named():
    keras_model, shared, _ = _two_layer_model()
    with pytest.raises(models.ModelSpecError, match=r'neither global nor local.*head/kernel:0.*head/bias:0'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared])


def test_foreign_layer_is_named():
    keras_model, shared, head = _two_layer_model()
    stranger = tf.keras.layers.Dense(2, name='stranger')
    stranger.build([None, 3])
    with pytest.raises(models.ModelSpecError, match='"stranger" is not part of Keras model'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared, stranger], local_layers=[head])


def test_compiled_model_is_rejected():
    keras_model, shared, head = _two_layer_model()
    keras_model.compile(optimizer='sgd', loss='mse')
    with pytest.raises(models.ModelSpecError, match='is compiled'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared], local_layers=[head])


def test_unbuilt_model_is_rejected():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(1)], name='lazy')
    with pytest.raises(models.ModelSpecError, match='"lazy" is not built'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_layers=keras_model.layers)


def test_input_spec_that_does_not_fit_the_model():
    keras_model, shared, head = _two_layer_model()
    bad_dtype = collections.OrderedDict(x=tf.TensorSpec([None, 3], tf.int64), y=tf.TensorSpec([None, 1], tf.float32))
    with pytest.raises(models.ModelSpecError, match='dtype int64.*expects float32'):
        models.from_keras_model(keras_model, input_spec=bad_dtype, global_layers=[shared], local_layers=[head])
    bad_shape = collections.OrderedDict(x=tf.TensorSpec([None, 5], tf.float32), y=tf.TensorSpec([None, 1], tf.float32))
    with pytest.raises(models.ModelSpecError, match='shape'):
        models.from_keras_model(keras_model, input_spec=bad_shape, global_layers=[shared], local_layers=[head])
    with pytest.raises(models.ModelSpecError, match='"x"'):
        models.from_keras_model(
            keras_model,
            input_spec={'features': _spec()['x'], 'y': _spec()['y']},
            global_layers=[shared],
            local_layers=[head],
        )


def test_require_parts():
    keras_model, shared, head = _two_layer_model()
    all_global = models.from_keras_model(keras_model, input_spec=_spec(), global_layers=[shared, head])
    models.require_parts(all_global, algorithm='FedAvg', needs_global=True)
    with pytest.raises(models.ModelSpecError, match='FURL needs a model with local trainable variables'):
        models.require_parts(all_global, algorithm='FURL', needs_local=True)
    keras_model, shared, head = _two_layer_model()
    all_local = models.from_keras_model(keras_model, input_spec=_spec(), local_layers=[shared, head])
    with pytest.raises(models.ModelSpecError, match='FedRecon needs a model with global trainable variables'):
        models.require_parts(all_local, algorithm='FedRecon')


def test_dataset_mismatch_names_client_and_field():
    spec = mf.personal_input_spec()
    good = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=tf.zeros([4, 1], tf.int64), y=tf.zeros([4, 1]))
    ).batch(2)
    models.check_dataset_matches(spec, good, client_id='u1')
    wrong_dtype = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=tf.zeros([4, 1], tf.int32), y=tf.zeros([4, 1]))
    ).batch(2)
    with pytest.raises(models.DatasetSpecError, match=r"client 'u7': field \"x\" has dtype int32"):
        models.check_dataset_matches(spec, wrong_dtype, client_id='u7')
    unbatched = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=tf.zeros([4, 1], tf.int64), y=tf.zeros([4, 1]))
    )
    with pytest.raises(models.DatasetSpecError, match=r'field "x" has shape \(1,\).*is the dataset batched'):
        models.check_dataset_matches(spec, unbatched, client_id='u2')
    wrong_keys = tf.data.Dataset.from_tensor_slices({'item': tf.zeros([4, 1], tf.int64), 'y': tf.zeros([4, 1])})
    with pytest.raises(models.DatasetSpecError, match=r"missing: \['x'\], unexpected: \['item'\]"):
        models.check_dataset_matches(spec, wrong_keys.batch(2), client_id='u3')
