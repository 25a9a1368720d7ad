"""User-modeling metrics of HPFL (Wu et al., WWW 2021) in numpy: ACC, AUC, RMSE, MAE, rating ACC, DOA and NDCG.

* Student performance prediction (binary, ASSISTments): `accuracy_binary`, `auc`, `rmse`.
* Rating prediction (MovieLens): `rating_accuracy` (the rounded, clipped prediction equals the true rating), `mae`,
  `rmse`.
* Ranking effectiveness: `doa` (degree of agreement, as EduCDM's ``doa_eval``) and `ndcg`.

Every function takes flat arrays (one entry per record) and raises `ValueError` for empty, mismatched or non-finite
input. Nothing here needs TensorFlow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ['accuracy_binary', 'auc', 'rmse', 'mae', 'rating_accuracy', 'doa', 'doa_report', 'ndcg']


def _pair(y_true, y_pred, names=('y_true', 'y_pred')) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(y_true, dtype=np.float64).reshape(-1)
    b = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError(f'{names[0]} is empty')
    if a.shape != b.shape:
        raise ValueError(f'{names[0]} and {names[1]} have {a.size} and {b.size} entries')
    for name, x in zip(names, (a, b)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f'{name} has a non-finite value at index {int(np.flatnonzero(~np.isfinite(x))[0])}')
    return a, b


def _binary_labels(y: np.ndarray, name: str = 'y_true') -> np.ndarray:
    bad = np.flatnonzero((y != 0) & (y != 1))
    if bad.size:
        raise ValueError(f'{name} must be 0/1 labels; index {int(bad[0])} is {y[bad[0]]:g}')
    return y


def accuracy_binary(y_true, y_pred, *, threshold: float = 0.5) -> float:
    """ACC of a binary task: the fraction of records with ``(y_pred >= threshold) == y_true``.

    Args:
        y_true: 0/1 labels.
        y_pred: Predicted probabilities of 1.
        threshold: Decision threshold (0.5, as in NeuralCD / EduCDM).
    """
    y, p = _pair(y_true, y_pred)
    _binary_labels(y)
    return float(np.mean((p >= threshold).astype(np.float64) == y))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, ties sharing the average of their ranks."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts  # Number of strictly smaller values.
    return (start + (counts + 1) / 2.0)[inverse]


def auc(y_true, y_score) -> float:
    """Area under the ROC curve (Mann-Whitney; a tied positive/negative pair counts 1/2, as sklearn).

    Args:
        y_true: 0/1 labels with both classes present.
        y_score: Scores (higher = more likely 1).

    Raises:
        ValueError: Only one class is present (AUC is undefined), or bad input.
    """
    y, s = _pair(y_true, y_score, ('y_true', 'y_score'))
    _binary_labels(y)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f'AUC needs both classes in y_true, got {n_pos} positives and {n_neg} negatives')
    ranks = _average_ranks(s)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def rmse(y_true, y_pred) -> float:
    """Root mean squared error."""
    y, p = _pair(y_true, y_pred)
    return float(np.sqrt(np.mean((y - p) ** 2)))


def mae(y_true, y_pred) -> float:
    """Mean absolute error."""
    y, p = _pair(y_true, y_pred)
    return float(np.mean(np.abs(y - p)))


def rating_accuracy(y_true, y_pred, *, rating_range: tuple[float, float] = (1.0, 5.0)) -> float:
    """Rating ACC: the fraction of records whose rounded, clipped prediction equals the true rating.

    The prediction is rounded half up (``floor(p + 0.5)``, so 2.5 -> 3) and clipped to `rating_range`; then it is
    compared with the (integer) true rating.

    Args:
        y_true: Integer ratings.
        y_pred: Real-valued predicted ratings.
        rating_range: ``(lowest, highest)`` rating.
    """
    y, p = _pair(y_true, y_pred)
    lo, hi = rating_range
    return float(np.mean(np.clip(np.floor(p + 0.5), lo, hi) == y))


# ----------------------------------------------------------------------------------------------------------------
# DOA.
# ----------------------------------------------------------------------------------------------------------------


def doa_report(user, item, label, user_attribute_scores, item_attributes) -> dict[str, Any]:
    """Degree of agreement (DOA) per attribute and averaged, as EduCDM's ``doa_report`` / ``doa_eval``.

    Definition (bigdata-ustc/EduCDM, ``EduCDM/ICD/metrics/metrics.py``, the DOA of NeuralCD's evaluation): for each
    attribute (knowledge concept) ``k`` and each item ``j`` having ``k``, take the records of ``j`` and every
    pair of them ``(a, b)`` with ``label_a > label_b`` (a answered correctly, b did not). The pair agrees when the
    users' scores on ``k`` are ordered the same way, ``F[user_a, k] > F[user_b, k]``; pairs with equal scores are
    ties and are left out of the denominator. Then ``DOA_k = agreeing pairs / (pairs - ties)`` summed over the
    items of ``k``, attributes without any such pair are skipped, and ``DOA`` is the mean of ``DOA_k`` over the
    remaining attributes (a macro average). Records, not distinct users, form the pairs, so a user who answered an
    item twice (once right, once wrong) makes a tied pair, exactly as in EduCDM.

    For binary labels this is EduCDM's definition. For ratings (MovieLens) the same definition is used as the
    analogue with ``F[u, k]`` the user's *preference* for genre ``k`` and the rating as the label: a pair of users who
    rated the same movie of genre ``k`` differently agrees when the one who gave the higher rating has the higher
    preference for ``k``; equal ratings form no pair (as equal binary labels do not).

    Args:
        user: int ``[n]`` user index of each record (the records to evaluate on, e.g. the test split).
        item: int ``[n]`` item index of each record.
        label: ``[n]`` labels (0/1, or ratings).
        user_attribute_scores: ``[num_users, K]`` per-attribute user scores (mastery / preference).
        item_attributes: ``[num_items, K]`` multi-hot item attributes.

    Returns:
        ``{'doa': mean over attributes (NaN if no attribute has a pair), 'per_attribute': float64 [K] (NaN where no
        pair), 'num_attributes': attributes with pairs (EduCDM's doa_know_support), 'num_pairs': non-tied pairs
        (doa_z_support)}``.

    Raises:
        ValueError: Mismatched shapes, indices out of range, or non-finite values.
    """
    user = np.asarray(user).reshape(-1)
    item = np.asarray(item).reshape(-1)
    label = np.asarray(label, dtype=np.float64).reshape(-1)
    scores = np.asarray(user_attribute_scores, dtype=np.float64)
    attributes = np.asarray(item_attributes)
    if not (user.size == item.size == label.size) or user.size == 0:
        raise ValueError(
            f'user, item and label must be non-empty with equal sizes, got {user.size}, {item.size}, {label.size}'
        )
    if scores.ndim != 2 or attributes.ndim != 2 or scores.shape[1] != attributes.shape[1]:
        raise ValueError(
            f'user_attribute_scores [num_users, K] and item_attributes [num_items, K] must agree in K, '
            f'got shapes {scores.shape} and {attributes.shape}'
        )
    for name, index, size in (('user', user, scores.shape[0]), ('item', item, attributes.shape[0])):
        if not np.issubdtype(index.dtype, np.integer):
            raise ValueError(f'{name} must be integer indices, got dtype {index.dtype}')
        if index.min() < 0 or index.max() >= size:
            raise ValueError(f'{name} indices must be in [0, {size}), got range [{index.min()}, {index.max()}]')
    if not np.all(np.isfinite(label)) or not np.all(np.isfinite(scores)):
        raise ValueError('label and user_attribute_scores must be finite')
    k = scores.shape[1]

    # One row per (record, attribute of its item).
    record, attribute = np.nonzero(attributes[item] != 0)
    group_of = attribute.astype(np.int64) * attributes.shape[0] + item[record]
    _, group = np.unique(group_of, return_inverse=True)
    row_label = label[record]
    _, pred_rank = np.unique(scores[user[record], attribute], return_inverse=True)
    base = pred_rank.max() + 2 if pred_rank.size else 1
    key = group.astype(np.int64) * base + pred_rank  # Sorting by key = sorting by (group, score).

    agree = np.zeros(k)
    pairs = np.zeros(k)
    ties = np.zeros(k)
    levels = np.unique(row_label)
    for level in levels[1:]:
        high = row_label == level
        low_keys = np.sort(key[row_label < level])
        high_keys = key[high]
        group_start = np.searchsorted(low_keys, group[high].astype(np.int64) * base, side='left')
        group_end = np.searchsorted(low_keys, group[high].astype(np.int64) * base + base - 1, side='right')
        less = np.searchsorted(low_keys, high_keys, side='left')
        less_or_equal = np.searchsorted(low_keys, high_keys, side='right')
        attr = attribute[high]
        agree += np.bincount(attr, weights=less - group_start, minlength=k)
        ties += np.bincount(attr, weights=less_or_equal - less, minlength=k)
        pairs += np.bincount(attr, weights=group_end - group_start, minlength=k)
    valid = pairs - ties
    per_attribute = np.full(k, np.nan)
    supported = valid > 0
    per_attribute[supported] = agree[supported] / valid[supported]
    return {
        'doa': float(per_attribute[supported].mean()) if supported.any() else float('nan'),
        'per_attribute': per_attribute,
        'num_attributes': int(supported.sum()),
        'num_pairs': int(valid.sum()),
    }


def doa(user, item, label, user_attribute_scores, item_attributes) -> float:
    """Degree of agreement averaged over attributes; see `doa_report` for the definition and arguments."""
    return doa_report(user, item, label, user_attribute_scores, item_attributes)['doa']


# ----------------------------------------------------------------------------------------------------------------
# NDCG.
# ----------------------------------------------------------------------------------------------------------------


def ndcg(user, y_true, y_score, *, k: int | None = 10, gain: str = 'linear', min_records: int = 1) -> float:
    """NDCG@k of ranking each user's items by predicted score, averaged over users.

    For each user, the records (items) are ranked by `y_score`, highest first (ties keep the input order: a stable
    sort). ``DCG@k = sum_{r=1..min(k, n)} g(y_true at rank r) / log2(r + 1)`` with the gain ``g(y) = y``
    (``gain='linear'``, the default: 0/1 correctness, or the rating 1..5) or ``g(y) = 2**y - 1``
    (``gain='exponential'``); ``NDCG@k = DCG@k / IDCG@k`` with IDCG@k the DCG of the ranking by `y_true`. The result
    is the unweighted mean over users; users with ``IDCG@k == 0`` (all gains 0, e.g. every answer wrong) or fewer
    than `min_records` records are skipped.

    Args:
        user: ``[n]`` user index (any integers) of each record.
        y_true: ``[n]`` true labels (non-negative gains: 0/1 or ratings).
        y_score: ``[n]`` predicted scores.
        k: Cut-off K (default 10); None ranks all of a user's records.
        gain: ``'linear'`` or ``'exponential'``.
        min_records: Users with fewer records are skipped (1 keeps everyone; a user with a single record then scores
            1).

    Returns:
        Mean NDCG@k over the users counted (NaN if none).

    Raises:
        ValueError: Bad arguments, negative labels, or mismatched / non-finite input.
    """
    y, s = _pair(y_true, y_score, ('y_true', 'y_score'))
    user = np.asarray(user).reshape(-1)
    if user.size != y.size:
        raise ValueError(f'user has {user.size} entries, y_true {y.size}')
    if k is not None and k < 1:
        raise ValueError(f'k must be >= 1 or None, got {k}')
    if gain not in ('linear', 'exponential'):
        raise ValueError(f"gain must be 'linear' or 'exponential', got {gain!r}")
    if y.min() < 0:
        raise ValueError('y_true must be non-negative (it is the gain)')
    g = y if gain == 'linear' else np.power(2.0, y) - 1.0
    _, u, counts = np.unique(user, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts
    position = np.arange(y.size)

    def dcg(order: np.ndarray) -> np.ndarray:
        rank = position - starts[u[order]]  # 0-based rank within the user (order groups rows by user).
        keep = rank < (k if k is not None else y.size)
        return np.bincount(u[order][keep], weights=g[order][keep] / np.log2(rank[keep] + 2.0), minlength=counts.size)

    predicted = dcg(np.lexsort((position, -s, u)))
    ideal = dcg(np.lexsort((position, -g, u)))
    counted = (ideal > 0) & (counts >= min_records)
    if not counted.any():
        return float('nan')
    return float(np.mean(predicted[counted] / ideal[counted]))
