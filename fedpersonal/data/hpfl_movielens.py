"""MovieLens 100K as cross-silo HPFL user-modeling data: 10 regional clients by the first digit of the zip code.

Files (GroupLens 100K layout, latin-1, no header), read from a directory the caller names:

* ``u.data``: ``user<TAB>item<TAB>rating<TAB>timestamp`` (read by `fedpersonal.data.movielens.load_ratings`);
* ``u.item``: ``id|title|release date|video release date|URL|`` + 19 genre flags (read by
  `fedpersonal.data.movielens_likes.load_movie_items`);
* ``u.user``: ``id|age|gender|occupation|zip code`` (read by `load_movie_users` here).

Partition: a user's client is the first digit of their zip code, ``zip_region_0`` .. ``zip_region_9`` (US ZIP codes
start with a digit that names a group of states, 0 = New England ... 9 = the West Coast), so there are 10 clients
as in the paper. Zip codes that do not start with a digit (in ML-100K: 18 users with Canadian postal codes such as
``T8H1N``) are *non-numeric*; ``non_numeric_zip`` decides their bucket:

* ``'drop'`` (default): the users are left out. This reproduces the paper's table (10 clients, 925 users and 1,679
  items, i.e. 943 users minus the 18 non-numeric ones; the paper reports 96,538 records where this gives 97,914).
* ``'own_client'``: they form an 11th client ``zip_region_other``.

Attributes are the 19 genres (`fedpersonal.data.movielens_likes.GENRES`, in ``u.item`` order); every ML-100K movie
has at least one flag (``unknown`` is a genre). The task is rating prediction: label = rating 1..5, rating range
(1, 5). Each user's ratings are ordered by (timestamp, item id) and split into train / validation / test in that
order (`fedpersonal.data.user_modeling.per_user_split`). Within a client, local user indices follow increasing user
id and local item indices increasing movie id; records are sorted by (user, timestamp, item).

Malformed files raise `fedpersonal.data.movielens.MovieLensFormatError` naming the file and the 1-based line.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import movielens
from fedpersonal.data import movielens_likes
from fedpersonal.data import user_modeling
from fedpersonal.data.movielens import MovieLensFormatError

__all__ = ['NON_NUMERIC_ZIP', 'OTHER_REGION', 'load_movie_users', 'load_movielens_silos', 'zip_region']

NON_NUMERIC_ZIP = ('drop', 'own_client')
OTHER_REGION = 'other'
"""Region of a zip code that does not start with a digit (client ``zip_region_other``)."""

_USER_FILE = 'u.user'
_USER_FIELDS = ('id', 'age', 'gender', 'occupation', 'zip code')


def load_movie_users(data_dir: str) -> pd.DataFrame:
    """Reads ``u.user`` of MovieLens 100K.

    Args:
        data_dir: Directory holding ``u.user``.

    Returns:
        A DataFrame with columns ``user_id`` (int64), ``age`` (int64), ``gender``, ``occupation`` and ``zip_code``
        (str, as written), in file order.

    Raises:
        MovieLensFormatError: The file is missing or empty, or a line does not have 5 ``|``-separated fields, a
            non-integer or duplicate id, a non-integer age, or an empty zip code (the message names the file and
            the 1-based line). Blank lines at the end of the file are accepted.
    """
    path = os.path.join(os.fspath(data_dir), _USER_FILE)
    if not os.path.isfile(path):
        raise MovieLensFormatError(
            f'{path}: no {_USER_FILE!r} file (expected the MovieLens 100K user list: '
            f'"{"|".join(_USER_FIELDS)}" per line)',
            path=path,
        )
    with open(path, 'rb') as f:
        text = f.read().decode('latin-1').replace('\r\n', '\n').rstrip('\n')
    if not text.strip():
        raise MovieLensFormatError(f'{path} line 1: file is empty', path=path, line=1)
    rows = []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(text.split('\n'), start=1):

        def fail(reason: str):
            raise MovieLensFormatError(f'{path} line {lineno}: {reason}', path=path, line=lineno)

        fields = line.split('|')
        if len(fields) != len(_USER_FIELDS):
            fail(
                f'expected {len(_USER_FIELDS)} "|"-separated fields ({", ".join(_USER_FIELDS)}), got '
                f'{len(fields)}: {line!r}'
            )
        if not re.fullmatch(r'\d{1,18}', fields[0]):
            fail(f'user id {fields[0]!r} is not a non-negative integer')
        user = int(fields[0])
        if user in seen:
            fail(f'duplicate user id {user} (first on line {seen[user]})')
        seen[user] = lineno
        if not re.fullmatch(r'\d{1,3}', fields[1]):
            fail(f'age {fields[1]!r} of user {user} is not a non-negative integer')
        if not fields[4].strip():
            fail(f'user {user} has an empty zip code')
        rows.append((user, int(fields[1]), fields[2], fields[3], fields[4].strip()))
    frame = pd.DataFrame(rows, columns=['user_id', 'age', 'gender', 'occupation', 'zip_code'])
    return frame.astype({'user_id': np.int64, 'age': np.int64})


def zip_region(zip_code: str) -> str:
    """The region of a zip code: its first character if that is a digit, else `OTHER_REGION`."""
    return zip_code[0] if zip_code[:1].isdigit() and zip_code[:1].isascii() else OTHER_REGION


def load_movielens_silos(
    data_dir: str,
    *,
    non_numeric_zip: str = 'drop',
    min_ratings_per_user: int = 3,
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> user_modeling.UserModelingData:
    """Loads MovieLens 100K as regional silos (see the module docstring).

    Args:
        data_dir: Directory with ``u.data``, ``u.item`` and ``u.user`` (e.g. ``/work/data/ml-100k``).
        non_numeric_zip: ``'drop'`` or ``'own_client'``: the bucket of users whose zip code does not start with a
            digit.
        min_ratings_per_user: Users with fewer ratings are dropped (>= 3; every ML-100K user has >= 20).
        split: Per-user (train, validation, test) fractions of the ratings, in time order.

    Returns:
        A valid `fedpersonal.data.user_modeling.UserModelingData` named ``'movielens_100k'``, rating task, clients
        ``zip_region_<digit>`` in digit order (then ``zip_region_other``); a region without users has no client.

    Raises:
        MovieLensFormatError: A file is missing or malformed, ``u.data`` names a user that ``u.user`` or a movie
            that ``u.item`` does not list, or a rated movie has no genre flag in ``u.item``.
        ValueError: Bad arguments, or no user is left.
    """
    if non_numeric_zip not in NON_NUMERIC_ZIP:
        raise errors.ConfigError(f'non_numeric_zip must be one of {NON_NUMERIC_ZIP}, got {non_numeric_zip!r}')
    if min_ratings_per_user < 3:
        raise errors.ConfigError(
            f'min_ratings_per_user must be >= 3 (every user needs train, validation and test ratings), '
            f'got {min_ratings_per_user}'
        )
    data_dir = os.fspath(data_dir)
    ratings = movielens.load_ratings(data_dir, variant='100k')
    movies = movielens_likes.load_movie_items(data_dir)
    people = load_movie_users(data_dir)

    ratings_path = os.path.join(data_dir, 'u.data')
    for column, known, listing in (
        ('user_id', people['user_id'], _USER_FILE),
        ('item_id', movies['item_id'], 'u.item'),
    ):
        unknown = np.flatnonzero(~ratings[column].isin(known).to_numpy())
        if unknown.size:
            i = int(unknown[0])
            raise MovieLensFormatError(
                f'{ratings_path} line {i + 1}: {column.split("_")[0]} {int(ratings[column].iloc[i])} is not in '
                f'{os.path.join(data_dir, listing)} ({wording.count(unknown.size, "ratings")} affected)',
                path=ratings_path,
                line=i + 1,
            )

    region_of_user = dict(zip(people['user_id'].tolist(), (zip_region(z) for z in people['zip_code'])))
    frame = ratings.assign(region=ratings['user_id'].map(region_of_user))
    if non_numeric_zip == 'drop':
        frame = frame[frame['region'] != OTHER_REGION]
    counts = frame.groupby('user_id')['user_id'].transform('size')
    frame = frame[counts >= min_ratings_per_user]
    if frame.empty:
        raise errors.DataError(f'no user with >= {min_ratings_per_user} ratings is left in {data_dir}')
    frame = frame.sort_values(['user_id', 'timestamp', 'item_id'], kind='stable').reset_index(drop=True)
    frame['split'] = user_modeling.per_user_split(frame['user_id'].to_numpy(), split)

    genres = movies[list(movielens_likes.GENRES)].to_numpy(dtype=np.float32)
    movie_ids = movies['item_id'].to_numpy(dtype=np.int64)
    # A movie's attributes are its genres: a rated movie needs at least one (ML-100K's `unknown` is a genre).
    bare = np.flatnonzero((genres.sum(axis=1) == 0) & np.isin(movie_ids, frame['item_id'].to_numpy()))
    if bare.size:
        items_path = os.path.join(data_dir, 'u.item')
        i = int(bare[0])  # u.item's rows in file order (blank lines only at its end): row i is line i + 1.
        raise MovieLensFormatError(
            f"{items_path} line {i + 1}: movie {int(movie_ids[i])} has no genre flag set (HPFL's item attributes "
            f'are the genres; set `unknown` for a movie without one; {bare.size} rated movies have none)',
            path=items_path,
            line=i + 1,
        )
    movie_order = np.argsort(movie_ids)
    regions = sorted(set(frame['region']), key=lambda r: (r == OTHER_REGION, r))
    silos = []
    for region in regions:
        part = frame[frame['region'] == region]
        user_ids, local_user = np.unique(part['user_id'].to_numpy(dtype=np.int64), return_inverse=True)
        item_ids, local_item = np.unique(part['item_id'].to_numpy(dtype=np.int64), return_inverse=True)
        rows = movie_order[np.searchsorted(movie_ids[movie_order], item_ids)]
        silos.append(
            user_modeling.ClientSilo(
                client_id=f'zip_region_{region}',
                num_users=int(user_ids.size),
                num_items=int(item_ids.size),
                user=local_user.astype(np.int64),
                item=local_item.astype(np.int64),
                label=part['rating'].to_numpy(dtype=np.float32),
                split=part['split'].to_numpy(dtype=np.int8),
                item_attributes=genres[rows],
                global_user_ids=user_ids,
                global_item_ids=item_ids,
            )
        )
    source = (
        f'{data_dir} (MovieLens 100K): clients by the first digit of the zip code, non-numeric zip codes '
        f'{non_numeric_zip!r}, users with >= {min_ratings_per_user} ratings, per-user time-ordered split '
        f'{tuple(split)}'
    )
    return user_modeling.validate(
        user_modeling.UserModelingData(
            name='movielens_100k',
            task='rating',
            num_attributes=len(movielens_likes.GENRES),
            attribute_names=list(movielens_likes.GENRES),
            rating_range=(1.0, 5.0),
            silos=silos,
            source=source,
        )
    )
