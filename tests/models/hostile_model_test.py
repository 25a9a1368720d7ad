"""Hostile arguments to the Keras wrapper and the algorithm builders: each gives a TypeError or a
`ModelSpecError` / `DatasetSpecError` naming the argument (or client and field), never a deep TF error."""

import collections

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from fedpersonal import algorithms
from fedpersonal import models
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.models import partially_local_model

SETTINGS = hypothesis.settings(max_examples=60, deadline=None)


def _two_layer_model(dims=3, dtype=tf.float32):
    inputs = tf.keras.Input(shape=[dims], dtype=dtype)
    shared = tf.keras.layers.Dense(4, name='shared')
    head = tf.keras.layers.Dense(1, name='head')
    return tf.keras.Model(inputs, head(shared(tf.cast(inputs, tf.float32)))), shared, head


def _spec(dims=3):
    return collections.OrderedDict(x=tf.TensorSpec([None, dims], tf.float32), y=tf.TensorSpec([None, 1], tf.float32))


# ---------------------------------------------------------------------------------------------- loss and metrics
_GOOD_METRICS = lambda: [tf.keras.metrics.MeanAbsoluteError(name='mae')]


@pytest.mark.parametrize(
    'loss_fn, metrics_fn, argument',
    [
        (tf.keras.losses.MeanSquaredError(), None, 'loss_fn'),  # An instance instead of a no-arg callable.
        ('mse', None, 'loss_fn'),
        (tf.keras.losses.mean_squared_error, None, 'loss_fn'),  # A function of (y_true, y_pred).
        (lambda: 'mse', None, 'loss_fn'),
        (None, None, 'loss_fn'),
        (tf.keras.losses.MeanSquaredError, [tf.keras.metrics.MeanAbsoluteError()], 'metrics_fn'),  # A list.
        (tf.keras.losses.MeanSquaredError, tf.keras.metrics.MeanAbsoluteError(), 'metrics_fn'),
        (tf.keras.losses.MeanSquaredError, tf.keras.metrics.MeanAbsoluteError, 'metrics_fn'),  # Returns one metric.
        (tf.keras.losses.MeanSquaredError, lambda: ['mae'], 'metrics_fn'),
        (tf.keras.losses.MeanSquaredError, 'mae', 'metrics_fn'),
        (tf.keras.losses.MeanSquaredError, lambda x: [], 'metrics_fn'),
    ],
)
def test_hostile_loss_and_metrics_fns_name_the_argument(loss_fn, metrics_fn, argument):
    with pytest.raises(TypeError, match=argument):
        partially_local_model.check_loss_and_metrics_fns(loss_fn, metrics_fn)


def test_good_loss_and_metrics_fns_pass():
    loss, metrics = partially_local_model.check_loss_and_metrics_fns(tf.keras.losses.MeanSquaredError, _GOOD_METRICS)
    assert isinstance(loss, tf.keras.losses.MeanSquaredError) and [m.name for m in metrics] == ['mae']
    assert partially_local_model.check_loss_and_metrics_fns(tf.keras.losses.MeanSquaredError, None)[1] == []


@pytest.mark.parametrize(
    'kwargs, argument',
    [
        (dict(loss_fn=tf.keras.losses.MeanSquaredError()), 'loss_fn'),
        (
            dict(loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=[tf.keras.metrics.MeanAbsoluteError()]),
            'metrics_fn',
        ),
    ],
)
@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_builders_reject_a_loss_instance_and_a_metrics_list_by_name(kwargs, argument, simulation):
    model_fn = mf.personal_model_fn(num_items=5, num_latent_factors=2)
    with pytest.raises(TypeError, match=rf'^{argument} must be a no-arg function'):
        algorithms.build_fed_recon(model_fn, simulation=simulation, **kwargs)


# ------------------------------------------------------------------------------------- global / local declarations
_DECLARATION_ITEM = st.sampled_from(
    ['shared', 'head', 'shared/kernel', 'head/bias:0', 'shared/kernel:0', 'head/kernel', 'missing', '', 3, None, 'x']
)


