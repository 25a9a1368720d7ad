"""The split order of a CSV interaction table's rows, and the warning about test items never seen in training.

Each user's rows are split into train / validation / test in the order `order_key` chooses: ``'timestamp'`` (the
timestamp column; ties in file order), ``'file'`` (the file order) or ``'shuffle'`` (a permutation seeded by the
run's seed: the same seed gives the same split); the default is ``'timestamp'`` when the file has that column, else
``'file'`` (logged). `warn_unseen_in_training` logs a warning with the count when test rows name items that no
training row has (the symptom of a file stored in item order split in file order); the loaders of
`fedpersonal.data.csv_tasks` and `fedpersonal.data.hpfl_assistments` call it after their split.

Example:

>>> import numpy as np
>>> warn_unseen_in_training(np.array([0, 1, 0]), np.array([0, 2, 2]), source='example')  # Item 1: test only.
1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from absl import logging

from fedpersonal import errors
from fedpersonal import wording

if TYPE_CHECKING:  # pragma: no cover
    from fedpersonal.data import csv_interactions

__all__ = ['SPLIT_ORDERS', 'resolve_split_order', 'order_key', 'warn_unseen_in_training']

SPLIT_ORDERS = ('timestamp', 'file', 'shuffle')


def resolve_split_order(data: csv_interactions.Interactions, split_order: str | None) -> str:
    """The split order to use: `split_order`, or (None) ``'timestamp'`` if `data` has timestamps, else ``'file'``.

    Raises:
        errors.ConfigError: `split_order` is not one of `SPLIT_ORDERS`, or is ``'timestamp'`` and the file has no
            timestamp column (the message names ``--split_order``).
    """
    if split_order is None:
        resolved = 'timestamp' if data.timestamp is not None else 'file'
        logging.info(
            "%s: each user's rows are split into train / validation / test in %s order (--split_order=%s%s).",
            data.path,
            'timestamp' if resolved == 'timestamp' else 'file',
            resolved,
            ''
            if resolved == 'timestamp'
            else '; the file has no timestamp column: pass --split_order=shuffle if '
            "each user's rows are not in time order",
        )
        return resolved
    if split_order not in SPLIT_ORDERS:
        raise errors.ConfigError(f'--split_order must be one of {SPLIT_ORDERS}, got {split_order!r}')
    if split_order == 'timestamp' and data.timestamp is None:
        raise errors.ConfigError(
            f'--split_order=timestamp: {data.path} has no timestamp column; add one, or pass --split_order=file '
            "(each user's rows are in time order in the file) or --split_order=shuffle (a seeded random order)."
        )
    return split_order


def order_key(data: csv_interactions.Interactions, split_order: str | None, *, seed: int) -> np.ndarray:
    """The position of every row in the split order: sorting a user's rows by it gives their train-first order.

    Args:
        data: The table.
        split_order: One of `SPLIT_ORDERS`, or None (`resolve_split_order`).
        seed: Seed of ``'shuffle'`` (the same seed gives the same order).

    Returns:
        int64 ``[N]``, a permutation of ``0..N-1``: the rank of each row by timestamp (ties in file order), by file
        position, or in a seeded random permutation.
    """
    resolved = resolve_split_order(data, split_order)
    n = data.num_rows
    if resolved == 'timestamp':
        assert data.timestamp is not None  # resolve_split_order checked it.
        order = np.lexsort((np.arange(n), data.timestamp))
    elif resolved == 'shuffle':
        order = np.random.default_rng(seed).permutation(n)
    else:
        order = np.arange(n)
    key = np.empty(n, dtype=np.int64)
    key[order] = np.arange(n, dtype=np.int64)
    return key


def warn_unseen_in_training(
    item: np.ndarray,
    split: np.ndarray,
    *,
    source: str,
    what: str = 'items',
    consequence: str = 'a model cannot learn them',
) -> int:
    """Logs a warning (with the count) when test rows name items no training row has; returns that count.

    Args:
        item: int ``[N]`` item (question) of each row.
        split: int ``[N]``: 0 train, 1 validation, 2 test.
        source: Names the data in the message (e.g. the file).
        what: What the items are, for the message.
        consequence: What that means for the model, for the message.

    Returns:
        The number of test rows whose item never occurs in training.
    """
    item, split = np.asarray(item), np.asarray(split)
    test = split == 2
    unseen = test & ~np.isin(item, item[split == 0])
    count = int(unseen.sum())
    if count:
        logging.warning(
            '%s: %d of %d test rows (%.1f%%) name %s that never occur in training (%s); %s. If that is '
            "most test rows, each user's rows are probably not in time order (e.g. stored in item order): pass "
            '--split_order=shuffle, or add a timestamp column.',
            source,
            count,
            int(test.sum()),
            100.0 * count / max(int(test.sum()), 1),
            what,
            wording.count(int(np.unique(item[unseen]).size), f'distinct {what}'),
            consequence,
        )
    return count
