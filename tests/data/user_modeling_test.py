"""Tests for fedpersonal.data.user_modeling: the HPFL data format, validation, statistics and the attribute figure."""

import dataclasses

import numpy as np
import pytest

from fedpersonal.data import user_modeling
from fedpersonal.data.user_modeling import ClientSilo
from fedpersonal.data.user_modeling import UserModelingData
from fedpersonal.data.user_modeling import UserModelingDataError


def _silo(client_id, user, item, label, split, attributes, user_ids, item_ids):
    return ClientSilo(
        client_id=client_id,
        num_users=len(user_ids),
        num_items=len(item_ids),
        user=np.asarray(user, dtype=np.int64),
        item=np.asarray(item, dtype=np.int64),
        label=np.asarray(label, dtype=np.float32),
        split=np.asarray(split, dtype=np.int8),
        item_attributes=np.asarray(attributes, dtype=np.float32),
        global_user_ids=np.asarray(user_ids, dtype=np.int64),
        global_item_ids=np.asarray(item_ids, dtype=np.int64),
    )


def _data():
    # Silo a: 2 users, 2 items (item 10 has attributes 0 and 1, item 11 attribute 0), 4 records.
    # Silo b: 1 user, 2 items (item 11 again, item 12 attribute 2), 3 records; attribute 1 is missing in b,
    # attribute 2 in a.
    a = _silo('a', [0, 0, 1, 1], [0, 1, 1, 0], [1, 0, 1, 1], [0, 1, 2, 0], [[1, 1, 0], [1, 0, 0]], [5, 6], [10, 11])
    b = _silo('b', [0, 0, 0], [1, 0, 1], [0, 0, 1], [0, 1, 2], [[0, 0, 1], [1, 0, 0]], [7], [12, 11])
    return UserModelingData(
        name='tiny',
        task='binary',
        num_attributes=3,
        attribute_names=['x', 'y', 'z'],
        rating_range=(0.0, 1.0),
        silos=[a, b],
        source='test',
    )


def test_valid_data_passes():
    data = _data()
    assert user_modeling.validate(data) is data


def test_attribute_distribution():
    # a: records on items 0, 1, 1, 0 -> attribute 0 in 4/4, attribute 1 in 2/4, attribute 2 in 0.
    # b: records on items 1, 0, 1 (item 1 = global 11 = attribute 0; item 0 = global 12 = attribute 2).
    np.testing.assert_allclose(user_modeling.attribute_distribution(_data()), [[1, 0.5, 0], [2 / 3, 0, 1 / 3]])


def test_statistics():
    stats = user_modeling.statistics(_data())
    pooled = np.array([6, 2, 1]) / 9
    tv_a = 0.5 * np.abs(np.array([4, 2, 0]) / 6 - pooled).sum()
    tv_b = 0.5 * np.abs(np.array([2, 0, 1]) / 3 - pooled).sum()
    expected = {
        'num_clients': 2,
        'num_records': 7,
        'num_users': 3,
        'num_items': 3,
        'num_attributes': 3,
        'attributes_per_item': 4 / 3,
        'attributes_per_record': 9 / 7,
        'num_attributes_present': 3,
        'records_per_client_min': 3,
        'records_per_client_median': 3.5,
        'records_per_client_max': 4,
        'users_per_client_min': 1,
        'users_per_client_median': 1.5,
        'users_per_client_max': 2,
        'items_per_client_min': 2,
        'items_per_client_median': 2.0,
        'items_per_client_max': 2,
        'missing_attributes_per_client_min': 1,
        'missing_attributes_per_client_median': 1.0,
        'missing_attributes_per_client_max': 1,
        'records_train': 3,
        'records_validation': 2,
        'records_test': 2,
        'label_mean': 4 / 7,
        'attribute_tv_distance_mean': (tv_a + tv_b) / 2,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value), key


def test_per_user_split():
    # User 3 has 10 records (8/1/1), user 1 has 3 (1/1/1), interleaved: each user's own order is kept.
    user = np.array([3, 1, 3, 3, 1, 3, 3, 3, 3, 1, 3, 3, 3])
    split = user_modeling.per_user_split(user)
    assert split.dtype == np.int8
    np.testing.assert_array_equal(split[user == 3], [0] * 8 + [1, 2])
    np.testing.assert_array_equal(split[user == 1], [0, 1, 2])
    np.testing.assert_array_equal(
        user_modeling.per_user_split(np.zeros(20, np.int64), (0.5, 0.25, 0.25)), [0] * 10 + [1] * 5 + [2] * 5
    )
    with pytest.raises(ValueError, match='at least 3'):
        user_modeling.per_user_split(np.array([0, 0]))
    with pytest.raises(ValueError, match='summing to 1'):
        user_modeling.per_user_split(np.zeros(5, np.int64), (0.8, 0.1, 0.2))


