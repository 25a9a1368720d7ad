"""Tests for fedpersonal.data.movielens."""

import collections
import os
import pathlib
import subprocess

import numpy as np
import pandas as pd
import pytest

from fedpersonal.data import movielens
from fedpersonal.data.movielens import MovieLensFormatError
from fedpersonal.data.synthetic_movielens import generate_movielens_like
from fedpersonal.data.synthetic_movielens import write_movielens_100k_layout

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_FETCH_ML100K = _REPO_ROOT.parent / 'shared' / 'data' / 'fetch-movielens-100k'

_GOOD_100K_LINE = '196\t242\t3\t881250949'


def _frame(rows):
    """Builds a ratings frame with the loader's dtypes from (user, item, rating, timestamp) tuples."""
    users, items, ratings, times = zip(*rows)
    return pd.DataFrame(
        {
            'user_id': np.asarray(users, dtype=np.int64),
            'item_id': np.asarray(items, dtype=np.int64),
            'rating': np.asarray(ratings, dtype=np.float32),
            'timestamp': np.asarray(times, dtype=np.int64),
        }
    )


@pytest.fixture(scope='module')
def synthetic_data():
    return movielens.preprocess_ratings(generate_movielens_like(seed=0), max_examples_per_user=None)


# ---------------------------------------------------------------------------------------------------------------
# load_ratings
# ---------------------------------------------------------------------------------------------------------------


def test_round_trip_100k_layout(tmp_path):
    ratings = generate_movielens_like(
        num_users=60, num_items=200, min_ratings_per_user=5, mean_ratings_per_user=30, seed=3
    )
    path = write_movielens_100k_layout(ratings, str(tmp_path))
    assert path == os.path.join(str(tmp_path), 'u.data')
    loaded = movielens.load_ratings(str(tmp_path))
    pd.testing.assert_frame_equal(loaded, ratings)
    assert list(loaded.columns) == ['user_id', 'item_id', 'rating', 'timestamp']
    assert [str(t) for t in loaded.dtypes] == ['int64', 'int64', 'float32', 'int64']
    pd.testing.assert_frame_equal(movielens.load_ratings(str(tmp_path), variant='100k'), ratings)


def test_load_1m_layout(tmp_path):
    (tmp_path / 'ratings.dat').write_text(
        '1::1193::5::978300760\n1::661::3::978302109\n6040::1097::4::956715569\n2::3952::1::978298709\n'
    )
    for variant in ('auto', '1m'):
        loaded = movielens.load_ratings(str(tmp_path), variant=variant)
        expected = _frame(
            [(1, 1193, 5, 978300760), (1, 661, 3, 978302109), (6040, 1097, 4, 956715569), (2, 3952, 1, 978298709)]
        )
        pd.testing.assert_frame_equal(loaded, expected)


def test_load_accepts_crlf_and_trailing_blank_lines(tmp_path):
    (tmp_path / 'u.data').write_bytes(b'1\t2\t3\t100\r\n4\t5\t4.5\t200\r\n\r\n\n')
    loaded = movielens.load_ratings(str(tmp_path))
    pd.testing.assert_frame_equal(loaded, _frame([(1, 2, 3.0, 100), (4, 5, 4.5, 200)]))


def test_auto_variant_with_both_files_is_an_error_and_explicit_variant_chooses(tmp_path):
    (tmp_path / 'u.data').write_text('1\t2\t3\t100\n')
    (tmp_path / 'ratings.dat').write_text('7::8::5::300\n')
    with pytest.raises(MovieLensFormatError, match='variant'):
        movielens.load_ratings(str(tmp_path))
    assert movielens.load_ratings(str(tmp_path), variant='100k')['user_id'].tolist() == [1]
    assert movielens.load_ratings(str(tmp_path), variant='1m')['user_id'].tolist() == [7]


def test_unknown_variant_raises(tmp_path):
    with pytest.raises(ValueError, match='variant'):
        movielens.load_ratings(str(tmp_path), variant='10m')


def _good_lines(n):
    return [f'{u}\t{u + 10}\t{1 + u % 5}\t{880000000 + u}' for u in range(1, n + 1)]


