"""SQLite client state store: persistence (commits only), crash recovery (SIGKILL), spec checks, corruption, files of
an earlier version, per-round cost."""

import os
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from fedpersonal import client_state

DIM = 8
SPEC = [((DIM,), np.float32), ((), np.int64)]
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(client: int, round_num: int):
    return [np.full((DIM,), round_num * 100 + client + 0.25, np.float32), np.int64(round_num)]


def _open(path, spec=SPEC):
    return client_state.SqliteClientStateStore(path, spec, client_state.zeros_default(spec))


def _assert_values(store, clients, round_num):
    for client, got in zip(clients, store.get([f'c{i}' for i in clients])):
        np.testing.assert_array_equal(got[0], _state(client, round_num)[0])
        assert int(got[1]) == round_num


def _rows(path, sql):
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def _store_at_round_2(path):
    """Clients c0..c9 registered (round 0); c0..c4 written in round 1 and c0..c2 in round 2; both committed."""
    with _open(path) as store:
        store.register([f'c{i}' for i in range(10)], [_state(i, 0) for i in range(10)])
        store.put([f'c{i}' for i in range(5)], [_state(i, 1) for i in range(5)], 1)
        store.commit(1)
        store.put([f'c{i}' for i in range(3)], [_state(i, 2) for i in range(3)], 2)
        store.commit(2)


# The child process: opens the store, does `mode`, prints READY and waits to be killed.
_CHILD = r"""
import sys, time, types
# Load the store modules without fedpersonal/__init__.py, which imports TFF (slow and not needed here).
pkg = types.ModuleType('fedpersonal'); pkg.__path__ = [REPO + '/fedpersonal']; sys.modules['fedpersonal'] = pkg
import numpy as np
from fedpersonal import client_state
path, mode = sys.argv[1], sys.argv[2]
spec = [((DIM,), np.float32), ((), np.int64)]
def state(client, round_num):
    return [np.full((DIM,), round_num * 100 + client + 0.25, np.float32), np.int64(round_num)]
store = client_state.SqliteClientStateStore(path, spec, client_state.zeros_default(spec))
if mode in ('put', 'put_commit'):
    ids = [0, 1, 5, 10]  # c10 is a new client.
    store.put([f'c{i}' for i in ids], [state(i, 3) for i in ids], 3)
    if mode == 'put_commit':
        store.commit(3)
elif mode == 'register':
    def slow_default(client_id):
        if client_id == 'new15000':  # Halfway through one register transaction.
            print('READY', flush=True)
            time.sleep(600)
        return [np.ones(DIM, np.float32), np.int64(-1)]
    store.register([f'new{i}' for i in range(10000)], None)
    store.default_fn = slow_default
    store.register([f'more{i}' for i in range(4000)] + [f'new{i}' for i in range(10000, 20000)], None)
print('READY', flush=True)
time.sleep(600)
"""


