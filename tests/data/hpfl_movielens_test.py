"""Tests for fedpersonal.data.hpfl_movielens (MovieLens 100K as regional HPFL silos)."""

import os
import pathlib

import numpy as np
import pandas as pd
import pytest

from fedpersonal.data import hpfl_movielens
from fedpersonal.data import movielens_likes
from fedpersonal.data import user_modeling
from fedpersonal.data.movielens import MovieLensFormatError
from fedpersonal.data.synthetic_movielens import write_movielens_100k_layout
from tests import tolerances

_REAL_DIR = pathlib.Path(os.environ.get('FEDPERSONAL_ML100K_DIR', '/work/data/ml-100k'))


def _flags(*genres):
    return '|'.join('1' if g in genres else '0' for g in movielens_likes.GENRES)


_ITEMS = (
    f'1|Toy Story (1995)|01-Jan-1995|||{_flags("Animation", "Comedy")}\n'
    f'2|GoldenEye (1995)||||{_flags("Action", "Thriller")}\n'
    f'3|Four Rooms (1995)||||{_flags("Comedy")}\n'
    f'4|Unknown (1996)||||{_flags("unknown")}\n'
)
# Users 1 (zip 02139: region 0), 2 and 3 (94043, 90210: region 9), 4 (Canadian T8H1N: non-numeric).
_USERS = '1|24|M|technician|02139\n2|53|F|other|94043\n3|23|M|writer|90210\n4|33|F|other|T8H1N\n'
# (user, item, rating, timestamp); user 2's ratings are out of time order in the file.
_RATINGS = [
    (2, 1, 5, 500),
    (1, 1, 4, 10),
    (2, 2, 3, 100),
    (1, 2, 2, 20),
    (2, 3, 4, 300),
    (1, 3, 1, 30),
    (2, 1, 2, 200),
    (3, 3, 5, 1),
    (3, 1, 4, 2),
    (3, 2, 3, 3),
    (4, 4, 1, 7),
    (4, 1, 2, 8),
    (4, 2, 3, 9),
]


def _write(tmp_path, ratings=_RATINGS, users=_USERS, items=_ITEMS):
    frame = pd.DataFrame(ratings, columns=['user_id', 'item_id', 'rating', 'timestamp'])
    write_movielens_100k_layout(frame, str(tmp_path))
    (tmp_path / 'u.user').write_bytes(users.encode('latin-1'))
    (tmp_path / 'u.item').write_bytes(items.encode('latin-1'))
    return str(tmp_path)


def test_small_files(tmp_path):
    data = hpfl_movielens.load_movielens_silos(_write(tmp_path))
    assert (data.name, data.task, data.rating_range, data.num_attributes) == ('movielens_100k', 'rating', (1, 5), 19)
    assert data.attribute_names == list(movielens_likes.GENRES)
    assert [s.client_id for s in data.silos] == ['zip_region_0', 'zip_region_9']  # User 4 (T8H1N) dropped.
    region0, region9 = data.silos
    np.testing.assert_array_equal(region0.global_user_ids, [1])
    np.testing.assert_array_equal(region0.label, [4, 2, 1])
    np.testing.assert_array_equal(region0.split, [0, 1, 2])
    np.testing.assert_array_equal(region9.global_user_ids, [2, 3])
    np.testing.assert_array_equal(region9.global_item_ids, [1, 2, 3])
    # User 2 in time order: (2, 100, r3), (1, 200, r2), (3, 300, r4), (1, 500, r5) -> 4 ratings = 2/1/1.
    np.testing.assert_array_equal(region9.user, [0, 0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(region9.item, [1, 0, 2, 0, 2, 0, 1])
    np.testing.assert_array_equal(region9.label, [3, 2, 4, 5, 5, 4, 3])
    np.testing.assert_array_equal(region9.split, [0, 0, 1, 2, 0, 1, 2])
    genres = list(movielens_likes.GENRES)
    toy_story = region9.item_attributes[0]
    assert [genres[k] for k in np.flatnonzero(toy_story)] == ['Animation', 'Comedy']
    stats = user_modeling.statistics(data)
    assert (stats['num_users'], stats['num_items'], stats['num_records']) == (3, 3, 10)
    # Integer counts' float32 mean: the sum exact, the division rounded once.
    assert stats['attributes_per_item'] == pytest.approx(5 / 3, rel=tolerances.U32)


def test_non_numeric_zip_own_client(tmp_path):
    data = hpfl_movielens.load_movielens_silos(_write(tmp_path), non_numeric_zip='own_client')
    assert [s.client_id for s in data.silos] == ['zip_region_0', 'zip_region_9', 'zip_region_other']
    other = data.silos[2]
    np.testing.assert_array_equal(other.global_user_ids, [4])
    np.testing.assert_array_equal(other.global_item_ids, [1, 2, 4])
    np.testing.assert_array_equal(other.item, [2, 0, 1])  # Time order: items 4, 1, 2.
    assert [movielens_likes.GENRES[k] for k in np.flatnonzero(other.item_attributes[2])] == ['unknown']


def test_zip_region():
    assert [hpfl_movielens.zip_region(z) for z in ('02139', '9', 'T8H1N', 'E2A4H', '٣1234')] == [
        '0',
        '9',
        'other',
        'other',
        'other',
    ]


def test_min_ratings_per_user(tmp_path):
    data = hpfl_movielens.load_movielens_silos(_write(tmp_path), min_ratings_per_user=4)
    assert [list(s.global_user_ids) for s in data.silos] == [[2]]
    with pytest.raises(ValueError, match='no user with >= 5 ratings'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path), min_ratings_per_user=5)
    with pytest.raises(ValueError, match='min_ratings_per_user must be >= 3'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path), min_ratings_per_user=2)
    with pytest.raises(ValueError, match='non_numeric_zip'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path), non_numeric_zip='canada')


