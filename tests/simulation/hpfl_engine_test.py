"""HPFL, its ablations and its baselines on the fast simulation engine equal the per-silo TFF path."""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import hpfl
from fedpersonal.data import user_modeling as um
from fedpersonal.models import gum
from fedpersonal.simulation import silo_engine
from tests import tolerances

K, H = 3, 2


def make_data():
    """Three silos of unequal sizes; silo 2 has fewer training records than one batch."""
    rng = np.random.default_rng(3)
    silos = []
    for c, (nu, ni, n) in enumerate(((6, 7, 14), (8, 9, 10), (3, 4, 3))):
        attributes = np.zeros((ni, K), np.float32)
        attributes[np.arange(ni), rng.integers(0, K, ni)] = 1
        attributes[0, :] = 1  # One item with every attribute.
        user = np.repeat(np.arange(nu), n)
        item = rng.integers(0, ni, user.size)
        item[:ni] = np.arange(ni)
        label = (rng.random(user.size) < 0.3 + 0.4 * (user % 2)).astype(np.float32)
        silos.append(
            um.ClientSilo(
                client_id=f's{c}',
                num_users=nu,
                num_items=ni,
                user=user.astype(np.int64),
                item=item.astype(np.int64),
                label=label,
                split=um.per_user_split(user),
                item_attributes=attributes,
                global_user_ids=np.arange(nu, dtype=np.int64) + 10 * c,
                global_item_ids=np.arange(ni, dtype=np.int64),
            )
        )
    return um.validate(
        um.UserModelingData(
            name='tiny',
            task='binary',
            num_attributes=K,
            attribute_names=['a', 'b', 'c'],
            rating_range=(0.0, 1.0),
            silos=silos,
            source='test',
        )
    )


DATA = make_data()
CONFIG = gum.GumConfig.for_data(DATA, hidden_dim=H)
IDS = [s.client_id for s in DATA.silos]
CLIENT_DATA = hpfl.federated_data(DATA, CONFIG, batch_size=8)


def _rounds(process, num_rounds):
    state, states = process.initialize(), hpfl.initial_client_states(DATA, CONFIG)
    history = []
    for _ in range(num_rounds):
        out = process.run_round(state, CLIENT_DATA, states, client_ids=IDS)
        state, states = out.state, out.private_states
        history.append(out.metrics)
    return state, states, history


# Depth: the GUM's sums over a record's K attributes and H-wide components (4 of them), a batch of 8's gradient sum,
# the accuracy-weighted mean over 3 silos, a k-means centre's mean over at most 9 rows and its H distances; steps:
# 2 epochs of at most 2 batches, 2 rounds. (A k-means assignment or a prediction on an exact tie would move a value
# by more than this; the random data here puts none there.)
DEPTH = K + 4 * H + 8 + 3 + 9 + H
STEPS = 2 * 2 * 2


def _assert_close(actual, expected, what):
    tf.nest.assert_same_structure(expected, actual, check_types=False)
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        tolerances.assert_reordered_close(a, e, depth=DEPTH, steps=STEPS, err_msg=what)


@pytest.mark.parametrize(
    'method',
    [
        pytest.param(m, marks=[pytest.mark.numeric] * (m in ('hpfl', 'fedavg')))
        for m in hpfl.HPFL_VARIANTS[:3] + hpfl.BASELINES
    ],
)
def test_engine_equals_the_per_silo_path(method):
    kwargs = dict(
        client_optimizer=tff.learning.optimizers.build_adam(0.02),
        client_epochs=2,
        accuracy_threshold=0.3,
        max_clients=len(IDS),
        max_local_clusters=3,
        max_global_clusters=4,
        kmeans_iterations=3,
    )
    engine = hpfl.build_method(method, CONFIG, simulation='engine', **kwargs)
    reference = hpfl.build_method(method, CONFIG, simulation='per_client', **kwargs)
    assert engine.simulation == 'engine' and reference.simulation == 'per_client'
    state, states, metrics = _rounds(engine, 2)
    expected_state, expected_states, expected_metrics = _rounds(reference, 2)
    _assert_close(metrics, expected_metrics, 'metrics')
    _assert_close(state.global_model_weights, expected_state.global_model_weights, 'global weights')
    _assert_close(state.aggregator.centres, expected_state.aggregator.centres, 'centres')
    _assert_close(state.aggregator.finalizer, expected_state.aggregator.finalizer, 'server optimizer state')
    assert int(state.distributor) == int(expected_state.distributor) == 2  # Rounds run.
    _assert_close(states, expected_states, 'client states')
    assert metrics[-1]['client_work']['num_train_examples'] > 0