@pytest.mark.parametrize(
    'lines, bad_line, fragments',
    [
        (
            _good_lines(16) + ['1\t2\t3'] + _good_lines(3),
            17,
            ['expected 4 tab-separated fields (user, item, rating, timestamp), got 3'],
        ),
        (_good_lines(2) + ['1\t2\t3\t4\t5'], 3, ['expected 4 tab-separated fields', 'got 5']),
        (_good_lines(2) + ['abc\t2\t3\t4'], 3, ["user id 'abc' is not a non-negative integer"]),
        (_good_lines(4) + ['1\t2.5\t3\t4'], 5, ["item id '2.5' is not a non-negative integer"]),
        (['1\t-2\t3\t4'], 1, ["item id '-2' is not a non-negative integer"]),
        (_good_lines(6) + ['1\t2\t3\tnow'], 7, ["timestamp 'now' is not a non-negative integer"]),
        (_good_lines(8) + ['1\t2\t7\t4'] + _good_lines(2), 9, ['rating 7 is outside the valid range 1..5']),
        (_good_lines(3) + ['1\t2\t0\t4'], 4, ['rating 0 is outside the valid range 1..5']),
        (_good_lines(1) + ['1\t2\tfive\t4'], 2, ["rating 'five' is not a number"]),
        (_good_lines(1) + ['1\t2\t-1\t4'], 2, ['rating -1 is outside the valid range 1..5']),
        (['1\t2\t-0.5\t4'], 1, ['rating -0.5 is outside the valid range 1..5']),
        (['1\t2\t1e1\t4'], 1, ['rating 1e1 is outside the valid range 1..5']),
        (['1\t2\tnan\t4'], 1, ["rating 'nan' is not a number"]),
        (['1\t2\t3.1234567\t4'], 1, ["rating '3.1234567' is not a plain decimal number"]),
        (_good_lines(2) + [''] + _good_lines(2), 3, ['empty line']),
        (['1\t2\t3\t99999999999999999999'], 1, ['too large']),
    ],
)
def test_malformed_100k_lines(tmp_path, lines, bad_line, fragments):
    (tmp_path / 'u.data').write_text('\n'.join(lines) + '\n')
    with pytest.raises(MovieLensFormatError) as info:
        movielens.load_ratings(str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / 'u.data') in message
    assert f'u.data line {bad_line}:' in message
    for fragment in fragments:
        assert fragment in message
    assert info.value.line == bad_line
    assert info.value.path == str(tmp_path / 'u.data')


def test_malformed_1m_line_names_file_and_line(tmp_path):
    (tmp_path / 'ratings.dat').write_text('1::2::3::4\n1::2::3::5\n1\t2\t3\t6\n')
    with pytest.raises(MovieLensFormatError) as info:
        movielens.load_ratings(str(tmp_path))
    message = str(info.value)
    assert 'ratings.dat line 3:' in message
    assert "expected 4 '::'-separated fields (user, item, rating, timestamp), got 1" in message
    assert info.value.line == 3


def test_1m_rating_out_of_range(tmp_path):
    (tmp_path / 'ratings.dat').write_text('1::2::3::4\n1::3::6::5\n')
    with pytest.raises(MovieLensFormatError, match=r'ratings\.dat line 2: rating 6 is outside'):
        movielens.load_ratings(str(tmp_path))


@pytest.mark.parametrize('content', ['', '\n', '\n\n\r\n'])
def test_empty_file(tmp_path, content):
    (tmp_path / 'u.data').write_text(content)
    with pytest.raises(MovieLensFormatError) as info:
        movielens.load_ratings(str(tmp_path))
    assert 'u.data line 1:' in str(info.value)
    assert 'empty' in str(info.value)
    assert info.value.line == 1


def test_missing_directory(tmp_path):
    missing = tmp_path / 'no-such-dir'
    with pytest.raises(MovieLensFormatError) as info:
        movielens.load_ratings(str(missing))
    message = str(info.value)
    assert str(missing) in message and 'does not exist' in message
    assert "'u.data'" in message and "'ratings.dat'" in message
    assert info.value.line is None


