"""FedPer and FedRep, each one client plan run by both backends: every backend equals a plain eager loop written
here (independent of the package's client work), FedRep's body is frozen during its head epochs, the head never
reaches a SERVER-placed value, FedPer learns personal heads, and an aggregator the engine cannot run falls back to
the per-client backend."""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import models
from fedpersonal.privacy import audit
from tests import tolerances

NUM_CLIENTS, NUM_CLASSES, DIM, HIDDEN = 4, 3, 6, 8
LR, SERVER_LR = 0.1, 1.0

# The longest chain of additions feeding a weight in one SGD step of the DIM-HIDDEN-NUM_CLASSES model on batches of
# 10: the forward fan-ins (6 + 8), the backward fan-outs (3 + 8), the batch's gradient sum (10), then the weighted
# mean over the 4 clients. (A step's terms stay O(1): LR 0.1 times inputs of |x| < 10 times the mean over 10.)
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + 10 + NUM_CLIENTS
# SGD steps a round: every client has at most 40 examples, 4 batches an epoch; FedPer 2 epochs, FedRep 3 + 2.
STEPS_PER_ROUND = {'fedper': 2 * 4, 'fedrep': (3 + 2) * 4}


def model_fn():
    inputs = tf.keras.Input(shape=[DIM])
    body = tf.keras.layers.Dense(HIDDEN, activation='relu', kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    keras_model = tf.keras.Model(inputs, head(body(inputs)))
    spec = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))
    return models.from_keras_model(keras_model, input_spec=spec, global_layers=[body], local_layers=[head])


def client_arrays(seed=0, sizes=(23, 30, 17, 40)):
    """Shared features -> class structure, every client naming the classes differently (a permutation)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=[NUM_CLASSES, DIM]) * 3
    arrays = []
    for client, n in enumerate(sizes):
        cls = rng.integers(0, NUM_CLASSES, n)
        x = (centres[cls] + rng.normal(size=[n, DIM])).astype(np.float32)
        arrays.append((x, np.roll(np.arange(NUM_CLASSES), client)[cls].astype(np.int32)))
    return arrays


def datasets(arrays, batch=10):
    return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch) for x, y in arrays]


def build(name, backend, **kwargs):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    common = dict(
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        server_optimizer=tff.learning.optimizers.build_sgdm(SERVER_LR),
        **kwargs,
    )
    with backends.use(backend):
        if name == 'fedper':
            return algorithms.build_fedper(model_fn, client_optimizer=sgd, client_epochs=2, **common)
        return algorithms.build_fedrep(
            model_fn, head_optimizer=sgd, body_optimizer=sgd, head_epochs=3, body_epochs=2, **common
        )


# ------------------------------------------------------------------ the reference: a plain eager loop, by hand
def _sgd_passes(variables, frozen, passes):
    """Plain SGD on `variables` = [w1, b1, w2, b2] entries named by index, the others constant, over `passes` (a
    list of epochs, each a list of (x, y) batches); returns the number of examples seen."""
    seen = 0
    for batches in passes:
        for xb, yb in batches:
            with tf.GradientTape() as tape:
                w1, b1, w2, b2 = variables
                logits = tf.matmul(tf.nn.relu(tf.matmul(xb, w1) + b1), w2) + b2
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits))
            trained = [i for i in range(4) if i not in frozen]
            grads = tape.gradient(loss, [variables[i] for i in trained])
            for i, g in zip(trained, grads):
                variables[i].assign_sub(LR * g)
            seen += len(xb)
    return seen


def _fixed_passes(x, y, epochs, batch=10):
    return [[(x[s : s + batch], y[s : s + batch]) for s in range(0, len(x), batch)]] * epochs


def reference_round(name, body, heads, arrays, passes_fn=None):
    """One round by hand: each client's phases, then the example-weighted mean of the trained bodies.
    `passes_fn(client, first_pass, epochs)` gives a phase's batches (default: the arrays in order, every epoch)."""
    passes_fn = passes_fn or (lambda client, first, epochs: _fixed_passes(*arrays[client], epochs))
    trained_bodies, weights, new_heads = [], [], []
    for client, head in enumerate(heads):
        variables = [tf.Variable(v) for v in list(body) + list(head)]
        if name == 'fedper':
            seen = _sgd_passes(variables, (), passes_fn(client, 0, 2))
        else:
            _sgd_passes(variables, (0, 1), passes_fn(client, 0, 3))  # Head, body frozen.
            seen = _sgd_passes(variables, (2, 3), passes_fn(client, 3, 2))  # Body, head frozen.
        trained_bodies.append([v.numpy() for v in variables[:2]])
        new_heads.append([v.numpy() for v in variables[2:]])
        weights.append(seen)
    total = float(sum(weights))
    mean = [sum(w * b[k] for w, b in zip(weights, trained_bodies)) / total for k in range(2)]
    new_body = [b - SERVER_LR * (b - m) for b, m in zip(body, mean)]
    return new_body, new_heads


