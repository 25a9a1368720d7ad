"""Tests for fedpersonal.models.furl_models: partition, shapes, training, BinaryAUC under TFF."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.metrics import keras_finalizer

from fedpersonal import models
from fedpersonal.data import synthetic_subreddit
from fedpersonal.models import furl_models
from tests import tolerances

_SMALL = dict(
    char_vocab_size=12,
    max_chars=6,
    num_features=3,
    num_classes=2,
    char_embedding_dim=4,
    lstm_units=4,
    user_embedding_dim=3,
    mlp_units=(8,),
)


def _batch(batch_size=5, num_items=0, seed=0, max_chars=6, num_features=3):
    rng = np.random.default_rng(seed)
    x = collections.OrderedDict(
        user_id=tf.constant(rng.integers(0, 4, batch_size), tf.int64),
        chars=tf.constant(rng.integers(0, 12, (batch_size, max_chars)), tf.int32),
        features=tf.constant(rng.random((batch_size, num_features)), tf.float32),
    )
    if num_items:
        x['item_id'] = tf.constant(rng.integers(0, num_items, batch_size), tf.int64)
    return collections.OrderedDict(x=x, y=tf.constant(rng.integers(0, 2, batch_size), tf.int64))


@pytest.mark.parametrize('mode, num_items', [('none', 0), ('private', 0), ('table', 0), ('private', 7)])
def test_partition_and_forward_pass(mode, num_items):
    model = furl_models.furl_model_fn(personalization=mode, num_users=4, num_items=num_items, **_SMALL)()
    assert isinstance(model, models.PartiallyLocalModel)
    global_names = [v.name for v in model.global_trainable_variables]
    local_names = [v.name for v in model.local_trainable_variables]
    assert not model.global_non_trainable_variables and not model.local_non_trainable_variables
    if mode == 'private':
        assert local_names == ['user_embedding/embedding:0']
        assert model.local_trainable_variables[0].shape == (1, 3)
        assert all(not n.startswith('user_embedding') for n in global_names)
    else:
        assert local_names == []
    assert ('user_embedding/embeddings:0' in global_names) == (mode == 'table')
    assert 'text_encoder/forward_lstm/cell/kernel:0' in global_names
    assert 'text_encoder/backward_lstm/cell/recurrent_kernel:0' in global_names
    assert 'char_embedding/embeddings:0' in global_names and 'logits/kernel:0' in global_names
    assert ('item_embedding/embeddings:0' in global_names) == (num_items > 0)
    output = model.forward_pass(_batch(num_items=num_items), training=False)
    assert output.predictions.shape == (5, 2) and int(output.num_examples) == 5
    assert list(model.input_spec['x']) == ['user_id', 'chars', 'features'] + (['item_id'] if num_items else [])


def test_table_mode_uses_the_user_row_and_private_mode_broadcasts():
    keras_model, _, _ = furl_models.build_keras_model(personalization='table', num_users=4, **_SMALL)
    batch = _batch()
    x = batch['x']
    table = keras_model.get_layer('user_embedding')
    base = keras_model(x).numpy()
    table.embeddings.assign(tf.tensor_scatter_nd_update(table.embeddings, [[int(x['user_id'][0])]], [[9.0, 9.0, 9.0]]))
    changed = np.any(keras_model(x).numpy() != base, axis=1)
    np.testing.assert_array_equal(changed, (x['user_id'].numpy() == x['user_id'].numpy()[0]))
    private, _, local = furl_models.build_keras_model(personalization='private', **_SMALL)
    assert local == [private.get_layer('user_embedding')]
    values = local[0].embedding.numpy()
    assert np.all(np.abs(values) <= 0.05) and np.any(values != 0)


def test_trimming_padding_leaves_the_text_encoding_unchanged():
    keras_model, _, _ = furl_models.build_keras_model(personalization='none', **_SMALL)
    chars = tf.constant([[3, 4, 0, 0, 0, 0], [5, 0, 6, 7, 0, 0], [0, 0, 0, 0, 0, 0]], tf.int32)
    trimmed = keras_model.get_layer('trim_padding')(chars)
    np.testing.assert_array_equal(trimmed.numpy(), chars.numpy()[:, :4])
    assert keras_model.get_layer('trim_padding')(tf.zeros([2, 6], tf.int32)).shape == (2, 1)
    embedding, encoder = keras_model.get_layer('char_embedding'), keras_model.get_layer('text_encoder')
    # The same LSTM cell steps on the same inputs (each step's products have the same shapes); the masked steps only
    # carry the state: exactly the same encoding.
    np.testing.assert_array_equal(encoder(embedding(trimmed)).numpy(), encoder(embedding(chars)).numpy())


def test_no_text_and_argument_errors():
    model = furl_models.furl_model_fn(
        personalization='private', char_vocab_size=2, max_chars=0, num_features=3, num_classes=2, num_items=7
    )()
    assert not any('lstm' in v.name for v in model.global_trainable_variables)
    assert model.forward_pass(_batch(num_items=7, max_chars=0)).predictions.shape == (5, 2)
    with pytest.raises(ValueError, match='num_users'):
        furl_models.furl_model_fn(personalization='table', **_SMALL)
    with pytest.raises(ValueError, match='personalization'):
        furl_models.furl_model_fn(personalization='server', **_SMALL)
    with pytest.raises(ValueError, match='no input representation'):
        furl_models.build_keras_model(
            personalization='none', char_vocab_size=2, max_chars=0, num_features=0, num_classes=3
        )


def _train(model, x, labels, steps=40):
    variables = model.global_trainable_variables + model.local_trainable_variables
    optimizer = tf.keras.optimizers.Adam(0.05)
    loss = furl_models.loss_fn()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(labels, model.predict_on_batch(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, variables), variables))
        return value

    return [float(step()) for _ in range(steps)]


def test_private_model_trains_text_and_user_vector():
    # One client; label: does the text contain char 5?
    rng = np.random.default_rng(1)
    chars = rng.integers(1, 12, (64, 6)).astype(np.int32)
    chars[rng.random((64, 6)) < 0.3] = 0
    labels = np.any(chars == 5, axis=1).astype(np.int64)
    x = collections.OrderedDict(user_id=tf.zeros([64], tf.int64), chars=tf.constant(chars), features=tf.zeros([64, 3]))
    model = furl_models.furl_model_fn(personalization='private', **_SMALL)()
    user_vector = model.local_trainable_variables[0].numpy()
    losses = _train(model, x, labels)
    assert losses[-1] < 0.6 * losses[0]
    assert not np.allclose(model.local_trainable_variables[0].numpy(), user_vector)


def test_table_model_learns_user_specific_labels():
    # Label = user (0 or 1) whatever the text: only the user table can explain it.
    rng = np.random.default_rng(2)
    users = np.tile([0, 1], 32)
    x = collections.OrderedDict(
        user_id=tf.constant(users, tf.int64),
        chars=tf.constant(rng.integers(0, 12, (64, 6)), tf.int32),
        features=tf.zeros([64, 3]),
    )
    model = furl_models.furl_model_fn(personalization='table', num_users=2, **_SMALL)()
    losses = _train(model, x, users.astype(np.int64), steps=30)
    assert losses[0] > 0.6 and losses[-1] < 0.2


def test_dataset_pipeline_matches_input_spec():
    data = synthetic_subreddit.generate_subreddit_like(
        num_users=3, num_subreddits=4, comments_per_user=(10, 12), vocab_words=40, max_chars=16
    )
    spec = furl_models.input_spec(max_chars=16, num_features=0)
    dataset = furl_models.batch_dataset(data.train.create_tf_dataset_for_client('1'), batch_size=4)
    models.check_dataset_matches(spec, dataset, client_id='1')
    batch = next(iter(dataset))
    assert batch['x']['chars'].shape == (4, 16) and batch['y'].dtype == tf.int64
    model = furl_models.furl_model_fn(personalization='private', **data.model_kwargs())()
    assert model.forward_pass(batch).predictions.shape == (4, 4)
    preprocessed = data.train.preprocess(functools.partial(furl_models.batch_dataset, batch_size=3, num_epochs=2))
    sizes = [int(b['y'].shape[0]) for b in preprocessed.create_tf_dataset_for_client('0')]
    assert sum(sizes) == 2 * data.examples_per_user('train')[0] and max(sizes) == 3


def _pairwise_auc(labels, scores):
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def _probabilities_to_logits(p):
    return np.stack([np.zeros_like(p), np.log(p) - np.log1p(-p)], axis=1).astype(np.float32)


def _auc_bound(scores, num_thresholds=200):
    """The float32 rounding of Keras' trapezoidal AUC against the exact float64 pairwise AUC: a nonzero trapezoid per
    distinct score, the rates' divisions, the product and the halving."""
    return tolerances.reorder_bound(depth=min(len(np.unique(scores)), num_thresholds) + 3, scale=1.0)