@pytest.mark.parametrize('variant', ['auto', '100k', '1m'])
def test_missing_files_lists_both_layouts(tmp_path, variant):
    (tmp_path / 'u.item').write_text('1|Toy Story (1995)\n')
    with pytest.raises(MovieLensFormatError) as info:
        movielens.load_ratings(str(tmp_path), variant=variant)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "'u.data'" in message and "'ratings.dat'" in message


def test_variant_1m_with_only_100k_file_is_missing(tmp_path):
    (tmp_path / 'u.data').write_text(_GOOD_100K_LINE + '\n')
    with pytest.raises(MovieLensFormatError, match="no 'ratings.dat' file"):
        movielens.load_ratings(str(tmp_path), variant='1m')


# ---------------------------------------------------------------------------------------------------------------
# preprocess_ratings
# ---------------------------------------------------------------------------------------------------------------


def test_preprocess_cap_keeps_earliest_with_item_tie_break():
    raw = _frame(
        [
            (50, 9, 1, 500),
            (50, 7, 2, 300),
            (50, 8, 3, 300),
            (50, 3, 4, 100),
            (50, 1, 5, 900),  # user 50: 5 rows
            (20, 8, 4, 10),
            (20, 3, 2, 5),
        ]
    )
    data = movielens.preprocess_ratings(raw, max_examples_per_user=3)
    # User 50 keeps t=100 (item 3), t=300 (items 7 then 8); drops t=500 (item 9) and t=900 (item 1).
    assert data.num_users == 2
    np.testing.assert_array_equal(data.user_ids, [20, 50])
    np.testing.assert_array_equal(data.item_ids, [3, 7, 8])  # items 1 and 9 lost all their ratings
    assert data.num_items == 3
    r = data.ratings
    user50 = r[r.user_id == 1]
    assert data.item_ids[user50.item_id].tolist() == [3, 7, 8]
    assert user50.timestamp.tolist() == [100, 300, 300]
    assert user50.rating.tolist() == [4.0, 2.0, 3.0]
    user20 = r[r.user_id == 0]
    assert data.item_ids[user20.item_id].tolist() == [3, 8]
    assert user20.timestamp.tolist() == [5, 10]
    assert [str(t) for t in r.dtypes] == ['int64', 'int64', 'float32', 'int64']
    assert r.index.equals(pd.RangeIndex(len(r)))


def test_preprocess_matches_independent_computation():
    raw = generate_movielens_like(num_users=80, num_items=300, min_ratings_per_user=5, mean_ratings_per_user=40, seed=5)
    raw = raw.sample(frac=1.0, random_state=0).reset_index(drop=True)  # the loader keeps file order
    cap = 25
    data = movielens.preprocess_ratings(raw, max_examples_per_user=cap)
    expected = raw.sort_values(['user_id', 'timestamp', 'item_id']).groupby('user_id', group_keys=False).head(cap)
    r = data.ratings
    # Dense ids cover 0..n-1 and the mapping arrays invert the remapping.
    assert sorted(r.user_id.unique()) == list(range(data.num_users))
    assert sorted(r.item_id.unique()) == list(range(data.num_items))
    assert np.all(np.diff(data.user_ids) > 0) and np.all(np.diff(data.item_ids) > 0)
    restored = pd.DataFrame(
        {
            'user_id': data.user_ids[r.user_id],
            'item_id': data.item_ids[r.item_id],
            'rating': r.rating,
            'timestamp': r.timestamp,
        }
    )
    pd.testing.assert_frame_equal(restored, expected.reset_index(drop=True))
    assert r.groupby('user_id').size().max() == cap
    # Sorted by (user, timestamp, item).
    keys = list(zip(r.user_id, r.timestamp, r.item_id))
    assert keys == sorted(keys)


def test_preprocess_without_cap_keeps_everything(synthetic_data):
    assert len(synthetic_data.ratings) == len(generate_movielens_like(seed=0))
    assert synthetic_data.num_users == 943


def test_preprocess_rejects_bad_arguments():
    raw = _frame([(1, 2, 3, 4)])
    with pytest.raises(ValueError, match='max_examples_per_user'):
        movielens.preprocess_ratings(raw, max_examples_per_user=0)
    with pytest.raises(ValueError, match='missing columns'):
        movielens.preprocess_ratings(raw.drop(columns='timestamp'))
    with pytest.raises(ValueError, match='empty'):
        movielens.preprocess_ratings(raw.iloc[:0])


