"""The next-word LSTM: which ids each embedding table serves, the variable split, masked loss and accuracies."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.data import text_pipeline as tp
from fedpersonal.models import next_word_prediction as nwp
from tests import tolerances

LAYOUT = tp.TokenLayout(vocab_size=6, num_oov_buckets=4)  # ids: pad 0, words 1-6, BOS 7, EOS 8, OOV 9-12


def test_each_id_is_embedded_by_exactly_one_table():
    ids = tf.constant([[0, 1, 6, 7, 8, 9, 12]], tf.int64)
    global_layer = nwp.GlobalTokenEmbedding(LAYOUT.num_global_ids, 3)
    local_layer = nwp.LocalOovEmbedding(LAYOUT.num_oov_buckets, 3, LAYOUT.oov_start)
    g, loc = global_layer(ids).numpy()[0], local_layer(ids).numpy()[0]
    table_g, table_l = global_layer.embeddings.numpy(), local_layer.embeddings.numpy()
    np.testing.assert_array_equal(g[:5], table_g[[0, 1, 6, 7, 8]])  # Rows looked up: exactly.
    np.testing.assert_array_equal(g[5:], 0.0)
    np.testing.assert_array_equal(loc[:5], 0.0)  # BOS and EOS are global (no off-by-one into local rows)
    np.testing.assert_array_equal(loc[5:], table_l[[0, 3]])


def test_only_the_oov_table_is_local():
    model = nwp.model_fn(LAYOUT, embedding_dim=5, lstm_units=7)()
    local = model.local_trainable_variables
    assert [tuple(v.shape) for v in local] == [(LAYOUT.num_oov_buckets, 5)]
    shapes = [tuple(v.shape) for v in model.global_trainable_variables]
    assert (LAYOUT.num_global_ids, 5) in shapes and (LAYOUT.num_oov_buckets, 5) not in shapes
    assert shapes[-1] == (LAYOUT.num_classes,)  # output bias over every id
    global_model = nwp.model_fn(LAYOUT, oov_local=False, embedding_dim=5, lstm_units=7)()
    assert not global_model.local_trainable_variables
    assert len(global_model.global_trainable_variables) == len(model.global_trainable_variables) + 1


def test_masked_cross_entropy_ignores_pad_targets():
    logits = tf.constant(np.random.default_rng(0).normal(size=[2, 3, LAYOUT.num_classes]), tf.float32)
    labels = tf.constant([[1, 2, 0], [8, 0, 0]], tf.int64)
    per_token = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).numpy()
    expected = per_token[[0, 0, 1], [0, 1, 0]].mean()
    # Each token's cross-entropy by another implementation (the log-sum-exp over the 13 ids, its log and exp), then
    # the mean over the 3 real tokens.
    tolerances.assert_reordered_close(nwp.loss_fn()(labels, logits).numpy(), expected, depth=LAYOUT.num_classes + 3 + 3)


@pytest.mark.parametrize('scale', [1.0, 30.0])
def test_token_cross_entropy_equals_keras_values_and_gradients(scale):
    rng = np.random.default_rng(1)
    logits = tf.constant(scale * rng.normal(size=[4, 6, 50]), tf.float32)
    labels = tf.constant(rng.integers(0, 50, size=[4, 6]), tf.int64)

    def value_and_gradient(fn, x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = fn(y, x)
            total = tf.reduce_sum(loss * tf.range(1.0, 7.0))  # Unequal upstream gradients per token.
        return loss, tape.gradient(total, x)

    keras = lambda y, x: tf.keras.losses.sparse_categorical_crossentropy(y, x, from_logits=True)
    ours, our_gradient = [t.numpy() for t in value_and_gradient(nwp.token_cross_entropy, logits, labels)]
    expected, expected_gradient = [t.numpy() for t in value_and_gradient(keras, logits, labels)]
    # Two implementations of a token's cross-entropy: the log-sum-exp's sum over the 50 classes (terms exp(x - max)
    # <= 1) and the exp, log and subtraction's roundings. The loss, max + log(sum) - x_label, is rounded on the
    # logits' scale; the gradient, (softmax - onehot) times the upstream 1..6, on the upstream's.
    depth = 50 + 3
    tolerances.assert_reordered_close(ours, expected, depth=depth, scale=tolerances.magnitude(logits))
    tolerances.assert_reordered_close(our_gradient, expected_gradient, depth=depth, scale=6.0)
    assert ours.min() >= 0.0  # Never negative, also where a label's logit is the largest by far.
    # Per client under tf.vectorized_map (the engine's client step), as per client.
    vectorized = tf.vectorized_map(
        lambda args: value_and_gradient(nwp.token_cross_entropy, args[0], args[1]),
        (logits[:, tf.newaxis], labels[:, tf.newaxis]),
        fallback_to_while_loop=False,
    )
    for client in range(4):
        one = value_and_gradient(nwp.token_cross_entropy, logits[client : client + 1], labels[client : client + 1])
        # Vectorized kernels: the same sums, possibly reordered (the bounds above).
        tolerances.assert_reordered_close(
            vectorized[0][client], one[0], depth=depth, scale=tolerances.magnitude(logits)
        )
        tolerances.assert_reordered_close(vectorized[1][client], one[1], depth=depth, scale=6.0)


def test_accuracies_skip_pad_then_oov_then_eos():
    labels = tf.constant([[1, 9, 8, 0]], tf.int64)  # word, OOV, EOS, pad
    predicted = tf.constant([[1, 9, 3, 5]], tf.int64)  # right, right, wrong, (pad)
    logits = tf.one_hot(predicted, LAYOUT.num_classes)
    values = {}
    for metric in nwp.metrics_fn(LAYOUT)():
        metric.update_state(labels, logits)
        values[metric.name] = float(metric.result())
    # Counts divided in float32: the correctly rounded quotients.
    assert values == {
        'accuracy': float(np.float32(2) / np.float32(3)),
        'accuracy_no_oov': 0.5,
        'accuracy_no_oov_no_eos': 1.0,
    }


def test_metric_round_trips_through_its_config():
    metric = nwp.NextWordAccuracy(6, 4, exclude_oov=True, name='a')
    clone = nwp.NextWordAccuracy.from_config(metric.get_config())
    assert (clone.layout, clone.exclude_oov, clone.exclude_eos, clone.name) == (LAYOUT, True, False, 'a')