def test_binary_auc_equals_pairwise_auc():
    # Scores >= 0.01 apart, so each lies in its own bucket of the 200 thresholds: the trapezoidal AUC is exact.
    p = np.array([0.05, 0.12, 0.33, 0.41, 0.47, 0.58, 0.66, 0.71, 0.89, 0.93])
    y = np.array([0, 0, 1, 0, 1, 0, 1, 1, 0, 1])
    metric = furl_models.BinaryAUC()
    metric.update_state(y, _probabilities_to_logits(p))
    assert abs(float(metric.result()) - _pairwise_auc(y, p)) <= _auc_bound(p)
    assert _pairwise_auc(y, p) == 0.72  # 18 of 25 (positive, negative) pairs ordered: 18 / 25, correctly rounded.
    # Probabilities instead of logits; labels [B, 1].
    metric = furl_models.BinaryAUC(from_logits=False)
    metric.update_state(y[:, None], np.stack([1 - p, p], axis=1))
    assert abs(float(metric.result()) - 0.72) <= _auc_bound(p)
    # Random logits with ties: close to the exact value with many thresholds.
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(size=(300, 2)), 1).astype(np.float32)
    labels = (rng.random(300) < 1 / (1 + np.exp(logits[:, 0] - logits[:, 1]))).astype(np.int64)
    scores = tf.nn.softmax(logits).numpy()[:, 1]
    metric = furl_models.BinaryAUC(num_thresholds=4001)
    metric.update_state(labels, logits)
    # The trapezoid credits a (positive, negative) pair half when no threshold separates its scores: off the exact
    # AUC by at most half the share of the pairs with distinct scores in one bucket (of width 1 / 4000), plus float32
    # rounding.
    pos, neg = scores[labels == 1], scores[labels == 0]
    bucket = lambda s: np.floor(s * 4000)
    unseparated = (bucket(pos)[:, None] == bucket(neg)[None, :]) & (pos[:, None] != neg[None, :])
    bound = 0.5 * unseparated.mean() + _auc_bound(scores, 4001)
    assert bound < 2e-3  # Far below a wrong AUC's error (the other class's scores would give 1 - AUC, tenths away).
    assert abs(float(metric.result()) - _pairwise_auc(labels, scores)) <= bound
    assert [m.name for m in furl_models.metrics_fn(2)] == ['accuracy', 'auc']
    assert [m.name for m in furl_models.metrics_fn(5)] == ['accuracy']


