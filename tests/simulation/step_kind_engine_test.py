"""Step kinds on the grouped engine (`fedpersonal.simulation.step_kind_engine`): a meta step's masked windows are
the per-client backend's parts; a convolutional model (whose clients loop inside the compiled step), a momentum
optimizer, a regularized layer, clients of unequal lengths and groups padded with an empty client give the
per-client backend's round; a batch norm model falls back to the per-client backend, logged. (Per-FedAvg's and
pFedMe's rounds against plain eager loops: tests/algorithms/per_fedavg_test.py, pfedme_test.py.)"""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import per_fedavg
from fedpersonal.algorithms import pfedme
from fedpersonal.core import step_kinds
from fedpersonal.simulation import step_kind_engine
from tests import tolerances

SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 6, 6, 1], tf.float32), y=tf.TensorSpec([None], tf.int32))


@pytest.mark.parametrize('parts', [2, 3])
def test_a_windows_real_examples_are_the_per_client_part(parts):
    size = 12
    batch = collections.OrderedDict(x=np.arange(size * 2, dtype=np.float32).reshape(size, 2), y=np.arange(size))
    for n in range(parts, size + 1):
        mask = np.array([1.0] * n + [0.0] * (size - n), np.float32)
        unpadded = tf.nest.map_structure(lambda a: a[:n], batch)
        for k in range(parts):
            window, inside = step_kind_engine._window(batch, tf.constant(mask), k, parts)
            want = step_kinds.batch_part(unpadded, k, parts)
            real = inside.numpy() > 0
            assert len(want['y']) == real.sum() >= n // parts > 0
            np.testing.assert_array_equal(window['y'].numpy()[real], want['y'])
            np.testing.assert_array_equal(window['x'].numpy()[real], want['x'])


def cnn_fn(batch_norm=False):
    init = tf.keras.initializers.GlorotUniform
    layers = [tf.keras.Input([6, 6, 1]), tf.keras.layers.Conv2D(2, 3, activation='relu', kernel_initializer=init(1))]
    if batch_norm:
        layers.append(tf.keras.layers.BatchNormalization())
    # A regularized layer: both backends differentiate the loss plus its regularization.
    dense = tf.keras.layers.Dense(3, kernel_initializer=init(2), kernel_regularizer=tf.keras.regularizers.L2(0.05))
    layers += [tf.keras.layers.Flatten(), dense]
    return tf.keras.Sequential(layers)


def cnn_datasets(sizes=(13, 7, 24), seed=0):
    rng = np.random.default_rng(seed)
    return [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.normal(size=[n, 6, 6, 1]).astype(np.float32), y=rng.integers(0, 3, n).astype(np.int32)
            )
        ).batch(4)
        for n in sizes
    ]


PLANS = {
    'per_fedavg_hf': lambda: per_fedavg.per_fedavg_plan(
        batch_size=3,
        inner_learning_rate=0.05,
        outer_optimizer=tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
        hessian_free=True,
    ),
    'pfedme': lambda: pfedme.pfedme_plan(lam=2.0, inner_steps=3, personal_learning_rate=0.05, learning_rate=0.1),
}


def run(plan, backend, rounds=2, model_fn=cnn_fn):
    with backends.use(backend):
        process = backends.build_classifier_process(
            plan,
            model_fn,
            element_spec=SPEC,
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            group_size=2,  # 3 clients: two groups, the second padded with an empty client.
        )
    data = cnn_datasets()
    state, privates = process.initialize(), [process.initial_private_state()] * len(data)
    for _ in range(rounds):
        output = process.run_round(state, data, privates)
        state, privates = output.state, list(output.private_states)
    return process, process.get_model_weights(state), privates, output.metrics['client_work']['train']


@pytest.mark.parametrize(
    'name', [pytest.param(n, marks=[pytest.mark.numeric] * (n == 'pfedme')) for n in sorted(PLANS)]
)
def test_a_cnn_on_the_engine_equals_the_per_client_backend(name):
    engine, per_client = run(PLANS[name](), 'engine'), run(PLANS[name](), 'per_client')
    assert engine[0].simulation == 'engine' and per_client[0].simulation == 'per_client'
    # Depth: the 3x3 convolution (9), the dense layer's 4 x 4 x 2 inputs and its L2 term's 96 squares, 3 logits,
    # backward the same fan-outs (3 + 2), a batch of 4's gradient sum, the mean over 3 clients; steps: at most 24 / 4
    # batches a round, 2 rounds.
    bound = dict(depth=9 + 32 + 96 + 3 + 3 + 2 + 4 + 3, steps=2 * 6)
    for got, want in zip(engine[1].trainable, per_client[1].trainable):
        tolerances.assert_reordered_close(got, want, **bound)
    assert not np.allclose(engine[1].trainable[0], engine[0].get_model_weights(engine[0].initialize()).trainable[0])
    for got, want in zip(engine[2], per_client[2]):
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            tolerances.assert_reordered_close(a, b, **bound)
    assert engine[3]['num_examples'] == per_client[3]['num_examples']
    tolerances.assert_reordered_close(engine[3]['loss'], per_client[3]['loss'], **bound)
    # A count of correct predictions: equal unless one sits on a tie, which these random weights do not produce.
    assert float(engine[3]['accuracy']) == float(per_client[3]['accuracy'])


def test_a_batch_norm_model_falls_back_to_the_per_client_backend():
    with mock.patch.object(backends.logging, 'info') as log, backends.use('engine'):
        process = backends.build_classifier_process(
            PLANS['pfedme'](),
            lambda: cnn_fn(batch_norm=True),
            element_spec=SPEC,
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            name='pFedMe',
        )
    (message, *args), _ = log.call_args
    assert 'pFedMe runs on the per-client backend' in message % tuple(args)
    assert 'batch normalization' in message % tuple(args)
    assert process.simulation == 'per_client'