# ---------------------------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------------------------


def test_split_by_user(synthetic_data):
    train, val, test = movielens.split_by_user(synthetic_data, seed=1)
    assert (len(train), len(val), len(test)) == (754, 94, 95)  # floor(943*.8), floor(943*.1), rest
    assert set(train).isdisjoint(val) and set(train).isdisjoint(test) and set(val).isdisjoint(test)
    assert sorted(train + val + test) == list(range(943))
    assert all(isinstance(u, int) for u in train + val + test)
    assert movielens.split_by_user(synthetic_data, seed=1) == (train, val, test)
    other = movielens.split_by_user(synthetic_data, seed=2)
    assert other[0] != train and other[2] != test
    n = synthetic_data.num_users
    expected_train = sorted(int(u) for u in np.random.default_rng(1).permutation(n)[:754])
    assert train == expected_train


def test_split_by_user_fraction_floor_is_robust():
    data = movielens.preprocess_ratings(_frame([(u, 1, 3, 0) for u in range(100)]))
    train, val, test = movielens.split_by_user(data, train_fraction=0.29, val_fraction=0.58)
    assert (len(train), len(val), len(test)) == (29, 58, 13)


def test_split_by_time_invariants(synthetic_data):
    train, val, test = movielens.split_by_time(synthetic_data)
    assert len(train) + len(val) + len(test) == len(synthetic_data.ratings)
    joined = pd.concat([train, val, test]).sort_values(['user_id', 'timestamp', 'item_id'])
    pd.testing.assert_frame_equal(joined.reset_index(drop=True), synthetic_data.ratings)
    counts = synthetic_data.ratings.groupby('user_id').size()
    users = set(counts.index[counts >= 3])
    assert users == set(train.user_id) == set(val.user_id) == set(test.user_id)
    t_max = train.groupby('user_id').timestamp.max()
    v_min, v_max = val.groupby('user_id').timestamp.min(), val.groupby('user_id').timestamp.max()
    s_min = test.groupby('user_id').timestamp.min()
    assert (t_max <= v_min).all() and (v_max <= s_min).all()
    # floor(0.8 n) train rows for users where no minimum forces an adjustment.
    train_counts = train.groupby('user_id').size()
    np.testing.assert_array_equal(train_counts[counts.index], np.floor(counts * 0.8).astype(int))


def test_split_by_time_small_users_and_rule():
    rows = []
    sizes = {0: 1, 1: 2, 2: 3, 3: 4, 4: 10, 5: 20, 6: 11}
    for user, n in sizes.items():
        rows += [(user, item, 3, 1000 - item) for item in range(n)]  # later item -> earlier timestamp
    data = movielens.preprocess_ratings(_frame(rows), max_examples_per_user=None)
    parts = movielens.split_by_time(data)
    got = {user: tuple(int((p.user_id == user).sum()) for p in parts) for user in sizes}
    assert got == {0: (1, 0, 0), 1: (1, 0, 1), 2: (1, 1, 1), 3: (2, 1, 1), 4: (8, 1, 1), 5: (16, 2, 2), 6: (8, 1, 2)}
    train = parts[0]
    # User 4's train rows are its 8 earliest ratings, in time order.
    assert train[train.user_id == 4].timestamp.tolist() == list(range(991, 999))
    no_val = movielens.split_by_time(data, train_fraction=0.5, val_fraction=0.0)
    assert len(no_val[1]) == 0
    assert int((no_val[0].user_id == 2).sum()) == 1 and int((no_val[2].user_id == 2).sum()) == 2
    with pytest.raises(ValueError):
        movielens.split_by_time(data, train_fraction=0.9, val_fraction=0.2)


def test_split_by_time_ties_keep_order():
    rows = [(1, item, 3, 100) for item in (5, 3, 9, 1, 7, 2, 8, 4, 6, 0)]
    data = movielens.preprocess_ratings(_frame(rows), max_examples_per_user=None)
    train, val, test = movielens.split_by_time(data)
    assert data.item_ids[train.item_id].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert data.item_ids[val.item_id].tolist() == [8]
    assert data.item_ids[test.item_id].tolist() == [9]


