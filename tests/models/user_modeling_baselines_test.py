"""Centralized NCD / NCF / GUM baselines: NCD's positivity constraint, and every model learns small generated data."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.data import synthetic_user_modeling
from fedpersonal.models import gum
from fedpersonal.models import user_modeling_baselines as ub
from fedpersonal.tasks import hpfl_user_modeling
from tests import tolerances


def _pooled(task):
    data = synthetic_user_modeling.generate_user_modeling(
        num_clients=3,
        num_attributes=5,
        num_items=60,
        items_per_client=30,
        users_per_client=20,
        records_per_user=(20, 30),
        task=task,
        seed=1,
    )
    index = hpfl_user_modeling.PooledIndex(data)
    return data, index, index.pooled_arrays('train'), index.pooled_arrays('validation')


def _train_mse(model, arrays):
    return float(np.mean((ub.predict_arrays(model, arrays) - arrays.label) ** 2))


def test_ncd_weights_stay_non_negative_after_training_steps():
    data, index, train, validation = _pooled('binary')
    model = ub.NcdModel(index.num_global_users, index.num_global_items, data.num_attributes, hidden_units=(8, 4))
    # Push the kernels negative: a large learning rate makes unconstrained steps cross zero.
    for kernel in model.kernels:
        kernel.assign(kernel * 0.0 + 1e-3)
    ub.train_centralized(model, train, validation, epochs=2, learning_rate=0.5, batch_size=32)
    for kernel in model.kernels:
        assert float(tf.reduce_min(kernel)) >= 0.0
    # Monotone in proficiency: raising a user's theta never lowers a prediction.
    user = tf.constant([0, 0], tf.int64)
    item = tf.constant([0, 0], tf.int64)
    attributes = tf.constant(index.global_item_attributes[[0, 0]])
    low = model.predict(user, item, attributes)
    model.theta.assign(model.theta + 3.0)
    assert np.all(model.predict(user, item, attributes).numpy() >= low.numpy() - 1e-7)


@pytest.mark.parametrize('kind,task', [('ncd', 'binary'), ('ncf', 'rating'), ('gum', 'rating'), ('ncf', 'binary')])
def test_models_learn_small_generated_data(kind, task):
    data, index, train, validation = _pooled(task)
    if kind == 'ncd':
        model = ub.NcdModel(index.num_global_users, index.num_global_items, data.num_attributes, hidden_units=(8, 4))
    elif kind == 'ncf':
        model = ub.NcfModel(index.num_global_users, index.num_global_items, embedding_dim=8, task=task)
    else:
        model = ub.CentralGumModel(
            gum.GumConfig(
                num_attributes=data.num_attributes,
                max_users=index.num_global_users,
                max_items=index.num_global_items,
                hidden_dim=4,
                task=task,
                rating_range=data.rating_range,
            )
        )
    before = _train_mse(model, train)
    result = ub.train_centralized(model, train, validation, epochs=8, learning_rate=0.02, batch_size=64)
    after = _train_mse(model, train)
    assert after < before - 0.01, (before, after, result.history)
    assert result.history[-1]['train_loss'] < result.history[0]['train_loss']
    # The kept weights are those of the best validation epoch.
    assert result.best_validation_loss == min(h['validation_loss'] for h in result.history)
    scores = model.user_attribute_scores(index.global_item_attributes)
    assert scores.shape == (index.num_global_users, data.num_attributes) and np.all(np.isfinite(scores))


def test_ncf_attribute_scores_are_mean_predictions_over_the_attribute_items():
    model = ub.NcfModel(4, 3, embedding_dim=2)
    attributes = np.array([[1, 0], [1, 1], [0, 1]], np.float32)
    scores = model.user_attribute_scores(attributes)
    u = tf.constant([2, 2, 2], tf.int64)
    p = model.predict(u, tf.constant([0, 1, 2], tf.int64), None).numpy()
    # The scores predict every item in one batch (another shape, maybe another kernel): NCF's sums (the MLP's fan-ins
    # 2 * 2 and 32, the output's 2 + 16), the mean over an attribute's (at most 3) items, the sigmoid and division.
    depth = 2 * 2 + 32 + (2 + 16) + 3 + 2
    tolerances.assert_reordered_close(scores[2], [(p[0] + p[1]) / 2, (p[1] + p[2]) / 2], depth=depth)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match='num_users'):
        ub.NcdModel(0, 3, 2)
    with pytest.raises(ValueError, match='task'):
        ub.NcfModel(2, 3, task='ranking')


@pytest.mark.parametrize('kind,task', [('ncd', 'binary'), ('ncf', 'rating'), ('gum', 'rating')])
def test_training_is_a_function_of_the_seed(kind, task):
    """Initializers (numpy) and shuffles derive from the seed: with TF's global seed set to it, as the HPFL task's
    `run` does, the same seed trains identical weights whatever random ops ran before; another seed does not."""
    data, index, train, validation = _pooled(task)

    def trained(seed, earlier_draws):
        tf.random.set_seed(seed)
        tf.random.uniform([earlier_draws])  # Random ops before training (an op-seed counter) must not matter.
        if kind == 'ncd':
            model = ub.NcdModel(
                index.num_global_users, index.num_global_items, data.num_attributes, hidden_units=(8, 4), seed=seed
            )
        elif kind == 'ncf':
            model = ub.NcfModel(index.num_global_users, index.num_global_items, embedding_dim=8, task=task, seed=seed)
        else:
            config = gum.GumConfig(
                num_attributes=data.num_attributes,
                max_users=index.num_global_users,
                max_items=index.num_global_items,
                hidden_dim=4,
                task=task,
                rating_range=data.rating_range,
            )
            model = ub.CentralGumModel(config, seed=seed)
        ub.train_centralized(model, train, validation, epochs=2, learning_rate=0.02, batch_size=64, seed=seed)
        return [v.numpy() for v in model.variables]

    first, again, other = trained(3, 1), trained(3, 5), trained(4, 1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))
