"""Partitioners: which rows of a table each client holds, and each client's train / test split.

A *partition* is a list with one int64 array of row indices per client (client ``c`` holds
``table[partition[c]]``, in that order). `fedpersonal.data.client_data.from_partition` turns a table and a
partition into a `tff.simulation.datasets.ClientData`.

* Label skew (`pathological`, `dirichlet`) are ports of PFLlib's ``separate_data`` (``dataset/utils/
  dataset_utils.py``, partitions ``'pat'`` and ``'dir'``); `train_test_split` is its ``split_data`` (sklearn's
  ``train_test_split(train_size=0.75, shuffle=True)`` per client). Each takes ``rng``: a seeded
  ``np.random.Generator``, or ``np.random.RandomState`` to draw exactly the numbers PFLlib draws from numpy's global
  legacy state; `fedpersonal.data.pfllib` runs them in PFLlib's order with its settings and seed (with
  ``RandomState(1)`` they reproduce PFLlib's own partitions exactly; see that module).
* `iid`: rows dealt to clients by a seeded permutation (row ``perm[i]`` goes to client ``i mod num_clients``).
* `by_key`: one client per distinct key (a user, a silo), rows in table order -- the by-user and by-silo partitions
  of the interaction loaders.

Where the ports differ from PFLlib (none changes a partition PFLlib produces):

* `pathological` raises `ConfigError` where PFLlib would silently leave rows in no client (when classes run out of
  clients: ``num_clients * classes_per_client`` too small for the classes, e.g. 7 clients x 2 classes of 10) or
  crash inside numpy (an unbalanced draw whose lower bound is not below its upper one).
* `dirichlet` stops after ``max_tries`` redraws with a `DataError` (PFLlib loops forever when the minimum size is
  out of reach).
* `train_test_split` raises `DataError` for a client whose train part would be empty (sklearn raises too).
* Labels are ints in ``[0, num_classes)``; ``num_classes`` defaults to ``max(labels) + 1`` (PFLlib:
  ``len(set(labels))``, the same for labels that all occur).

Example:

>>> import numpy as np
>>> labels = np.repeat(np.arange(4), 5)  # 4 classes x 5 rows.
>>> parts = pathological(labels, num_clients=4, classes_per_client=2, rng=np.random.default_rng(0), balance=True)
>>> [sorted(set(labels[p].tolist())) for p in parts]
[[0, 1], [0, 1], [2, 3], [2, 3]]
>>> sorted(np.concatenate(parts).tolist()) == list(range(20))
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from fedpersonal import errors

__all__ = [
    'Rng',
    'make_rng',
    'pathological',
    'dirichlet',
    'iid',
    'by_key',
    'train_test_split',
    'client_of_row',
    'label_counts',
]

Rng: TypeAlias = np.random.Generator | np.random.RandomState
"""A seeded numpy random source: a ``Generator``, or a legacy ``RandomState`` (PFLlib's exact draws)."""


def make_rng(seed: int, *, legacy: bool = False) -> Rng:
    """``np.random.RandomState(seed)`` if `legacy` (PFLlib's ``np.random.seed(seed)`` stream), else
    ``np.random.default_rng(seed)``."""
    return np.random.RandomState(seed) if legacy else np.random.default_rng(seed)


def _randint(rng: Rng, low: float, high: float, size: int) -> np.ndarray:
    # PFLlib passes float bounds, which numpy truncates: the same as int() for these positive bounds.
    if isinstance(rng, np.random.RandomState):
        return rng.randint(int(low), int(high), size)
    return rng.integers(int(low), int(high), size)


def _check_labels(labels: np.ndarray, num_classes: int | None) -> tuple[np.ndarray, int]:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise errors.DataError(f'labels must be a non-empty 1-D array, got shape {labels.shape}')
    if labels.dtype.kind not in 'iu':
        raise errors.DataError(f'labels must be integers, got dtype {labels.dtype}')
    if labels.min() < 0:
        raise errors.DataError(f'labels must be >= 0, found {labels.min()}')
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.max() >= k:
        raise errors.DataError(f'labels must be < num_classes={k}, found {labels.max()}')
    return labels.astype(np.int64), k


def _check_clients(num_clients: int, num_rows: int) -> None:
    if num_clients < 1:
        raise errors.ConfigError(f'num_clients must be >= 1, got {num_clients}')
    if num_clients > num_rows:
        raise errors.ConfigError(f'num_clients={num_clients} exceeds the {num_rows} rows')


def pathological(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    *,
    rng: Rng,
    balance: bool = False,
    least_samples: int = 0,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """Pathological label skew: each client holds rows of at most `classes_per_client` classes (PFLlib ``'pat'``).

    Classes are dealt in order: class ``k`` goes to the first ``ceil(num_clients / num_classes *
    classes_per_client)`` clients (in client order) that still take a class; its rows (in table order) are cut
    into contiguous pieces, one per such client: equal pieces (`balance`; the last client takes the remainder), or
    sizes drawn uniformly from ``[max(n_per / 10, least_samples / num_classes), n_per)`` with ``n_per`` the class's
    rows over its clients (the last takes the rest). Only the unbalanced sizes are random.

    Args:
        labels: int ``[N]`` class of each row.
        num_clients: Number of clients.
        classes_per_client: The most classes a client holds (PFLlib's ``class_per_client``; all classes = IID).
        rng: Random source of the unbalanced sizes.
        balance: Equal pieces.
        least_samples: PFLlib's minimum size (`fedpersonal.data.pfllib.least_samples`), the unbalanced lower bound.
        num_classes: Number of classes (default ``max(labels) + 1``).

    Returns:
        One int64 index array per client; every row is in exactly one client.

    Raises:
        ConfigError: Bad counts, or clients too few to take every class (PFLlib would drop those classes' rows).
        DataError: Bad labels, or a class too small for an unbalanced draw.
    """
    labels, k = _check_labels(labels, num_classes)
    _check_clients(num_clients, labels.size)
    if not 1 <= classes_per_client <= k:
        raise errors.ConfigError(f'classes_per_client must be in 1..{k}, got {classes_per_client}')
    per_class = int(np.ceil((num_clients / k) * classes_per_client))
    remaining = [classes_per_client] * num_clients
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in range(k):
        selected = [c for c in range(num_clients) if remaining[c] > 0][:per_class]
        if not selected:
            raise errors.ConfigError(
                f'{num_clients} clients x {classes_per_client} classes cannot take all {k} classes (classes '
                f'{cls}..{k - 1} would be in no client; PFLlib drops them): use more clients or classes_per_client'
            )
        rows = np.flatnonzero(labels == cls)
        n_per = rows.size / len(selected)
        if balance:
            sizes = [int(n_per)] * (len(selected) - 1)
        else:
            low = max(n_per / 10, least_samples / k)
            if len(selected) > 1 and not int(low) < int(n_per):  # numpy truncates float bounds.
                raise errors.DataError(
                    f'class {cls} has {rows.size} rows for {len(selected)} clients: too few for an unbalanced '
                    f'draw from [{low:g}, {n_per:g}); use balance=True or a smaller least_samples'
                )
            sizes = _randint(rng, low, n_per, len(selected) - 1).tolist() if len(selected) > 1 else []
        sizes.append(rows.size - sum(sizes))
        start = 0
        for client, size in zip(selected, sizes):
            pieces[client].append(rows[start : start + size])
            start += size
            remaining[client] -= 1
    return [np.concatenate(p).astype(np.int64) if p else np.zeros(0, np.int64) for p in pieces]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    *,
    rng: Rng,
    least_samples: int,
    num_classes: int | None = None,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Practical label skew: each class's rows split over clients by a Dirichlet(alpha) draw (PFLlib ``'dir'``).

    Per class in order: its rows are shuffled, a Dirichlet(alpha * 1) vector over clients is drawn, clients that
    already hold ``>= N / num_clients`` rows get weight 0, and the shuffled rows are cut at the cumulative weights
    (Yurochkin et al. 2019, as PFLlib). The whole draw is repeated until every client holds `least_samples` rows.

    Args:
        labels: int ``[N]`` class of each row.
        num_clients: Number of clients.
        alpha: Dirichlet concentration (0.1: strong skew; large: near-IID).
        rng: Random source.
        least_samples: Minimum rows per client (`fedpersonal.data.pfllib.least_samples`).
        num_classes: Number of classes (default ``max(labels) + 1``).
        max_tries: Draws before giving up.

    Returns:
        One int64 index array per client (each class's rows in shuffled order, classes in order); every row is in
        exactly one client and every client has at least `least_samples` rows.

    Raises:
        ConfigError: Bad counts or alpha.
        DataError: Bad labels, or no draw in `max_tries` met `least_samples`.
    """
    labels, k = _check_labels(labels, num_classes)
    _check_clients(num_clients, labels.size)
    if not alpha > 0:
        raise errors.ConfigError(f'alpha must be positive, got {alpha}')
    if least_samples * num_clients > labels.size:
        raise errors.ConfigError(
            f'least_samples={least_samples} x {num_clients} clients exceeds the {labels.size} rows'
        )
    n = labels.size
    for _ in range(max_tries):
        batches: list[list[int]] = [[] for _ in range(num_clients)]
        for cls in range(k):
            rows = np.where(labels == cls)[0]
            rng.shuffle(rows)
            weights = rng.dirichlet(np.repeat(alpha, num_clients))
            weights = np.array([w * (len(b) < n / num_clients) for w, b in zip(weights, batches)])
            if not weights.sum() > 0:  # Every client is full, so every row is placed: this class has none.
                continue  # (PFLlib divides 0 by 0 here and appends nothing.)
            weights = weights / weights.sum()
            cuts = (np.cumsum(weights) * len(rows)).astype(int)[:-1]
            batches = [b + part.tolist() for b, part in zip(batches, np.split(rows, cuts))]
        if min(len(b) for b in batches) >= least_samples:
            return [np.asarray(b, dtype=np.int64) for b in batches]
    raise errors.DataError(
        f'no Dirichlet(alpha={alpha:g}) draw in {max_tries} tries gave every one of {num_clients} clients '
        f'{least_samples} rows; lower least_samples or raise alpha'
    )


def iid(num_rows: int, num_clients: int, *, rng: Rng) -> list[np.ndarray]:
    """Rows dealt by a seeded permutation: row ``perm[i]`` goes to client ``i mod num_clients`` (ascending rows)."""
    _check_clients(num_clients, num_rows)
    client = rng.permutation(num_rows) % num_clients
    order = np.argsort(client, kind='stable')
    return np.split(order.astype(np.int64), np.cumsum(np.bincount(client, minlength=num_clients))[:-1])


def by_key(keys: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """One client per distinct key (by user, by silo).

    Args:
        keys: ``[N]`` key of each row (ints or strings).

    Returns:
        ``(distinct keys ascending, one int64 index array per key with its rows in table order)``.
    """
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise errors.DataError(f'keys must be 1-D, got shape {keys.shape}')
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind='stable').astype(np.int64)
    return distinct, (np.split(order, np.cumsum(counts)[:-1]) if distinct.size else [])


def train_test_split(
    partition: Sequence[np.ndarray], train_fraction: float = 0.75, *, rng: Rng
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's rows split into train and test by a permutation (PFLlib's ``split_data``).

    For a client with ``n`` rows: ``p = rng.permutation(n)``, test = its rows at ``p[:ceil(n * (1 - f))]``, train
    = at the next ``floor(n * f)`` (sklearn's ``train_test_split(train_size=f, shuffle=True)``), clients in order.

    Args:
        partition: Row indices per client.
        train_fraction: ``f`` in (0, 1).
        rng: Random source.

    Returns:
        ``(train, test)``: row indices per client (disjoint; together the client's rows).

    Raises:
        ConfigError: `train_fraction` outside (0, 1).
        DataError: A client whose train part would be empty.
    """
    if not 0.0 < train_fraction < 1.0:
        raise errors.ConfigError(f'train_fraction must be in (0, 1), got {train_fraction}')
    train, test = [], []
    for c, rows in enumerate(partition):
        rows = np.asarray(rows, dtype=np.int64)
        n_test = math.ceil((1.0 - train_fraction) * rows.size)
        n_train = math.floor(train_fraction * rows.size)
        if n_train == 0:
            raise errors.DataError(f'client {c} has {rows.size} rows: its train part ({train_fraction:g}) is empty')
        permutation = rng.permutation(rows.size)
        test.append(rows[permutation[:n_test]])
        train.append(rows[permutation[n_test : n_test + n_train]])
    return train, test


def client_of_row(partition: Sequence[np.ndarray], num_rows: int) -> np.ndarray:
    """int64 ``[num_rows]``: the client holding each row, -1 for none.

    Raises:
        DataError: A row index out of range or held by two clients.
    """
    out = np.full(num_rows, -1, dtype=np.int64)
    for c, rows in enumerate(partition):
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
            raise errors.DataError(f'client {c} has a row index outside 0..{num_rows - 1}')
        if (out[rows] != -1).any() or np.unique(rows).size != rows.size:
            raise errors.DataError(f'client {c} holds a row that another client (or itself) already holds')
        out[rows] = c
    return out


def label_counts(labels: np.ndarray, partition: Sequence[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """int64 ``[num_clients, num_classes]``: rows of each class per client (PFLlib's ``statistic``, dense)."""
    labels, k = _check_labels(labels, num_classes)
    return np.stack([np.bincount(labels[np.asarray(rows, dtype=np.int64)], minlength=k) for rows in partition])
