"""Tests for fedpersonal.metrics.user_modeling_metrics: hand-computed values and a brute-force DOA."""

import itertools
import math

import numpy as np
import pytest
from sklearn import metrics as sk_metrics

from fedpersonal.metrics import user_modeling_metrics as um


def test_accuracy_binary():
    assert um.accuracy_binary([1, 0, 1, 0], [0.9, 0.4, 0.5, 0.6]) == 0.75  # 0.5 counts as 1.
    assert um.accuracy_binary([1, 0], [0.6, 0.7], threshold=0.65) == 0.0
    with pytest.raises(ValueError, match='0/1 labels; index 1 is 2'):
        um.accuracy_binary([1, 2], [0.5, 0.5])


def test_auc_hand_computed_and_ties():
    assert um.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75  # 3 of 4 pairs: binary fractions, exact.
    # Pairs (pos, neg): (.5, .5) tie = 1/2, (.5, .2) = 1, (.9, .5) = 1, (.9, .2) = 1 -> 3.5 / 4.
    assert um.auc([0, 1, 0, 1], [0.5, 0.5, 0.2, 0.9]) == 0.875
    assert um.auc([1, 0], [0.0, 1.0]) == 0.0


def test_auc_matches_sklearn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=500)
    s = np.round(rng.random(500) + 0.3 * y, 2)  # Rounded: many ties.
    # float64, sklearn's trapezoid against our rank sums: the same value in another order (500 terms: ~1e-13).
    assert um.auc(y, s) == pytest.approx(sk_metrics.roc_auc_score(y, s), abs=1e-12)


def test_auc_needs_both_classes():
    with pytest.raises(ValueError, match='both classes'):
        um.auc([1, 1], [0.2, 0.3])


def test_rmse_mae():
    # Integer errors: the sums are exact, the division and root rounded once each, as here.
    assert um.rmse([1, 2, 3], [1, 2, 5]) == math.sqrt(4 / 3)
    assert um.mae([1, 2, 3], [1, 2, 5]) == 2 / 3
    assert um.mae([1, 2, 3], [0, 3, 3]) == 2 / 3


def test_rating_accuracy_rounds_half_up_and_clips():
    # 0.2 -> 0 -> clipped 1 (= 1); 3.49 -> 3 (= 3); 6.1 -> 6 -> 5 (= 5); 2.5 -> 3 (!= 2).
    assert um.rating_accuracy([1, 3, 5, 2], [0.2, 3.49, 6.1, 2.5]) == 0.75
    assert um.rating_accuracy([0, 1], [-0.4, 0.5], rating_range=(0, 1)) == 1.0


@pytest.mark.parametrize(
    'y_true, y_pred, message',
    [
        ([], [], 'empty'),
        ([1, 2], [1.0], '2 and 1 entries'),
        ([1, np.nan], [1, 2], 'non-finite value at index 1'),
    ],
)
def test_bad_input(y_true, y_pred, message):
    for fn in (um.rmse, um.mae, um.rating_accuracy):
        with pytest.raises(ValueError, match=message):
            fn(y_true, y_pred)


def _two_concepts(scores):
    """EduCDM's doa_eval doctest as records: users 0, 1, 2 answer item 0 (concept 0) and item 1 (concept 1)."""
    user = np.array([0, 1, 2, 0, 1, 2])
    item = np.array([0, 0, 0, 1, 1, 1])
    label = np.array([1, 0, 1, 0, 1, 1])
    attributes = np.array([[1, 0], [0, 1]])
    return um.doa_report(user, item, label, np.asarray(scores), attributes)


def test_doa_educdm_doctest():
    # y_true [[1, 0, 1]], [[0, 1, 1]]; y_pred [[.5, .4, .6]], [[.2, .3, .5]] -> 1.0.
    report = _two_concepts([[0.5, 0.2], [0.4, 0.3], [0.6, 0.5]])
    assert report['doa'] == 1.0
    assert report['num_attributes'] == 2 and report['num_pairs'] == 4
    # y_pred [[.4, .5, .6]], [[.3, .2, .5]] -> concept 0: (.4 > .5)? no, (.6 > .5) yes; concept 1 likewise -> 0.5.
    report = _two_concepts([[0.4, 0.3], [0.5, 0.2], [0.6, 0.5]])
    assert report['doa'] == 0.5
    np.testing.assert_array_equal(report['per_attribute'], [0.5, 0.5])  # Counts' quotients: exact.


def test_doa_ties_leave_the_denominator_and_unpaired_concepts_are_skipped():
    # Item 0 (concepts 0 and 1): users 0, 1 right, user 2 wrong. Concept 0 scores: 0.5, 0.3 vs 0.3 -> 1 agree,
    # 1 tie -> 1/1. Concept 1 scores: 0.1, 0.2 vs 0.9 -> 0/2. Concept 2: no item -> skipped (NaN).
    scores = np.array([[0.5, 0.1, 0.0], [0.3, 0.2, 0.0], [0.3, 0.9, 0.0]])
    report = um.doa_report([0, 1, 2], [0, 0, 0], [1, 1, 0], scores, np.array([[1, 1, 0]]))
    np.testing.assert_array_equal(report['per_attribute'], [1.0, 0.0, np.nan])
    assert report['doa'] == 0.5 and report['num_attributes'] == 2 and report['num_pairs'] == 3
    # Every pair tied or no pair at all: NaN.
    assert math.isnan(um.doa([0, 1], [0, 0], [1, 0], np.ones((2, 1)), np.ones((1, 1))))
    assert math.isnan(um.doa([0, 1], [0, 0], [1, 1], np.eye(2)[:, :1], np.ones((1, 1))))


