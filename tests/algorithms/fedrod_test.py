"""FedRoD, one client plan run by both backends: each equals a plain eager loop written here (the balanced softmax
loss by hand), the generic head follows the balanced loss and the personal head the ordinary one, the personal
head and the label counts never reach the server, and the two heads together fit per-client label namings that the
generic head cannot."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import fedrod
from fedpersonal.privacy import audit
from tests import tolerances

NUM_CLASSES, DIM, HIDDEN, LR = 4, 6, 8, 0.1
# The longest chain of additions feeding a weight in one gradient of the DIM-HIDDEN-NUM_CLASSES model on a batch of
# 10: the forward fan-ins (6 + 8, and the personal head's 8 beside the generic logits), the backward fan-outs
# (4 + 8) and the batch's gradient sum (10).
GRADIENT_DEPTH = DIM + HIDDEN + HIDDEN + NUM_CLASSES + HIDDEN + 10
# A round adds the weighted mean over skewed_arrays' 4 clients.
DEPTH = GRADIENT_DEPTH + 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def keras_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([DIM]),
            tf.keras.layers.Dense(HIDDEN, 'relu', kernel_initializer=init(seed=1)),
            tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(seed=2)),
        ]
    )


def model_fn():
    return fedrod.FedRodModel(keras_fn(), NUM_CLASSES)


def build(backend, epochs=1):
    with backends.use(backend):
        return fedrod.build_fedrod(
            model_fn,
            element_spec=SPEC,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            client_epochs=epochs,
        )


def skewed_arrays(seed=0, sizes=(23, 30, 17, 40), permuted=False):
    """Shared class centres; each client sees a skewed share of the classes (the first client lacks one); with
    `permuted`, each client names the classes differently (a rotation)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=[NUM_CLASSES, DIM]) * 2
    arrays = []
    for client, n in enumerate(sizes):
        share = np.roll([0.6, 0.25, 0.15, 0.0 if client == 0 else 0.05], client)
        cls = rng.choice(NUM_CLASSES, n, p=share / share.sum())
        x = (centres[cls] + rng.normal(size=[n, DIM])).astype(np.float32)
        labels = np.roll(np.arange(NUM_CLASSES), client)[cls] if permuted else cls
        arrays.append((x, labels.astype(np.int32)))
    return arrays


def datasets(arrays, batch=10):
    return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch) for x, y in arrays]


# ------------------------------------------------------------------ the reference: a plain eager loop, by hand
def _cross_entropy(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def reference_round(shared, heads, arrays, epochs=1, batch=10):
    """PFLlib's clientrod.py: per batch, body + generic head on the balanced softmax loss, then the personal head
    on the features and generic logits of before that step; the server averages the shared weights by examples."""
    trained, examples, new_heads = [], [], []
    for (x, y), head in zip(arrays, heads):
        w1, b1, w2, b2 = [tf.constant(v) for v in shared]
        p2, q2 = [tf.constant(v) for v in head]
        log_prior = np.log(np.bincount(y, minlength=NUM_CLASSES).astype(np.float32))
        for _ in range(epochs):
            for s in range(0, len(x), batch):
                xb, yb = x[s : s + batch], y[s : s + batch]
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch([w1, b1, w2, b2, p2, q2])
                    features = tf.nn.relu(xb @ w1 + b1)
                    generic = features @ w2 + b2
                    balanced = _cross_entropy(yb, generic + log_prior)
                    own = _cross_entropy(yb, tf.stop_gradient(generic) + tf.stop_gradient(features) @ p2 + q2)
                g_shared = tape.gradient(balanced, [w1, b1, w2, b2])
                g_head = tape.gradient(own, [p2, q2])
                w1, b1, w2, b2 = [v - LR * g for v, g in zip([w1, b1, w2, b2], g_shared)]
                p2, q2 = [v - LR * g for v, g in zip([p2, q2], g_head)]
        trained.append([v.numpy() for v in (w1, b1, w2, b2)])
        examples.append(len(x))
        new_heads.append([p2.numpy(), q2.numpy()])
    total = float(sum(examples))
    return [sum(n * t[k] for n, t in zip(examples, trained)) / total for k in range(4)], new_heads


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_every_backend_equals_a_plain_loop(backend):
    arrays = skewed_arrays()
    process = build(backend, epochs=2)
    assert process.simulation == backend
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    shared = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    heads = [list(privates[0].trainable)] * len(arrays)
    np.testing.assert_array_equal(heads[0][0], shared[2])  # The personal head starts as the generic one.
    start = heads[0][0]
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        shared, heads = reference_round(shared, heads, arrays, epochs=2)
    steps = 2 * 2 * 4  # 2 rounds of 2 epochs of at most 4 batches (40 examples).
    bound = tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)
    assert np.abs(heads[0][0] - start).max() > 100 * bound  # The personal head trained far beyond the bound.
    for got, want in zip(process.get_model_weights(state).trainable, shared):
        tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=steps)
    for private, head, (_, y) in zip(privates, heads, arrays):
        for got, want in zip(private.trainable, head):
            tolerances.assert_reordered_close(got, want, depth=DEPTH, steps=steps)
        np.testing.assert_array_equal(private.non_trainable[-1], np.bincount(y, minlength=NUM_CLASSES))
    assert 0.0 < output.metrics['client_work']['train']['fedrod_accuracy'] <= 1.0


