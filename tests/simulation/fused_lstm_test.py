"""The fused LSTM (`BlockLSTM`) equals the Keras LSTM it replaces, alone and vectorized over clients."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.simulation import functional
from fedpersonal.simulation import fused_lstm
from fedpersonal.simulation import lockstep
from tests import tolerances
from tests.simulation import next_word_data

T, D, U = 6, 3, 4
# One LSTM output or gradient: each of the T steps sums a gate's input (D) and recurrent (U) terms, the backward
# pass runs back through every step and sums over the batch of 5 and the loss's outputs (T x U).
DEPTH = 2 * T * (D + U) + 5 + T * U


def _lstm_model(return_sequences=True, return_state=False, masking=False):
    def build():
        x = tf.keras.Input([T, D])
        h = tf.keras.layers.Masking(0.0)(x) if masking else x
        out = tf.keras.layers.LSTM(
            U,
            return_sequences=return_sequences,
            return_state=return_state,
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
            recurrent_initializer=tf.keras.initializers.Orthogonal(seed=2),
            bias_initializer=tf.keras.initializers.RandomNormal(seed=3),  # Every gate's bias matters.
        )(h)
        return tf.keras.Model(x, out)

    return build


def _distinct_weights(t: tf.Tensor) -> tf.Tensor:
    return tf.reshape(tf.sin(tf.range(tf.size(t), dtype=t.dtype)), tf.shape(t))


def _outputs_and_gradients(model: functional.FunctionalModel, weights, x):
    @tf.function(autograph=False)
    def run(weights, x):
        with tf.GradientTape() as tape:
            tape.watch([weights, x])
            outputs = tf.nest.flatten(model(functional.Parts(weights, [], [], []), x)[0])
            # A loss that weighs every output element differently, so every gradient path is checked.
            loss = tf.add_n([tf.reduce_sum(o * _distinct_weights(o)) for o in outputs])
        return outputs, tape.gradient(loss, [weights, x])

    return run(weights, x)


@pytest.mark.numeric
@pytest.mark.parametrize(
    'return_sequences,return_state,masking',
    [(True, False, False), (False, False, False), (True, True, False), (True, False, True)],
)
def test_fused_equals_keras_outputs_and_gradients(return_sequences, return_state, masking):
    model_fn = _lstm_model(return_sequences, return_state, masking)
    fused = functional.FunctionalModel(model_fn)
    keras = functional.FunctionalModel(model_fn, fuse_lstms=False)
    assert fused.pfor_loops and not keras.pfor_loops
    weights = [tf.constant(w) for w in fused.initial_weights.global_trainable]
    x = np.random.default_rng(0).normal(size=[5, T, D]).astype(np.float32)
    if masking:
        x[:2, -2:] = 0.0  # Masked time steps: the fused layer hands a masked call to Keras.
    got, want = _outputs_and_gradients(fused, weights, x), _outputs_and_gradients(keras, weights, x)
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        tolerances.assert_reordered_close(a.numpy(), b.numpy(), depth=DEPTH)
    assert float(tf.reduce_max(tf.abs(got[1][0][2]))) > 1e-3  # The bias gradient is not trivially zero.


@pytest.mark.numeric
def test_vectorized_over_clients_with_per_client_weights():
    model = functional.FunctionalModel(_lstm_model())
    base = [tf.constant(w) for w in model.initial_weights.global_trainable]
    rng = np.random.default_rng(1)
    per_client = [tf.stack([w * (1.0 + 0.3 * c) for c in range(3)]) for w in base]  # 3 clients' own weights.
    x = tf.constant(rng.normal(size=[3, 5, T, D]).astype(np.float32))

    def client(args):
        weights, client_x = args
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss = tf.reduce_sum(tf.square(model(functional.Parts(weights, [], [], []), client_x)[0]))
        return loss, tape.gradient(loss, weights)

    together = tf.function(lambda: lockstep.for_each_client(client, (per_client, x), pfor_loops=True))()
    one_by_one = [tf.function(client)(([w[c] for w in per_client], x[c])) for c in range(3)]
    for c in range(3):
        tolerances.assert_reordered_close(together[0][c].numpy(), one_by_one[c][0].numpy(), depth=DEPTH)
        for a, b in zip(together[1], one_by_one[c][1]):
            tolerances.assert_reordered_close(a[c].numpy(), b.numpy(), depth=DEPTH)
    assert abs(float(together[0][0] - together[0][2])) > 1e-3  # The clients' weights differ.


@pytest.mark.parametrize(
    'layer,fusable',
    [
        (tf.keras.layers.LSTM(2), True),
        (tf.keras.layers.LSTM(2, dropout=0.1), False),
        (tf.keras.layers.LSTM(2, recurrent_dropout=0.1), False),
        (tf.keras.layers.LSTM(2, activation='relu'), False),
        (tf.keras.layers.LSTM(2, recurrent_activation='hard_sigmoid'), False),
        (tf.keras.layers.LSTM(2, use_bias=False), False),
        (tf.keras.layers.LSTM(2, go_backwards=True), False),
        (tf.keras.layers.GRU(2), False),
        (tf.keras.layers.RNN(tf.keras.layers.LSTMCell(2)), False),
    ],
)
def test_fusable(layer, fusable):
    assert fused_lstm.fusable(layer) is fusable


def test_next_word_model_is_fused():
    assert functional.FunctionalModel(next_word_data.model_fn).pfor_loops