def _brute_force_doa(user, item, label, scores, attributes):
    """EduCDM's doa_eval loops, written out: per concept, per item of it, every (higher, lower) label pair."""
    per_concept = []
    for k in range(attributes.shape[1]):
        agree = valid = 0
        for j in np.flatnonzero(attributes[:, k]):
            rows = np.flatnonzero(item == j)
            for a, b in itertools.permutations(rows, 2):
                if label[a] > label[b]:
                    sa, sb = scores[user[a], k], scores[user[b], k]
                    if sa != sb:
                        valid += 1
                        agree += sa > sb
        if valid:
            per_concept.append(agree / valid)
    return np.mean(per_concept)


@pytest.mark.parametrize('task, seed', [('binary', 0), ('binary', 1), ('rating', 2), ('rating', 3)])
def test_doa_matches_brute_force(task, seed):
    rng = np.random.default_rng(seed)
    num_users, num_items, k, n = 12, 8, 5, 90
    user = rng.integers(0, num_users, size=n)  # Repeated (user, item) pairs happen: they make tied pairs.
    item = rng.integers(0, num_items, size=n)
    label = rng.integers(0, 2, size=n) if task == 'binary' else rng.integers(1, 6, size=n)
    scores = rng.integers(0, 4, size=(num_users, k)) / 4.0  # Few distinct values: many ties.
    attributes = (rng.random((num_items, k)) < 0.35).astype(np.float32)
    attributes[np.arange(num_items), rng.integers(0, k, size=num_items)] = 1.0
    expected = _brute_force_doa(user, item, label, scores, attributes)
    # float64 counts' quotients averaged in another order than the brute force's.
    assert um.doa(user, item, label, scores, attributes) == pytest.approx(expected, abs=1e-12)


def test_doa_bad_input():
    with pytest.raises(ValueError, match='agree in K'):
        um.doa([0], [0], [1], np.ones((1, 2)), np.ones((1, 3)))
    with pytest.raises(ValueError, match=r'item indices must be in \[0, 1\)'):
        um.doa([0], [1], [1], np.ones((1, 2)), np.ones((1, 2)))
    with pytest.raises(ValueError, match='equal sizes'):
        um.doa([0, 0], [0], [1], np.ones((1, 2)), np.ones((1, 2)))


_LOG3 = math.log2(3)


def test_ndcg_hand_computed():
    user = [7, 7, 7, 8, 8, 9, 9]
    y = [1, 0, 1, 0, 0, 5, 3]
    s = [0.9, 0.8, 0.1, 0.3, 0.4, 0.1, 0.2]
    # User 7: ranking 1, 0, 1 -> DCG 1 + 1/2, IDCG 1 + 1/log2(3). User 8: all gains 0 -> skipped.
    # User 9: ranking 3, 5 -> DCG 3 + 5/log2(3), IDCG 5 + 3/log2(3).
    user7 = 1.5 / (1 + 1 / _LOG3)
    user9 = (3 + 5 / _LOG3) / (5 + 3 / _LOG3)
    # float64, the discounted sums in another order than written here: approx's default (1e-6) is far above it.
    assert um.ndcg(user, y, s) == pytest.approx((user7 + user9) / 2)
    assert um.ndcg(user, y, s, k=1) == pytest.approx((1.0 + 0.6) / 2)
    user9_exp = (7 + 31 / _LOG3) / (31 + 7 / _LOG3)
    assert um.ndcg(user, y, s, gain='exponential') == pytest.approx((user7 + user9_exp) / 2)
    # min_records=3 keeps only user 7.
    assert um.ndcg(user, y, s, min_records=3) == pytest.approx(user7)


def test_ndcg_is_order_independent_and_perfect_for_true_scores():
    rng = np.random.default_rng(0)
    user = rng.integers(0, 20, size=300)
    y = rng.integers(1, 6, size=300).astype(float)
    s = rng.random(300)
    perm = rng.permutation(300)
    # The users' means added in another order (float64).
    assert um.ndcg(user, y, s, k=5) == pytest.approx(um.ndcg(user[perm], y[perm], s[perm], k=5))
    # The ideal ranking: DCG and IDCG add the same gains in the same order, so each ratio is 1 exactly.
    assert um.ndcg(user, y, y + 1e-3 * s, k=None) == 1.0
    assert um.ndcg(user, y, -y, k=None) < um.ndcg(user, y, s, k=None)


def test_ndcg_bad_input():
    with pytest.raises(ValueError, match='k must be'):
        um.ndcg([0], [1], [1], k=0)
    with pytest.raises(ValueError, match='gain'):
        um.ndcg([0], [1], [1], gain='log')
    with pytest.raises(ValueError, match='non-negative'):
        um.ndcg([0], [-1], [1])
    assert math.isnan(um.ndcg([0, 0], [0, 0], [1, 2]))