# ---------------------------------------------------------------------------------------------------------------
# to_client_data
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def small_data():
    raw = generate_movielens_like(num_users=30, num_items=120, min_ratings_per_user=3, mean_ratings_per_user=15, seed=7)
    return movielens.preprocess_ratings(raw.sample(frac=1.0, random_state=1), max_examples_per_user=None)


def test_to_client_data_structure_counts_and_order(small_data):
    import tensorflow as tf

    ratings = small_data.ratings
    client_data = movielens.to_client_data(ratings)
    assert client_data.client_ids == [str(u) for u in range(small_data.num_users)]
    spec = client_data.element_type_structure
    assert isinstance(spec, collections.OrderedDict)
    assert list(spec) == ['user_id', 'item_id', 'rating', 'timestamp']
    assert [spec[k].dtype for k in spec] == [tf.int64, tf.int64, tf.float32, tf.int64]
    assert all(spec[k].shape == tf.TensorShape([]) for k in spec)
    counts = ratings.groupby('user_id').size()
    for cid in client_data.client_ids:
        elements = list(client_data.create_tf_dataset_for_client(cid).as_numpy_iterator())
        assert len(elements) == counts[int(cid)]
        rows = ratings[ratings.user_id == int(cid)]
        assert [e['user_id'] for e in elements] == [int(cid)] * len(elements)
        assert [e['item_id'] for e in elements] == rows.item_id.tolist()
        assert [e['timestamp'] for e in elements] == rows.timestamp.tolist()
        np.testing.assert_array_equal([e['rating'] for e in elements], rows.rating.to_numpy())
        assert all(np.diff([e['timestamp'] for e in elements]) >= 0)


def test_to_client_data_sorts_unsorted_frames_by_time():
    frame = _frame([(3, 1, 4, 30), (3, 2, 5, 10), (3, 0, 1, 20), (1, 4, 2, 5)])
    client_data = movielens.to_client_data(frame)
    assert client_data.client_ids == ['1', '3']
    elements = list(client_data.create_tf_dataset_for_client('3').as_numpy_iterator())
    assert [e['timestamp'] for e in elements] == [10, 20, 30]
    assert [e['item_id'] for e in elements] == [2, 0, 1]


def test_to_client_data_subset_and_errors(small_data):
    ratings = small_data.ratings
    client_data = movielens.to_client_data(ratings, [5, 2, 11])
    assert client_data.client_ids == ['5', '2', '11']
    assert len(list(client_data.create_tf_dataset_for_client('11'))) == int((ratings.user_id == 11).sum())
    with pytest.raises(ValueError):
        client_data.create_tf_dataset_for_client('3')
    without_7 = ratings[ratings.user_id != 7]
    with pytest.raises(ValueError, match='user 7 has no rows'):
        movielens.to_client_data(without_7, [1, 7])
    with pytest.raises(ValueError, match='more than once'):
        movielens.to_client_data(ratings, [1, 2, 1])


def test_to_client_data_is_traceable(small_data):
    """The dataset fn also works on string tensors (tf.function / TFF serialization paths)."""
    import tensorflow as tf

    ratings = small_data.ratings
    users = [4, 0, 9]
    client_data = movielens.to_client_data(ratings, users)
    all_clients = client_data.create_tf_dataset_from_all_clients(seed=0)
    assert all_clients.element_spec == client_data.element_type_structure
    got = sorted((int(e['user_id']), int(e['timestamp']), int(e['item_id'])) for e in all_clients.as_numpy_iterator())
    subset = ratings[ratings.user_id.isin(users)]
    assert got == sorted(zip(subset.user_id, subset.timestamp, subset.item_id))

    @tf.function
    def timestamps(client_id):
        return (
            client_data.serializable_dataset_fn(client_id)
            .map(lambda e: e['timestamp'])
            .reduce(tf.constant(0, tf.int64), lambda acc, t: acc + t)
        )

    assert int(timestamps(tf.constant('9'))) == int(ratings[ratings.user_id == 9].timestamp.sum())
    with pytest.raises(tf.errors.InvalidArgumentError):
        timestamps(tf.constant('5'))  # not one of the selected users

    # TFF serializes the same function into a computation (used by e.g. compose_dataset_computation...).
    dataset = client_data.dataset_computation('4')
    elements = list(dataset.as_numpy_iterator())
    rows = ratings[ratings.user_id == 4]
    assert [e['item_id'] for e in elements] == rows.item_id.tolist()
    assert [e['timestamp'] for e in elements] == rows.timestamp.tolist()


