"""Client state stores: the contract shared by the in-memory and the SQLite store, and the default initializers."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedpersonal import client_state
from fedpersonal.client_state import store as store_lib

SPEC = [((4,), np.float32), ((), np.int64), ((2, 3), np.float64)]
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(value):
    """A state of SPEC whose entries are all derived from `value`."""
    return [np.full((4,), value, np.float32), np.int64(value * 10), np.full((2, 3), -value, np.float64)]


def _assert_state_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        e = np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype
        assert a.tobytes() == e.tobytes()  # Bit-exact (NaN and -0.0 included).


@pytest.fixture(params=['in_memory', 'sqlite'])
def make_store(request, tmp_path):
    """`make_store(spec=SPEC, default_fn=zeros)` for each store kind; closes everything afterwards."""
    stores = []

    def make(spec=SPEC, default_fn=None):
        default_fn = default_fn or client_state.zeros_default(spec)
        if request.param == 'in_memory':
            store = client_state.InMemoryClientStateStore(spec, default_fn)
        else:
            store = client_state.SqliteClientStateStore(tmp_path / f'store{len(stores)}.db', spec, default_fn)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def test_unseen_clients_get_default_and_stay_unregistered(make_store):
    default_fn = client_state.seeded_uniform_default(SPEC[:1] + SPEC[2:], 0.1, 3)
    spec = SPEC[:1] + SPEC[2:]
    store = make_store(spec, default_fn)
    states = store.get(['a', 'b', 'a'])
    _assert_state_equal(states[0], default_fn('a'))
    _assert_state_equal(states[1], default_fn('b'))
    _assert_state_equal(states[2], default_fn('a'))
    assert not np.array_equal(states[0][0], states[1][0])
    assert not store.contains('a') and not store.contains('b')
    assert len(store) == 0
    assert store.committed_round() == 0


def test_put_get_round_trip_is_exact_and_returns_copies(make_store):
    store = make_store()
    rng = np.random.default_rng(0)
    special = [
        np.array([np.nan, -0.0, np.inf, 1e-45], np.float32),
        np.int64(-(2**63)),
        np.array([[np.finfo(np.float64).max, -np.inf, 5e-324], [0.1, 0.2, 0.3]]),
    ]
    states = [special] + [
        [rng.normal(size=4).astype(np.float32), np.int64(i), rng.normal(size=(2, 3))] for i in range(5)
    ]
    ids = [f'client/{i} é' for i in range(6)]
    store.put(ids, states, round_num=1)
    got = store.get(list(reversed(ids)) + [ids[2]])
    for actual, expected in zip(got, list(reversed(states)) + [states[2]]):
        _assert_state_equal(actual, expected)
    got[0][0][:] = 123.0  # Returned arrays are writable copies: the store is unaffected.
    _assert_state_equal(store.get([ids[-1]])[0], states[-1])
    states[1][0][:] = -7.0  # So are the stored values: mutating the caller's arrays changes nothing.
    assert store.get([ids[1]])[0][0][0] != -7.0
    assert len(store) == 6 and all(store.contains(cid) for cid in ids)


@pytest.mark.parametrize(
    'bad_state, index, fragments',
    [
        ([np.zeros(4, np.float32), np.int32(1), np.zeros((2, 3))], 1, ['array 1', 'dtype int64', 'dtype int32']),
        ([np.zeros(5, np.float32), np.int64(1), np.zeros((2, 3))], 0, ['array 0', 'shape (4,)', 'shape (5,)']),
        ([np.zeros(4, np.float32), np.int64(1), np.zeros((3, 2))], 2, ['array 2', 'shape (2, 3)', 'shape (3, 2)']),
        ([np.zeros(4, np.float64), np.int64(1), np.zeros((2, 3))], 0, ['array 0', 'dtype float32', 'dtype float64']),
        ([np.zeros(4, np.float32), np.int64(1)], None, ['has 2 arrays, expected 3']),
        (np.zeros(4, np.float32), None, ['must be a list of 3 arrays']),
    ],
)
def test_spec_validation_names_client_and_array(make_store, bad_state, index, fragments):
    store = make_store()
    store.register(['r0'])
    for call in (
        lambda: store.put(['good', 'bad-client'], [_state(1.0), bad_state], 1),
        lambda: store.register(['good', 'bad-client'], [_state(1.0), bad_state]),
    ):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "'bad-client'" in message
        for fragment in fragments:
            assert fragment in message
        if index is not None:
            assert f'expected shape {SPEC[index][0]} dtype {np.dtype(SPEC[index][1])}' in message
        # Nothing of the failed call was written: the valid client before the bad one is absent too.
        assert not store.contains('good') and len(store) == 1


def test_default_fn_is_validated(make_store):
    store = make_store(default_fn=lambda cid: [np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="client 'x': state has 1 arrays, expected 3"):
        store.get(['x'])


def test_put_argument_errors(make_store):
    store = make_store()
    with pytest.raises(ValueError, match="client 'a' is listed more than once"):
        store.put(['a', 'b', 'a'], [_state(1)] * 3, 1)
    with pytest.raises(ValueError, match='2 client ids but 1 states'):
        store.put(['a', 'b'], [_state(1)], 1)
    with pytest.raises(ValueError, match='client ids must be str'):
        store.put([7], [_state(1)], 1)
    store.put(['a'], [_state(1)], 1)
    store.commit(1)
    with pytest.raises(ValueError, match='round 1 is not after the committed round 1'):
        store.put(['a'], [_state(2)], 1)
    assert len(store) == 1
    _assert_state_equal(store.get(['a'])[0], _state(1))


def test_commit_then_rollback_restores_committed_values(make_store):
    store = make_store()
    store.register(['a', 'b'], [_state(0), _state(0.5)])
    store.put(['a', 'c'], [_state(1), _state(1.5)], 1)
    store.commit(1)
    assert store.committed_round() == 1
    store.put(['a', 'b', 'new'], [_state(2), _state(2.5), _state(2.75)], 2)
    assert len(store) == 4 and store.contains('new')
    _assert_state_equal(store.get(['a'])[0], _state(2))

    store.rollback(1)

    a, b, c, new = store.get(['a', 'b', 'c', 'new'])
    _assert_state_equal(a, _state(1))
    _assert_state_equal(b, _state(0.5))  # Registered value, never put before round 2.
    _assert_state_equal(c, _state(1.5))
    _assert_state_equal(new, _state(0))  # First written in round 2: gone, back to the default.
    assert not store.contains('new') and len(store) == 3
    assert store.committed_round() == 1
    store.put(['new'], [_state(3)], 2)  # Round 2 can be redone after the rollback.
    assert len(store) == 4


def test_rounds_between_commits_keep_only_the_latest_write(make_store):
    store = make_store()
    store.put(['a'], [_state(1)], 1)
    store.commit(1)
    store.put(['a', 'b'], [_state(2), _state(2.5)], 2)
    store.put(['a'], [_state(3)], 3)
    assert len(store) == 2

    store.rollback(3)  # A server checkpoint of round 3 exists but commit(3) was never called: nothing to discard.
    assert store.committed_round() == 1
    _assert_state_equal(store.get(['a'])[0], _state(3))
    _assert_state_equal(store.get(['b'])[0], _state(2.5))

    store.put(['a', 'c'], [_state(4), _state(4.5)], 4)
    assert len(store) == 3
    # Round 3's write of 'a' was superseded by round 4's: neither round 2 nor 3 can be restored or committed.
    for round_num in (2, 3):
        with pytest.raises(
            ValueError, match=rf'rollback\({round_num}\): a write of round 4 is pending.*committed round 1'
        ):
            store.rollback(round_num)
        with pytest.raises(ValueError, match=rf'commit\({round_num}\): a write of round 4 is pending'):
            store.commit(round_num)
    _assert_state_equal(store.get(['a'])[0], _state(4))  # The refused calls changed nothing.
    assert len(store) == 3 and store.committed_round() == 1

    store.commit(4)
    assert store.committed_round() == 4
    a, b, c = store.get(['a', 'b', 'c'])
    _assert_state_equal(a, _state(4))
    _assert_state_equal(b, _state(2.5))
    _assert_state_equal(c, _state(4.5))
    with pytest.raises(ValueError, match='cannot go back before round 4'):
        store.rollback(3)
    with pytest.raises(ValueError, match='cannot go back before round 4'):
        store.commit(3)
    store.rollback(4)  # Nothing pending: no change.
    _assert_state_equal(store.get(['a'])[0], _state(4))
    assert len(store) == 3


def test_rollback_to_the_committed_round_discards_every_later_write(make_store):
    store = make_store()
    store.put(['a'], [_state(1)], 1)
    store.put(['a'], [_state(2)], 2)
    store.commit(2)
    for round_num in (3, 4, 5):  # Many rounds between checkpoints.
        store.put(['a', 'late'], [_state(round_num), _state(-round_num)], round_num)
    store.rollback(2)
    _assert_state_equal(store.get(['a'])[0], _state(2))
    assert not store.contains('late') and len(store) == 1


def test_memory_does_not_grow_with_the_rounds_between_commits():
    """Every client written every round (Ditto's personal copies): the store holds one pending value per client."""
    import tracemalloc

    spec = [((2500,), np.float32)]  # 10 KB a client.
    store = client_state.InMemoryClientStateStore(spec, client_state.zeros_default(spec))
    ids = [f'c{i}' for i in range(100)]
    tracemalloc.start()
    try:
        for round_num in range(1, 31):
            store.put(ids, [[np.full((2500,), round_num, np.float32)] for _ in ids], round_num)
            if round_num == 1:
                one_round = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert one_round > 100 * 10_000 and grown < 1.5 * one_round, (one_round, grown)
    np.testing.assert_array_equal(store.get(['c7'])[0][0], np.full((2500,), 30, np.float32))


def test_same_round_put_twice_replaces(make_store):
    store = make_store()
    store.put(['a'], [_state(1)], 1)
    store.put(['a'], [_state(1.25)], 1)
    assert len(store) == 1
    store.rollback(0)
    assert len(store) == 0 and not store.contains('a')


def test_register_bulk(make_store):
    store = make_store(default_fn=lambda cid: _state(float(cid.split('-')[1]) if '-' in cid else 0.0))
    n = 20_000
    ids = [f'c-{i}' for i in range(n)]
    store.register(ids)
    store.register(['x-1', 'x-2'], [_state(-1), _state(-2)])
    assert len(store) == n + 2
    assert store.contains('c-0') and store.contains(f'c-{n - 1}') and not store.contains(f'c-{n}')
    expected = {'c-17': _state(17.0), f'c-{n - 1}': _state(float(n - 1)), 'x-2': _state(-2)}
    for got, want in zip(store.get(list(expected)), expected.values()):
        _assert_state_equal(got, want)

    with pytest.raises(ValueError, match="client 'c-5' is already registered"):
        store.register(['fresh', 'c-5'])
    with pytest.raises(ValueError, match="client 'dup'"):
        store.register(['dup', 'dup'])
    store.put(['p'], [_state(9)], 1)
    with pytest.raises(ValueError, match="client 'p' is already registered"):
        store.register(['p'])
    assert not store.contains('fresh') and not store.contains('dup')  # Failed registrations are atomic.
    assert len(store) == n + 3


def test_registered_values_are_not_rolled_back(make_store):
    store = make_store()
    store.put(['a'], [_state(1)], 1)
    store.commit(1)
    store.put(['a'], [_state(2)], 2)
    store.register(['late'], [_state(7)])  # Registered during round 2, before the crash.
    store.rollback(1)
    assert store.contains('late') and len(store) == 2
    _assert_state_equal(store.get(['late'])[0], _state(7))


def test_closed_store_raises(make_store):
    store = make_store()
    store.close()
    with pytest.raises(ValueError, match='closed'):
        store.get(['a'])
    with pytest.raises(ValueError, match='closed'):
        len(store)
    store.close()  # Idempotent.


def test_context_manager_closes(make_store):
    with make_store() as store:
        store.put(['a'], [_state(1)], 1)
    with pytest.raises(ValueError, match='closed'):
        store.put(['a'], [_state(1)], 2)


def test_spec_normalization_and_spec_of():
    assert store_lib.normalize_spec([([3], 'float32'), ((), np.int64)]) == [
        ((3,), np.dtype(np.float32)),
        ((), np.dtype(np.int64)),
    ]
    assert client_state.spec_of([np.zeros((2, 5), np.float16), 3.0]) == [
        ((2, 5), np.dtype(np.float16)),
        ((), np.dtype(np.float64)),
    ]
    fake_tf_dtype = type('DType', (), {'as_numpy_dtype': np.float16})()  # Like tf.float16, without TF.
    assert store_lib.normalize_spec([((2,), fake_tf_dtype)]) == [((2,), np.dtype(np.float16))]
    with pytest.raises(ValueError, match='spec entry 0: dtype object'):
        store_lib.normalize_spec([((1,), object)])
    with pytest.raises(ValueError, match='spec entry 1: shape must have non-negative'):
        store_lib.normalize_spec([((1,), np.float32), ((-1,), np.float32)])


def test_zeros_default():
    states = client_state.zeros_default(SPEC)('anyone')
    _assert_state_equal(states, [np.zeros(4, np.float32), np.int64(0), np.zeros((2, 3))])


# Computed once with seeded_uniform_default; any change of the algorithm breaks existing experiments.
_ALICE_F32 = np.array([-0.1298882, 0.21930014, 0.6219808], np.float32)
_ALICE_F64_SEED7 = np.array([0.48962073363253134, 0.5877877910734066], np.float64)


def test_seeded_uniform_default_matches_recorded_values():
    fn = client_state.seeded_uniform_default([((3,), np.float32)], scale=1.0, seed=0)
    _assert_state_equal(fn('alice'), [_ALICE_F32])
    fn64 = client_state.seeded_uniform_default([((2,), np.float64)], scale=1.0, seed=7)
    _assert_state_equal(fn64('alice'), [_ALICE_F64_SEED7])


def test_seeded_uniform_default_properties():
    spec = [((1000,), np.float32), ((10, 10), np.float64), ((), np.float16)]
    fn = client_state.seeded_uniform_default(spec, scale=0.05, seed=1)
    a, a_again, b = fn('a'), fn('a'), fn('b')
    _assert_state_equal(a_again, a)
    assert [x.dtype for x in a] == [np.float32, np.float64, np.float16]
    assert [x.shape for x in a] == [(1000,), (10, 10), ()]
    assert not np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], client_state.seeded_uniform_default(spec, 0.05, seed=2)('a')[0])
    values = np.concatenate([x.astype(np.float64).ravel() for x in a + b])
    assert values.min() >= -0.05 and values.max() <= 0.05
    assert abs(values.mean()) < 0.005 and 0.027 < values.std() < 0.031  # Uniform: std = 0.05 / sqrt(3).
    with pytest.raises(ValueError, match='entry 1 has dtype int64'):
        client_state.seeded_uniform_default([((1,), np.float32), ((1,), np.int64)], 1.0, 0)


def test_seeded_uniform_default_is_identical_in_another_process():
    code = (
        'import json, sys, types\n'
        # Load the store modules without fedpersonal/__init__.py, which imports TFF (slow, not needed).
        f'pkg = types.ModuleType("fedpersonal"); pkg.__path__ = [{os.path.join(_REPO, "fedpersonal")!r}]\n'
        'sys.modules["fedpersonal"] = pkg\n'
        'import numpy as np\n'
        'from fedpersonal.client_state import store\n'
        'fn = store.seeded_uniform_default([((5,), np.float64)], 2.5, 11)\n'
        'print(json.dumps({c: fn(c)[0].tolist() for c in ["u1", "user-\u00e9", ""]}))\n'
    )
    env = dict(os.environ, PYTHONHASHSEED='12345')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True, timeout=120)
    other = json.loads(out.stdout)
    fn = client_state.seeded_uniform_default([((5,), np.float64)], 2.5, 11)
    assert set(other) == {'u1', 'user-\u00e9', ''}
    for cid, values in other.items():
        np.testing.assert_array_equal(np.array(values), fn(cid)[0])
