"""Balanced shares of a group round (`fedpersonal.runtime.balance`): the split the workers' speeds predict to be
fastest (against every split, enumerated), whole groups covering every client once, and kept against noise."""

import itertools

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedpersonal.runtime import balance


@settings(max_examples=200, deadline=None)
@given(
    groups=st.integers(0, 12),
    seconds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=3),
)
def test_fastest_counts_is_the_best_split_of_every_split(groups, seconds):
    counts = balance.fastest_counts(groups, seconds)
    assert sum(counts) == groups and min(counts) >= 0
    makespan = lambda split: max(c * s for c, s in zip(split, seconds))
    splits = [c for c in itertools.product(range(groups + 1), repeat=len(seconds)) if sum(c) == groups]
    assert makespan(counts) <= min(makespan(c) for c in splits) + 1e-12


@settings(max_examples=200, deadline=None)
@given(clients=st.integers(1, 60), group_size=st.integers(1, 7), data=st.data())
def test_slices_cover_every_client_once_in_whole_groups_in_worker_order(clients, group_size, data):
    groups = -(-clients // group_size)
    cut = sorted(data.draw(st.lists(st.integers(0, groups), min_size=2, max_size=3)))
    counts = [b - a for a, b in zip([0, *cut], [*cut, groups])]
    bounds = balance.slices(clients, group_size, counts)
    assert [i for a, b in bounds for i in range(a, b)] == list(range(clients))
    for (a, b), count in zip(bounds, counts):
        assert b - a == min(count * group_size, clients - a)  # Whole groups; only the last may be partial.


def test_the_balancer_splits_evenly_until_measured_then_by_speed_and_ignores_small_gains():
    balancer = balance.GroupBalancer(2)
    assert balancer.counts(40, [20, 20]) == [20, 20]
    balancer.record([20, 20], [2.0, 3.0])  # 0.10 and 0.15 s a group.
    assert balancer.estimates() == [0.10, 0.15]
    assert balancer.counts(40, [20, 20], [20, 20]) == [24, 16]  # 2.4 s against 3.0 s: taken.
    balancer.record([24, 0], [2.4])  # A worker given no group keeps its estimate.
    assert balancer.estimates() == pytest.approx([0.10, 0.15])
    # Median of recent rounds: one slow round (a client's data read there the first time) does not move it.
    for seconds in (2.4, 9.6, 2.4):
        balancer.record([24, 16], [seconds, 2.4])
    assert balancer.estimates() == pytest.approx([0.10, 0.15])
    balancer.record([24, 16], [2.52, 2.4])  # 0.105 s a group: [24, 16] is within 3% of the best split.
    balancer.record([24, 16], [2.52, 2.4])
    assert balancer.counts(40, [20, 20], [24, 16]) == [24, 16]
    assert balancer.counts(41, [21, 20], [24, 16]) == balance.fastest_counts(41, balancer.estimates())