def _run_and_kill(path, mode):
    code = _CHILD.replace('REPO', repr(_REPO)).replace('DIM', str(DIM))
    proc = subprocess.Popen(
        [sys.executable, '-c', code, str(path), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == 'READY', f'child failed: {line!r} {proc.stderr.read()}'
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_persistence_across_reopen(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    with _open(path) as store:
        store.put(['c3', 'c20'], [_state(3, 3), _state(20, 3)], 3)
        assert len(store) == 11 and store.contains('c20')
        _assert_values(store, [3, 20], 3)
    with _open(path) as store:  # Uncommitted writes do not outlive the store: a resume would discard them.
        assert store.committed_round() == 2
        assert len(store) == 10 and not store.contains('c20')
        _assert_values(store, [0, 1, 2], 2)
        _assert_values(store, [3, 4], 1)
        _assert_values(store, [5, 9], 0)


def test_sigkill_before_commit_leaves_the_committed_round(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    _run_and_kill(path, 'put')
    with _open(path) as store:
        assert store.committed_round() == 2 and len(store) == 10
        _assert_values(store, [0, 1], 2)  # The killed process's writes of round 3 never reached the file.
        _assert_values(store, [5], 0)
        assert not store.contains('c10')
        store.rollback(2)  # Resume from the server checkpoint of round 2: nothing to discard.
        _assert_values(store, [0, 1], 2)
        assert len(store) == 10


def test_sigkill_after_commit_keeps_the_committed_round(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    _run_and_kill(path, 'put_commit')
    with _open(path) as store:
        assert store.committed_round() == 3
        store.rollback(3)
        _assert_values(store, [0, 1, 5, 10], 3)
        _assert_values(store, [2], 2)
        assert len(store) == 11
        with pytest.raises(ValueError, match='cannot go back before round 3'):
            store.rollback(2)


def test_sigkill_during_register_leaves_none_of_it(tmp_path):
    path = tmp_path / 'states.db'
    _run_and_kill(path, 'register')
    with _open(path) as store:
        assert len(store) == 10000  # The first register call, complete; nothing of the killed one.
        assert store.contains('new9999') and not store.contains('more0') and not store.contains('new10000')
        assert _rows(path, 'SELECT COUNT(*) FROM states') == [(10000,)]


def test_reopen_with_a_different_spec_fails(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    for other in (
        [((DIM + 1,), np.float32), ((), np.int64)],
        [((DIM,), np.float64), ((), np.int64)],
        [((DIM,), np.float32)],
    ):
        with pytest.raises(ValueError) as info:
            _open(path, other)
        message = str(info.value)
        assert 'was created with spec [(8,) float32, () int64]' in message
        assert f'opened with spec {client_state.store.format_spec(client_state.store.normalize_spec(other))}' in message
    with _open(path) as store:  # The failed opens changed nothing.
        assert len(store) == 10
        _assert_values(store, [0], 2)


def test_opening_a_foreign_database_fails(tmp_path):
    path = tmp_path / 'other.db'
    with sqlite3.connect(path) as conn:
        conn.execute('CREATE TABLE t (x)')
    with pytest.raises(ValueError, match='not a client state store'):
        _open(path)


def test_corrupt_blob_is_reported_with_the_client_id(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE states SET blob = substr(blob, 1, 13) WHERE client_id = 'c7'")
    with _open(path) as store:
        with pytest.raises(
            client_state.CorruptStateError,
            match=r"client 'c7': stored state is corrupt: expected 40 bytes .*got 13 bytes",
        ):
            store.get(['c1', 'c7'])
        _assert_values(store, [1], 2)  # Other clients still read fine.


def test_uncommitted_rows_of_an_earlier_version_are_discarded_on_open(tmp_path):
    """Files written before pending writes moved to memory may hold uncommitted rows (and count their new clients)."""
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    with sqlite3.connect(path) as conn:
        blob = np.concatenate([_state(0, 3)[0].view(np.uint8), np.int64(3).reshape(1).view(np.uint8)]).tobytes()
        conn.executemany('INSERT INTO pending (client_id, round, blob) VALUES (?, 3, ?)', [('c0', blob), ('c99', blob)])
        conn.execute("UPDATE meta SET value = 11 WHERE key = 'num_clients'")
    with _open(path) as store:
        assert store.committed_round() == 2 and len(store) == 10 and not store.contains('c99')
        _assert_values(store, [0], 2)
    assert _rows(path, 'SELECT COUNT(*) FROM pending') == [(0,)]
    assert _rows(path, "SELECT value FROM meta WHERE key = 'num_clients'") == [(10,)]


def test_schema_wal_and_garbage_collection(tmp_path):
    path = tmp_path / 'states.db'
    _store_at_round_2(path)
    assert _rows(path, 'PRAGMA journal_mode') == [('wal',)]
    assert _rows(path, 'SELECT COUNT(*) FROM pending') == [(0,)]
    # One row per client: the versions of rounds 0 and 1 superseded by commits were deleted.
    assert _rows(path, 'SELECT round, COUNT(*) FROM states GROUP BY round ORDER BY round') == [(0, 5), (1, 2), (2, 3)]
    with _open(path) as store:
        before = _rows(path, 'SELECT client_id, round, blob FROM states ORDER BY 1')
        store.put(['c0', 'c1'], [_state(0, 3), _state(1, 3)], 3)
        store.put(['c0', 'c10'], [_state(0, 4), _state(10, 4)], 4)
        # A round writes nothing to the file: the writes wait in memory for the commit.
        assert _rows(path, 'SELECT client_id, round, blob FROM states ORDER BY 1') == before
        assert _rows(path, 'SELECT COUNT(*) FROM pending') == [(0,)]
        store.commit(4)
        assert _rows(path, 'SELECT client_id, round FROM states WHERE round > 2 ORDER BY 1') == [
            ('c0', 4),
            ('c1', 3),
            ('c10', 4),
        ]
        assert _rows(path, "SELECT key, value FROM meta WHERE key != 'spec' ORDER BY key") == [
            ('committed_round', 4),
            ('format', 1),
            ('num_clients', 11),
        ]
    with _open(path) as store:
        assert len(store) == 11
        _assert_values(store, [0, 10], 4)
        _assert_values(store, [1], 3)


def _vm_steps(store, fn):
    """SQLite virtual-machine instructions (in units of 100) executed by `fn()` on the store's connection."""
    steps = [0]

    def handler():
        steps[0] += 1
        return 0

    store._conn.set_progress_handler(handler, 100)  # pylint: disable=protected-access
    try:
        fn()
    finally:
        store._conn.set_progress_handler(None, 100)  # pylint: disable=protected-access
    return steps[0]


def test_round_cost_does_not_grow_with_registered_clients(tmp_path):
    """get + put + commit + rollback of 10 clients: the same SQL work with 1K or 50K registered clients."""
    costs = {}
    for n in (1_000, 50_000):
        with _open(tmp_path / f'{n}.db') as store:
            store.register([f'c{i}' for i in range(n)])
            clients = [f'c{i}' for i in range(0, n, n // 10)]

            def one_round(round_num):
                states = store.get(clients)
                store.put(clients, states, round_num)
                store.commit(round_num)
                store.put(clients[:5], states[:5], round_num + 1)
                store.rollback(round_num)
                assert len(store) == n

            one_round(1)  # Warm the statement cache.
            costs[n] = _vm_steps(store, lambda: one_round(3))
    assert costs[50_000] <= 1.5 * costs[1_000] + 5, costs  # A full scan would be ~50x.