def test_plot_attribute_distribution(tmp_path):
    path = user_modeling.plot_attribute_distribution(_data(), str(tmp_path / 'figs' / 'attributes.png'))
    with open(path, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def _replace_silo(data, index, **changes):
    silos = list(data.silos)
    silos[index] = dataclasses.replace(silos[index], **changes)
    return dataclasses.replace(data, silos=silos)


@pytest.mark.parametrize(
    'changes, client_id, field, message',
    [
        (dict(user=np.array([0, 0, 1, 1], np.int32)), 'a', 'user', 'dtype int64, got int32'),
        (dict(label=np.array([1, 0, 1], np.float32)), 'a', 'label', r'shape \(4,\)'),
        (dict(item=np.array([0, 1, 2, 0], np.int64)), 'a', 'item', r'index 2 outside \[0, num_items=2\)'),
        (dict(user=np.array([0, 0, 0, 0], np.int64)), 'a', 'user', 'local index 1 has no record'),
        (dict(split=np.array([0, 0, 2, 0], np.int8)), 'a', 'split', 'no validation record'),
        (dict(split=np.array([0, 1, 3, 0], np.int8)), 'a', 'split', 'record 2 is 3'),
        (dict(label=np.array([1, 0, 2, 1], np.float32)), 'a', 'label', 'must be 0 or 1; record 2 is 2'),
        (dict(label=np.array([1, 0, np.nan, 1], np.float32)), 'a', 'label', 'record 2 is not finite'),
        (
            dict(item_attributes=np.array([[1, 1, 0], [0, 0, 0]], np.float32)),
            'a',
            'item_attributes',
            r'item 1 \(global id 11\) has no attribute',
        ),
        (dict(item_attributes=np.array([[1, 0.5, 0], [1, 0, 0]], np.float32)), 'a', 'item_attributes', 'multi-hot'),
        (dict(item_attributes=np.ones((2, 2), np.float32)), 'a', 'item_attributes', r'shape \(2, 3\)'),
        (dict(global_item_ids=np.array([10, 10], np.int64)), 'a', 'global_item_ids', 'id 10 appears more than once'),
        (dict(num_users=0), 'a', 'num_users', 'no empty silo'),
        (dict(user=np.zeros(0, np.int64)), 'a', 'user', 'non-empty'),
        (dict(client_id='b'), 'b', 'client_id', 'more than one silo'),
    ],
)
def test_validate_names_silo_and_field(changes, client_id, field, message):
    with pytest.raises(UserModelingDataError, match=message) as info:
        user_modeling.validate(_replace_silo(_data(), 0, **changes))
    assert (info.value.client_id, info.value.field) == (client_id, field)
    assert f'silo {client_id!r} field {field!r}' in str(info.value)


def test_validate_rating_task_range():
    data = dataclasses.replace(_data(), task='rating', rating_range=(1.0, 5.0))
    with pytest.raises(UserModelingDataError, match='rating 0 of record 1 is outside rating_range'):
        user_modeling.validate(data)
    ratings = [np.array([1, 2, 5, 3], np.float32), np.array([4, 4, 1], np.float32)]
    silos = [dataclasses.replace(s, label=r) for s, r in zip(data.silos, ratings)]
    user_modeling.validate(dataclasses.replace(data, silos=silos))


@pytest.mark.parametrize(
    'changes, field',
    [
        (dict(task='ranking'), 'task'),
        (dict(rating_range=(1.0, 5.0)), 'rating_range'),
        (dict(attribute_names=['x', 'y']), 'attribute_names'),
        (dict(silos=[]), 'silos'),
    ],
)
def test_validate_dataset_fields(changes, field):
    with pytest.raises(UserModelingDataError, match=f"field '{field}'") as info:
        user_modeling.validate(dataclasses.replace(_data(), **changes))
    assert info.value.field == field and info.value.client_id is None
