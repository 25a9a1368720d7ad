"""Tests for fedpersonal.data.movielens_likes (MovieLens 100K as a binary FURL task)."""

import logging as std_logging
import os
import pathlib
import subprocess
import tempfile

import numpy as np
import pytest
from absl import logging

from fedpersonal.data import movielens_likes
from fedpersonal.data.movielens import MovieLensFormatError

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_FETCH_ML100K = _REPO_ROOT.parent / 'shared' / 'data' / 'fetch-movielens-100k'

_FLAGS_COMEDY = '|'.join('1' if g == 'Comedy' else '0' for g in movielens_likes.GENRES)
_FLAGS_DRAMA_WAR = '|'.join('1' if g in ('Drama', 'War') else '0' for g in movielens_likes.GENRES)
_ITEMS = (
    f'1|Toy Story (1995)|01-Jan-1995||http://us.imdb.com/M/title-exact?Toy%20Story%20(1995)|{_FLAGS_COMEDY}\n'
    f'5|Misérables, Les (1995)|||http://x|{_FLAGS_DRAMA_WAR}\n'
    f'3|Four Rooms (1995)||||{_FLAGS_COMEDY}\n'
)


def _write(tmp_path, ratings, items=_ITEMS):
    """ratings: (user, item, rating, timestamp) tuples -> u.data; items: u.item text (latin-1)."""
    (tmp_path / 'u.data').write_text(''.join(f'{u}\t{i}\t{r}\t{t}\n' for u, i, r, t in ratings))
    (tmp_path / 'u.item').write_bytes(items.encode('latin-1'))
    return str(tmp_path)


# User 10: 5 ratings (timestamps out of file order), user 20: 3 ratings, user 30: 2 ratings (dropped by min_ratings).
_RATINGS = [
    (10, 1, 5, 500),
    (10, 5, 2, 100),
    (10, 3, 4, 300),
    (10, 1, 1, 200),
    (10, 5, 3, 400),
    (20, 3, 4, 50),
    (20, 1, 4, 60),
    (20, 5, 1, 70),
    (30, 1, 5, 10),
    (30, 3, 5, 20),
]


def _rows(client_data, client_id):
    return list(client_data.create_tf_dataset_for_client(client_id).as_numpy_iterator())


def test_load_small_files(tmp_path):
    data = movielens_likes.load_movielens_likes(_write(tmp_path, _RATINGS), min_ratings=3, max_chars=12)
    assert (data.num_users, data.num_classes, data.num_features, data.max_chars, data.num_items) == (2, 2, 19, 12, 0)
    np.testing.assert_array_equal(data.user_ids, [10, 20])
    # User 10 in time order: t=100 item 5 r2, t=200 item 1 r1, t=300 item 3 r4, t=400 item 5 r3, t=500 item 1 r5.
    train = _rows(data.train, '0')
    assert [r['label'] for r in train] == [0, 0, 1]  # 5 -> 3/1/1
    assert [r['label'] for r in _rows(data.eval, '0')] == [0]
    assert [r['label'] for r in _rows(data.test, '0')] == [1]
    assert [r['label'] for r in _rows(data.train, '1')] == [1]
    # Chars: the lowercased title, truncated to 12 characters.
    decode = {i: c for c, i in data.char_vocab.items()}
    titles = [''.join(decode.get(int(c), '?') for c in r['chars'] if c) for r in train]
    assert titles == ['misérables, ', 'toy story (1', 'four rooms (']
    genres = list(movielens_likes.GENRES)
    np.testing.assert_array_equal(np.flatnonzero(train[0]['features']), [genres.index('Drama'), genres.index('War')])
    np.testing.assert_array_equal(np.flatnonzero(train[1]['features']), [genres.index('Comedy')])
    assert all(r['user_id'] == 0 for r in train)
    np.testing.assert_array_equal(data.user_positive_rate, [1 / 3, 1.0])  # Counts' float64 quotients.
    assert 'movie title' in data.description


# Both users rate movie 5 last: their one test rating names a movie no training rating has.
_LAST_MOVIE_UNSEEN = [(10, 1, 5, 1), (10, 3, 4, 2), (10, 1, 3, 3), (10, 3, 2, 4), (10, 5, 4, 5)]
_LAST_MOVIE_UNSEEN += [(20, 1, 4, 1), (20, 3, 4, 2), (20, 5, 1, 3)]


def test_test_movies_never_rated_in_training_are_warned_about_and_shuffle_reorders(tmp_path, caplog):
    logging.set_verbosity(logging.INFO)
    caplog.set_level(std_logging.INFO, logger='absl')
    directory = _write(tmp_path, _LAST_MOVIE_UNSEEN)
    data = movielens_likes.load_movielens_likes(directory, min_ratings=3)
    (warning,) = [r.message for r in caplog.records if r.levelno == std_logging.WARNING and 'never occur' in r.message]
    assert warning.startswith(os.path.join(directory, 'u.data') + ': 2 of 2 test rows (100.0%) name movies')
    assert 'a model knows them only by their text and features' in warning  # Titles and genres, not ids.
    assert [r['label'] for r in _rows(data.test, '0')] == [1]  # Movie 5 at t=5, rated 4.

    # A seeded shuffle of each user's ratings: another split, the same for the same seed.
    caplog.clear()
    test_labels = lambda d: [[int(r['label']) for r in _rows(d.test, c)] for c in ('0', '1')]
    shuffled = [
        movielens_likes.load_movielens_likes(directory, min_ratings=3, split_order='random', seed=s) for s in range(6)
    ]
    assert test_labels(shuffled[0]) == test_labels(
        movielens_likes.load_movielens_likes(directory, min_ratings=3, split_order='random', seed=0)
    )
    assert any(test_labels(d) != test_labels(data) for d in shuffled)


