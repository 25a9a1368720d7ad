"""Ditto: the personal update against a hand computation, the global FedAvg step, personal models on clients."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import ditto
from fedpersonal.privacy import audit
from tests import tolerances

W0 = np.array([[0.2, -0.1, 0.0], [0.1, 0.3, -0.2]], np.float32)  # [features, classes]
X = np.array([[1.0, 2.0], [0.5, -1.0], [-1.0, 0.5]], np.float32)
Y = np.array([0, 2, 1], np.int32)
# The hand computation runs in float32 numpy in another order than TF: the logits' dot product (2 features), the
# softmax's sum (3 classes), the batch's gradient sum (3 examples), and the exp, the division and the lam and eta
# terms rounded on the way; one step.
DEPTH = 2 + 3 + 3 + 4


def linear_model():
    x = tf.keras.Input([2])
    layer = tf.keras.layers.Dense(3, use_bias=False, kernel_initializer=tf.keras.initializers.Constant(W0))
    return tf.keras.Model(x, layer(x))


def data(x=X, y=Y):
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(3)


def ce_gradient(w, x, y):
    logits = x @ w
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return x.T @ p / len(y)


@pytest.mark.numeric
def test_personal_and_global_updates_match_hand_computation():
    lam, eta, eta_global = 0.5, 0.3, 0.2
    process = ditto.build_ditto(
        linear_model,
        element_spec=data().element_spec,
        lam=lam,
        personal_epochs=1,
        client_epochs=1,
        client_optimizer=tff.learning.optimizers.build_sgdm(eta_global),
        personal_optimizer=tff.learning.optimizers.build_sgdm(eta),
    )
    state = process.initialize()
    v0 = W0 + np.array([[0.5, 0.0, -0.5], [0.0, 0.2, 0.0]], np.float32)
    personal = tff.learning.models.ModelWeights(trainable=[v0], non_trainable=[])
    out = process.run_round(state, [data()], [personal])
    # v <- v - eta * (grad F(v) + lam * (v - w)), w the received global model.
    expected_v = v0 - eta * (ce_gradient(v0, X, Y) + lam * (v0 - W0))
    assert np.abs(expected_v - v0).max() > 100 * tolerances.reorder_bound(depth=DEPTH, scale=1.0)  # A real step.
    tolerances.assert_reordered_close(out.private_states[0].trainable[0], expected_v, depth=DEPTH)
    # The global model: one local SGD step, averaged (one client) and applied with server SGD 1.0.
    expected_w = W0 - eta_global * ce_gradient(W0, X, Y)
    tolerances.assert_reordered_close(process.get_model_weights(out.state).trainable[0], expected_w, depth=DEPTH)

    # Two clients: the global model is the example-weighted mean; lam = 0 gives plain local SGD.
    process0 = ditto.build_ditto(
        linear_model,
        element_spec=data().element_spec,
        lam=0.0,
        client_optimizer=tff.learning.optimizers.build_sgdm(eta_global),
        personal_optimizer=tff.learning.optimizers.build_sgdm(eta),
    )
    x2, y2 = X[:1], Y[:1]
    out = process0.run_round(process0.initialize(), [data(), data(x2, y2)], [personal, personal])
    tolerances.assert_reordered_close(
        out.private_states[1].trainable[0], v0 - eta * ce_gradient(v0, x2, y2), depth=DEPTH
    )
    expected_w = (3 * (W0 - eta_global * ce_gradient(W0, X, Y)) + (W0 - eta_global * ce_gradient(W0, x2, y2))) / 4
    # The weighted mean over the 2 clients adds 2 terms.
    tolerances.assert_reordered_close(process0.get_model_weights(out.state).trainable[0], expected_w, depth=DEPTH + 2)


def test_personal_models_never_reach_the_server():
    process = ditto.build_ditto(linear_model, element_spec=data().element_spec)
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
