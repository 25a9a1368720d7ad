"""MovieLens 100K / 1M loading, preprocessing, splitting and `ClientData` construction.

`load_ratings` (from `fedpersonal.data.movielens_files`, re-exported here) reads and validates the GroupLens
ratings files (100K ``u.data``, 1M ``ratings.dat``) from a directory the caller names; nothing is downloaded.

Typical pipeline::

    raw = load_ratings('/path/to/ml-100k')              # original GroupLens ids
    data = preprocess_ratings(raw, max_examples_per_user=300)  # dense 0-based ids, capped, time-sorted
    train_users, val_users, test_users = split_by_user(data, seed=0)
    train_cd = to_client_data(data.ratings, train_users)   # tff.simulation.datasets.ClientData

Importing this module does not import TensorFlow or TFF; `to_client_data` imports them on first use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
import pandas as pd

from fedpersonal import errors
from fedpersonal.data import client_data
from fedpersonal.data.movielens_files import RATING_COLUMNS as RATING_COLUMNS
from fedpersonal.data.movielens_files import MovieLensFormatError as MovieLensFormatError
from fedpersonal.data.movielens_files import load_ratings as load_ratings

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow_federated as tff

__all__ = [
    'MovieLensFormatError',
    'MovieLensData',
    'RATING_COLUMNS',
    'load_ratings',
    'preprocess_ratings',
    'split_by_user',
    'split_by_time',
    'to_client_data',
    'dataset_statistics',
]

# ----------------------------------------------------------------------------------------------------------------
# Preprocessing.
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class MovieLensData:
    """Ratings with dense 0-based user and item indices.

    Equality is identity (`eq=False`): comparing DataFrames field by field is ambiguous.

    Attributes:
        ratings: Columns ``user_id`` and ``item_id`` (dense int64 indices in ``[0, num_users)`` and
            ``[0, num_items)``), ``rating`` (float32) and ``timestamp`` (int64). Rows are sorted by
            (user_id, timestamp, item_id) and the index is a RangeIndex.
        num_users: Number of users; every index in ``[0, num_users)`` has at least one rating.
        num_items: Number of items; every index in ``[0, num_items)`` has at least one rating.
        user_ids: int64 array of length `num_users`; ``user_ids[u]`` is the original id of dense user ``u``
            (strictly increasing).
        item_ids: Same for items.
    """

    ratings: pd.DataFrame
    num_users: int
    num_items: int
    user_ids: np.ndarray
    item_ids: np.ndarray

    def __post_init__(self):
        if len(self.user_ids) != self.num_users or len(self.item_ids) != self.num_items:
            raise ValueError(
                f'user_ids/item_ids have lengths {len(self.user_ids)}/{len(self.item_ids)}, expected '
                f'num_users={self.num_users}/num_items={self.num_items}'
            )
        missing = [c for c in RATING_COLUMNS if c not in self.ratings.columns]
        if missing:
            raise errors.DataError(f'ratings is missing columns {missing}')


def _check_ratings_frame(ratings: pd.DataFrame, name: str = 'ratings') -> None:
    if not isinstance(ratings, pd.DataFrame):
        raise TypeError(f'{name} must be a pandas.DataFrame, got {type(ratings).__name__}')
    missing = [c for c in RATING_COLUMNS if c not in ratings.columns]
    if missing:
        raise errors.DataError(f'{name} is missing columns {missing}; expected {list(RATING_COLUMNS)}')
    for col in ('user_id', 'item_id', 'timestamp'):
        if not pd.api.types.is_integer_dtype(ratings[col].dtype):
            raise errors.DataError(f'{name}[{col!r}] must have an integer dtype, got {ratings[col].dtype}')
    if not pd.api.types.is_numeric_dtype(ratings['rating'].dtype):
        raise errors.DataError(f'{name}["rating"] must be numeric, got {ratings["rating"].dtype}')


def _sorted_by_user_time(ratings: pd.DataFrame) -> pd.DataFrame:
    """Stable sort by (user_id, timestamp, item_id) with a fresh RangeIndex."""
    order = np.lexsort((ratings['item_id'].to_numpy(), ratings['timestamp'].to_numpy(), ratings['user_id'].to_numpy()))
    return ratings.iloc[order].reset_index(drop=True)


def preprocess_ratings(
    ratings: pd.DataFrame, *, max_examples_per_user: int | None = 300, seed: int = 0
) -> MovieLensData:
    """Caps ratings per user, remaps ids to dense indices and sorts each user's ratings by time.

    Steps, all deterministic:

    1. Each user's ratings are ordered by (timestamp, item_id); if `max_examples_per_user` is set, only the
       first `max_examples_per_user` of them (the earliest; ties broken by the smaller item id) are kept.
    2. User and item ids that remain are mapped to dense 0-based indices in increasing order of original id. The
       remapping happens *after* the cap, so an item whose only ratings were dropped by the cap gets no index.
    3. Rows are sorted by (user index, timestamp, item index).

    Args:
        ratings: Frame with columns ``user_id, item_id, rating, timestamp`` (original ids), e.g. from
            `load_ratings` or `generate_movielens_like`. Extra columns are dropped.
        max_examples_per_user: Maximum number of ratings kept per user, or None for no cap.
        seed: Accepted for a uniform call signature across the data layer; the result does not depend on it.

    Returns:
        A `MovieLensData`.

    Raises:
        ValueError: If the frame is empty, lacks a column, or `max_examples_per_user` < 1.
    """
    del seed  # The cap is deterministic (earliest ratings); see docstring.
    _check_ratings_frame(ratings)
    if len(ratings) == 0:
        raise errors.DataError('ratings is empty')
    if max_examples_per_user is not None and max_examples_per_user < 1:
        raise errors.ConfigError(f'max_examples_per_user must be >= 1 or None, got {max_examples_per_user}')

    frame = pd.DataFrame(
        {
            'user_id': ratings['user_id'].to_numpy(dtype=np.int64),
            'item_id': ratings['item_id'].to_numpy(dtype=np.int64),
            'rating': ratings['rating'].to_numpy(dtype=np.float32),
            'timestamp': ratings['timestamp'].to_numpy(dtype=np.int64),
        }
    )
    frame = _sorted_by_user_time(frame)
    if max_examples_per_user is not None:
        position = frame.groupby('user_id', sort=False).cumcount().to_numpy()
        frame = frame.loc[position < max_examples_per_user].reset_index(drop=True)

    user_ids, user_index = np.unique(frame['user_id'].to_numpy(), return_inverse=True)
    item_ids, item_index = np.unique(frame['item_id'].to_numpy(), return_inverse=True)
    frame['user_id'] = user_index.astype(np.int64)
    frame['item_id'] = item_index.astype(np.int64)
    # Remapping is monotone, so the (user, timestamp, item) order is preserved; sort again anyway for clarity
    # of the invariant (cheap: already sorted).
    frame = _sorted_by_user_time(frame)
    return MovieLensData(
        ratings=frame,
        num_users=int(len(user_ids)),
        num_items=int(len(item_ids)),
        user_ids=user_ids.astype(np.int64),
        item_ids=item_ids.astype(np.int64),
    )


# ----------------------------------------------------------------------------------------------------------------
# Splits.
# ----------------------------------------------------------------------------------------------------------------


def _check_fractions(train_fraction: float, val_fraction: float) -> None:
    if not 0.0 < train_fraction < 1.0:
        raise errors.ConfigError(f'train_fraction must be in (0, 1), got {train_fraction}')
    if not 0.0 <= val_fraction < 1.0:
        raise errors.ConfigError(f'val_fraction must be in [0, 1), got {val_fraction}')
    if train_fraction + val_fraction > 1.0 + 1e-12:
        raise errors.ConfigError(f'train_fraction + val_fraction must be <= 1, got {train_fraction} + {val_fraction}')


def _floor(x: float) -> int:
    # Tolerate floating-point products such as 0.29 * 100 = 28.999999999999996.
    return int(math.floor(x + 1e-9))


def split_by_user(
    data: MovieLensData, *, train_fraction: float = 0.8, val_fraction: float = 0.1, seed: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """Partitions users into train / validation / test groups.

    A permutation of ``range(num_users)`` is drawn with ``np.random.default_rng(seed)``; the first
    ``floor(num_users * train_fraction)`` users of it are train, the next ``floor(num_users * val_fraction)``
    validation and the rest test.

    Args:
        data: Preprocessed data.
        train_fraction: Fraction of users for training, in (0, 1).
        val_fraction: Fraction of users for validation, in [0, 1); ``train_fraction + val_fraction <= 1``.
        seed: Seed of the permutation.

    Returns:
        Three disjoint lists of dense user indices (python ints, each sorted ascending) that together cover
        ``range(num_users)``.
    """
    if (
        not 0.0 <= train_fraction <= 1.0
        or not 0.0 <= val_fraction <= 1.0
        or (train_fraction + val_fraction > 1.0 + 1e-12)
    ):
        raise errors.ConfigError(
            f'need 0 <= train_fraction, val_fraction and train_fraction + val_fraction <= 1, got '
            f'{train_fraction}, {val_fraction}'
        )
    n = data.num_users
    permutation = np.random.default_rng(seed).permutation(n)
    n_train = _floor(n * train_fraction)
    n_val = min(_floor(n * val_fraction), n - n_train)
    parts = (permutation[:n_train], permutation[n_train : n_train + n_val], permutation[n_train + n_val :])
    return tuple(sorted(int(u) for u in part) for part in parts)  # type: ignore[return-value]


def _time_split_sizes(n: np.ndarray, train_fraction: float, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-user (train, val) counts for `split_by_time`; see its docstring for the rule."""
    n = n.astype(np.int64)
    n_train = np.floor(n * train_fraction + 1e-9).astype(np.int64)
    n_val = np.floor(n * val_fraction + 1e-9).astype(np.int64)
    big = n >= 3
    # Users with >= 3 ratings: at least one row in every part (validation only if val_fraction > 0).
    if val_fraction > 0:
        n_val_big = np.minimum(np.maximum(n_val, 1), n - 2)
    else:
        n_val_big = np.zeros_like(n)
    n_train_big = np.minimum(np.maximum(n_train, 1), n - n_val_big - 1)
    # Users with 1 or 2 ratings: train first (at least one row), then validation, rest test.
    n_train_small = np.minimum(np.maximum(n_train, 1), n)
    n_val_small = np.minimum(n_val, n - n_train_small)
    return np.where(big, n_train_big, n_train_small), np.where(big, n_val_big, n_val_small)


