"""Sampled participation with simulated dropouts and over-selection: who takes part, what is counted, and that a
dropped client's private state stays as it was."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from fedpersonal import client_state
from fedpersonal import program
from fedpersonal.program import participation
from tests.program import training_loop_test as toy

CLIENTS = [f'c{i}' for i in range(12)]


def _client_data():
    return tff.simulation.datasets.TestClientData({c: {'x': [np.float32(i % 3)]} for i, c in enumerate(CLIENTS)})


def _first_x(dataset):
    return np.float32(next(iter(dataset))['x'])


def _run(tmp_path, *, dropout_rate, overselection, rounds=6, per_round=4):
    initial = program.flatten_private_state(toy._initial_private())
    store = client_state.InMemoryClientStateStore(
        client_state.spec_of(initial), lambda cid: [a.copy() for a in initial]
    )
    _, history = program.run_learning_process(
        toy.build_process(),
        client_data=_client_data(),
        dataset_fn=_first_x,
        clients_per_round=per_round,
        total_rounds=rounds,
        outputs=program.ExperimentOutputs(str(tmp_path), f'run_{dropout_rate}_{overselection}'),
        client_state_store=store,
        seed=3,
        dropout_rate=dropout_rate,
        overselection=overselection,
    )
    counts = {
        c: int(program.unflatten_private_state(s, toy._initial_private()).count)
        for c, s in zip(CLIENTS, store.get(CLIENTS))
    }
    return history, counts


def _expected(rounds, per_round, dropout_rate, overselection):
    participated = collections.Counter()
    for r in range(1, rounds + 1):
        sampled = participation.sample_clients(CLIENTS, int(np.ceil(per_round * overselection)), r, 3)
        survivors, _ = participation.surviving_clients(sampled, per_round, r, 3, dropout_rate)
        participated.update(survivors)
    return {c: participated[c] for c in CLIENTS}


def test_dropped_clients_keep_their_state_and_are_counted(tmp_path):
    history, counts = _run(tmp_path, dropout_rate=0.5, overselection=1.0)
    # Each client's count is the number of rounds it reported back in; a dropped one kept its state.
    assert counts == _expected(6, 4, 0.5, 1.0)
    dropped = [row['participation/dropped'] for row in history]
    assert [row['participation/sampled'] for row in history] == [4] * 6
    assert [row['participation/clients'] for row in history] == [4 - d for d in dropped]
    assert sum(dropped) > 0 and sum(counts.values()) == 24 - sum(dropped)


def test_overselection_fills_the_round_despite_dropouts(tmp_path):
    history, counts = _run(tmp_path, dropout_rate=0.3, overselection=2.0)
    assert counts == _expected(6, 4, 0.3, 2.0)
    assert [row['participation/sampled'] for row in history] == [8] * 6
    assert all(row['participation/clients'] <= 4 for row in history)
    assert sum(row['participation/clients'] for row in history) >= 22  # ~all rounds full (seeded).


def test_without_dropouts_the_sample_is_unchanged():
    for r in range(1, 5):
        sampled = participation.sample_clients(CLIENTS, 4, r, 0)
        assert participation.surviving_clients(sampled, 4, r, 0, 0.0) == (sampled, 0)


def test_bad_rates_are_refused(tmp_path):
    with pytest.raises(ValueError, match='dropout_rate'):
        _run(tmp_path, dropout_rate=1.0, overselection=1.0)
    with pytest.raises(ValueError, match='overselection'):
        _run(tmp_path, dropout_rate=0.0, overselection=0.5)
