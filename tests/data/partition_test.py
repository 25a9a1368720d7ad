"""Partitioners: property tests, and equality with PFLlib's own code (`pfllib_reference`) on numpy's legacy state."""

import math

import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.data import partition
from tests.data.pfllib_reference import pfllib_least
from tests.data.pfllib_reference import pfllib_split_data
from tests.data.pfllib_reference import run_pfllib

labels_strategy = st.integers(2, 6).flatmap(
    lambda k: st.lists(st.integers(0, k - 1), min_size=60, max_size=400).map(lambda v: (np.array(v), k))
)


@settings(max_examples=40, deadline=None)
@given(data=labels_strategy, num_clients=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_dirichlet_matches_pfllib_and_properties(data, num_clients, seed):
    labels, k = data
    least = min(3, labels.size // num_clients // 2)
    try:
        ours = partition.dirichlet(
            labels, num_clients, 0.5, rng=np.random.RandomState(seed), least_samples=least, num_classes=k,
            max_tries=200,
        )  # fmt: skip
    except errors.DataError:
        event('gave up')
        return  # No draw in max_tries met least_samples (PFLlib would loop on).
    event('compared')
    reference = run_pfllib(
        labels, seed, num_clients=num_clients, num_classes=k, balance=False, partition_name='dir',
        class_per_client=None, alpha=0.5, least_samples=least,
    )  # fmt: skip
    assert [r.tolist() for r in ours] == [r.tolist() for r in reference]
    owner = partition.client_of_row(ours, labels.size)  # Raises if a row is in two clients.
    assert (owner >= 0).all() and min(r.size for r in ours) >= least


@settings(max_examples=40, deadline=None)
@given(
    data=labels_strategy,
    num_clients=st.integers(1, 12),
    per_client=st.integers(1, 6),
    balance=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_pathological_matches_pfllib_and_properties(data, num_clients, per_client, balance, seed):
    labels, k = data
    labels = np.concatenate([labels, np.arange(k)])  # Every class occurs.
    per_client = min(per_client, k)
    least = pfllib_least(labels.size, num_clients)
    kwargs = dict(rng=np.random.RandomState(seed), balance=balance, least_samples=least, num_classes=k)
    try:
        ours = partition.pathological(labels, num_clients, per_client, **kwargs)
    except errors.InputError as e:  # Classes left without clients, or an impossible unbalanced draw.
        assert 'PFLlib drops them' in str(e) or 'too few for an unbalanced draw' in str(e)
        event('refused')
        return
    event('compared')
    reference = run_pfllib(
        labels, seed, num_clients=num_clients, num_classes=k, balance=balance, partition_name='pat',
        class_per_client=per_client, alpha=None, least_samples=least,
    )  # fmt: skip
    assert [r.tolist() for r in ours] == [r.tolist() for r in reference]
    owner = partition.client_of_row(ours, labels.size)
    assert (owner >= 0).all()  # Every row in exactly one client.
    counts = partition.label_counts(labels, ours, k)
    assert ((counts > 0).sum(axis=1) <= per_client).all()
    if balance:  # Equal pieces of each class (the last client of a class takes the remainder).
        for cls in range(k):
            sizes = counts[:, cls][counts[:, cls] > 0]
            assert sizes[:-1].ptp() == 0 if sizes.size > 1 else True


def test_pathological_refuses_what_pfllib_drops():
    labels = np.repeat(np.arange(10), 20)
    with pytest.raises(errors.ConfigError, match=r'classes 8\.\.9 would be in no client'):
        partition.pathological(labels, 7, 2, rng=np.random.default_rng(0), balance=True)
    with pytest.raises(errors.DataError, match='too few for an unbalanced draw'):
        partition.pathological(labels, 20, 2, rng=np.random.default_rng(0), least_samples=1000)


def test_dirichlet_gives_up_with_a_clear_error():
    labels = np.repeat(np.arange(2), 30)
    with pytest.raises(errors.DataError, match='no Dirichlet'):
        partition.dirichlet(labels, 6, 0.01, rng=np.random.default_rng(0), least_samples=10, max_tries=3)
    with pytest.raises(errors.ConfigError, match='exceeds the 60 rows'):
        partition.dirichlet(labels, 6, 0.1, rng=np.random.default_rng(0), least_samples=11)
    with pytest.raises(errors.ConfigError, match='alpha must be positive'):
        partition.dirichlet(labels, 6, 0.0, rng=np.random.default_rng(0), least_samples=1)


@settings(max_examples=30, deadline=None)
@given(data=labels_strategy, num_clients=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_same_seed_same_partition_generator(data, num_clients, seed):
    labels, k = data
    least = min(2, labels.size // num_clients // 2)

    def draw():
        rng = np.random.default_rng(seed)
        parts = partition.dirichlet(labels, num_clients, 1.0, rng=rng, least_samples=least, num_classes=k)
        return parts, partition.train_test_split(parts, 0.75, rng=rng)

    (a, (a_train, a_test)), (b, (b_train, b_test)) = draw(), draw()
    for x, y in zip(a + a_train + a_test, b + b_train + b_test):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(2, 60), min_size=1, max_size=10), seed=st.integers(0, 2**31 - 1))
def test_train_test_split_is_sklearns_75_25(sizes, seed):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    parts = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(sizes))]
    train, test = partition.train_test_split(parts, 0.75, rng=np.random.RandomState(seed))
    state = np.random.get_state()
    np.random.seed(seed)
    ref_train, ref_test = pfllib_split_data(parts, 0.75)
    np.random.set_state(state)
    for p, tr, te, rtr, rte in zip(parts, train, test, ref_train, ref_test):
        assert tr.size == math.floor(0.75 * p.size) and te.size == math.ceil(0.25 * p.size)
        assert sorted(np.concatenate([tr, te]).tolist()) == p.tolist()  # Disjoint, together the client's rows.
        np.testing.assert_array_equal(tr, rtr)
        np.testing.assert_array_equal(te, rte)
    with pytest.raises(errors.DataError, match='client 0 has 1 rows'):
        partition.train_test_split([np.array([3])], 0.75, rng=np.random.default_rng(0))


@settings(max_examples=30, deadline=None)
@given(num_rows=st.integers(1, 300), num_clients=st.integers(1, 20), seed=st.integers(0, 1000))
def test_iid_deals_every_row_once(num_rows, num_clients, seed):
    if num_clients > num_rows:
        with pytest.raises(errors.ConfigError):
            partition.iid(num_rows, num_clients, rng=np.random.default_rng(seed))
        return
    parts = partition.iid(num_rows, num_clients, rng=np.random.default_rng(seed))
    owner = partition.client_of_row(parts, num_rows)
    assert (owner >= 0).all() and max(p.size for p in parts) - min(p.size for p in parts) <= 1
    expected = np.random.default_rng(seed).permutation(num_rows) % num_clients
    np.testing.assert_array_equal(owner, expected)


def test_by_key_keeps_table_order():
    keys, parts = partition.by_key(np.array(['b', 'a', 'b', 'c', 'a']))
    assert keys.tolist() == ['a', 'b', 'c']
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2], [3]]


def test_bad_labels_and_overlaps():
    with pytest.raises(errors.DataError, match='integers'):
        partition.pathological(np.array([0.5, 1.0]), 1, 1, rng=np.random.default_rng(0))
    with pytest.raises(errors.DataError, match='< num_classes=2'):
        partition.label_counts(np.array([0, 2]), [np.array([0, 1])], num_classes=2)
    with pytest.raises(errors.DataError, match='already holds'):
        partition.client_of_row([np.array([0, 1]), np.array([1])], 3)