# ---------------------------------------------------------------------------------------------------------------
# dataset_statistics
# ---------------------------------------------------------------------------------------------------------------


def test_dataset_statistics():
    data = movielens.preprocess_ratings(
        _frame([(1, 10, 5, 1), (1, 11, 4, 2), (1, 12, 4, 3), (2, 10, 1, 4), (3, 12, 4, 5), (3, 11, 3, 6)])
    )
    stats = movielens.dataset_statistics(data)
    assert stats['num_users'] == 3 and stats['num_items'] == 3 and stats['num_ratings'] == 6
    assert stats['ratings_per_user_mean'] == 2.0
    assert stats['ratings_per_user_min'] == 1 and stats['ratings_per_user_max'] == 3
    assert stats['ratings_per_user_median'] == 2.0
    assert stats['rating_histogram'] == {1.0: 1, 3.0: 1, 4.0: 3, 5.0: 1}
    # Integer sums and one float64 division each: exact.
    assert stats['density'] == 6 / 9
    assert stats['rating_mean'] == 21 / 6
    assert (stats['timestamp_min'], stats['timestamp_max']) == (1, 6)


# ---------------------------------------------------------------------------------------------------------------
# Real MovieLens 100K (skipped when unavailable)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def ml100k_dir(tmp_path_factory):
    env_dir = os.environ.get('FEDPERSONAL_ML100K_DIR')
    if env_dir:
        if not os.path.isfile(os.path.join(env_dir, 'u.data')):
            pytest.skip(f'FEDPERSONAL_ML100K_DIR={env_dir} has no u.data')
        return env_dir
    if not _FETCH_ML100K.is_file():
        pytest.skip(f'MovieLens 100K unavailable: set FEDPERSONAL_ML100K_DIR ({_FETCH_ML100K} not found)')
    dest = tmp_path_factory.mktemp('ml-100k')
    # The script runs `python3 -m pip download`; the project venv (uv-built) has no pip, so let `python3` resolve
    # outside the active virtual environment.
    env = dict(os.environ)
    venv = env.pop('VIRTUAL_ENV', None)
    if venv:
        venv_bin = os.path.join(venv, 'bin')
        env['PATH'] = os.pathsep.join(
            p for p in env.get('PATH', '').split(os.pathsep) if os.path.abspath(p) != os.path.abspath(venv_bin)
        )
    try:
        subprocess.run([str(_FETCH_ML100K), str(dest)], check=True, capture_output=True, timeout=120, env=env)
    except subprocess.CalledProcessError as e:
        pytest.skip(f'fetching MovieLens 100K failed: {e}: {e.stderr.decode(errors="replace")[-500:]}')
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f'fetching MovieLens 100K failed: {e}')
    return str(dest)


def test_real_movielens_100k(ml100k_dir):
    raw = movielens.load_ratings(ml100k_dir)
    assert len(raw) == 100_000
    assert raw.user_id.nunique() == 943 and raw.item_id.nunique() == 1682
    assert raw.user_id.min() == 1 and raw.user_id.max() == 943
    assert raw.item_id.min() == 1 and raw.item_id.max() == 1682
    assert raw.groupby('user_id').size().min() >= 20
    assert set(raw.rating.unique()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    data = movielens.preprocess_ratings(raw, max_examples_per_user=None)
    stats = movielens.dataset_statistics(data)
    assert (stats['num_users'], stats['num_items'], stats['num_ratings']) == (943, 1682, 100_000)
    assert stats['ratings_per_user_min'] == 20 and stats['ratings_per_user_max'] == 737
    assert stats['rating_histogram'] == {1.0: 6110, 2.0: 11370, 3.0: 27145, 4.0: 34174, 5.0: 21201}
    capped = movielens.preprocess_ratings(raw)  # default cap 300
    assert capped.ratings.groupby('user_id').size().max() == 300
    assert capped.num_users == 943
