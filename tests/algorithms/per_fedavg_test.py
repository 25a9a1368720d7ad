"""Per-FedAvg, one client plan (a `MetaStep` phase): the round equals a plain eager loop written here (the trial step
on a batch's first part, the gradient of its second part there; Hessian-free: less alpha times the Hessian-vector
product on a third part) on both backends, and the backends equal each other; nothing private reaches the server;
one adaptation step on the engine's meta-learned model fits the clients' permuted labels."""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import models
from fedpersonal.algorithms import per_fedavg
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets

DIM, HIDDEN, NUM_CLASSES = 6, 8, 3
ALPHA, BETA, BATCH = 0.05, 0.1, 5
# The longest chain of additions feeding a weight in one gradient of the DIM-HIDDEN-NUM_CLASSES model on a part of
# BATCH examples: the forward fan-ins (6 + 8), the backward fan-outs (3 + 8), the part's gradient sum (5), then the
# weighted mean over the 4 clients.
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + BATCH + 4
# The Hessian-vector product adds the product's sum over all the parameters and a second backward pass's fan-outs.
HVP_DEPTH = DEPTH + (DIM * HIDDEN + HIDDEN + HIDDEN * NUM_CLASSES + NUM_CLASSES) + NUM_CLASSES + HIDDEN
# Sequential updates: a client of at most 41 examples takes at most 5 meta steps, each of 2 (first-order: trial
# step, then the step) or 3 (Hessian-free: and the Hessian-vector product at the start) dependent gradients.
STEPS = 5 * 3
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def model_fn():
    init = tf.keras.initializers.GlorotUniform
    keras_model = tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, 'relu', kernel_initializer=init(seed=1)),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2)),
        ]
    )
    return models.from_keras_model(keras_model, input_spec=SPEC, global_layers=keras_model.layers, local_layers=[])


def loss_fn():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build(backend, hessian_free=False):
    with backends.use(backend):
        return per_fedavg.build_per_fedavg(
            model_fn,
            loss_fn=loss_fn,
            batch_size=BATCH,
            inner_learning_rate=ALPHA,
            outer_optimizer=tff.learning.optimizers.build_sgdm(BETA),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            hessian_free=hessian_free,
        )


# ------------------------------------------------------------------ the reference: a plain eager loop, by hand
def _loss(weights, x, y):
    w1, b1, w2, b2 = weights
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _grad(weights, x, y):
    weights = [tf.constant(w) for w in weights]
    with tf.GradientTape() as tape:
        tape.watch(weights)
        loss = _loss(weights, x, y)
    return tape.gradient(loss, weights)


def _hessian_vector(weights, x, y, vector):
    weights = [tf.constant(w) for w in weights]
    with tf.GradientTape() as outer:
        outer.watch(weights)
        with tf.GradientTape() as inner:
            inner.watch(weights)
            loss = _loss(weights, x, y)
        product = tf.add_n([tf.reduce_sum(g * v) for g, v in zip(inner.gradient(loss, weights), vector)])
    return outer.gradient(product, weights)


