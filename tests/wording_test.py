"""User-facing counts say '1 student', not '1 students' (issue 41)."""

import pytest

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import hpfl_assistments


@pytest.mark.parametrize(
    'n, plural, singular, expected',
    [(1, 'students', None, '1 student'), (0, 'rows', None, '0 rows'), (3, 'rows', None, '3 rows')]
    + [(1, 'distinct concept mixes', 'distinct concept mix', '1 distinct concept mix')],
)
def test_count(n, plural, singular, expected):
    assert wording.count(n, plural, singular) == expected


@pytest.mark.parametrize(
    'grouping, distinct, expected',
    [
        ('exercises', 1, 'only 1 distinct exercise set (students with the same exercise set '),
        ('exercises', 2, 'only 2 distinct exercise sets (students with the same exercise set '),
        ('concepts', 1, 'only 1 distinct concept mix (students with the same concept mix '),
    ],
)
def test_the_collapsed_clustering_message_counts_in_the_right_number(grouping, distinct, expected):
    error = hpfl_assistments._collapse_error(grouping, distinct, 4)
    assert isinstance(error, errors.DataError) and expected in str(error)
    assert 'students differ' not in str(error)


def test_too_few_students_for_the_silos_says_one_student(tmp_path):
    (tmp_path / 'record.csv').write_text('user_id,item_id,score\n' + ''.join(f'7,{i},1\n' for i in range(1, 11)))
    (tmp_path / 'item.csv').write_text('item_id,knowledge_code\n' + ''.join(f'{i},[1]\n' for i in range(1, 11)))
    with pytest.raises(errors.DataError, match=r'1 student with >= 10 responses, fewer than num_clients=2'):
        hpfl_assistments.load_assist_silos(str(tmp_path), num_clients=2)
