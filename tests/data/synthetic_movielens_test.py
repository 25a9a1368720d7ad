"""Tests for fedpersonal.data.synthetic_movielens."""

import time

import numpy as np
import pandas as pd
import pytest

from fedpersonal.data import movielens
from fedpersonal.data.synthetic_movielens import generate_movielens_like
from fedpersonal.data.synthetic_movielens import write_movielens_100k_layout

# 1997-01-01 and 1999-01-01, unix seconds.
_YEAR_1997 = 852_076_800
_YEAR_1999 = 915_148_800


@pytest.fixture(scope='module')
def ratings():
    return generate_movielens_like(seed=0)


def test_deterministic_for_seed(ratings):
    pd.testing.assert_frame_equal(generate_movielens_like(seed=0), ratings)
    other = generate_movielens_like(seed=1)
    assert len(other) != len(ratings) or not other.equals(ratings)
    small = dict(num_users=20, num_items=50, min_ratings_per_user=3, mean_ratings_per_user=8)
    pd.testing.assert_frame_equal(generate_movielens_like(**small, seed=4), generate_movielens_like(**small, seed=4))


def test_schema_ids_and_timestamps(ratings):
    assert list(ratings.columns) == ['user_id', 'item_id', 'rating', 'timestamp']
    assert [str(t) for t in ratings.dtypes] == ['int64', 'int64', 'float32', 'int64']
    assert ratings.index.equals(pd.RangeIndex(len(ratings)))
    assert sorted(ratings.user_id.unique()) == list(range(1, 944))
    assert ratings.item_id.min() >= 1 and ratings.item_id.max() <= 1682
    assert ratings.item_id.nunique() > 1600
    assert not ratings.duplicated(['user_id', 'item_id']).any()
    assert ratings.timestamp.min() >= _YEAR_1997 and ratings.timestamp.max() < _YEAR_1999
    # Sorted by user, timestamps strictly increasing within each user.
    assert (np.diff(ratings.user_id) >= 0).all()
    same_user = np.diff(ratings.user_id) == 0
    assert (np.diff(ratings.timestamp)[same_user] > 0).all()


def test_counts_per_user(ratings):
    counts = ratings.groupby('user_id').size()
    assert counts.min() >= 20
    assert counts.max() <= 1682
    assert abs(counts.mean() - 106) < 2
    assert counts.median() < counts.mean() * 0.8  # heavy right tail, like MovieLens (median 65, mean 106)
    small = generate_movielens_like(
        num_users=40, num_items=30, min_ratings_per_user=10, mean_ratings_per_user=25, seed=2
    )
    small_counts = small.groupby('user_id').size()
    assert small_counts.min() >= 10 and small_counts.max() <= 30


