"""CSV interaction tables (`fedpersonal.data.csv_interactions`) as the in-memory data of each task.

Each function reads a table and returns what the task's own loader returns for its real dataset, so the tasks run
unchanged on a user's data (`--dataset=csv --data_path=FILE`, docs/DATA.md):

* `load_csv_ratings`: a ratings table as the ratings frame of `fedpersonal.data.movielens.load_ratings` (MovieLens
  matrix factorization); its ``timestamp`` column is the row's position in the split order, so the task's per-user
  time split (`movielens.split_by_time`) and per-user cap follow `--split_order`;
* `load_csv_silos`: a responses table as HPFL's cross-silo `user_modeling.UserModelingData` (binary task, like
  ASSISTments; attributes = skills), or a ratings table with an ``attributes`` column (rating task, like MovieLens;
  attributes = e.g. genres); silos from the file's ``silo`` column or formed like ASSISTments'
  (`hpfl_assistments.build_silos`: clustering or random);
* `load_csv_furl`: a responses table as the FURL task of ASSISTments (`assistments.load_assistments`: label =
  correct, features = multi-hot skills, item_id = question), or a ratings table as a "likes" task like MovieLens
  likes (label = rating >= `like_threshold`, item_id = item).

Users with fewer than 3 rows cannot be split into train, validation and test; HPFL and FURL leave them out (logged
with the count). After the split, `interaction_splits.warn_unseen_in_training` warns about test items that never
occur in training (for FURL, `furl_tasks.build_furl_data` does). Datasets are named ``csv:<file stem>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from absl import logging

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import csv_interactions
from fedpersonal.data import furl_tasks
from fedpersonal.data import hpfl_assistments
from fedpersonal.data import interaction_splits
from fedpersonal.data import user_modeling

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ['MIN_ROWS_PER_USER', 'load_csv_ratings', 'load_csv_silos', 'load_csv_furl']

MIN_ROWS_PER_USER = 3
"""Fewest rows a user needs to be in train, validation and test (HPFL and FURL leave out users with fewer)."""


def _drop_small_users(data: csv_interactions.Interactions, minimum: int) -> csv_interactions.Interactions:
    counts = np.bincount(data.user, minlength=data.num_users)
    small = counts[data.user] < minimum
    if small.all():
        raise errors.DataError(
            f'{data.path}: no user has {minimum} or more rows (every user needs train, validation and test rows)'
        )
    if small.any():
        logging.warning(
            '%s: leaving out %d of %d users with fewer than %d rows (%s): every user needs train, validation '
            'and test rows.',
            data.path,
            int(((counts > 0) & (counts < minimum)).sum()),
            data.num_users,
            minimum,
            wording.count(int(small.sum()), 'rows'),
        )
    return data.subset(~small)


def _sorted_rows(data: csv_interactions.Interactions, split_order: str | None, seed: int) -> np.ndarray:
    """Row indices sorted by (user, position in the split order)."""
    return np.lexsort((interaction_splits.order_key(data, split_order, seed=seed), data.user))


def load_csv_ratings(path: str, *, split_order: str | None = None, seed: int = 0) -> tuple[pd.DataFrame, str]:
    """A ratings table as the frame `movielens.load_ratings` returns, plus a description.

    Args:
        path: The CSV ratings table.
        split_order: `interaction_splits.SPLIT_ORDERS` or None (timestamp if the file has one, else file order).
        seed: Seed of ``'shuffle'``.

    Returns:
        (frame, description): columns ``user_id``, ``item_id`` (the ids of `Interactions.user_ids` /
        ``item_ids``), ``rating`` (float32) and ``timestamp`` (int64: the row's position in the split order), in
        file order; the description starts with the dataset name ``csv:<stem>``.
    """
    import pandas as pd  # pylint: disable=g-import-not-at-top

    data = csv_interactions.load_interactions(path, kind=csv_interactions.RATINGS)
    order = interaction_splits.resolve_split_order(data, split_order)
    key = interaction_splits.order_key(data, order, seed=seed)
    frame = pd.DataFrame(
        {
            'user_id': data.user_ids[data.user],
            'item_id': data.item_ids[data.item],
            'rating': data.value.astype(np.float32),
            'timestamp': key,
        }
    )
    description = (
        f'{data.name} ({data.path}: {data.num_rows} ratings of {data.num_items} items by {data.num_users} users; '
        f'split order {order})'
    )
    return frame, description


def load_csv_silos(
    path: str,
    *,
    grouping: str,
    num_clients: int,
    split_order: str | None = None,
    seed: int = 0,
    binarize_threshold: float | None = None,
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> user_modeling.UserModelingData:
    """A responses table as HPFL's cross-silo binary task (attributes: the skills), or a ratings table with an
    ``attributes`` column as its rating task (rating range: the least and greatest rating of the file).

    Args:
        path: The CSV responses or ratings table.
        grouping: ``'column'`` (the file's ``silo`` column) or a clustering / random grouping of
            `hpfl_assistments.GROUPINGS` (``--assist_grouping``).
        num_clients: Silos to form by clustering or at random (``--assist_num_clients``; not used by ``'column'``).
        split_order: `interaction_splits.SPLIT_ORDERS` or None.
        seed: Seed of ``'shuffle'``, the clustering and the random grouping.
        binarize_threshold: Maps fractional scores to 0/1 (`csv_interactions.load_interactions`).
        split: Per-user (train, validation, test) fractions, in the split order.

    Returns:
        A valid `UserModelingData` named ``csv:<stem>``.

    Raises:
        csv_interactions.CsvFormatError: The file is malformed.
        errors.ConfigError: ``'column'`` without a silo column, or a silo column with another grouping.
        errors.DataError: Clustering cannot form the silos (the message names the fix).
    """
    data = csv_interactions.load_interactions(path, binarize_threshold=binarize_threshold)
    ratings = data.kind == csv_interactions.RATINGS
    if data.item_skills is None:
        raise errors.DataError(
            f'{data.path}: HPFL needs the attributes of every item (its model is per attribute): add an attributes '
            'column to the ratings table (ids separated by ";", e.g. genres Action;Comedy; docs/DATA.md).'
        )
    if grouping == 'column' and data.silo is None:
        raise errors.ConfigError(
            f"--assist_grouping=column: {data.path} has no silo column; add one (the user's school or region) "
            "or form silos with --assist_grouping 'exercises', 'concepts' or 'random'."
        )
    if grouping != 'column' and data.silo is not None:
        raise errors.ConfigError(
            f'{data.path} has a silo column: pass --assist_grouping=column to use it, or drop the column to form '
            f'silos by --assist_grouping={grouping}.'
        )
    order = interaction_splits.resolve_split_order(data, split_order)
    data = _drop_small_users(data, MIN_ROWS_PER_USER)
    data = data.subset(_sorted_rows(data, order, seed))
    user_ids, user_index = np.unique(data.user, return_inverse=True)  # Dense over the users kept.
    split_of_record = user_modeling.per_user_split(user_index, split)
    interaction_splits.warn_unseen_in_training(
        data.item, split_of_record, source=data.path, what=f'{data.item_column}s'
    )
    rating_range = (0.0, 1.0)
    if ratings:
        rating_range = (float(data.value.min()), float(data.value.max()))
        if not rating_range[0] < rating_range[1]:
            raise errors.DataError(f'{data.path}: every rating is {rating_range[0]:g}: there is nothing to learn')
    silo_of_user = None
    if data.silo is not None:
        silo_of_user = np.zeros(user_ids.size, dtype=np.int64)
        silo_of_user[user_index] = data.silo
    silos = hpfl_assistments.build_silos(
        user_ids=data.user_ids[user_ids],
        user_index=user_index.astype(np.int64),
        item_ids=data.item_ids,
        item_index=data.item,
        label=data.value.astype(np.float32),
        split=split_of_record,
        item_attributes=data.skill_matrix(),
        grouping=grouping,
        num_clients=num_clients,
        seed=seed,
        client_prefix='group_',
        silo_of_user=silo_of_user,
        silo_names=data.silo_names,
    )
    how = 'the silo column' if grouping == 'column' else f'{grouping!r} grouping (seed {seed})'
    source = (
        f'{data.path}: {len(silos)} silos by {how}, users with >= {MIN_ROWS_PER_USER} {data.kind}, per-user '
        f'{order}-order split {tuple(split)}'
    )
    return user_modeling.validate(
        user_modeling.UserModelingData(
            name=data.name,
            task='rating' if ratings else 'binary',
            num_attributes=len(data.skill_names),
            attribute_names=list(data.skill_names) if ratings else [f'skill_{s}' for s in data.skill_names],
            rating_range=rating_range,
            silos=silos,
            source=source,
        )
    )


def load_csv_furl(
    path: str,
    *,
    split_order: str | None = None,
    seed: int = 0,
    binarize_threshold: float | None = None,
    like_threshold: float | None = None,
) -> furl_tasks.FurlData:
    """A responses or ratings table as a binary FURL task (users are clients; no text).

    Responses: label = correct, features = multi-hot skills, ``item_id`` = question (as ASSISTments). Ratings:
    label = 1 if rating >= `like_threshold`, features = the multi-hot ``attributes`` (none without that column),
    ``item_id`` = item (as MovieLens likes with item ids).

    Args:
        path: The CSV table.
        split_order: `interaction_splits.SPLIT_ORDERS` or None.
        seed: Seed of ``'shuffle'``.
        binarize_threshold: Responses: maps fractional scores to 0/1.
        like_threshold: Ratings: the least rating that counts as liked (required for ratings).

    Returns:
        A `furl_tasks.FurlData` named ``csv:<stem>`` whose description starts with that name.

    Raises:
        csv_interactions.CsvFormatError: The file is malformed.
        errors.ConfigError: A ratings table without `like_threshold`, or a responses table with it.
    """
    data = csv_interactions.load_interactions(path, binarize_threshold=binarize_threshold)
    ratings = data.kind == csv_interactions.RATINGS
    if ratings and like_threshold is None:
        raise errors.ConfigError(
            f'{data.path} is a ratings table: FURL learns a binary label from it; pass --like_threshold=R (a rating '
            '>= R counts as liked, e.g. 4 on a 1..5 scale).'
        )
    if not ratings and like_threshold is not None:
        raise errors.ConfigError(f'--like_threshold applies to ratings tables; {data.path} is a responses table.')
    order = interaction_splits.resolve_split_order(data, split_order)
    data = _drop_small_users(data, MIN_ROWS_PER_USER)
    rows = _sorted_rows(data, order, seed)
    data = data.subset(rows)
    user_ids, user_index = np.unique(data.user, return_inverse=True)
    if ratings:
        assert like_threshold is not None
        label = (data.value >= like_threshold).astype(np.int64)
        if data.item_skills is None:
            features = np.zeros((data.num_items, 0), dtype=np.float32)
            what = f'label = rating >= {like_threshold:g}, no features'
        else:
            features = data.skill_matrix()
            what = f'label = rating >= {like_threshold:g}, features = multi-hot over {len(data.skill_names)} attributes'
    else:
        label = data.value.astype(np.int64)
        features = data.skill_matrix()
        what = f'label = correct, features = multi-hot over {len(data.skill_names)} skills'
    description = (
        f'{data.name} ({data.path}, {data.kind}): users are clients, one example per row; {what}, item_id = '
        f'{data.item_column} ({data.num_items}), no text; users with >= {MIN_ROWS_PER_USER} rows; per-user '
        f'{order}-order 0.8/0.1/0.1 split.'
    )
    return furl_tasks.build_furl_data(
        name=data.name,
        description=description,
        user_id=user_index,
        order_key=np.arange(user_index.size),  # Rows are already in (user, split order).
        doc_index=data.item,
        label=label,
        doc_texts=None,
        doc_features=features,
        num_classes=2,
        max_chars=0,
        user_ids=data.user_ids[user_ids],
        item_id=data.item,
        num_items=data.num_items,
        split_order='time',
        seed=seed,
        source=data.path,  # `build_furl_data` warns about test items never seen in training.
        item_name=f'{data.item_column}s',
    )
