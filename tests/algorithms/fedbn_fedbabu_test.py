"""FedBN and FedBABU, each one client plan run by both backends: every backend equals a plain eager loop written
here, FedBN's batch norm weights (scale, offset and moving statistics) never reach a SERVER-placed value and move
per client, and FedBABU's head stays at its initial values while the body trains."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import models
from fedpersonal.algorithms import fedbabu
from fedpersonal.algorithms import fedbn
from fedpersonal.privacy import audit
from tests import tolerances

NUM_CLIENTS, NUM_CLASSES, DIM, HIDDEN = 4, 3, 6, 8
LR, MOMENTUM, EPSILON = 0.1, 0.9, 1e-3
# The longest chains of additions feeding a weight in one SGD step on batches of 10, then the weighted mean over the
# 4 clients. FedBN's dense-batch norm-dense model: the forward fan-ins (DIM, HIDDEN), the batch's moments (10 + 10),
# the backward fan-out (NUM_CLASSES), batch norm's backward sums over the batch (10 + 10), the batch's gradient sum
# (10). FedBABU's dense-dense model: the fan-ins (DIM + HIDDEN), the fan-outs (NUM_CLASSES + HIDDEN), the batch's sum.
FEDBN_DEPTH = DIM + HIDDEN + 2 * 10 + NUM_CLASSES + 2 * 10 + 10 + NUM_CLIENTS
FEDBABU_DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + 10 + NUM_CLIENTS
# 2 rounds of 2 epochs of at most 4 batches (40 examples), each step feeding the next.
STEPS = 2 * 2 * 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def bn_keras_model():
    """dense (no bias) -> batch norm -> relu -> dense: the batch norm's shape (HIDDEN,) is no other weight's."""
    return tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, use_bias=False, kernel_initializer=tf.keras.initializers.GlorotUniform(1)),
            tf.keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=EPSILON),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2)),
        ]
    )


fedbn_model_fn = fedbn.fedbn_model_fn(bn_keras_model, input_spec=SPEC)


def body_head_model_fn():
    inputs = tf.keras.Input(shape=[DIM])
    body = tf.keras.layers.Dense(HIDDEN, activation='relu', kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    keras_model = tf.keras.Model(inputs, head(body(inputs)))
    return models.from_keras_model(keras_model, input_spec=SPEC, global_layers=[body], local_layers=[head])


def client_arrays(seed=0, sizes=(23, 30, 17, 40), permute=True):
    """Class structure shared by the clients, each client's features shifted and scaled its own way (FedBN's
    feature skew) and its labels permuted (unless not `permute`)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=[NUM_CLASSES, DIM]) * 3
    arrays = []
    for client, n in enumerate(sizes):
        cls = rng.integers(0, NUM_CLASSES, n)
        x = (centres[cls] + rng.normal(size=[n, DIM])) * (1 + client) + client
        labels = np.roll(np.arange(NUM_CLASSES), client if permute else 0)[cls]
        arrays.append((x.astype(np.float32), labels.astype(np.int32)))
    return arrays


def datasets(arrays, batch=10):
    return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch) for x, y in arrays]


def build(name, backend, lr=LR):
    common = dict(
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        client_optimizer=tff.learning.optimizers.build_sgdm(lr),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        client_epochs=2,
    )
    with backends.use(backend):
        if name == 'fedbn':
            return fedbn.build_fedbn(fedbn_model_fn, **common)
        return fedbabu.build_fedbabu(body_head_model_fn, **common)


def _batches(x, y, epochs, batch=10):
    return [(x[s : s + batch], y[s : s + batch]) for s in range(0, len(x), batch)] * epochs