def test_rating_histogram_looks_like_movielens(ratings):
    assert set(np.unique(ratings.rating)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    histogram = np.bincount(ratings.rating.astype(int), minlength=6)[1:] / len(ratings)
    assert int(np.argmax(histogram)) + 1 == 4
    assert int(np.argmin(histogram)) + 1 == 1
    np.testing.assert_allclose(histogram, [0.061, 0.114, 0.271, 0.342, 0.212], atol=0.03)
    assert 3.4 < ratings.rating.mean() < 3.7


def test_item_popularity_is_skewed(ratings):
    per_item = ratings.groupby('item_id').size().sort_values(ascending=False)
    top = int(0.1 * 1682)
    assert per_item.iloc[:top].sum() / len(ratings) > 0.30
    uniform = generate_movielens_like(zipf_exponent=0.0, seed=0)
    per_item_uniform = uniform.groupby('item_id').size().sort_values(ascending=False)
    assert per_item_uniform.iloc[:top].sum() / len(uniform) < 0.15


def test_fast():
    start = time.perf_counter()
    generate_movielens_like(seed=11)
    assert time.perf_counter() - start < 2.0  # ~0.3 s typically; generous for loaded CI machines


def test_invalid_arguments():
    with pytest.raises(ValueError):
        generate_movielens_like(num_items=10, min_ratings_per_user=20)
    with pytest.raises(ValueError):
        generate_movielens_like(min_ratings_per_user=20, mean_ratings_per_user=10)
    with pytest.raises(ValueError):
        generate_movielens_like(rank=0)
    with pytest.raises(ValueError):
        generate_movielens_like(noise_std=-1.0)


def test_write_movielens_100k_layout_exact_bytes(tmp_path):
    frame = pd.DataFrame(
        {
            'user_id': np.array([196, 186], dtype=np.int64),
            'item_id': np.array([242, 302], dtype=np.int64),
            'rating': np.array([3, 5], dtype=np.float32),
            'timestamp': np.array([881250949, 891717742], dtype=np.int64),
        }
    )
    path = write_movielens_100k_layout(frame, str(tmp_path / 'out'))
    with open(path, 'rb') as f:
        assert f.read() == b'196\t242\t3\t881250949\n186\t302\t5\t891717742\n'
    with pytest.raises(ValueError, match='1..5'):
        write_movielens_100k_layout(frame.assign(rating=np.float32(3.5)), str(tmp_path))
    with pytest.raises(ValueError, match='missing'):
        write_movielens_100k_layout(frame.drop(columns='rating'), str(tmp_path))


def _als_residual_fit(train, num_users, num_items, item_mean, rank, lam, iterations, seed=0):
    """Alternating least squares on (rating - item mean); returns user and item factors."""
    users = train.user_id.to_numpy()
    items = train.item_id.to_numpy()
    residual = train.rating.to_numpy(np.float64) - item_mean[items]
    rng = np.random.default_rng(seed)
    factors = {'user': rng.normal(0, 0.1, (num_users, rank)), 'item': rng.normal(0, 0.1, (num_items, rank))}

    def solve(rows, cols, other, n):
        order = np.argsort(rows, kind='stable')
        rows, cols, target = rows[order], cols[order], residual[order]
        x = other[cols]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        gram = np.zeros((n, rank, rank))
        rhs = np.zeros((n, rank))
        gram[rows[starts]] = np.add.reduceat(x[:, :, None] * x[:, None, :], starts, axis=0)
        rhs[rows[starts]] = np.add.reduceat(x * target[:, None], starts, axis=0)
        return np.linalg.solve(gram + lam * np.eye(rank), rhs[..., None])[..., 0]

    for _ in range(iterations):
        factors['user'] = solve(users, items, factors['item'], num_users)
        factors['item'] = solve(items, users, factors['user'], num_items)
    return factors['user'], factors['item']


def test_low_rank_signal_is_learnable(ratings):
    """A rank-9 ALS fit (8 factors + room for the user bias) beats per-item means clearly on held-out ratings."""
    data = movielens.preprocess_ratings(ratings, max_examples_per_user=None)
    train, _, test = movielens.split_by_time(data)
    mu = float(train.rating.mean())
    sums = np.bincount(train.item_id, weights=train.rating, minlength=data.num_items)
    counts = np.bincount(train.item_id, minlength=data.num_items)
    item_mean = (sums + 5 * mu) / (counts + 5)  # shrunk towards the global mean (unseen items -> mu)
    user_factors, item_factors = _als_residual_fit(
        train, data.num_users, data.num_items, item_mean, rank=9, lam=5.0, iterations=8
    )
    u, i = test.user_id.to_numpy(), test.item_id.to_numpy()
    truth = test.rating.to_numpy(np.float64)
    rmse_global = np.sqrt(np.mean((truth - mu) ** 2))
    rmse_item_mean = np.sqrt(np.mean((truth - item_mean[i]) ** 2))
    prediction = np.clip(item_mean[i] + np.sum(user_factors[u] * item_factors[i], axis=1), 1, 5)
    rmse_mf = np.sqrt(np.mean((truth - prediction) ** 2))
    print(f'held-out RMSE: global mean {rmse_global:.3f}, item mean {rmse_item_mean:.3f}, ALS {rmse_mf:.3f}')
    assert rmse_item_mean < rmse_global
    assert rmse_mf < 0.85 * rmse_item_mean
