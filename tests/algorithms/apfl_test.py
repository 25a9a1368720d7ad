"""APFL, one client plan run by both backends: each equals a plain eager loop written here (the mixture's gradient
for v and alpha by hand), alpha stays within [0, 1] and moves, the personal model and alpha never reach the server,
and the personalized models fit per-client label permutations that the global model cannot."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal.algorithms import apfl
from fedpersonal.core import client_plan
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets

NUM_CLASSES, DIM, HIDDEN = 3, 6, 8
LR, PERSONAL_LR = 0.1, 0.2
# The longest chain of additions feeding a weight in one SGD step of the DIM-HIDDEN-NUM_CLASSES model on batches of
# 10 (client_arrays: 4 clients of at most 40 examples): the forward fan-ins (6 + 8), the backward fan-outs (3 + 8),
# the batch's gradient sum (10), then the weighted mean over the 4 clients.
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + 10 + 4
# alpha's gradient adds the products over all the model's parameters, and feeds the personal model's next step.
PRIVATE_DEPTH = DEPTH + (DIM * HIDDEN + HIDDEN + HIDDEN * NUM_CLASSES + NUM_CLASSES)
# A round: 2 personal and 2 global epochs of 4 batches, each step feeding the next; two rounds.
STEPS = 2 * (2 + 2) * 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def model_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, 'relu', kernel_initializer=init(seed=1)),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2)),
        ]
    )


def build(backend, initial_alpha=0.5):
    with backends.use(backend):
        return algorithms.build_apfl(
            model_fn,
            element_spec=SPEC,
            initial_alpha=initial_alpha,
            client_epochs=2,
            personal_epochs=2,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            personal_optimizer=tff.learning.optimizers.build_sgdm(PERSONAL_LR),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        )


# ------------------------------------------------------------------ the reference: a plain eager loop, by hand
def _loss_and_grads(weights, x, y):
    weights = [tf.constant(w) for w in weights]
    with tf.GradientTape() as tape:
        tape.watch(weights)
        w1, b1, w2, b2 = weights
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return [g.numpy() for g in tape.gradient(loss, weights)]


def reference_round(body, privates, arrays, batch=10):
    trained, examples, new_privates = [], [], []
    for (x, y), private in zip(arrays, privates):
        v, alpha = [np.array(p) for p in private[:-1]], float(private[-1])
        for _ in range(2):  # Personal phase: v and alpha on the mixture at the received w.
            for s in range(0, len(x), batch):
                a = min(max(alpha, 0.0), 1.0)
                g = _loss_and_grads(
                    [a * vi + (1 - a) * wi for vi, wi in zip(v, body)], x[s : s + batch], y[s : s + batch]
                )
                d_alpha = (
                    sum(float(np.sum((vi - wi) * gi)) for vi, wi, gi in zip(v, body, g)) if 0 <= alpha <= 1 else 0.0
                )
                v = [vi - PERSONAL_LR * a * gi for vi, gi in zip(v, g)]
                alpha -= PERSONAL_LR * d_alpha
        alpha = min(max(alpha, 0.0), 1.0)
        w, seen = [np.array(b) for b in body], 0
        for _ in range(2):  # Global phase: FedAvg's local SGD on the copy of w.
            for s in range(0, len(x), batch):
                g = _loss_and_grads(w, x[s : s + batch], y[s : s + batch])
                w = [wi - LR * gi for wi, gi in zip(w, g)]
                seen += len(x[s : s + batch])
        trained.append(w)
        examples.append(seen)
        new_privates.append(v + [np.float32(alpha)])
    total = float(sum(examples))
    new_body = [sum(n * t[k] for n, t in zip(examples, trained)) / total for k in range(len(body))]
    return new_body, new_privates


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_every_backend_equals_a_plain_loop(backend):
    arrays = client_arrays()
    process = build(backend)
    assert process.simulation == backend
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    expected_privates = [list(body) + [np.float32(0.5)]] * len(arrays)
    assert float(privates[0].trainable[-1]) == 0.5  # Stored as given.
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        body, expected_privates = reference_round(body, expected_privates, arrays)
    bound = tolerances.reorder_bound(depth=PRIVATE_DEPTH, scale=1.0, steps=STEPS)
    assert abs(float(expected_privates[0][-1]) - 0.5) > 100 * bound  # alpha moved far beyond the bound.
    for got, want in zip(process.get_model_weights(state).trainable, body):
        tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=STEPS)
    for got, want in zip(privates, expected_privates):
        for g, w in zip(got.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=PRIVATE_DEPTH, steps=STEPS)


def test_alpha_stays_within_0_and_1_and_moves():
    arrays = client_arrays(seed=1, sizes=(40,) * 4)
    for initial in (0.0, 0.5):
        process = build('engine', initial_alpha=initial)
        state, privates = process.initialize(), [process.initial_private_state()] * 4
        for _ in range(3):
            output = process.run_round(state, datasets(arrays), privates)
            state, privates = output.state, list(output.private_states)
        alphas = np.array([float(p.trainable[-1]) for p in privates])
        assert np.all((alphas >= 0.0) & (alphas <= 1.0)), alphas
        # Each client's own labels favour its personal model, so alpha rises (projected back onto 1 when it would
        # pass it); from the boundary 0 a projected step can leave it or stay, per client.
        assert np.all(alphas > 0.5) if initial == 0.5 else len(set(alphas.tolist())) > 1, alphas


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_the_personal_model_and_alpha_never_reach_the_server(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_personalized_models_fit_what_the_global_model_cannot():
    arrays = client_arrays(seed=2, sizes=(60,) * 4)
    process = build('engine', initial_alpha=0.5)
    state, privates = process.initialize(), [process.initial_private_state()] * 4
    for _ in range(15):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
    weights = process.get_model_weights(state)

    def accuracy(trainable, x, y):
        w1, b1, w2, b2 = trainable
        logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        return float(np.mean(np.argmax(logits, -1) == y))

    sgd = tff.learning.optimizers.build_sgdm(LR)
    plan = apfl.apfl_plan(
        client_epochs=1, personal_epochs=1, client_optimizer=sgd, personal_optimizer=sgd, initial_alpha=0.5
    )
    mixed = [client_plan.personalized_weights(plan, weights, p).trainable for p in privates]
    *v, alpha = [np.asarray(t) for t in privates[0].trainable]  # The mixture, written here.
    a = np.clip(alpha, 0.0, 1.0)
    # Elementwise, no sum: the two products and the addition may round differently (another formula, an FMA).
    tolerances.assert_reordered_close(mixed[0][0], a * v[0] + (1 - a) * np.asarray(weights.trainable[0]), depth=3)
    personalized = np.mean([accuracy(m, x, y) for m, (x, y) in zip(mixed, arrays)])
    shared = np.mean([accuracy([np.asarray(w) for w in weights.trainable], x, y) for x, y in arrays])
    assert personalized > 0.8 and personalized > shared + 0.3, (personalized, shared)


# ------------------------------------------------------------------ PFLlib's variant (clientapfl.py), by hand
def pfllib_reference_round(body, privates, arrays, batch=10, epochs=2):
    trained, examples, new_privates = [], [], []
    for (x, y), private in zip(arrays, privates):
        v, alpha = [np.array(p) for p in private[:-1]], float(private[-1])
        w, seen = [np.array(b) for b in body], 0
        for _ in range(epochs):
            for s in range(0, len(x), batch):
                g_w = _loss_and_grads(w, x[s : s + batch], y[s : s + batch])
                g_v = _loss_and_grads(v, x[s : s + batch], y[s : s + batch])
                w = [wi - LR * gi for wi, gi in zip(w, g_w)]
                v = [vi - LR * gi for vi, gi in zip(v, g_v)]
                grad_alpha = sum(
                    float(np.sum((vi - wi) * (alpha * gv + (1 - alpha) * gw))) for vi, wi, gv, gw in zip(v, w, g_v, g_w)
                )
                alpha = min(max(alpha - LR * (grad_alpha + 0.02 * alpha), 0.0), 1.0)
                seen += len(x[s : s + batch])
        v = [(1 - alpha) * wi + alpha * vi for vi, wi in zip(v, w)]
        trained.append(w)
        examples.append(seen)
        new_privates.append(v + [np.float32(alpha)])
    total = float(sum(examples))
    new_body = [sum(n * t[k] for n, t in zip(examples, trained)) / total for k in range(len(body))]
    return new_body, new_privates


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_pfllib_variant_on_every_backend_equals_clientapfl_written_here(backend):
    plan = apfl.pfllib_plan(client_epochs=2, learning_rate=LR, initial_alpha=0.5)
    with backends.use(backend):
        process = backends.build_classifier_process(
            plan, model_fn, element_spec=SPEC, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    assert process.simulation == backend
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    arrays = client_arrays()
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    expected = [list(body) + [np.float32(0.5)]] * len(arrays)
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        body, expected = pfllib_reference_round(body, expected, arrays)
    assert all(abs(float(p[-1]) - 0.5) > 1e-3 for p in expected)  # alpha moved for every client.
    for got, want in zip(process.get_model_weights(state).trainable, body):
        tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=STEPS)
    for got, want in zip(privates, expected):
        for g, w in zip(got.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=PRIVATE_DEPTH, steps=STEPS)
    # The client predicts with v (already its mixture), not a mixture of v with the global model.
    predicting = client_plan.personalized_weights(plan, process.get_model_weights(state), privates[0]).trainable
    assert all(np.array_equal(p, np.asarray(v)) for p, v in zip(predicting, privates[0].trainable[:-1]))