def test_binary_auc_finalizes_under_tff():
    # Two clients' unfinalized AUC variables, summed and finalized by TFF as FedRecon/FURL do it
    # (create_keras_metric_finalizer + sum_then_finalize), give the AUC of the pooled examples.
    rng = np.random.default_rng(2)
    p = rng.permutation(np.linspace(0.02, 0.98, 40))
    y = (rng.random(40) < p).astype(np.int64)
    client_values = []
    for labels, probs in ((y[:15], p[:15]), (y[15:], p[15:])):
        metric = furl_models.BinaryAUC()
        metric.update_state(labels, _probabilities_to_logits(probs))
        client_values.append(collections.OrderedDict(auc=[v.numpy() for v in metric.variables]))
    finalizers = collections.OrderedDict(auc=keras_finalizer.create_keras_metric_finalizer(furl_models.BinaryAUC()))
    unfinalized_type = tff.types.to_type(
        collections.OrderedDict(auc=[tff.TensorType(np.float32, v.shape) for v in client_values[0]['auc']])
    )

    @tff.federated_computation(tff.FederatedType(unfinalized_type, tff.CLIENTS))
    def aggregate(values):
        return tff.learning.metrics.sum_then_finalize(finalizers, unfinalized_type)(values)

    result = aggregate(client_values)
    # Scores 0.025 apart, each in its own bucket of the 200 thresholds; the clients' counts add exactly.
    assert abs(float(result['auc']) - _pairwise_auc(y, p)) <= _auc_bound(p)
    assert 0.5 < _pairwise_auc(y, p) < 1.0
