"""Tests for fedpersonal.models.gum: the published prediction formula, its range, per-attribute vectors, labels."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.models import gum
from tests import tolerances

K, H, USERS, ITEMS = 4, 3, 5, 6
# A prediction's sums, in float32 both here (numpy, per record) and in TF (batched): q @ relative_M and
# (theta * qm) @ skill_W (K terms each), the mean over the H skills, and the five sigmoids' and products' roundings.
PREDICT_DEPTH = K + K + H + 6


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _random_weights(seed=0, config=None):
    config = config or gum.GumConfig(num_attributes=K, max_users=USERS, max_items=ITEMS, hidden_dim=H)
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.normal(0, 1, shape).astype(np.float32)
    return config, gum.GumWeights(
        public=gum.PublicWeights(f(K, H), f(K, H), f(K, K)),
        private=gum.PrivateWeights(f(USERS, K), f(ITEMS, K), f(ITEMS), f(ITEMS), f(ITEMS)),
    )


def _numpy_predict(w, user, item, q):
    """The formula as published, one record at a time."""
    out = []
    for u, e, row in zip(user, item, q):
        qm = row @ w.public.relative_M
        skill = _sigmoid((w.private.theta[u] * qm) @ w.public.skill_W)
        know = _sigmoid((w.private.difficulty[e] * qm) @ w.public.know_W)
        x = np.mean(skill - know) * w.private.discrimination[e]
        s, g = _sigmoid(w.private.slip[e] - 1), _sigmoid(w.private.guess[e] - 1)
        out.append(_sigmoid((1 - s) * x + g * (1 - x)))
    return np.array(out)


def test_predict_matches_the_published_formula():
    _, weights = _random_weights()
    rng = np.random.default_rng(1)
    user, item = rng.integers(0, USERS, 9), rng.integers(0, ITEMS, 9)
    q = (rng.random((9, K)) < 0.5).astype(np.float32)
    got = gum.predict(weights, tf.constant(user), tf.constant(item), tf.constant(q)).numpy()
    tolerances.assert_reordered_close(got, _numpy_predict(weights, user, item, q), depth=PREDICT_DEPTH)
    label = rng.random(9).astype(np.float32)
    loss = gum.mse_loss(weights, tf.constant(user), tf.constant(item), tf.constant(q), tf.constant(label))
    # The mean over the 9 records adds 9 terms, and the square its rounding.
    tolerances.assert_reordered_close(
        loss.numpy(), np.mean((_numpy_predict(weights, user, item, q) - label) ** 2), depth=PREDICT_DEPTH + 9 + 1
    )


def test_prediction_range_at_initialization_is_the_documented_one():
    config = gum.GumConfig(num_attributes=K, max_users=USERS, max_items=ITEMS, hidden_dim=H)
    weights = gum.initial_weights(config, 0, 0)
    weights = weights._replace(
        private=weights.private._replace(theta=weights.private.theta * 50, difficulty=weights.private.difficulty * 50)
    )
    user, item = np.repeat(np.arange(USERS), ITEMS), np.tile(np.arange(ITEMS), USERS)
    q = np.ones([user.size, K], np.float32)
    y = gum.predict(weights, tf.constant(user), tf.constant(item), tf.constant(q)).numpy()
    guess = _sigmoid(-1.0)  # s = g = 0 at initialization; w = 1.
    low, high = _sigmoid(guess - (1 - 2 * guess)), _sigmoid(guess + (1 - 2 * guess))
    # The documented range, to its 3 decimals (half a unit of the last).
    assert low == pytest.approx(0.452, abs=5e-4) and high == pytest.approx(0.675, abs=5e-4)
    slack = tolerances.reorder_bound(depth=PREDICT_DEPTH, scale=1.0)  # float32 predictions against float64 ends.
    assert y.min() >= low - slack and y.max() <= high + slack
    assert y.max() - y.min() > 0.05  # The extreme inputs spread the predictions inside that range.


def test_attribute_vectors_are_the_rows_of_the_public_matrices():
    config, weights = _random_weights()
    vectors = gum.attribute_vectors(weights.public).numpy()
    assert vectors.shape == (K, gum.attribute_vector_size(config)) == (K, 2 * H + K)
    for k in range(K):
        np.testing.assert_array_equal(
            vectors[k],
            np.concatenate([weights.public.skill_W[k], weights.public.know_W[k], weights.public.relative_M[k]]),
        )
    back = gum.from_attribute_vectors(vectors, H)
    for a, b in zip(back, weights.public):
        np.testing.assert_array_equal(a, b)


def test_items_without_an_attribute_leave_its_relation_row_untouched():
    """Row k of relative_M belongs to attribute k: batches without attribute k give it no gradient."""
    _, weights = _random_weights(3)
    q = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0]], np.float32)  # No item has attribute 3.
    public = [tf.constant(v) for v in weights.public]
    with tf.GradientTape() as tape:
        tape.watch(public)
        w = weights._replace(public=gum.PublicWeights(*public))
        loss = gum.mse_loss(
            w, tf.constant([0, 1, 2]), tf.constant([0, 1, 2]), tf.constant(q), tf.constant([1.0, 0.0, 1.0])
        )
    grad_m = tape.gradient(loss, public[2]).numpy()
    np.testing.assert_array_equal(grad_m[3], 0.0)
    assert np.abs(grad_m[:3]).sum() > 0


def test_labels_map_to_the_unit_interval_and_back():
    config = gum.GumConfig(num_attributes=2, max_users=1, max_items=1, task='rating', rating_range=(1, 5))
    ratings = np.array([1.0, 2.0, 3.5, 5.0], np.float32)
    unit = gum.to_unit(ratings, config.rating_range)
    # Differences and quotients of these binary fractions are exact in float32.
    np.testing.assert_array_equal(unit, [0.0, 0.25, 0.625, 1.0])
    np.testing.assert_array_equal(gum.from_unit(unit, config.rating_range), ratings)
    # Rating accuracy: the back-mapped prediction, rounded and clipped, equals the rating.
    predictions = gum.to_unit(np.array([1.4, 2.6, 3.4, 5.9], np.float32), config.rating_range)
    truth = gum.to_unit(np.array([1.0, 2.0, 3.0, 5.0], np.float32), config.rating_range)
    np.testing.assert_array_equal(gum.correct(tf.constant(predictions), tf.constant(truth), config), [1, 0, 1, 1])
    binary = gum.GumConfig(num_attributes=2, max_users=1, max_items=1)
    np.testing.assert_array_equal(
        gum.correct(tf.constant([0.2, 0.5, 0.7]), tf.constant([0.0, 0.0, 0.0]), binary), [1, 0, 0]
    )


def test_initialization_and_trainable_fields():
    config = gum.GumConfig(
        num_attributes=K,
        max_users=USERS,
        max_items=ITEMS,
        hidden_dim=H,
        use_discrimination=False,
        discrimination_init=2.0,
    )
    weights = gum.initial_weights(config, public_seed=4, private_seed=5)
    np.testing.assert_array_equal(weights.public.relative_M, np.eye(K))
    assert weights.public.skill_W.shape == (K, H) and weights.private.theta.shape == (USERS, K)
    np.testing.assert_array_equal(weights.private.discrimination, 2.0)
    assert 'discrimination' not in gum.trainable_private_fields(config)
    np.testing.assert_array_equal(gum.initial_public(config, 4).skill_W, weights.public.skill_W)  # Deterministic.
    assert not np.array_equal(gum.initial_public(config, 5).skill_W, weights.public.skill_W)


@pytest.mark.parametrize(
    'kwargs, field',
    [
        (dict(num_attributes=0), 'num_attributes'),
        (dict(max_users=-1), 'max_users'),
        (dict(task='ranking'), 'task'),
        (dict(task='rating', rating_range=(5, 1)), 'rating_range'),
        (dict(rating_range=(1, 5)), 'rating_range'),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    args = dict(num_attributes=K, max_users=USERS, max_items=ITEMS)
    args.update(kwargs)
    with pytest.raises(gum.GumConfigError, match=field):
        gum.GumConfig(**args)
