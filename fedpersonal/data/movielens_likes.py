"""MovieLens "likes": a binary FURL document-classification task built from MovieLens 100K.

Each rating is one example of its user (users are clients): the *document* is the movie, its text (``chars``) the
movie title (e.g. ``"toy story (1995)"``), its side ``features`` the 19 GroupLens genre flags, and the ``label`` is
1 ("liked") if the rating is >= 4, else 0. Like the paper's Sticker task (click / no click), it is a binary task
whose base rate varies a lot between users, so a per-user representation should help. Each user's ratings are
split 0.8/0.1/0.1 in time order (timestamp, ties by item id). See `fedpersonal.data.furl_tasks` for the format.

Files (GroupLens 100K layout, latin-1, no header):

* ``u.data``: ``user<TAB>item<TAB>rating<TAB>timestamp`` (read with `fedpersonal.data.movielens.load_ratings`);
* ``u.item``: ``id|title|release date|video release date|IMDb URL|`` followed by 19 genre flags (0/1) in the order of
  ``u.genre`` (`GENRES`); date and URL fields may be empty.

Malformed files raise `fedpersonal.data.movielens.MovieLensFormatError` naming the file and the 1-based line.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import furl_tasks
from fedpersonal.data import movielens
from fedpersonal.data.movielens import MovieLensFormatError

__all__ = ['GENRES', 'load_movie_items', 'load_movielens_likes']

GENRES = (
    'unknown',
    'Action',
    'Adventure',
    'Animation',
    "Children's",
    'Comedy',
    'Crime',
    'Documentary',
    'Drama',
    'Fantasy',
    'Film-Noir',
    'Horror',
    'Musical',
    'Mystery',
    'Romance',
    'Sci-Fi',
    'Thriller',
    'War',
    'Western',
)
"""The 19 MovieLens 100K genres, in the order of the flags in ``u.item``."""

_ITEM_FILE = 'u.item'
_NUM_ITEM_FIELDS = 5 + len(GENRES)
_LIKE_THRESHOLD = 4.0


def load_movie_items(data_dir: str) -> pd.DataFrame:
    """Reads ``u.item`` of MovieLens 100K.

    Args:
        data_dir: Directory holding ``u.item``.

    Returns:
        A DataFrame with columns ``item_id`` (int64, original id), ``title`` (str) and one int8 column per genre
        (named as in `GENRES`), in file order.

    Raises:
        MovieLensFormatError: If the file is missing or empty, or a line does not have 24 ``|``-separated fields, a
            non-integer or duplicate id, an empty title, or a genre flag other than 0/1 (the message names the file
            and the 1-based line number). Blank lines at the end of the file are accepted.
    """
    path = os.path.join(os.fspath(data_dir), _ITEM_FILE)
    if not os.path.isfile(path):
        raise MovieLensFormatError(
            f'{path}: no {_ITEM_FILE!r} file (expected the MovieLens 100K item list: '
            f'"id|title|release date|video release date|URL|" + {len(GENRES)} genre flags)',
            path=path,
        )
    with open(path, 'rb') as f:
        text = f.read().decode('latin-1')
    text = text.replace('\r\n', '\n').rstrip('\n')
    if not text.strip():
        raise MovieLensFormatError(f'{path} line 1: file is empty', path=path, line=1)
    ids, titles, flags = [], [], []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(text.split('\n'), start=1):

        def fail(reason: str):
            raise MovieLensFormatError(f'{path} line {lineno}: {reason}', path=path, line=lineno)

        fields = line.split('|')
        if len(fields) != _NUM_ITEM_FIELDS:
            fail(
                f'expected {_NUM_ITEM_FIELDS} "|"-separated fields (id, title, release date, video release date, '
                f'URL and {len(GENRES)} genre flags), got {len(fields)}: {line!r}'
            )
        if not re.fullmatch(r'\d{1,18}', fields[0]):
            fail(f'item id {fields[0]!r} is not a non-negative integer')
        item = int(fields[0])
        if item in seen:
            fail(f'duplicate item id {item} (first on line {seen[item]})')
        seen[item] = lineno
        if not fields[1].strip():
            fail(f'item {item} has an empty title')
        genre_flags = fields[5:]
        bad = next((g for g, v in zip(GENRES, genre_flags) if v not in ('0', '1')), None)
        if bad is not None:
            fail(f'genre flag {bad!r} of item {item} is {genre_flags[GENRES.index(bad)]!r}, expected 0 or 1')
        ids.append(item)
        titles.append(fields[1])
        flags.append([int(v) for v in genre_flags])
    frame = pd.DataFrame({'item_id': np.asarray(ids, dtype=np.int64), 'title': titles})
    genre_array = np.asarray(flags, dtype=np.int8).reshape(len(ids), len(GENRES))
    for g, genre in enumerate(GENRES):
        frame[genre] = genre_array[:, g]
    return frame


def load_movielens_likes(
    data_dir: str,
    *,
    max_chars: int = 64,
    min_ratings: int = 20,
    seed: int = 0,
    split_order: str = 'time',
    include_item_id: bool = False,
) -> furl_tasks.FurlData:
    """Loads the MovieLens-likes FURL task from a MovieLens 100K directory (``u.data`` + ``u.item``).

    Args:
        data_dir: Directory with ``u.data`` and ``u.item`` in GroupLens 100K layout.
        max_chars: Title length in characters (longer titles are truncated).
        min_ratings: Users with fewer ratings are dropped (>= 3 so every user is in train, eval and test). MovieLens
            100K users all have >= 20.
        seed: Seed of ``split_order='random'``.
        split_order: ``'time'`` (default; by timestamp, ties by item id) or ``'random'`` (seeded permutation).
        include_item_id: Also put the dense movie index in the examples as ``item_id`` (``num_items`` = number of
            movies in ``u.item``) so a model can embed the movie. Off by default: the paper's model only sees the
            text.

    Returns:
        A `furl_tasks.FurlData` with ``num_classes=2``, ``num_features=19``; users are the dense indices of the
        remaining users in increasing order of GroupLens user id (``user_ids`` holds the GroupLens ids).

    Raises:
        MovieLensFormatError: A file is missing or malformed, or ``u.data`` rates an item that ``u.item`` does
            not list (the message names the file and line).
        ValueError: Bad arguments, or no user has `min_ratings` ratings.
    """
    if min_ratings < 3:
        raise errors.ConfigError(
            f'min_ratings must be >= 3 (every user needs train, eval and test examples), got {min_ratings}'
        )
    if max_chars < 1:
        raise errors.ConfigError(f'max_chars must be >= 1, got {max_chars}')
    ratings = movielens.load_ratings(data_dir, variant='100k')
    items = load_movie_items(data_dir)

    item_ids = items['item_id'].to_numpy()
    item_order = np.argsort(item_ids, kind='stable')
    sorted_ids = item_ids[item_order]
    position = np.searchsorted(sorted_ids, ratings['item_id'].to_numpy())
    position = np.minimum(position, len(sorted_ids) - 1)
    unknown = np.flatnonzero(sorted_ids[position] != ratings['item_id'].to_numpy())
    if unknown.size:
        i = int(unknown[0])
        path = os.path.join(os.fspath(data_dir), 'u.data')
        raise MovieLensFormatError(
            f'{path} line {i + 1}: item {int(ratings["item_id"].iloc[i])} is not in '
            f'{os.path.join(os.fspath(data_dir), _ITEM_FILE)} ({wording.count(unknown.size, "ratings")} with an unknown item)',
            path=path,
            line=i + 1,
        )
    doc_index = position.astype(np.int64)  # Dense item index = rank of the GroupLens id.

    counts = ratings.groupby('user_id')['user_id'].transform('size').to_numpy()
    keep = counts >= min_ratings
    if not keep.any():
        raise errors.DataError(f'no user has at least min_ratings={min_ratings} ratings')
    ratings, doc_index = ratings.loc[keep].reset_index(drop=True), doc_index[keep]
    user_ids, user_index = np.unique(ratings['user_id'].to_numpy(), return_inverse=True)
    # Time order with ties broken by item id: pre-sort by (user, timestamp, item) so the stable split keeps it.
    order = np.lexsort((doc_index, ratings['timestamp'].to_numpy(), user_index))
    user_index, doc_index = user_index[order], doc_index[order]
    timestamps = ratings['timestamp'].to_numpy()[order]
    label = (ratings['rating'].to_numpy()[order] >= _LIKE_THRESHOLD).astype(np.int64)

    items_sorted = items.iloc[item_order]
    genres = items_sorted[list(GENRES)].to_numpy(dtype=np.float32)
    description = (
        f'MovieLens 100K likes ({os.fspath(data_dir)}): users are clients, one example per rating; text = movie '
        f'title ({max_chars} chars), features = {len(GENRES)} genre flags, label = rating >= 4; '
        f'users with >= {min_ratings} ratings; per-user {split_order}-ordered 0.8/0.1/0.1 split.'
    )
    return furl_tasks.build_furl_data(
        name='movielens_likes',
        description=description,
        user_id=user_index,
        order_key=timestamps,
        doc_index=doc_index,
        label=label,
        doc_texts=items_sorted['title'].tolist(),
        doc_features=genres,
        num_classes=2,
        max_chars=max_chars,
        user_ids=user_ids,
        item_id=doc_index if include_item_id else None,
        num_items=len(items) if include_item_id else 0,
        split_order=split_order,
        seed=seed,
        source=os.path.join(os.fspath(data_dir), 'u.data'),
        item_name='movies',
    )