@pytest.mark.numeric
def test_per_client_phases_see_a_reshuffling_datasets_successive_orders_in_plan_order(initial):
    """FedRep's head epochs see the dataset's 1st-3rd shuffles, its body epochs the 5th-6th (TF's `repeat` opens the
    dataset once more to find its end: a 4th shuffle, unused), twice the same: the phases open the dataset in plan
    order (they train disjoint variables, so the plan orders them explicitly; this run did not show the race
    without that ordering, so the test checks the order, not the race)."""
    arrays = client_arrays()

    def shuffled(client):
        x, y = arrays[client]
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=client, reshuffle_each_iteration=True)

    def as_model_input(dataset):
        return dataset.map(lambda x, y: collections.OrderedDict(x=x, y=y)).batch(10)

    def passes(client, first, epochs):
        dataset = shuffled(client).batch(10)  # A new object: its k-th iteration is the k-th shuffle, as in TFF.
        start = first + (first > 0)  # After a phase of first > 1 epochs, whose repeat drew one shuffle more.
        orders = [[(xb.numpy(), yb.numpy()) for xb, yb in dataset] for _ in range(start + epochs)]
        return orders[start:]

    process = build('fedrep', 'per_client')
    body, head = initial
    for _ in range(2):  # The same numbers twice (the order was the runtime's choice before the plan fixed it).
        output = process.run_round(
            process.initialize(),
            [as_model_input(shuffled(c)) for c in range(len(arrays))],
            [process.initial_private_state()] * len(arrays),
        )
        expected_body, expected_heads = reference_round(
            'fedrep', list(body), [list(head)] * len(arrays), arrays, passes
        )
        steps = STEPS_PER_ROUND['fedrep']  # One round.
        for got, want in zip(process.get_model_weights(output.state).trainable, expected_body):
            tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=steps)
        for got, want in zip(output.private_states, expected_heads):
            for g, w in zip(got.trainable, want):
                tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=steps)


@pytest.fixture(scope='module')
def initial():
    model = model_fn()
    body = [v.numpy() for v in model.global_trainable_variables]
    head = [v.numpy() for v in model.local_trainable_variables]
    return body, head


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
@pytest.mark.parametrize('name', ['fedper', 'fedrep'])
def test_every_backend_equals_a_plain_loop(initial, name, backend):
    arrays = client_arrays()
    process = build(name, backend)
    assert process.simulation == backend
    state = process.initialize()
    body, head = initial
    np.testing.assert_array_equal(process.get_model_weights(state).trainable[0], body[0])  # The same initializer.
    heads = [process.initial_private_state()] * NUM_CLIENTS
    expected_body, expected_heads = list(body), [list(head)] * NUM_CLIENTS
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), heads)
        state, heads = output.state, list(output.private_states)
        expected_body, expected_heads = reference_round(name, expected_body, expected_heads, arrays)
    steps = 2 * STEPS_PER_ROUND[name]  # Two rounds.
    bound = tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)
    moved = [np.abs(w - b).max() for w, b in zip(expected_body + expected_heads[0], body + head)]
    assert min(moved) > 100 * bound, moved  # Every variable trained far beyond the bound.
    for got, want in zip(process.get_model_weights(state).trainable, expected_body):
        tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=steps)
    for got, want in zip(heads, expected_heads):
        for g, w in zip(got.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=steps)
    metrics = output.metrics['client_work']['train']
    # Metrics count every step of every phase: 2 epochs (FedPer), 3 head + 2 body epochs (FedRep).
    assert metrics['num_examples'] == sum(len(x) for x, _ in arrays) * (2 if name == 'fedper' else 5)


