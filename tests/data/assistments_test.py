"""Tests for fedpersonal.data.assistments (ASSISTments 2009-2010 a0910 as a binary FURL task)."""

import os
import pathlib

import numpy as np
import pytest

from fedpersonal.data import assistments
from fedpersonal.data.assistments import AssistmentsFormatError

_REAL_DIR = pathlib.Path(os.environ.get('FEDPERSONAL_ASSIST_DIR', '/work/shared/data/assist-a0910'))

_ITEMS = 'item_id,knowledge_code\n10,[3]\n30,"[1, 3]"\n20,[2]\n'
# Student 7: 6 responses in file order; student 4: 4 responses; student 9: 2 (dropped with min_responses >= 3).
_RECORDS = (
    'user_id,item_id,score\n'
    '7,30,1\n7,10,0\n7,20,1\n4,20,0\n7,30,1\n4,10,1\n7,10,1\n9,10,1\n4,30,1\n7,20,0\n4,20,1\n9,20,0\n'
)


def _write(tmp_path, records=_RECORDS, items=_ITEMS):
    (tmp_path / 'record.csv').write_text(records)
    (tmp_path / 'item.csv').write_text(items)
    return str(tmp_path)


def _rows(client_data, client_id):
    return list(client_data.create_tf_dataset_for_client(client_id).as_numpy_iterator())


def test_load_small_files(tmp_path):
    data = assistments.load_assistments(_write(tmp_path), min_responses=3)
    assert (data.num_users, data.num_classes, data.num_features, data.num_items, data.max_chars) == (2, 2, 3, 3, 0)
    np.testing.assert_array_equal(data.user_ids, [4, 7])
    # Student 7 (dense 1), file order: items 30,10,20,30,10,20 scores 1,0,1,1,1,0 -> 6 = 4/1/1.
    train = _rows(data.train, '1')
    assert [int(r['label']) for r in train] == [1, 0, 1, 1]
    assert [int(r['item_id']) for r in train] == [2, 0, 1, 2]  # dense index = rank of the id among 10, 20, 30
    assert [int(r['label']) for r in _rows(data.eval, '1')] == [1]
    assert [int(r['label']) for r in _rows(data.test, '1')] == [0]
    np.testing.assert_array_equal(train[0]['features'], [1, 0, 1])  # concepts [1, 3] -> features 0 and 2
    np.testing.assert_array_equal(train[1]['features'], [0, 0, 1])
    assert train[0]['chars'].shape == (0,)
    assert list(train[0]) == ['user_id', 'chars', 'features', 'label', 'item_id']
    # Student 4 (dense 0): items 20,10,30,20 scores 0,1,1,1 -> 4 = 2/1/1.
    assert [int(r['label']) for r in _rows(data.train, '0')] == [0, 1]
    np.testing.assert_array_equal(data.user_positive_rate, [0.5, 0.75])  # Counts' quotients: exact.
    assert data.char_vocab_size == 2 and data.char_vocab == {}


def test_min_responses(tmp_path):
    _write(tmp_path)
    assert assistments.load_assistments(str(tmp_path), min_responses=5).num_users == 1
    with pytest.raises(ValueError, match='min_responses'):
        assistments.load_assistments(str(tmp_path), min_responses=2)
    with pytest.raises(ValueError, match='no student'):
        assistments.load_assistments(str(tmp_path), min_responses=7)


@pytest.mark.parametrize(
    'bad_line, message',
    [
        ('7,10,2', "line 4: score '2' is not 0 or 1"),
        ('7,10', 'line 4: expected 3 comma-separated fields'),
        ('7,ten,1', 'line 4: user_id and item_id must be non-negative integers'),
        ('', 'line 4: empty line'),
    ],
)
def test_malformed_record_names_file_and_line(tmp_path, bad_line, message):
    lines = _RECORDS.split('\n')
    lines.insert(3, bad_line)
    _write(tmp_path, records='\n'.join(lines))
    with pytest.raises(AssistmentsFormatError, match=message) as info:
        assistments.load_assistments(str(tmp_path), min_responses=3)
    assert str(tmp_path / 'record.csv') in str(info.value) and info.value.line == 4