def test_table_cuts_use_at_most_a_third_more_rows_than_needed():
    cuts = {n: silo_engine.rows(n, 10_745) for n in (1, 16, 17, 24, 25, 33, 48, 49, 4_100, 6_145, 10_000)}
    assert cuts == {
        1: 16,
        16: 16,
        17: 24,
        24: 24,
        25: 32,
        33: 48,
        48: 48,
        49: 64,
        4_100: 6_144,
        6_145: 8_192,
        10_000: 10_745,
    }


@pytest.mark.parametrize('method', ['hpfl', 'fedavg'])
def test_cutting_each_silo_tables_to_its_own_rows_is_exact(monkeypatch, method):
    """The tiny silos have fewer items than the smallest cut; cut them to exactly their items (7, 9 and 4 of 9)."""
    cut_to = []
    monkeypatch.setattr(silo_engine, 'rows', lambda count, capacity: cut_to.append(int(count)) or int(count))
    kwargs = dict(client_optimizer=tff.learning.optimizers.build_adam(0.02), max_clients=len(IDS), kmeans_iterations=3)
    state, states, metrics = _rounds(hpfl.build_method(method, CONFIG, simulation='engine', **kwargs), 2)
    assert sorted(set(cut_to)) == [4, 7, 9]
    expected = _rounds(hpfl.build_method(method, CONFIG, simulation='per_client', **kwargs), 2)
    _assert_close(state.global_model_weights, expected[0].global_model_weights, 'global weights')
    _assert_close(states, expected[1], 'client states')
    _assert_close(metrics, expected[2], 'metrics')


def test_what_the_engine_would_not_apply_per_silo_runs_on_the_per_client_backend(caplog):
    """Lazy row updates (tf.unique: no XLA kernel) and aggregators acting on each silo's upload fall back, logged."""
    noised = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.1, clients_per_round=3.0, clip=1.0
    )
    cases = (
        (dict(row_updates='lazy'), "row_updates='lazy'"),
        (dict(public_sum_factory=noised), 'public_sum_factory=DifferentiallyPrivateFactory'),
    )
    for kwargs, reason in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger='absl'):
            assert hpfl.build_hpfl(CONFIG, **kwargs).simulation == 'per_client'
        assert any(reason in r.getMessage() and 'per-client backend' in r.getMessage() for r in caplog.records)
    assert hpfl.build_hpfl(CONFIG, public_sum_factory=tff.aggregators.SumFactory()).simulation == 'engine'
    with backends.use('per_client'):
        assert hpfl.build_hpfl(CONFIG).simulation == 'per_client'
        assert hpfl.build_hpfl(CONFIG, simulation='engine').simulation == 'engine'  # The deprecated alias.


def test_batches_are_materialized_in_the_order_tff_iterates_them():
    """A reshuffling dataset's Python object yields a new order per iteration; TFF (and the engine) the first one."""
    from fedpersonal.simulation import packing

    dataset = tf.data.Dataset.range(20).shuffle(20, seed=4, reshuffle_each_iteration=True).batch(6)
    first = [b.tolist() for b in dataset.as_numpy_iterator()]
    second = [b.tolist() for b in dataset.as_numpy_iterator()]
    assert first != second  # The object's seed generator moved on.
    concat = tff.tensorflow.computation(tff.SequenceType(tff.TensorType(np.int64, [None])))(
        lambda batches: batches.reduce(tf.zeros([0], tf.int64), lambda a, b: tf.concat([a, b], 0))
    )
    seen_by_tff = concat(dataset).tolist()
    materialized = packing.batches_as_tff_sees(dataset)
    assert [len(b) for b in materialized] == [6, 6, 6, 2]
    assert np.concatenate(materialized).tolist() == seen_by_tff == sum(first, [])