# ------------------------------------------------------------------ the references: plain eager loops, by hand
def fedbn_reference_round(shared, bns, arrays):
    """shared = [w1, w2, b2]; bns[c] = ([gamma, beta], [moving mean, moving variance]). Batch norm by hand: batch
    moments (biased variance) in training, moving = momentum * moving + (1 - momentum) * batch moment."""
    trained, weights, new_bns = [], [], []
    for (x, y), (bn_trainable, (mean, var)) in zip(arrays, bns):
        w1, w2, b2 = [tf.Variable(v) for v in shared]
        gamma, beta = [tf.Variable(v) for v in bn_trainable]
        seen = 0
        for xb, yb in _batches(x, y, 2):
            with tf.GradientTape() as tape:
                h = tf.matmul(xb, w1)
                m, v = tf.reduce_mean(h, 0), tf.math.reduce_variance(h, 0)
                h = tf.nn.relu(gamma * (h - m) / tf.sqrt(v + EPSILON) + beta)
                logits = tf.matmul(h, w2) + b2
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits))
            variables = [w1, w2, b2, gamma, beta]
            for var_, g in zip(variables, tape.gradient(loss, variables)):
                var_.assign_sub(LR * g)
            mean = MOMENTUM * mean + (1 - MOMENTUM) * m.numpy()
            var = MOMENTUM * var + (1 - MOMENTUM) * v.numpy()
            seen += len(xb)
        trained.append([w1.numpy(), w2.numpy(), b2.numpy()])
        new_bns.append(([gamma.numpy(), beta.numpy()], [mean, var]))
        weights.append(seen)
    total = float(sum(weights))
    return [sum(w * t[k] for w, t in zip(weights, trained)) / total for k in range(3)], new_bns


def fedbabu_reference_round(body, head, arrays):
    """The body trained by plain SGD with the head fixed at `head`; the example-weighted mean of the bodies."""
    trained, weights = [], []
    for x, y in arrays:
        w1, b1 = [tf.Variable(v) for v in body]
        for xb, yb in _batches(x, y, 2):
            with tf.GradientTape() as tape:
                logits = tf.matmul(tf.nn.relu(tf.matmul(xb, w1) + b1), head[0]) + head[1]
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits))
            for var_, g in zip([w1, b1], tape.gradient(loss, [w1, b1])):
                var_.assign_sub(LR * g)
        trained.append([w1.numpy(), b1.numpy()])
        weights.append(len(x) * 2)
    total = float(sum(weights))
    return [sum(w * t[k] for w, t in zip(weights, trained)) / total for k in range(2)]


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_fedbn_equals_a_plain_loop_on_every_backend(backend):
    arrays = client_arrays()
    process = build('fedbn', backend)
    assert process.simulation == backend
    state = process.initialize()
    initial = process.initial_private_state()
    shared = [np.asarray(v) for v in process.get_model_weights(state).trainable]
    initial_shared = shared
    bns = [([np.asarray(v) for v in initial.trainable], [np.asarray(v) for v in initial.non_trainable])] * NUM_CLIENTS
    np.testing.assert_array_equal(bns[0][1][1], np.ones(HIDDEN))  # Moving variance starts at 1.
    privates = [initial] * NUM_CLIENTS
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        shared, bns = fedbn_reference_round(shared, bns, arrays)
    # Each tensor against its own magnitude (the moving variances reach ~40; the inputs' scales, up to ~50, are
    # normalized away by the batch norm after the first layer, so its gradient's terms stay O(1) too).
    bound = tolerances.reorder_bound(depth=FEDBN_DEPTH, scale=1.0, steps=STEPS)
    assert max(np.abs(s - np.asarray(i)).max() for s, i in zip(shared, initial_shared)) > 100 * bound  # Trained.
    for got, want in zip(process.get_model_weights(state).trainable, shared):
        tolerances.assert_reordered_close(got, want, depth=FEDBN_DEPTH, steps=STEPS)
    for got, (want_trainable, want_statistics) in zip(privates, bns):
        for g, w in zip(list(got.trainable) + list(got.non_trainable), want_trainable + want_statistics):
            tolerances.assert_reordered_close(g, w, depth=FEDBN_DEPTH, steps=STEPS)


