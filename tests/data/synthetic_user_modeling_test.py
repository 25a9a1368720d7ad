"""Tests for fedpersonal.data.synthetic_user_modeling (generated cross-silo user-modeling data)."""

import dataclasses

import numpy as np
import pytest

from fedpersonal.data import synthetic_user_modeling as synthetic
from fedpersonal.data import user_modeling
from fedpersonal.metrics import user_modeling_metrics as metrics


def _same(a, b):
    return all(
        np.array_equal(getattr(x, f.name), getattr(y, f.name))
        for x, y in zip(a.silos, b.silos)
        for f in dataclasses.fields(x)
    )


def test_default_shape_and_validity():
    data = synthetic.generate_user_modeling()
    assert user_modeling.validate(data) is data
    assert (data.name, data.task, data.num_attributes, data.rating_range) == (
        'synthetic_user_modeling',
        'binary',
        12,
        (0.0, 1.0),
    )
    stats = user_modeling.statistics(data)
    assert stats['num_clients'] == 8 and stats['num_users'] == 320
    assert 8 * 40 * 20 <= stats['num_records'] <= 8 * 40 * 60
    assert stats['items_per_client_max'] == 80
    assert 1.0 < stats['attributes_per_item'] <= 3.0
    # Clients have different attribute mixes (non-IID), and some attributes are missing for some clients.
    assert stats['attribute_tv_distance_mean'] > 0.25
    assert stats['missing_attributes_per_client_max'] >= 1
    assert 0.3 < stats['label_mean'] < 0.7
    for silo in data.silos:
        items_attributes = silo.item_attributes.sum(axis=1)
        assert items_attributes.min() >= 1 and items_attributes.max() <= 3
        counts = np.bincount(silo.user)
        assert counts.min() >= 20 and counts.max() <= 60


def test_deterministic_and_seeded():
    assert _same(synthetic.generate_user_modeling(seed=3), synthetic.generate_user_modeling(seed=3))
    assert not _same(synthetic.generate_user_modeling(seed=3), synthetic.generate_user_modeling(seed=4))
    assert _same(synthetic.generate_user_modeling(seed=5), synthetic.generate_user_modeling_with_truth(seed=5)[0])


def test_binary_responses_follow_the_latent_abilities():
    data, truth = synthetic.generate_user_modeling_with_truth()
    label = np.concatenate([s.label for s in data.silos])
    expected = np.concatenate(truth.expected_label)
    assert metrics.auc(label, expected) > 0.7  # Learnable: the true response probability ranks answers well.
    assert abs(label.mean() - expected.mean()) < 0.03
    for silo, ability in zip(data.silos, truth.user_ability):
        assert metrics.doa(silo.user, silo.item, silo.label, ability, silo.item_attributes) > 0.6
        shuffled = np.random.default_rng(0).permutation(ability)
        assert metrics.doa(silo.user, silo.item, silo.label, shuffled, silo.item_attributes) < 0.6


def test_rating_task():
    data, truth = synthetic.generate_user_modeling_with_truth(task='rating', num_clients=3, seed=1)
    assert data.task == 'rating' and data.rating_range == (1.0, 5.0)
    label = np.concatenate([s.label for s in data.silos])
    assert set(np.unique(label)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert metrics.rmse(label, np.clip(np.concatenate(truth.expected_label), 1, 5)) < 0.8
    assert np.corrcoef(label, np.concatenate(truth.expected_label))[0, 1] > 0.7


def test_splits_follow_generation_order():
    silo = synthetic.generate_user_modeling(num_clients=1).silos[0]
    for u in range(silo.num_users):
        split = silo.split[silo.user == u]
        assert np.all(np.diff(split) >= 0) and set(split) == {0, 1, 2}


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(task='ranking'), 'task'),
        (dict(items_per_client=500), 'items_per_client'),
        (dict(records_per_user=(2, 10)), 'records_per_user'),
        (dict(records_per_user=(30, 90)), 'records_per_user'),
        (dict(attribute_concentration=0.0), 'attribute_concentration'),
        (dict(num_clients=0), 'num_clients'),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic.generate_user_modeling(**kwargs)