@SETTINGS
@hypothesis.given(
    global_layers=st.one_of(st.none(), st.lists(st.sampled_from(['shared', 'head', 'obj_shared', 'nope', 1.5]))),
    local_layers=st.one_of(
        st.none(), st.lists(st.sampled_from(['shared', 'head', 'obj_head', 'nope'])), st.just('one')
    ),
    global_variables=st.one_of(st.none(), st.lists(_DECLARATION_ITEM, max_size=3)),
    local_variables=st.one_of(st.none(), st.lists(_DECLARATION_ITEM, max_size=3), st.just('head')),
)
def test_random_declarations_wrap_or_name_the_problem(global_layers, local_layers, global_variables, local_variables):
    keras_model, shared, head = _two_layer_model()
    objects = {'obj_shared': shared, 'obj_head': head}

    def resolve(items):
        if items == 'one':
            return head  # A single layer instead of a list.
        if isinstance(items, list):
            return [objects.get(i, i) if isinstance(i, str) else i for i in items]
        return items

    try:
        model = models.from_keras_model(
            keras_model,
            input_spec=_spec(),
            global_layers=resolve(global_layers),
            local_layers=resolve(local_layers),
            global_variables=global_variables,
            local_variables=local_variables,
        )
    except (TypeError, models.ModelSpecError) as e:
        assert any(a in str(e) for a in ('layer', 'variable', 'Variables')), e
        return
    names = [
        v.name
        for v in model.global_trainable_variables
        + model.global_non_trainable_variables
        + model.local_trainable_variables
        + model.local_non_trainable_variables
    ]
    assert sorted(names) == sorted(v.name for v in keras_model.variables)


def test_names_are_resolved_and_unknown_names_listed():
    keras_model, _, _ = _two_layer_model()
    model = models.from_keras_model(
        keras_model, input_spec=_spec(), global_layers=['shared'], local_variables=['head/kernel', 'head/bias:0']
    )
    assert [v.name for v in model.local_trainable_variables] == ['head/kernel:0', 'head/bias:0']
    with pytest.raises(models.ModelSpecError, match=r"local_variables: no variable named 'head/kernal'.*head/kernel:0"):
        models.from_keras_model(
            keras_model, input_spec=_spec(), global_layers=['shared'], local_variables=['head/kernal', 'head/bias']
        )
    with pytest.raises(TypeError, match='local_layers must be a list of layers'):
        models.from_keras_model(
            keras_model, input_spec=_spec(), global_layers=['shared'], local_layers=keras_model.layers[-1]
        )
    with pytest.raises(TypeError, match='global_variables must hold'):
        models.from_keras_model(keras_model, input_spec=_spec(), global_variables=[1], local_layers=['head', 'shared'])


# ------------------------------------------------------------------------------------- input spec vs first batch
_DTYPES = [tf.float32, tf.float64, tf.int64, tf.int32]


@SETTINGS
@hypothesis.given(
    model_dims=st.integers(1, 3),
    model_dtype=st.sampled_from(_DTYPES),
    spec_shape=st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=1, max_size=3),
    spec_dtype=st.sampled_from(_DTYPES),
    batch_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    batch_dtype=st.sampled_from(_DTYPES),
    label_dtype=st.sampled_from([tf.float32, tf.int64]),
)
def test_random_specs_and_batches_fit_or_raise_a_spec_error(
    model_dims, model_dtype, spec_shape, spec_dtype, batch_shape, batch_dtype, label_dtype
):
    keras_model, shared, head = _two_layer_model(model_dims, model_dtype)
    spec = collections.OrderedDict(x=tf.TensorSpec(spec_shape, spec_dtype), y=tf.TensorSpec([None, 1], tf.float32))
    try:
        model = models.from_keras_model(keras_model, input_spec=spec, global_layers=[shared], local_layers=[head])
    except models.ModelSpecError as e:
        assert 'input_spec' in str(e)
        return
    batch = collections.OrderedDict(x=tf.zeros(batch_shape, batch_dtype), y=tf.zeros([batch_shape[0], 1], label_dtype))
    dataset = tf.data.Dataset.from_tensors(batch)
    try:
        models.check_dataset_matches(model.input_spec, dataset, client_id='c0')
    except models.DatasetSpecError as e:
        assert "client 'c0': field" in str(e)
        return
    output = model.forward_pass(batch)
    assert output.predictions.shape == (batch_shape[0], 1) and np.isfinite(output.predictions.numpy()).all()
