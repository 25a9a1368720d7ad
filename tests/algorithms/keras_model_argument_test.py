"""Every personalization builder takes a Keras model function with the datasets' ``element_spec`` (issue 64): the
builders of FedPer's family and Per-FedAvg, which took only a partially local model, give with a Keras model the
very process they give with the partially local model a user would declare by hand (the same computation, so the
same numbers bit for bit), keep the layers the algorithm keeps local by default or those named, and refuse what
cannot be meant."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import models

DIM, HIDDEN, CLASSES = 5, 7, 3
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def keras_fn(batch_norm=False):
    def build():
        inputs = tf.keras.Input([DIM])
        hidden = tf.keras.layers.Dense(
            HIDDEN, activation='relu', name='body', kernel_initializer=tf.keras.initializers.GlorotUniform(1)
        )(inputs)
        if batch_norm:
            hidden = tf.keras.layers.BatchNormalization(name='bn')(hidden)
        outputs = tf.keras.layers.Dense(
            CLASSES, name='head', kernel_initializer=tf.keras.initializers.GlorotUniform(2)
        )(hidden)
        return tf.keras.Model(inputs, outputs)

    return build


def declared_fn(local, batch_norm=False):
    """The partially local model a user declares by hand: layers named `local` local, the others global."""

    def build():
        keras_model = keras_fn(batch_norm)()
        layers = [layer for layer in keras_model.layers if layer.weights]
        local_layers = [layer for layer in layers if layer.name in local]
        global_layers = [layer for layer in layers if layer.name not in local]
        return models.from_keras_model(
            keras_model, input_spec=SPEC, global_layers=global_layers, local_layers=local_layers
        )

    return build


def client_data(num_clients=3, n=20):
    rng = np.random.default_rng(0)
    return [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.normal(size=[n, DIM]).astype(np.float32), y=rng.integers(0, CLASSES, n).astype(np.int32)
            )
        ).batch(5)
        for _ in range(num_clients)
    ]


def options():
    return dict(
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
    )


BUILDERS = {
    # builder, its arguments, the layers it keeps local by default, a model with batch normalization
    'fedper': (algorithms.build_fedper, options, ('head',), False),
    'lg_fedavg': (algorithms.build_lg_fedavg, options, ('body',), False),
    'fedbabu': (algorithms.build_fedbabu, options, ('head',), False),
    'fedbn': (algorithms.build_fedbn, options, ('bn',), True),
    'fedrep': (
        algorithms.build_fedrep,
        lambda: dict(
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            head_optimizer=tff.learning.optimizers.build_sgdm(0.1),
            body_optimizer=tff.learning.optimizers.build_sgdm(0.1),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            head_epochs=2,
        ),
        ('head',),
        False,
    ),
    'per_fedavg': (
        algorithms.build_per_fedavg,
        lambda: dict(
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            batch_size=5,
            inner_learning_rate=0.05,
            outer_optimizer=tff.learning.optimizers.build_sgdm(0.05),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        ),
        (),
        False,
    ),
}


def two_rounds(process):
    state = process.initialize()
    private = [process.initial_private_state()] * 3 if process.stateful else None
    for _ in range(2):
        output = process.run_round(state, client_data(), private)
        state, private = output.state, list(output.private_states) if process.stateful else None
    weights = process.get_model_weights(state)
    states = [[np.asarray(w) for w in p.trainable + p.non_trainable] for p in private] if private else [[]] * 3
    return [np.asarray(w) for w in weights.trainable + weights.non_trainable], states


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_a_keras_model_gives_the_process_of_the_model_declared_by_hand(name, backend):
    build, kwargs, local, batch_norm = BUILDERS[name]
    with backends.use(backend):
        by_hand = two_rounds(build(declared_fn(local, batch_norm), **kwargs()))
        keras = two_rounds(build(keras_fn(batch_norm), element_spec=SPEC, **kwargs()))
    model = keras_fn(batch_norm)()
    local_shapes = [tuple(v.shape) for name_ in local for v in model.get_layer(name_).weights]
    # The private states hold exactly the default local layers' weights (FedBABU keeps none: stateless).
    expected = [] if name == 'fedbabu' else local_shapes
    assert [[w.shape for w in p] for p in keras[1]] == [expected] * 3
    for got, want in zip(keras[0] + sum(keras[1], []), by_hand[0] + sum(by_hand[1], []), strict=True):
        np.testing.assert_array_equal(got, want)  # One computation: bit for bit.


def test_local_layers_names_the_layers_kept_on_the_clients():
    process = algorithms.build_fedper(keras_fn(), element_spec=SPEC, local_layers=['body'], **options())
    assert [tuple(v.shape) for v in process.initial_private_state().trainable] == [(DIM, HIDDEN), (HIDDEN,)]


@pytest.mark.parametrize(
    'model_fn, kwargs, error, message',
    [
        (keras_fn(), dict(local_layers=['head']), ValueError, 'local_layers names layers of a Keras model: pass'),
        (keras_fn(), dict(element_spec=SPEC, local_layers=['fc']), ValueError, r"local_layers \['fc'\] are no layers"),
        (
            declared_fn(('head',)),
            dict(element_spec=SPEC),
            TypeError,
            'With element_spec, model_fn must return a tf.keras.Model, got PartiallyLocalModel',
        ),
    ],
)
def test_what_cannot_be_meant_is_refused(model_fn, kwargs, error, message):
    with pytest.raises(error, match=message):
        algorithms.build_fedper(model_fn, **kwargs, **options())


def test_fedbn_of_a_keras_model_without_batch_normalization_is_refused():
    with pytest.raises(ValueError, match='FedBN needs a model with BatchNormalization layers'):
        algorithms.build_fedbn(keras_fn(), element_spec=SPEC, **options())
