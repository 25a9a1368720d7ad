"""Tests for fedpersonal.data.hpfl_assistments (ASSISTments a0910 as school-like HPFL silos)."""

import json
import os
import pathlib

import numpy as np
import pytest

from fedpersonal.data import hpfl_assistments
from fedpersonal.data import user_modeling
from fedpersonal.data.assistments import AssistmentsFormatError

_REAL_DIR = pathlib.Path(os.environ.get('FEDPERSONAL_ASSIST_DIR', '/work/shared/data/assist-a0910'))

# Two "schools": students 11, 12, 13 get exercises 1-4 (concepts 1, 2), students 21, 22, 23 get exercises 5-8
# (concepts 3, 4; exercise 8 also has concept 1). Student 13 answers exercise 1 twice.
_ITEMS = 'item_id,knowledge_code\n1,[1]\n2,[2]\n3,"[1, 2]"\n4,[1]\n5,[3]\n6,[4]\n7,[3]\n8,"[4, 1]"\n'
_SCHOOL_A = {11: [1, 2, 3, 4], 12: [2, 3, 4, 1, 2], 13: [1, 1, 3, 4]}
_SCHOOL_B = {21: [5, 6, 7, 8], 22: [8, 7, 6, 5, 6], 23: [5, 6, 8]}


def _write(tmp_path, names=None):
    rows = []
    for user, items in sorted({**_SCHOOL_A, **_SCHOOL_B}.items(), key=lambda kv: -kv[0]):  # Users 23 first.
        rows += [f'{user},{item},{(user + item + n) % 2}' for n, item in enumerate(items)]
    (tmp_path / 'record.csv').write_text('user_id,item_id,score\n' + '\n'.join(rows) + '\n')
    (tmp_path / 'item.csv').write_text(_ITEMS)
    if names is not None:
        (tmp_path / 'dict_knowledge_code.json').write_text(names)
    return str(tmp_path)