@pytest.mark.parametrize(
    'bad_line, message',
    [
        ('40,[x]', "line 3: knowledge_code '\\[x\\]' is not a non-empty JSON list"),
        ('40,[]', 'line 3: knowledge_code .* non-empty'),
        ('40,"[1, 0]"', 'line 3: knowledge_code .* positive integer'),
        ('10,[1]', r'line 3: duplicate item_id 10 \(first on line 2\)'),
        ('40', 'line 3: expected 2 fields'),
        ('-4,[1]', "line 3: item_id '-4' is not a non-negative integer"),
    ],
)
def test_malformed_item_names_file_and_line(tmp_path, bad_line, message):
    lines = _ITEMS.split('\n')
    lines.insert(2, bad_line)
    _write(tmp_path, items='\n'.join(lines))
    with pytest.raises(AssistmentsFormatError, match=message) as info:
        assistments.load_assistments(str(tmp_path), min_responses=3)
    assert str(tmp_path / 'item.csv') in str(info.value) and info.value.line == 3


def test_headers_missing_files_and_unknown_items(tmp_path):
    _write(tmp_path, records=_RECORDS.replace('user_id,item_id,score', 'user,item,score'))
    with pytest.raises(AssistmentsFormatError, match=r'record\.csv line 1: expected the header'):
        assistments.load_assistments(str(tmp_path))
    _write(tmp_path, records='user_id,item_id,score\n')
    with pytest.raises(AssistmentsFormatError, match='line 2: no data rows'):
        assistments.load_assistments(str(tmp_path))
    _write(tmp_path, records=_RECORDS + '4,99,1\n')
    with pytest.raises(AssistmentsFormatError, match=r'record\.csv line 14: item_id 99 is not in .*item\.csv'):
        assistments.load_assistments(str(tmp_path), min_responses=3)
    os.remove(tmp_path / 'item.csv')
    with pytest.raises(AssistmentsFormatError, match=r'item\.csv: file not found'):
        assistments.load_assistments(str(tmp_path))


def test_random_split_order(tmp_path):
    _write(tmp_path)
    a = assistments.load_assistments(str(tmp_path), min_responses=3, split_order='random', seed=3)
    b = assistments.load_assistments(str(tmp_path), min_responses=3, split_order='random', seed=3)
    assert a.arrays('train')['item_id'].tolist() == b.arrays('train')['item_id'].tolist()
    assert a.num_examples('train') == 6


def test_data_of_the_a0910_layout_is_labelled_by_its_directory_unless_it_is_a0910(tmp_path):
    _write(tmp_path)
    assert assistments.release_name(str(tmp_path)) == f'assistments:{tmp_path.name}'
    assert assistments.load_assistments(str(tmp_path), min_responses=3).description.startswith(
        f'ASSISTments-layout data ({tmp_path})'
    )


@pytest.mark.skipif(not (_REAL_DIR / 'record.csv').is_file(), reason=f'{_REAL_DIR} not available')
def test_the_real_a0910_files_are_labelled_a0910(tmp_path):
    assert assistments.release_name(str(_REAL_DIR)) == 'assist_a0910'
    for name in ('record.csv', 'item.csv'):  # One changed row is other data.
        (tmp_path / name).write_bytes((_REAL_DIR / name).read_bytes())
    with open(tmp_path / 'record.csv', 'a') as f:
        f.write('1,12209,1\n')
    assert assistments.release_name(str(tmp_path)) == f'assistments:{tmp_path.name}'


@pytest.mark.skipif(not (_REAL_DIR / 'record.csv').is_file(), reason=f'{_REAL_DIR} not available')
def test_real_assist_a0910():
    data = assistments.load_assistments(str(_REAL_DIR))
    stats = data.statistics()
    assert (stats['num_users'], stats['num_examples']) == (2380, 257_585)
    assert (data.num_features, data.num_items, data.max_chars) == (110, 16_804, 0)
    assert stats['examples_per_user_min'] == 16 and stats['examples_per_user_max'] == 1000
    assert stats['positive_rate'] == 170_451 / 257_585  # The integer labels' mean: one float64 division.
    assert (stats['num_train_examples'], stats['num_eval_examples'], stats['num_test_examples']) == (
        205_080,
        24_668,
        27_837,
    )
    assert data.train.client_ids == data.test.client_ids == [str(u) for u in range(2380)]
    np.testing.assert_array_equal(data.user_ids, np.arange(1, 2381))
    example = next(iter(data.train.create_tf_dataset_for_client('0')))
    # record.csv row 1 is "1,12209,0": student 1, exercise 12209 (dense 12208: ids are 1..16804).
    assert int(example['item_id']) == 12208 and int(example['label']) == 0
    assert example['features'].shape == (110,) and float(example['features'].numpy().sum()) >= 1