def test_fedrep_freezes_the_body_during_head_epochs_and_the_head_during_body_epochs(initial):
    arrays = client_arrays()
    sgd0 = tff.learning.optimizers.build_sgdm(0.0)
    sgd = tff.learning.optimizers.build_sgdm(LR)
    loss_fn = lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    server = tff.learning.optimizers.build_sgdm(1.0)
    body, head = initial
    for backend in ('engine', 'per_client'):
        with backends.use(backend):
            body_still = algorithms.build_fedrep(
                model_fn, loss_fn=loss_fn, head_optimizer=sgd, body_optimizer=sgd0, server_optimizer=server
            )
            head_still = algorithms.build_fedrep(
                model_fn, loss_fn=loss_fn, head_optimizer=sgd0, body_optimizer=sgd, server_optimizer=server
            )
        out = body_still.run_round(body_still.initialize(), datasets(arrays), [body_still.initial_private_state()] * 4)
        np.testing.assert_array_equal(body_still.get_model_weights(out.state).trainable[0], body[0])
        assert not np.allclose(out.private_states[0].trainable[0], head[0])
        out = head_still.run_round(head_still.initialize(), datasets(arrays), [head_still.initial_private_state()] * 4)
        np.testing.assert_array_equal(out.private_states[0].trainable[0], head[0])
        assert not np.allclose(head_still.get_model_weights(out.state).trainable[0], body[0])


@pytest.mark.parametrize('name', ['fedper', 'fedrep'])
def test_the_head_never_reaches_the_server(name):
    for backend in ('engine', 'per_client'):
        process = build(name, backend)
        assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
        result = process.next.type_signature.result
        head_shapes = {(HIDDEN, NUM_CLASSES), (NUM_CLASSES,)}
        assert not head_shapes & (audit.tensor_shapes(result.state) | audit.tensor_shapes(result.metrics))
        assert result.private_states.placement is tff.CLIENTS


def test_fedper_learns_personal_heads():
    arrays = client_arrays(seed=1, sizes=(60,) * NUM_CLIENTS)
    process = build('fedper', 'engine')
    state, heads, losses = process.initialize(), [process.initial_private_state()] * NUM_CLIENTS, []
    for _ in range(15):
        output = process.run_round(state, datasets(arrays), heads)
        state, heads = output.state, list(output.private_states)
        losses.append(output.metrics['client_work']['train']['loss'])
    assert losses[-1] < 0.35 * losses[0], losses
    assert not np.allclose(heads[0].trainable[0], heads[1].trainable[0])  # Per-client label permutations.


def test_an_aggregator_the_engine_cannot_run_falls_back_to_the_per_client_backend():
    aggregator = tff.learning.robust_aggregator(zeroing=True, clipping=False)
    with mock.patch.object(backends.logging, 'info') as log:
        process = build('fedper', 'engine', model_aggregator=aggregator)
    assert process.simulation == 'per_client'
    (message, *args), _ = log.call_args
    assert (message % tuple(args)).startswith('FedPer runs on the per-client backend: The fast simulation engine')
    arrays = client_arrays()
    output = process.next(process.initialize(), datasets(arrays), [process.initial_private_state()] * NUM_CLIENTS)
    assert np.isfinite(output.metrics['client_work']['train']['loss'])