def reference_round(weights, arrays, hessian_free):
    parts = 3 if hessian_free else 2
    trained, counts = [], []
    for x, y in arrays:
        w = [np.array(v) for v in weights]
        size = parts * BATCH
        for s in range(0, len(x), size):
            xb, yb = x[s : s + size], y[s : s + size]
            if len(xb) < parts:
                continue
            cuts = np.cumsum([0] + [len(xb) // parts + (k < len(xb) % parts) for k in range(parts)])
            pieces = [(xb[cuts[k] : cuts[k + 1]], yb[cuts[k] : cuts[k + 1]]) for k in range(parts)]
            trial = [v - ALPHA * g.numpy() for v, g in zip(w, _grad(w, *pieces[0]))]
            direction = [g.numpy() for g in _grad(trial, *pieces[1])]
            if hessian_free:
                hv = _hessian_vector(w, *pieces[2], direction)
                direction = [d - ALPHA * h.numpy() for d, h in zip(direction, hv)]
            w = [v - BETA * d for v, d in zip(w, direction)]
        trained.append(w)
        counts.append(sum(len(x[s : s + size]) for s in range(0, len(x), size) if len(x[s : s + size]) >= parts))
    total = float(sum(counts))
    return [sum(c * t[k] for c, t in zip(counts, trained)) / total for k in range(4)]


# The Hessian-free variant runs again under another instruction set (scripts/test.sh); the exact one is the same plan.
@pytest.mark.parametrize('hessian_free', [False, pytest.param(True, marks=pytest.mark.numeric)])
def test_a_round_equals_the_two_batch_meta_step_by_hand_on_both_backends(hessian_free):
    arrays = client_arrays(sizes=(23, 30, 17, 41))
    depth = HVP_DEPTH if hessian_free else DEPTH
    results = {}
    for backend in ('engine', 'per_client'):
        with mock.patch.object(backends.logging, 'info') as log:
            process = build(backend, hessian_free)
        # No fallback: the engine runs the step kind (the engine's one line naming its strategy aside).
        assert not [c for c in log.call_args_list if 'per-client backend' in c.args[0]]
        assert process.simulation == backend
        state = process.initialize()
        initial = process.get_model_weights(state).trainable
        output = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays))
        expected = reference_round(initial, arrays, hessian_free)
        results[backend] = process.get_model_weights(output.state).trainable
        bound = tolerances.reorder_bound(depth=depth, scale=1.0, steps=STEPS)
        assert max(np.abs(e - np.asarray(i)).max() for e, i in zip(expected, initial)) > 100 * bound  # Trained.
        for got, want in zip(results[backend], expected):
            tolerances.assert_reordered_close(got, want, depth=depth, steps=STEPS)
        results[backend + '_metrics'] = output.metrics
    for got, want in zip(results['engine'], results['per_client']):
        tolerances.assert_reordered_close(got, want, depth=depth, steps=STEPS)
    # The metrics (of the second parts at the trial weights) agree too.
    engine, per_client = (results[f'{b}_metrics']['client_work']['train'] for b in ('engine', 'per_client'))
    assert engine['num_examples'] == per_client['num_examples'] > 0
    # The loss adds each example's (a forward pass) over the round's second parts (fewer than the 111 examples).
    tolerances.assert_reordered_close(engine['loss'], per_client['loss'], depth=depth + 111, steps=STEPS)


def test_the_hessian_free_step_differs_from_the_first_order_one():
    arrays = client_arrays(sizes=(30,))
    weights = [v.numpy() for v in model_fn().global_trainable_variables]
    first, second = reference_round(weights, arrays, False), reference_round(weights, arrays, True)
    # The reference itself is not degenerate: the two steps differ far beyond the bound the backends are held to.
    bound = tolerances.reorder_bound(depth=HVP_DEPTH, scale=1.0, steps=STEPS)
    assert np.abs(first[0] - second[0]).max() > 100 * bound


def test_nothing_private_reaches_the_server():
    process = build('per_client')  # Its private state is empty (pFedMe's test audits the engine's theta).
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []


def test_one_adaptation_step_personalizes_the_meta_learned_model():
    arrays = client_arrays(seed=1, sizes=(60,) * 4)
    process = build('engine')
    state, privates = process.initialize(), [process.initial_private_state()] * 4
    for _ in range(20):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
    weights = process.get_model_weights(state)
    before, after = [], []
    for x, y in arrays:
        batch = collections.OrderedDict(x=x[: BATCH * 2], y=y[: BATCH * 2])
        adapted = per_fedavg.adapt(model_fn, weights, batch, ALPHA, loss_fn)
        before.append(float(_loss([tf.constant(w) for w in weights.trainable], x, y)))
        after.append(float(_loss([tf.constant(w) for w in adapted.trainable], x, y)))
    assert np.mean(after) < np.mean(before), (before, after)
