"""FedALA, one client plan: on every backend (per-client, the grouped engine with its own weight-learning loop) it
equals a plain eager loop written here (ALA.py's weight learning by hand), its element-wise weights stay within
[0, 1] and move, the client's model and weights never reach the server, and the aggregated models fit per-client
label permutations that the global model cannot."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import fedala
from fedpersonal.core import client_plan
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets

NUM_CLASSES, DIM, HIDDEN, LR = 3, 6, 8, 0.1
# The longest chain of additions feeding a weight in one SGD or weight-learning step of the DIM-HIDDEN-NUM_CLASSES
# model on batches of 10: the forward fan-ins (6 + 8), the backward fan-outs (3 + 8), the batch's gradient sum (10),
# then the weighted mean over client_arrays' 3 clients (sizes 23, 30, 17). (The mixing weights' gradient is
# element-wise: no sum of its own.)
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + 10 + 3
# 3 rounds of 3 batches: the first trains only; the second learns the weights for at most max_epochs = 15 epochs of
# the 80% sample (3 batches of 10), then trains; the third takes one weight-learning pass, then trains.
STEPS = 3 + (15 * 3 + 3) + (3 + 3)
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))
# A threshold at which the clients' first weight learning settles after more than the minimum 11 epochs, or runs
# to the cap (checked in the test).
ALA = fedala.AdaptiveLocalAggregation(eta=2.0, rand_percent=80, batch_size=10, threshold=0.02, max_epochs=15, seed=3)


def model_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, 'relu', kernel_initializer=init(seed=1)),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2)),
        ]
    )


def build(backend, aggregation=ALA, epochs=1):
    with backends.use(backend):
        return fedala.build_fedala(
            model_fn,
            element_spec=SPEC,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            client_epochs=epochs,
            aggregation=aggregation,
        )


def run(process, arrays, rounds):
    state, privates = process.initialize(), [process.initial_private_state()] * len(arrays)
    for _ in range(rounds):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
    return state, privates


# ------------------------------------------------------------------ the reference: a plain eager loop, by hand
def _loss_and_grads(weights, x, y):
    weights = [tf.constant(w) for w in weights]
    with tf.GradientTape() as tape:
        tape.watch(weights)
        w1, b1, w2, b2 = weights
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return float(loss), [g.numpy() for g in tape.gradient(loss, weights)]


FIRST_EPOCHS = []  # The epochs of each reference client's first weight learning, as it goes.


def reference_ala(ala, own, mixing, count, received, x, y):
    """ALA.py's adaptive_local_aggregation: the start and the new W (the lower tensors take the received ones)."""
    if not np.any(own[0] != received[0]):
        return list(received), mixing, count
    n = len(x)
    size = n * ala.rand_percent // 100
    start = int(tf.random.stateless_uniform([], [ala.seed, count], 0, n - size + 1, dtype=tf.int64))
    xs, ys = x[start : start + size], y[start : start + size]
    k = len(mixing)
    v, w = own[-k:], received[-k:]
    model = list(received[:-k]) + [vi + (wi - vi) * m for vi, wi, m in zip(v, w, mixing)]
    losses = []
    while True:
        for s in range(0, len(xs), ala.batch_size):
            last, g = _loss_and_grads(model, xs[s : s + ala.batch_size], ys[s : s + ala.batch_size])
            mixing = [np.clip(m - ala.eta * gi * (wi - vi), 0, 1) for m, gi, wi, vi in zip(mixing, g[-k:], w, v)]
            model = model[:-k] + [vi + (wi - vi) * m for vi, wi, m in zip(v, w, mixing)]
        losses.append(last)
        if count > 0 or len(losses) >= ala.max_epochs:
            break
        if len(losses) > ala.num_pre_loss and np.std(losses[-ala.num_pre_loss :]) < ala.threshold:
            break
    if count == 0:
        FIRST_EPOCHS.append(len(losses))
    return model, mixing, count + 1


def reference_round(ala, server, privates, arrays, epochs=1, batch=10):
    trained, examples, new_privates = [], [], []
    for (x, y), (own, mixing, count) in zip(arrays, privates):
        weights, mixing, count = reference_ala(ala, own, mixing, count, server, x, y)
        for _ in range(epochs):
            for s in range(0, len(x), batch):
                _, g = _loss_and_grads(weights, x[s : s + batch], y[s : s + batch])
                weights = [wi - LR * gi for wi, gi in zip(weights, g)]
        trained.append(weights)
        examples.append(len(x) * epochs)
        new_privates.append((weights, mixing, count))
    total = float(sum(examples))
    return [sum(n * t[k] for n, t in zip(examples, trained)) / total for k in range(len(server))], new_privates


