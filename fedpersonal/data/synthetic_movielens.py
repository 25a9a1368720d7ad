"""Synthetic ratings that look like MovieLens 100K and have a low-rank structure.

`generate_movielens_like` draws a ratings frame in the same form as `fedpersonal.data.load_ratings` returns
(1-based GroupLens-style ids, integer ratings 1..5, unix timestamps in 1997-1998), so every part of the pipeline can
run without the real data. `write_movielens_100k_layout` writes such a frame as a GroupLens ``u.data`` file.

Generative model (defaults reproduce the MovieLens 100K shape: 943 users, 1,682 items, ~106 ratings per user,
rating histogram about 6/11/27/34/21 % for 1..5):

* user factors ``p_u`` and item factors ``q_i`` in R^rank with i.i.d. N(0, 1/sqrt(rank)) entries, so that
  ``<p_u, q_i>`` has unit variance whatever the rank; it is scaled by ``_INTERACTION_SCALE``;
* user bias ``b_u ~ N(0, _USER_BIAS_STD)``, item bias ``b_i`` left-skewed (a few very badly rated items, as in
  MovieLens): ``b_i = _ITEM_BIAS_STD * z - _ITEM_BIAS_SKEW * e`` with ``z`` normal and ``e`` exponential, centred;
* number of ratings per user: ``min_ratings_per_user`` plus a Gamma(shape 0.7) excess (many light users, a long
  right tail, like MovieLens: with the defaults the median is ~70 and the maximum ~800), scaled so the mean is
  ``mean_ratings_per_user`` after clipping to ``num_items``;
* items per user drawn without replacement with probability proportional to ``popularity_rank ** -zipf_exponent``
  (popularity ranks are a random permutation of the items), by the Gumbel-top-k trick;
* rating ``clip(round(mu + b_u + b_i + <p_u, q_i> + noise), 1, 5)`` with ``mu = _GLOBAL_MEAN`` and
  ``noise ~ N(0, noise_std)``;
* timestamps: each user starts at a uniform time in 1997-09-20 .. 1998-04-22 and rates their items in random order
  over a span of (exponentially distributed, mean ~3 weeks) time, strictly increasing.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from fedpersonal import errors

__all__ = ['generate_movielens_like', 'write_movielens_100k_layout']

# Scales chosen so that, with noise_std=0.5, the rating histogram is close to MovieLens 100K.
_GLOBAL_MEAN = 3.55
_USER_BIAS_STD = 0.38
_ITEM_BIAS_STD = 0.25
_ITEM_BIAS_SKEW = 0.8
_INTERACTION_SCALE = 0.6
_COUNT_GAMMA_SHAPE = 0.7

# MovieLens 100K time range (first and last rating), unix seconds.
_T_START = 874_724_710  # 1997-09-20
_T_END = 893_286_638  # 1998-04-22
_MEAN_SPAN_SECONDS = 21 * 24 * 3600
_USER_CHUNK = 1024


def _ratings_per_user(
    rng: np.random.Generator, num_users: int, num_items: int, minimum: int, mean: float
) -> np.ndarray:
    """Heavy-tailed counts in [minimum, num_items] whose mean is close to `mean`."""
    excess = rng.gamma(_COUNT_GAMMA_SHAPE, 1.0, size=num_users)
    target = mean - minimum
    if target <= 0:
        return np.full(num_users, minimum, dtype=np.int64)
    scale = target / excess.mean()
    # A few fixed-point steps compensate for the clipping at num_items (deterministic).
    for _ in range(20):
        counts = np.clip(minimum + np.round(scale * excess), minimum, num_items)
        achieved = counts.mean() - minimum
        if achieved <= 0 or abs(achieved - target) < 0.01:
            break
        scale *= target / achieved
    return counts.astype(np.int64)


def generate_movielens_like(
    *,
    num_users: int = 943,
    num_items: int = 1682,
    rank: int = 8,
    min_ratings_per_user: int = 20,
    mean_ratings_per_user: float = 106,
    zipf_exponent: float = 1.0,
    noise_std: float = 0.5,
    seed: int = 0,
) -> pd.DataFrame:
    """Generates MovieLens-100K-like ratings with a rank-`rank` structure (see the module docstring).

    Args:
        num_users: Number of users (ids 1..num_users, every one has ratings).
        num_items: Number of items (ids 1..num_items; an item may, rarely, get no rating).
        rank: Rank of the latent user/item factors.
        min_ratings_per_user: Minimum number of ratings of each user.
        mean_ratings_per_user: Target mean number of ratings per user (achieved up to rounding unless the
            clipping at `num_items` makes it impossible).
        zipf_exponent: Item popularity skew: item with popularity rank k is drawn with weight k ** -zipf_exponent
            (0 = uniform).
        noise_std: Standard deviation of the Gaussian noise added before rounding.
        seed: Seed; the output is a deterministic function of all arguments.

    Returns:
        A DataFrame with columns ``user_id`` (int64, 1-based), ``item_id`` (int64, 1-based), ``rating`` (float32,
        an integer in 1..5) and ``timestamp`` (int64 unix seconds in 1997-09-20 .. 1998-04-23, strictly
        increasing within each user), sorted by (user_id, timestamp), with a RangeIndex.

    Raises:
        ValueError: If an argument is out of range (e.g. ``min_ratings_per_user > num_items``).
    """
    if num_users < 1 or num_items < 1 or rank < 1:
        raise errors.ConfigError(f'num_users, num_items and rank must be >= 1, got {num_users}, {num_items}, {rank}')
    if not 1 <= min_ratings_per_user <= num_items:
        raise errors.ConfigError(
            f'min_ratings_per_user must be in [1, num_items={num_items}], got {min_ratings_per_user}'
        )
    if not min_ratings_per_user <= mean_ratings_per_user <= num_items:
        raise errors.ConfigError(
            f'mean_ratings_per_user must be in [min_ratings_per_user={min_ratings_per_user}, '
            f'num_items={num_items}], got {mean_ratings_per_user}'
        )
    if zipf_exponent < 0 or noise_std < 0:
        raise errors.ConfigError(f'zipf_exponent and noise_std must be >= 0, got {zipf_exponent}, {noise_std}')

    rng = np.random.default_rng(seed)
    factor_std = rank**-0.25  # <p, q> then has unit variance.
    user_factors = rng.normal(0.0, factor_std, size=(num_users, rank))
    item_factors = rng.normal(0.0, factor_std, size=(num_items, rank))
    user_bias = rng.normal(0.0, _USER_BIAS_STD, size=num_users)
    skew = rng.exponential(1.0, size=num_items)
    item_bias = rng.normal(0.0, _ITEM_BIAS_STD, size=num_items) - _ITEM_BIAS_SKEW * (skew - 1.0)
    popularity_rank = rng.permutation(num_items) + 1
    log_weight = -zipf_exponent * np.log(popularity_rank.astype(np.float64))

    counts = _ratings_per_user(rng, num_users, num_items, min_ratings_per_user, mean_ratings_per_user)

    # Items without replacement, proportional to popularity: the k largest of log_weight + Gumbel noise.
    item_lists: list[np.ndarray] = []
    for lo in range(0, num_users, _USER_CHUNK):
        hi = min(num_users, lo + _USER_CHUNK)
        keys = log_weight[None, :] + rng.gumbel(size=(hi - lo, num_items))
        k_max = int(counts[lo:hi].max())
        if k_max < num_items:
            candidates = np.argpartition(-keys, k_max - 1, axis=1)[:, :k_max]
        else:
            candidates = np.broadcast_to(np.arange(num_items), (hi - lo, num_items))
        candidate_keys = np.take_along_axis(keys, candidates, axis=1)
        ranked = np.take_along_axis(candidates, np.argsort(-candidate_keys, axis=1), axis=1)
        # The user's top-counts[u] items; sorted so the result does not depend on the partition's order.
        item_lists.extend(np.sort(ranked[u - lo, : counts[u]]) for u in range(lo, hi))
    users = np.repeat(np.arange(num_users), counts)
    items = np.concatenate(item_lists)
    # Random rating order within each user (so time does not follow popularity).
    items = items[np.lexsort((rng.random(items.size), users))]

    score = (
        _GLOBAL_MEAN
        + user_bias[users]
        + item_bias[items]
        + _INTERACTION_SCALE * np.einsum('nk,nk->n', user_factors[users], item_factors[items])
        + rng.normal(0.0, noise_std, size=items.size)
    )
    rating = np.clip(np.rint(score), 1, 5).astype(np.float32)

    # Timestamps: start uniform in the MovieLens range; increments spread over an exponential span.
    starts = rng.integers(_T_START, _T_END - 7 * 24 * 3600, size=num_users)
    spans = np.minimum(rng.exponential(_MEAN_SPAN_SECONDS, size=num_users), _T_END - starts - counts)
    gaps = rng.exponential(1.0, size=items.size)
    boundaries = np.concatenate([[0], np.cumsum(counts)])
    cumulative = np.cumsum(gaps)
    before = np.concatenate([[0.0], cumulative])[boundaries[:-1]]  # cumulative sum before each user's block
    total = cumulative[boundaries[1:] - 1] - before
    fraction = (cumulative - np.repeat(before, counts)) / np.repeat(total, counts)
    position = np.arange(items.size) - np.repeat(boundaries[:-1], counts)
    timestamp = np.repeat(starts, counts) + np.floor(fraction * np.repeat(spans, counts)).astype(np.int64) + position

    return pd.DataFrame(
        {
            'user_id': (users + 1).astype(np.int64),
            'item_id': (items + 1).astype(np.int64),
            'rating': rating,
            'timestamp': timestamp.astype(np.int64),
        }
    )


def write_movielens_100k_layout(ratings: pd.DataFrame, directory: str) -> str:
    """Writes `ratings` as a GroupLens MovieLens 100K ``u.data`` file.

    The file has one ``user<TAB>item<TAB>rating<TAB>timestamp`` line per row (in frame order), no header, ``\\n``
    line endings, exactly as distributed by GroupLens, so `fedpersonal.data.load_ratings(directory)` reads it back.

    Args:
        ratings: Frame with columns ``user_id, item_id, rating, timestamp``; ids and timestamps non-negative
            integers, ratings integers in 1..5.
        directory: Output directory (created if needed). An existing ``u.data`` is overwritten.

    Returns:
        The path of the written ``u.data``.

    Raises:
        ValueError: If a column is missing or a value cannot be represented in the format.
    """
    missing = [c for c in ('user_id', 'item_id', 'rating', 'timestamp') if c not in ratings.columns]
    if missing:
        raise errors.DataError(f'ratings is missing columns {missing}')
    columns = {}
    for name in ('user_id', 'item_id', 'timestamp'):
        values = ratings[name].to_numpy()
        if not np.issubdtype(values.dtype, np.integer):
            raise errors.DataError(f'ratings[{name!r}] must be integers, got dtype {values.dtype}')
        if values.size and values.min() < 0:
            raise errors.DataError(f'ratings[{name!r}] must be non-negative')
        columns[name] = values.astype(np.int64)
    rating = ratings['rating'].to_numpy(dtype=np.float64)
    if rating.size and (np.any(rating != np.rint(rating)) or rating.min() < 1 or rating.max() > 5):
        raise errors.DataError('ratings["rating"] must be integers in 1..5 for the MovieLens 100K format')
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, 'u.data')
    lines = [
        f'{u}\t{i}\t{r}\t{t}\n'
        for u, i, r, t in zip(
            columns['user_id'].tolist(),
            columns['item_id'].tolist(),
            rating.astype(np.int64).tolist(),
            columns['timestamp'].tolist(),
        )
    ]
    with open(path, 'w', encoding='ascii', newline='\n') as f:
        f.writelines(lines)
    return path
