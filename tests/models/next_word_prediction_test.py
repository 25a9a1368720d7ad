"""The next-word LSTM: which ids each embedding table serves, the variable split, masked loss and accuracies."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.data import text_pipeline as tp
from fedpersonal.models import next_word_prediction as nwp

LAYOUT = tp.TokenLayout(vocab_size=6, num_oov_buckets=4)  # ids: pad 0, words 1-6, BOS 7, EOS 8, OOV 9-12


def test_each_id_is_embedded_by_exactly_one_table():
    ids = tf.constant([[0, 1, 6, 7, 8, 9, 12]], tf.int64)
    global_layer = nwp.GlobalTokenEmbedding(LAYOUT.num_global_ids, 3)
    local_layer = nwp.LocalOovEmbedding(LAYOUT.num_oov_buckets, 3, LAYOUT.oov_start)
    g, loc = global_layer(ids).numpy()[0], local_layer(ids).numpy()[0]
    table_g, table_l = global_layer.embeddings.numpy(), local_layer.embeddings.numpy()
    np.testing.assert_allclose(g[:5], table_g[[0, 1, 6, 7, 8]])
    np.testing.assert_allclose(g[5:], 0.0)
    np.testing.assert_allclose(loc[:5], 0.0)  # BOS and EOS are global (no off-by-one into local rows)
    np.testing.assert_allclose(loc[5:], table_l[[0, 3]])


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
    assert nwp.loss_fn()(labels, logits).numpy() == pytest.approx(expected, rel=1e-6)


def test_accuracies_skip_pad_then_oov_then_eos():
    labels = tf.constant([[1, 9, 8, 0]], tf.int64)  # word, OOV, EOS, pad
    predicted = tf.constant([[1, 9, 3, 5]], tf.int64)  # right, right, wrong, (pad)
    logits = tf.one_hot(predicted, LAYOUT.num_classes)
    values = {}
    for metric in nwp.metrics_fn(LAYOUT)():
        metric.update_state(labels, logits)
        values[metric.name] = float(metric.result())
    assert values == {
        'accuracy': pytest.approx(2 / 3),
        'accuracy_no_oov': pytest.approx(1 / 2),
        'accuracy_no_oov_no_eos': 1.0,
    }


def test_metric_round_trips_through_its_config():
    metric = nwp.NextWordAccuracy(6, 4, exclude_oov=True, name='a')
    clone = nwp.NextWordAccuracy.from_config(metric.get_config())
    assert (clone.layout, clone.exclude_oov, clone.exclude_eos, clone.name) == (LAYOUT, True, False, 'a')