def test_fedbn_batch_norm_weights_never_reach_the_server_and_move_per_client():
    arrays = client_arrays()
    for backend in ('engine', 'per_client'):
        process = build('fedbn', backend)
        assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
        result = process.next.type_signature.result
        assert (HIDDEN,) not in audit.tensor_shapes(result.state) | audit.tensor_shapes(result.metrics)
        assert result.private_states.placement is tff.CLIENTS
        private = process.initial_private_state()
        assert [np.shape(t) for t in private.trainable] == [(HIDDEN,)] * 2  # Scale and offset,
        assert [np.shape(t) for t in private.non_trainable] == [(HIDDEN,)] * 2  # and the moving statistics.
        output = process.run_round(
            process.initialize(), datasets(arrays), [process.initial_private_state()] * NUM_CLIENTS
        )
        means = [np.asarray(p.non_trainable[0]) for p in output.private_states]
        assert all(np.abs(m).max() > 0.1 for m in means)  # Moved from 0,
        assert min(np.abs(a - b).max() for i, a in enumerate(means) for b in means[i + 1 :]) > 0.1  # each its own.


def test_fedbn_learns_clients_whose_features_are_shifted_and_scaled_their_own_way():
    data = datasets(client_arrays(sizes=(60, 80, 50, 70), permute=False))  # Feature skew alone: one labelling.
    with backends.use('engine'):
        process = fedbn.build_fedbn(
            fedbn_model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy()],
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        )
    state, private, train = process.initialize(), [process.initial_private_state()] * NUM_CLIENTS, []
    for _ in range(6):
        output = process.run_round(state, data, private)
        state, private = output.state, list(output.private_states)
        train.append(output.metrics['client_work']['train'])
    assert train[0]['sparse_categorical_accuracy'] < 0.7  # From chance-like predictions (3 classes)
    assert train[-1]['sparse_categorical_accuracy'] > 0.95  # to fitting every client,
    assert train[-1]['loss'] < train[0]['loss'] / 3  # the loss falling with the rounds.


def test_fedbn_needs_batch_norm_layers():
    plain = fedbn.fedbn_model_fn(
        lambda: tf.keras.Sequential([tf.keras.Input([DIM]), tf.keras.layers.Dense(2)]), input_spec=SPEC
    )
    with pytest.raises(ValueError, match='FedBN needs a model with BatchNormalization'):
        plain()


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_fedbabu_equals_a_plain_loop_with_the_head_frozen_at_its_initial_values(backend):
    arrays = client_arrays()
    process = build('fedbabu', backend)
    model = body_head_model_fn()
    body = [v.numpy() for v in model.global_trainable_variables]
    head = [v.numpy() for v in model.local_trainable_variables]
    initial_body = body
    state = process.initialize()
    for _ in range(2):
        state = process.run_round(state, datasets(arrays), None).state
        body = fedbabu_reference_round(body, head, arrays)
    got = process.get_model_weights(state).trainable
    assert len(got) == 2  # The body only: the head is not the server's.
    bound = tolerances.reorder_bound(depth=FEDBABU_DEPTH, scale=1.0, steps=STEPS)
    assert max(np.abs(w - i).max() for w, i in zip(body, initial_body)) > 100 * bound  # Trained far beyond it.
    for g, w in zip(got, body):
        tolerances.assert_reordered_close(g, w, depth=FEDBABU_DEPTH, steps=STEPS)


def test_fedbabu_keeps_no_head_anywhere_and_trains_the_body():
    """The head is neither server state nor client state (it is the model's initial one, every round); the body
    moves. Its staying at the initial values during training is the plain-loop comparison above."""
    arrays = client_arrays()
    for backend in ('engine', 'per_client'):
        process = build('fedbabu', backend)
        assert not process.stateful
        result = process.next.type_signature.result
        assert (HIDDEN, NUM_CLASSES) not in audit.tensor_shapes(result.state) | audit.tensor_shapes(result.metrics)
        state = process.initialize()
        before = np.asarray(process.get_model_weights(state).trainable[0])
        after = process.get_model_weights(process.run_round(state, datasets(arrays), None).state).trainable[0]
        assert not np.allclose(before, after)
