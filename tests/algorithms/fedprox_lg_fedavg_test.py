"""FedProx and LG-FedAvg, one client plan each, on both backends: FedProx equals TFF's own
`build_weighted_fed_prox` (the independent reference), LG-FedAvg equals a plain eager loop written here, and
LG-FedAvg's representation never reaches a SERVER-placed value."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import models
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets

NUM_CLASSES, DIM, HIDDEN, LR, MU = 3, 6, 8, 0.1, 0.5
# The longest chain of additions feeding a weight in one SGD step of the DIM-HIDDEN-NUM_CLASSES model on batches of
# 10: the forward fan-ins (6 + 8), the backward fan-outs (3 + 8), the batch's gradient sum (10), then the weighted
# mean over client_arrays' 4 clients (at most 40 examples: 4 batches an epoch).
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + 10 + 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def keras_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, 'relu', kernel_initializer=init(seed=1), name='body'),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2), name='head'),
        ]
    )


def loss_fn():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _fedprox_reference_round(weights, arrays, mu):
    """One FedProx round by hand: each client makes 2 passes of plain SGD (batches of 10 in order) on its loss plus
    ``mu / 2 * ||v - w||^2`` (gradient ``mu * (v - w)``); the server takes the example-weighted mean."""
    trained, sizes = [], []
    for x, y in arrays:
        v = [tf.Variable(w) for w in weights]
        for _ in range(2):
            for s in range(0, len(x), 10):
                with tf.GradientTape() as tape:
                    logits = tf.matmul(tf.nn.relu(tf.matmul(x[s : s + 10], v[0]) + v[1]), v[2]) + v[3]
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[s : s + 10], logits=logits)
                    )
                for a, g, w in zip(v, tape.gradient(loss, v), weights):
                    a.assign_sub(LR * (g + mu * (a - w)))
        trained.append([a.numpy() for a in v])
        sizes.append(len(x))
    return [sum(n * t[k] for n, t in zip(sizes, trained)) / float(sum(sizes)) for k in range(4)]


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def _assert_same(a, b, steps):
    tolerances.assert_trees_reordered_close(
        [np.asarray(x) for x in a], [np.asarray(y) for y in b], depth=DEPTH, steps=steps
    )


@pytest.fixture(scope='module')
def fedprox_reference():
    """TFF's `build_weighted_fed_prox` after one round (its client work makes 2 passes over repeated data)."""
    arrays = client_arrays(seed=3)
    reference = tff.learning.algorithms.build_weighted_fed_prox(
        lambda: tff.learning.models.from_keras_model(keras_fn(), loss=loss_fn(), input_spec=SPEC),
        proximal_strength=MU,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
    )
    state = reference.next(reference.initialize(), [d.repeat(2) for d in datasets(arrays)]).state
    return arrays, reference.get_model_weights(state).trainable


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_fedprox_equals_a_plain_loop_and_tffs_fedprox_pushes_the_other_way(backend, fedprox_reference):
    arrays, tff_weights = fedprox_reference
    with backends.use(backend):
        process = algorithms.build_fedprox(
            keras_fn, element_spec=SPEC, mu=MU, client_optimizer=tff.learning.optimizers.build_sgdm(LR), client_epochs=2
        )
    state = process.initialize()
    weights = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    output = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays))
    ours = process.get_model_weights(output.state).trainable
    steps = 2 * 4  # One round of 2 epochs of at most 4 batches.
    bound = tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)  # 3.7e-5: the weights are O(1).
    _assert_same(ours, _fedprox_reference_round(weights, arrays, MU), steps)
    assert _max_diff(ours, _fedprox_reference_round(weights, arrays, 0.0)) > 1e-3 > 10 * bound  # The term matters.
    # TFF 0.87 adds mu * (w - v) to the gradient, the opposite sign of the paper's term (and of ours).
    _assert_same(tff_weights, _fedprox_reference_round(weights, arrays, -MU), steps)
    assert _max_diff(tff_weights, ours) > 1e-3


@pytest.mark.numeric
def test_fedprox_with_mu_0_is_tffs_fedavg():
    arrays = client_arrays(seed=5)
    sgd = tff.learning.optimizers.build_sgdm(LR)
    process = algorithms.build_fedprox(keras_fn, element_spec=SPEC, mu=0.0, client_optimizer=sgd)
    reference = tff.learning.algorithms.build_weighted_fed_avg(
        lambda: tff.learning.models.from_keras_model(keras_fn(), loss=loss_fn(), input_spec=SPEC),
        client_optimizer_fn=sgd,
    )
    state, ref_state = process.initialize(), reference.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    for _ in range(2):
        state = process.run_round(state, datasets(arrays), privates).state
        ref_state = reference.next(ref_state, datasets(arrays)).state
    got, want = process.get_model_weights(state).trainable, reference.get_model_weights(ref_state).trainable
    _assert_same(got, want, steps=2 * 4)  # 2 rounds of one epoch of at most 4 batches.


def lg_model_fn():
    keras_model = keras_fn()
    body, head = keras_model.layers
    return models.from_keras_model(keras_model, input_spec=SPEC, global_layers=[head], local_layers=[body])


def build_lg(backend):
    with backends.use(backend):
        return algorithms.build_lg_fedavg(
            lg_model_fn,
            loss_fn=loss_fn,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            client_epochs=2,
        )


def _lg_reference_round(head, bodies, arrays):
    """One LG-FedAvg round by hand: each client trains its body and the received head by plain SGD (2 epochs,
    batches of 10 in order); the server takes the example-weighted mean of the trained heads."""
    heads, new_bodies, sizes = [], [], []
    for body, (x, y) in zip(bodies, arrays):
        w1, b1, w2, b2 = [tf.Variable(v) for v in list(body) + list(head)]
        for _ in range(2):
            for s in range(0, len(x), 10):
                with tf.GradientTape() as tape:
                    logits = tf.matmul(tf.nn.relu(tf.matmul(x[s : s + 10], w1) + b1), w2) + b2
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[s : s + 10], logits=logits)
                    )
                for v, g in zip((w1, b1, w2, b2), tape.gradient(loss, [w1, b1, w2, b2])):
                    v.assign_sub(LR * g)
        new_bodies.append([w1.numpy(), b1.numpy()])
        heads.append([w2.numpy(), b2.numpy()])
        sizes.append(len(x))
    total = float(sum(sizes))
    return [sum(n * h[k] for n, h in zip(sizes, heads)) / total for k in range(2)], new_bodies


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_lg_fedavg_equals_a_plain_loop_and_keeps_each_representation(backend):
    arrays = client_arrays(seed=4)
    process = build_lg(backend)
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    head = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    bodies = [[np.asarray(w) for w in p.trainable] for p in privates]
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        head, bodies = _lg_reference_round(head, bodies, arrays)
    steps = 2 * 2 * 4  # 2 rounds of 2 epochs of at most 4 batches.
    _assert_same(process.get_model_weights(state).trainable, head, steps)
    for p, body in zip(privates, bodies):
        _assert_same(p.trainable, body, steps)
    bound = tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)  # 7.4e-5: the weights are O(1).
    assert _max_diff(privates[0].trainable[:1], privates[1].trainable[:1]) > 1e-3 > 10 * bound


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_lg_fedavg_representation_never_reaches_the_server(backend):
    process = build_lg(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    result = process.next.type_signature.result
    body_shapes = {(DIM, HIDDEN), (HIDDEN,)}
    assert not body_shapes & (audit.tensor_shapes(result.state) | audit.tensor_shapes(result.metrics))
    assert result.private_states.placement is tff.CLIENTS