def test_small_files_recover_the_two_schools(tmp_path):
    data = hpfl_assistments.load_assist_silos(
        _write(tmp_path, json.dumps({'Add': 1, 'Sub': 2, 'Mul': 4})), num_clients=2, min_records_per_user=3
    )
    # Not the a0910 release's files: labelled by the directory they were read from.
    assert (data.name, data.task, data.num_attributes) == (f'assistments:{tmp_path.name}', 'binary', 4)
    assert data.rating_range == (0, 1)
    assert data.attribute_names == ['Add', 'Sub', 'concept_3', 'Mul']
    a, b = data.silos
    assert (a.client_id, b.client_id) == ('assist_group_0', 'assist_group_1')  # By smallest student id.
    np.testing.assert_array_equal(a.global_user_ids, [11, 12, 13])
    np.testing.assert_array_equal(b.global_user_ids, [21, 22, 23])
    np.testing.assert_array_equal(a.global_item_ids, [1, 2, 3, 4])
    np.testing.assert_array_equal(b.global_item_ids, [5, 6, 7, 8])
    np.testing.assert_array_equal(b.item_attributes, [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 1, 0], [1, 0, 0, 1]])
    # File order: student 23 first (local user 2 of b), then 22, then 21; student 13 before 12 before 11.
    np.testing.assert_array_equal(b.user, [2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(b.item, [0, 1, 3, 3, 2, 1, 0, 1, 0, 1, 2, 3])
    np.testing.assert_array_equal(
        b.label,
        [(23 + i + n) % 2 for n, i in enumerate(_SCHOOL_B[23])]
        + [(22 + i + n) % 2 for n, i in enumerate(_SCHOOL_B[22])]
        + [(21 + i + n) % 2 for n, i in enumerate(_SCHOOL_B[21])],
    )
    # Per student in file order: 3 -> 1/1/1, 5 -> 3/1/1, 4 -> 2/1/1.
    np.testing.assert_array_equal(b.split, [0, 1, 2, 0, 0, 0, 1, 2, 0, 0, 1, 2])
    np.testing.assert_array_equal(a.item[a.user == 2], [0, 0, 2, 3])
    assert (b.label.dtype, b.split.dtype, b.item_attributes.dtype) == (np.float32, np.int8, np.float32)
    stats = user_modeling.statistics(data)
    assert (stats['num_users'], stats['num_items'], stats['num_records']) == (6, 8, 25)
    assert stats['missing_attributes_per_client_min'] == 1  # a lacks concepts 3 and 4, b lacks concept 2.


def test_min_records_per_user_and_other_groupings(tmp_path):
    directory = _write(tmp_path)
    data = hpfl_assistments.load_assist_silos(directory, num_clients=2, min_records_per_user=5)
    assert sorted(int(u) for s in data.silos for u in s.global_user_ids) == [12, 22]
    assert data.attribute_names == ['concept_1', 'concept_2', 'concept_3', 'concept_4']
    by_concepts = hpfl_assistments.load_assist_silos(
        directory, num_clients=2, min_records_per_user=3, grouping='concepts'
    )
    assert [list(s.global_user_ids) for s in by_concepts.silos] == [[11, 12, 13], [21, 22, 23]]
    random = hpfl_assistments.load_assist_silos(directory, num_clients=3, min_records_per_user=3, grouping='random')
    assert [s.num_users for s in random.silos] == [2, 2, 2]
    again = hpfl_assistments.load_assist_silos(directory, num_clients=3, min_records_per_user=3, grouping='random')
    assert [list(s.global_user_ids) for s in random.silos] == [list(s.global_user_ids) for s in again.silos]


def test_bad_arguments(tmp_path):
    directory = _write(tmp_path)
    with pytest.raises(ValueError, match='min_records_per_user must be >= 3'):
        hpfl_assistments.load_assist_silos(directory, min_records_per_user=2)
    with pytest.raises(ValueError, match='fewer than num_clients=7'):
        hpfl_assistments.load_assist_silos(directory, num_clients=7, min_records_per_user=3)
    with pytest.raises(ValueError, match='grouping'):
        hpfl_assistments.load_assist_silos(directory, grouping='schools')


def test_format_errors_name_file_and_line(tmp_path):
    directory = _write(tmp_path)
    (tmp_path / 'record.csv').write_text('user_id,item_id,score\n1,1,1\n1,9,0\n1,2,1\n')
    with pytest.raises(AssistmentsFormatError, match=r'record.csv line 3: item_id 9 is not in .*item.csv'):
        hpfl_assistments.load_assist_silos(directory, num_clients=1, min_records_per_user=3)
    (tmp_path / 'record.csv').write_text('user_id,item_id,score\n1,1,1\n1,2,5\n')
    with pytest.raises(AssistmentsFormatError, match="record.csv line 3: score '5'"):
        hpfl_assistments.load_assist_silos(directory, num_clients=1, min_records_per_user=3)
    _write(tmp_path, names='{"Add": "one"}')
    with pytest.raises(AssistmentsFormatError, match="dict_knowledge_code.json: concept 'Add' has id 'one'"):
        hpfl_assistments.load_assist_silos(directory, num_clients=2, min_records_per_user=3)
    _write(tmp_path, names='{not json')
    with pytest.raises(AssistmentsFormatError, match='dict_knowledge_code.json: not valid JSON'):
        hpfl_assistments.load_assist_silos(directory, num_clients=2, min_records_per_user=3)


@pytest.mark.skipif(
    not (_REAL_DIR / 'record.csv').is_file(),
    reason=f'ASSISTments a0910 not found at {_REAL_DIR} (set FEDPERSONAL_ASSIST_DIR)',
)
def test_real_data_default_partition():
    data = hpfl_assistments.load_assist_silos(str(_REAL_DIR))
    stats = user_modeling.statistics(data)
    assert (
        stats['num_clients'],
        stats['num_records'],
        stats['num_users'],
        stats['num_items'],
        stats['num_attributes'],
    ) == (40, 257_585, 2_380, 16_804, 110)
    assert stats['attributes_per_item'] == pytest.approx(1.198, abs=1e-3)
    assert data.attribute_names[0] == 'Absolute Value'
    assert stats['users_per_client_min'] >= 10 and stats['records_per_client_min'] >= 500
    # Non-IID in concepts, far more than a random deal of the same students.
    assert stats['attribute_tv_distance_mean'] > 0.4
    random = user_modeling.statistics(hpfl_assistments.load_assist_silos(str(_REAL_DIR), grouping='random'))
    assert random['attribute_tv_distance_mean'] < 0.2
    assert stats['missing_attributes_per_client_median'] > 2 * random['missing_attributes_per_client_median']