def test_the_engine_runs_it_itself():
    assert build('engine').simulation == 'engine'


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['per_client', 'engine'])
def test_it_equals_a_plain_loop(backend):
    arrays = client_arrays(sizes=(23, 30, 17))
    process = build(backend)
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    server = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    expected = [(list(server), [np.ones_like(server[2]), np.ones_like(server[3])], 0)] * len(arrays)
    for _ in range(3):  # No aggregation before a client's first round, then learning until settled, then one pass.
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        server, expected = reference_round(ALA, server, expected, arrays)
    initial = [np.asarray(w) for w in process.get_model_weights(process.initialize()).trainable]
    bound = tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=STEPS)
    assert max(np.abs(s - i).max() for s, i in zip(server, initial)) > 100 * bound  # Trained far beyond the bound.
    for got, want in zip(process.get_model_weights(state).trainable, server):
        tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=STEPS)
    for got, (own, mixing, count) in zip(privates, expected):
        for g, w in zip(got.trainable, own + mixing):
            tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=STEPS)
        assert int(got.non_trainable[-1]) == count == 2
    first = FIRST_EPOCHS[-len(arrays) :]  # Both ends of the first learning: settled, and stopped at the cap.
    assert ALA.num_pre_loss + 1 < min(first) < max(first) == ALA.max_epochs, first


@pytest.mark.numeric
def test_batch_norm_statistics_learn_on_through_the_aggregation_on_both_backends_alike():
    """Batch norm's moving statistics update on every weight-learning step (training mode), then in training: the
    engine carries them per client through both, as the per-client backend's variables hold them."""

    def bn_model():
        init = tf.keras.initializers.GlorotUniform
        return tf.keras.Sequential(
            [
                tf.keras.Input([DIM]),
                tf.keras.layers.Dense(HIDDEN, use_bias=False, kernel_initializer=init(seed=1)),
                tf.keras.layers.BatchNormalization(momentum=0.5),
                tf.keras.layers.ReLU(),
                tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2)),
            ]
        )

    arrays = client_arrays(sizes=(23, 30, 17))
    runs = {}
    for backend in ('per_client', 'engine'):
        with backends.use(backend):
            process = fedala.build_fedala(
                bn_model,
                element_spec=SPEC,
                client_optimizer=tff.learning.optimizers.build_sgdm(LR),
                server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
                aggregation=ALA,
            )
        assert process.simulation == backend
        state, privates = run(process, arrays, 3)
        weights = process.get_model_weights(state)
        runs[backend] = list(weights.trainable) + [
            t for p in privates for t in list(p.trainable) + list(p.non_trainable)
        ]
    # Batch norm adds the batch's mean and variance (10 terms each) to the chain; the steps are test_it_equals_a_plain
    # loop's (the same clients, rounds and weight learning).
    depth = DEPTH + 2 * 10
    moved = runs['engine'][-2]  # A client's moving variance, learned away from its initial ones.
    assert np.abs(moved - 1.0).max() > 100 * tolerances.reorder_bound(depth=depth, steps=STEPS, scale=1.0)
    for a, b in zip(runs['per_client'], runs['engine']):
        tolerances.assert_reordered_close(a, b, depth=depth, steps=STEPS)


def test_the_weights_stay_within_0_and_1_move_and_make_the_prediction():
    arrays = client_arrays(seed=1, sizes=(40,) * 3)
    process = build('per_client')
    state, privates = run(process, arrays, 3)
    weights = process.get_model_weights(state)
    mixing = np.concatenate([np.ravel(t) for p in privates for t in p.trainable[4:]])
    assert np.all((mixing >= 0.0) & (mixing <= 1.0)), mixing
    assert np.any(mixing < 1.0) and np.any(mixing == 0.0), mixing  # Learned away from their start; some clipped.
    plan = fedala.fedala_plan(client_epochs=1, client_optimizer=tff.learning.optimizers.build_sgdm(LR), aggregation=ALA)
    predicting = client_plan.personalized_weights(plan, weights, privates[0]).trainable
    own, w = [np.asarray(t) for t in privates[0].trainable], [np.asarray(t) for t in weights.trainable]
    np.testing.assert_array_equal(predicting[0], w[0])  # The lower layer: the global one; the head: aggregated.
    # Element-wise, no sum: its three operations may round differently (another formula, an FMA).
    tolerances.assert_reordered_close(predicting[2], own[2] + (w[2] - own[2]) * own[4], depth=3)


@pytest.mark.parametrize('backend', ['per_client', 'engine'])
def test_the_model_and_its_weights_never_reach_the_server(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_aggregated_models_fit_what_the_global_model_cannot():
    arrays = client_arrays(seed=2, sizes=(60,) * 4)
    process = build('per_client')
    state, privates = run(process, arrays, 12)
    weights = process.get_model_weights(state)

    def accuracy(trainable, x, y):
        w1, b1, w2, b2 = [np.asarray(t) for t in trainable]
        return float(np.mean(np.argmax(np.maximum(x @ w1 + b1, 0) @ w2 + b2, -1) == y))

    plan = fedala.fedala_plan(client_epochs=1, client_optimizer=tff.learning.optimizers.build_sgdm(LR), aggregation=ALA)
    personal = [client_plan.personalized_weights(plan, weights, p).trainable for p in privates]
    personalized = np.mean([accuracy(m, x, y) for m, (x, y) in zip(personal, arrays)])
    shared = np.mean([accuracy(weights.trainable, x, y) for x, y in arrays])
    assert personalized > 0.8 and personalized > shared + 0.3, (personalized, shared)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match='rand_percent'):
        fedala.AdaptiveLocalAggregation(rand_percent=0)
    with pytest.raises(ValueError, match='layer_idx 5 exceeds'):
        build('per_client', aggregation=fedala.AdaptiveLocalAggregation(layer_idx=5))