def test_the_generic_head_follows_the_balanced_loss_and_the_personal_head_the_plain_one():
    """One client, one batch: the shared weights' step is the balanced loss's gradient only (not the plain loss's,
    nor the personal head's), the personal head's the plain loss of both heads only."""
    ((x, y),) = skewed_arrays(sizes=(10,))
    model = model_fn()
    model.label_counts.assign(np.bincount(y, minlength=NUM_CLASSES).astype(np.float32))
    variables = model.variables_of(fedrod.SHARED) + model.variables_of(fedrod.PERSONAL_HEAD)
    with tf.GradientTape(persistent=True) as tape:
        total = model.phase_loss('fedrod', x, y, 0)
        generic = model.generic_head(model.body(x))
        balanced = fedrod.balanced_softmax_loss(y, generic, model.label_counts)
        plain = _cross_entropy(y, generic)
    got = tape.gradient(total, variables)
    shared = tape.gradient(balanced, model.variables_of(fedrod.SHARED))
    for g, want in zip(got[:4], shared):  # One gradient by two graphs: up to their sums' order.
        tolerances.assert_reordered_close(g, want, depth=GRADIENT_DEPTH)
    assert np.abs(got[2] - tape.gradient(plain, model.variables_of(fedrod.SHARED))[2]).max() > 1e-3
    # The class the client lacks: its generic logit gets no gradient from the balanced loss.
    assert np.all(np.asarray(got[3])[3] == 0.0) and np.isfinite(float(total))
    assert all(np.abs(g).max() > 0 for g in got[4:])


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_the_personal_head_and_label_counts_never_reach_the_server(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_both_heads_fit_what_the_generic_head_cannot():
    arrays = skewed_arrays(seed=3, sizes=(60,) * 4, permuted=True)
    process = build('engine', epochs=3)
    state, privates = process.initialize(), [process.initial_private_state()] * 4
    for _ in range(8):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
    weights = process.get_model_weights(state)
    w1, b1, w2, b2 = [np.asarray(w) for w in weights.trainable]

    def accuracy(logits, y):
        return float(np.mean(np.argmax(logits, -1) == y))

    both, generic = [], []
    for (x, y), private in zip(arrays, privates):
        features = np.maximum(x @ w1 + b1, 0)
        p2, q2 = [np.asarray(v) for v in private.trainable]
        generic.append(accuracy(features @ w2 + b2, y))
        both.append(accuracy(features @ w2 + b2 + features @ p2 + q2, y))
    # The generic head learns one naming of the classes; each client's personal head corrects it to its own.
    assert np.mean(both) > 0.75 and np.mean(both) > np.mean(generic) + 0.4, (both, generic)


def test_a_client_that_lacks_class_0_and_finishes_first_keeps_a_finite_loss_on_the_engine():
    """The engine's dense models step every client of a group, a finished one on a padded example (label 0) that is
    discarded: for a client without class 0 its balanced loss is infinite, which must not make the round's loss NaN
    (issue 64: FedRoD on a user's dense model in the benchmark binary)."""
    rng = np.random.default_rng(3)
    short_y = np.array([1, 2] * 6, np.int32)  # 12 rows, no class 0: 2 batches against the other client's 4.
    long_y = rng.integers(0, NUM_CLASSES, 40).astype(np.int32)
    arrays = [(rng.normal(size=[len(y), DIM]).astype(np.float32), y) for y in (short_y, long_y)]
    losses, weights = [], []
    for backend in ('engine', 'per_client'):
        process = build(backend)
        output = process.run_round(process.initialize(), datasets(arrays), [process.initial_private_state()] * 2)
        losses.append(float(output.metrics['client_work']['train']['fedrod_loss']))
        weights.append(process.get_model_weights(output.state).trainable)
    assert np.isfinite(losses).all(), losses
    # One epoch of at most 4 batches, then the weighted mean over the 2 clients; the reported loss adds the 52
    # examples' losses (each of order its value) on top of the weights' reordering.
    depth, steps = GRADIENT_DEPTH + 2, 4
    loss_bound = tolerances.reorder_bound(depth=depth + 52, scale=max(1.0, abs(losses[1])), steps=steps)
    assert abs(losses[0] - losses[1]) <= loss_bound, (losses, loss_bound)
    for got, want in zip(*weights):  # The discarded steps moved no weight.
        tolerances.assert_reordered_close(got, want, depth=depth, steps=steps)