def test_load_movie_users(tmp_path):
    _write(tmp_path)
    users = hpfl_movielens.load_movie_users(str(tmp_path))
    assert users['user_id'].tolist() == [1, 2, 3, 4]
    assert users['zip_code'].tolist() == ['02139', '94043', '90210', 'T8H1N']
    assert users['age'].dtype == np.int64


@pytest.mark.parametrize(
    'users, message',
    [
        ('1|24|M|technician\n', r'u.user line 1: expected 5 "\|"-separated fields'),
        ('1|24|M|x|02139\nx|3|F|y|1\n', "u.user line 2: user id 'x' is not a non-negative integer"),
        ('1|24|M|x|02139\n1|3|F|y|1\n', r'u.user line 2: duplicate user id 1 \(first on line 1\)'),
        ('1|old|M|x|02139\n', "u.user line 1: age 'old'"),
        ('1|24|M|x| \n', 'u.user line 1: user 1 has an empty zip code'),
    ],
)
def test_malformed_users_name_file_and_line(tmp_path, users, message):
    _write(tmp_path, users=users)
    with pytest.raises(MovieLensFormatError, match=message):
        hpfl_movielens.load_movie_users(str(tmp_path))


def test_unknown_ids_and_missing_files(tmp_path):
    with pytest.raises(MovieLensFormatError, match=r'u.data line 6: user 9 is not in .*u.user'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path, ratings=_RATINGS[:5] + [(9, 1, 3, 1)]))
    with pytest.raises(MovieLensFormatError, match=r'u.data line 1: item 7 is not in .*u.item'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path, ratings=[(1, 7, 3, 1)] + _RATINGS))
    no_genre = _ITEMS.replace(f'3|Four Rooms (1995)||||{_flags("Comedy")}', f'3|Four Rooms (1995)||||{_flags()}')
    with pytest.raises(MovieLensFormatError, match=r'u.item line 3: movie 3 has no genre flag set .* 1 rated movies'):
        hpfl_movielens.load_movielens_silos(_write(tmp_path, items=no_genre))
    unrated = _ITEMS + f'5|Never Rated (1997)||||{_flags()}\n'  # Not in any silo: no attribute needed.
    assert hpfl_movielens.load_movielens_silos(_write(tmp_path, items=unrated)).silos
    (tmp_path / 'u.user').unlink()
    with pytest.raises(MovieLensFormatError, match="no 'u.user' file"):
        hpfl_movielens.load_movielens_silos(str(tmp_path))


@pytest.mark.skipif(
    not (_REAL_DIR / 'u.user').is_file(), reason=f'MovieLens 100K not found at {_REAL_DIR} (set FEDPERSONAL_ML100K_DIR)'
)
def test_real_data_matches_the_papers_shape():
    data = hpfl_movielens.load_movielens_silos(str(_REAL_DIR))
    stats = user_modeling.statistics(data)
    # The paper: 10 clients, 925 users, 1,679 items, 19 attributes, 1.72 attributes per item (96,538 records).
    assert (stats['num_clients'], stats['num_users'], stats['num_items'], stats['num_attributes']) == (
        10,
        925,
        1_679,
        19,
    )
    assert stats['num_records'] == 97_914
    assert stats['attributes_per_item'] == pytest.approx(1.72, abs=5e-3)
    assert [s.client_id for s in data.silos] == [f'zip_region_{d}' for d in range(10)]
    assert hpfl_movielens.load_movielens_silos(str(_REAL_DIR), non_numeric_zip='own_client').silos[-1].num_users == 18