def test_include_item_id_uses_dense_movie_index(tmp_path):
    data = movielens_likes.load_movielens_likes(_write(tmp_path, _RATINGS), min_ratings=3, include_item_id=True)
    assert data.num_items == 3
    # Dense index = rank of the GroupLens id among u.item's ids (1, 3, 5).
    assert [int(r['item_id']) for r in _rows(data.train, '0')] == [2, 0, 1]


def test_min_ratings_filters_users(tmp_path):
    data = movielens_likes.load_movielens_likes(_write(tmp_path, _RATINGS), min_ratings=3)
    assert data.num_users == 2
    with pytest.raises(ValueError, match='min_ratings'):
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=2)
    with pytest.raises(ValueError, match='no user'):
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=6)


@pytest.mark.parametrize(
    'bad_line, message',
    [
        ('7|Short||||0|1', r'line 2: expected 24 "\|"-separated fields'),
        (f'x|Title||||{_FLAGS_COMEDY}', "line 2: item id 'x' is not a non-negative integer"),
        (f'1|Again||||{_FLAGS_COMEDY}', 'line 2: duplicate item id 1 \\(first on line 1\\)'),
        (f'7| ||||{_FLAGS_COMEDY}', 'line 2: item 7 has an empty title'),
        ('7|T||||' + _FLAGS_COMEDY.replace('1', '2'), "line 2: genre flag 'Comedy' of item 7 is '2'"),
        ('', 'line 2: expected 24'),
    ],
)
def test_malformed_u_item_names_file_and_line(tmp_path, bad_line, message):
    items = _ITEMS.split('\n')
    items.insert(1, bad_line)
    _write(tmp_path, _RATINGS, '\n'.join(items))
    with pytest.raises(MovieLensFormatError, match=message) as info:
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=3)
    assert str(tmp_path / 'u.item') in str(info.value)
    assert info.value.line == 2 and info.value.path == str(tmp_path / 'u.item')


def test_missing_u_item_and_unknown_items(tmp_path):
    _write(tmp_path, _RATINGS)
    os.remove(tmp_path / 'u.item')
    with pytest.raises(MovieLensFormatError, match="no 'u.item' file"):
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=3)
    _write(tmp_path, _RATINGS + [(40, 99, 3, 1)])
    with pytest.raises(MovieLensFormatError, match=r'u\.data line 11: item 99 is not in .*u\.item') as info:
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=3)
    assert info.value.line == 11


def test_malformed_u_data_is_reported_by_the_ratings_loader(tmp_path):
    (tmp_path / 'u.item').write_text(_ITEMS)
    (tmp_path / 'u.data').write_text('10\t1\t5\t500\n10\t1\tfive\t600\n')
    with pytest.raises(MovieLensFormatError, match=r'u\.data line 2: rating .five. is not a number'):
        movielens_likes.load_movielens_likes(str(tmp_path), min_ratings=3)


# ---------------------------------------------------------------------------------------------------------------
# Real MovieLens 100K (skipped when unavailable)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def ml100k_dir():
    env_dir = os.environ.get('FEDPERSONAL_ML100K_DIR')
    if env_dir:
        if not os.path.isfile(os.path.join(env_dir, 'u.item')):
            pytest.skip(f'FEDPERSONAL_ML100K_DIR={env_dir} has no u.item')
        return env_dir
    if not _FETCH_ML100K.is_file():
        pytest.skip(f'MovieLens 100K unavailable: set FEDPERSONAL_ML100K_DIR ({_FETCH_ML100K} not found)')
    # A fixed cache directory: the fetch script is idempotent and returns at once when the files are verified.
    dest = os.path.join(tempfile.gettempdir(), f'fedpersonal-ml100k-{os.getuid()}')
    env = dict(os.environ)
    venv = env.pop('VIRTUAL_ENV', None)  # The script runs `python3 -m pip`; the uv-built venv has no pip.
    if venv:
        venv_bin = os.path.join(venv, 'bin')
        env['PATH'] = os.pathsep.join(
            p for p in env.get('PATH', '').split(os.pathsep) if os.path.abspath(p) != os.path.abspath(venv_bin)
        )
    try:
        subprocess.run([str(_FETCH_ML100K), dest], check=True, capture_output=True, timeout=120, env=env)
    except subprocess.CalledProcessError as e:
        pytest.skip(f'fetching MovieLens 100K failed: {e}: {e.stderr.decode(errors="replace")[-500:]}')
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f'fetching MovieLens 100K failed: {e}')
    return dest


def test_real_movielens_likes(ml100k_dir):
    items = movielens_likes.load_movie_items(ml100k_dir)
    assert len(items) == 1682 and items['item_id'].tolist() == list(range(1, 1683))
    assert items['title'].iloc[0] == 'Toy Story (1995)'
    data = movielens_likes.load_movielens_likes(ml100k_dir)
    stats = data.statistics()
    assert (stats['num_users'], stats['num_examples'], stats['num_features']) == (943, 100_000, 19)
    assert (stats['num_train_examples'], stats['num_eval_examples'], stats['num_test_examples']) == (
        79_619,
        9_596,
        10_785,
    )
    assert stats['positive_rate'] == 55_375 / 100_000  # ratings 4 and 5 (the integer labels' mean: one division)
    assert stats['examples_per_user_min'] == 20 and stats['examples_per_user_max'] == 737
    assert data.train.client_ids == data.test.client_ids == [str(u) for u in range(943)]
    assert data.user_positive_rate.shape == (943,)
    assert 0.5 < data.user_positive_rate.mean() < 0.65 and data.user_positive_rate.std() > 0.1
    assert data.char_vocab_size < 80 and {'a', 'z', '(', '1'} <= set(data.char_vocab)