def split_by_time(
    data: MovieLensData, *, train_fraction: float = 0.8, val_fraction: float = 0.1
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Splits each user's ratings in time order into train / validation / test parts.

    Each user's rows are ordered by (timestamp, item_id). For a user with ``n`` ratings let
    ``t = floor(n * train_fraction)`` and ``v = floor(n * val_fraction)``. The user's first ``n_train`` rows go to
    train, the next ``n_val`` to validation and the remaining ``n - n_train - n_val`` to test, where

    * if ``n >= 3``: ``n_val = min(max(v, 1), n - 2)`` (``0`` if ``val_fraction == 0``) and
      ``n_train = min(max(t, 1), n - n_val - 1)``, so every part gets at least one row (the first adjustments
      take rows from train; e.g. n=3 -> 1/1/1, n=4 -> 2/1/1, n=10 -> 8/1/1, n=20 -> 16/2/2);
    * if ``n < 3``: ``n_train = min(max(t, 1), n)`` and ``n_val = min(v, n - n_train)`` (n=1 -> 1/0/0,
      n=2 -> 1/0/1 with the default fractions).

    Hence, within each user, every train timestamp <= every validation timestamp <= every test timestamp.

    Args:
        data: Preprocessed data.
        train_fraction: Fraction of each user's ratings for training, in (0, 1).
        val_fraction: Fraction for validation, in [0, 1); ``train_fraction + val_fraction <= 1`` (users with
            >= 3 ratings still get at least one test row).

    Returns:
        (train, val, test) frames with the columns of ``data.ratings`` (dense ids), each sorted by
        (user_id, timestamp, item_id) with a fresh RangeIndex.
    """
    _check_fractions(train_fraction, val_fraction)
    frame = _sorted_by_user_time(data.ratings[list(RATING_COLUMNS)])
    grouped = frame.groupby('user_id', sort=False)
    position = grouped.cumcount().to_numpy()
    size = grouped['user_id'].transform('size').to_numpy()
    n_train, n_val = _time_split_sizes(size, train_fraction, val_fraction)
    is_train = position < n_train
    is_val = ~is_train & (position < n_train + n_val)
    is_test = ~is_train & ~is_val
    return tuple(frame.loc[mask].reset_index(drop=True) for mask in (is_train, is_val, is_test))


# ----------------------------------------------------------------------------------------------------------------
# TFF ClientData.
# ----------------------------------------------------------------------------------------------------------------


def to_client_data(
    ratings: pd.DataFrame, user_indices: Sequence[int] | None = None
) -> tff.simulation.datasets.ClientData:
    """Builds an in-memory `tff.simulation.datasets.ClientData` with one client per user.

    Client ids are ``str(user_index)``. Each client's dataset yields unbatched elements
    ``OrderedDict(user_id=int64 scalar, item_id=int64 scalar, rating=float32 scalar, timestamp=int64 scalar)``
    in (timestamp, item_id) order.

    Built by `fedpersonal.data.client_data.from_partition` (a by-user partition of the time-sorted rows), whose
    dataset function takes a python ``str`` client id or a ``tf.string`` tensor (traced by `tf.function`/TFF).

    Args:
        ratings: Frame with dense integer ``user_id``/``item_id`` (e.g. ``MovieLensData.ratings`` or a part
            returned by `split_by_time`).
        user_indices: Users to include, in the order of the resulting ``client_ids``; default: every user in
            `ratings`, ascending.

    Returns:
        The ClientData.

    Raises:
        ValueError: If `ratings` is empty or malformed, has negative user ids, or a requested user has no rows,
            or `user_indices` is empty or has duplicates.
    """
    _check_ratings_frame(ratings)
    frame = _sorted_by_user_time(
        pd.DataFrame(
            {
                'user_id': ratings['user_id'].to_numpy(dtype=np.int64),
                'item_id': ratings['item_id'].to_numpy(dtype=np.int64),
                'rating': ratings['rating'].to_numpy(dtype=np.float32),
                'timestamp': ratings['timestamp'].to_numpy(dtype=np.int64),
            }
        )
    )
    if len(frame) == 0:
        raise errors.DataError('ratings is empty')
    users = frame['user_id'].to_numpy()
    if users[0] < 0:
        raise errors.DataError(f'user ids must be non-negative dense indices, found {users[0]}')
    present, starts, counts = np.unique(users, return_index=True, return_counts=True)

    if user_indices is None:
        selected = present
    else:
        selected = np.asarray([int(u) for u in user_indices], dtype=np.int64)
        if selected.size == 0:
            raise errors.DataError('user_indices is empty')
        unique_sel, first = np.unique(selected, return_index=True)
        if unique_sel.size != selected.size:
            dup = int(selected[np.setdiff1d(np.arange(selected.size), first)[0]])
            raise errors.DataError(f'user_indices contains user {dup} more than once')
        missing = selected[~np.isin(selected, present)]
        if missing.size:
            raise errors.DataError(
                f'user {int(missing[0])} has no rows in ratings ({missing.size} of the requested users have none)'
            )

    where = np.searchsorted(present, selected)
    partition = [np.arange(s, s + c) for s, c in zip(starts[where], counts[where])]
    columns = {name: frame[name].to_numpy() for name in RATING_COLUMNS}
    return client_data.from_partition(columns, partition, [str(int(u)) for u in selected])


# ----------------------------------------------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------------------------------------------


def dataset_statistics(data: MovieLensData) -> dict[str, Any]:
    """Summary statistics for documentation tables.

    Args:
        data: Preprocessed data.

    Returns:
        A dict with python scalars: ``num_users``, ``num_items``, ``num_ratings``, ``density`` (ratings / (users *
        items)), ``ratings_per_user_mean``, ``ratings_per_user_min``, ``ratings_per_user_median``,
        ``ratings_per_user_max``, the same four for ``ratings_per_item_*``, ``rating_mean``, ``rating_std``,
        ``timestamp_min``, ``timestamp_max``, and ``rating_histogram``: a dict from rating value (float, ascending)
        to count.
    """
    r = data.ratings
    per_user = r.groupby('user_id').size().to_numpy()
    per_item = r.groupby('item_id').size().to_numpy()
    values, counts = np.unique(r['rating'].to_numpy(), return_counts=True)
    stats: dict[str, Any] = {
        'num_users': int(data.num_users),
        'num_items': int(data.num_items),
        'num_ratings': int(len(r)),
        'density': float(len(r) / max(1, data.num_users * data.num_items)),
    }
    for prefix, sizes in (('ratings_per_user', per_user), ('ratings_per_item', per_item)):
        stats[f'{prefix}_mean'] = float(sizes.mean()) if sizes.size else 0.0
        stats[f'{prefix}_min'] = int(sizes.min()) if sizes.size else 0
        stats[f'{prefix}_median'] = float(np.median(sizes)) if sizes.size else 0.0
        stats[f'{prefix}_max'] = int(sizes.max()) if sizes.size else 0
    rating = r['rating'].to_numpy(dtype=np.float64)
    stats['rating_mean'] = float(rating.mean()) if rating.size else float('nan')
    stats['rating_std'] = float(rating.std()) if rating.size else float('nan')
    stats['timestamp_min'] = int(r['timestamp'].min()) if len(r) else 0
    stats['timestamp_max'] = int(r['timestamp'].max()) if len(r) else 0
    stats['rating_histogram'] = {float(v): int(c) for v, c in zip(values, counts)}
    return stats
