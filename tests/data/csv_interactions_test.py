"""CSV interaction tables: parsing, errors naming file/line/field, split orders, the unseen-items warning, and the
conversions to each task's data (`fedpersonal.data.csv_tasks`)."""

import doctest
import logging as std_logging
import os

import hypothesis
import numpy as np
import pytest
from absl import logging
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.data import csv_interactions
from fedpersonal.data import csv_tasks
from fedpersonal.data import hpfl_assistments
from fedpersonal.data import interaction_splits
from fedpersonal.data import movielens
from fedpersonal.data import user_modeling
from fedpersonal.program import csv_config
from fedpersonal.tasks import hpfl_user_modeling_config

RESPONSES = """user,question,correct,skills
s1,q1,1,7;8
s1,q2,0,8
s2,q1,0,8;7
s2,q3,1, 9
"""


def _write(tmp_path, text, name='data.csv'):
    path = tmp_path / name
    path.write_bytes(text.encode('utf-8') if isinstance(text, str) else text)
    return str(path)


def _responses(num_users=12, num_questions=10, per_user=6, silos=3, timestamps=True, seed=0):
    """A responses table: every user answers `per_user` distinct questions, silos by user."""
    rng = np.random.default_rng(seed)
    rows = ['user,question,correct,skills' + (',timestamp' if timestamps else '') + (',silo' if silos else '')]
    for u in range(num_users):
        for t, q in enumerate(rng.choice(num_questions, size=per_user, replace=False)):
            row = f'u{u},q{q},{int(rng.random() < 0.6)},{q % 4};{(q + 1) % 4}'
            row += f',{100 * t + u}' if timestamps else ''
            row += f',school{u % silos}' if silos else ''
            rows.append(row)
    return '\n'.join(rows) + '\n'


# ---------------------------------------------------------------------------------------------------- good files
def test_responses_are_parsed_with_dense_ids_and_skills(tmp_path):
    data = csv_interactions.load_interactions(_write(tmp_path, RESPONSES, 'answers.csv'))
    assert (data.name, data.kind, data.num_rows) == ('csv:answers', 'responses', 4)
    assert data.user_names == ('s1', 's2') and data.user.tolist() == [0, 0, 1, 1]
    assert data.item_names == ('q1', 'q2', 'q3') and data.item.tolist() == [0, 1, 0, 2]
    assert data.value.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert data.line.tolist() == [2, 3, 4, 5]
    assert data.skill_names == ('7', '8', '9')
    np.testing.assert_array_equal(data.skill_matrix(), [[1, 1, 0], [0, 1, 0], [0, 0, 1]])
    assert data.timestamp is None and data.silo is None


def test_ratings_with_integer_ids_timestamps_bom_crlf_any_column_order(tmp_path):
    text = (
        '\ufeffRating, Timestamp ,item,user\r\n4.5,2024-03-01T00:00:00,20,10\r\n3,1700000000,3,10\r\n1,5,20,9\r\n\r\n'
    )
    data = csv_interactions.load_interactions(_write(tmp_path, text), kind='ratings')
    assert data.kind == 'ratings'
    assert data.user_ids.tolist() == [9, 10] and data.item_ids.tolist() == [3, 20]  # Numeric order, not '10' < '9'.
    assert data.user.tolist() == [1, 1, 0] and data.item.tolist() == [1, 0, 1]
    assert data.value.tolist() == [4.5, 3.0, 1.0]
    assert data.timestamp.tolist() == [1709251200.0, 1700000000.0, 5.0]


def test_fractional_scores_are_binarized_at_the_threshold(tmp_path):
    path = _write(tmp_path, 'user,question,correct,skills\na,q,0.5,1\na,r,0.49,1\na,s,1,1\n')
    data = csv_interactions.load_interactions(path, binarize_threshold=0.5)
    assert data.value.tolist() == [1.0, 0.0, 1.0] and data.num_binarized == 2


def test_silo_column(tmp_path):
    path = _write(tmp_path, 'user,question,correct,skills,silo\na,q,1,1,x\nb,q,0,1,y\na,r,1,2,x\n')
    data = csv_interactions.load_interactions(path)
    assert data.silo_names == ('x', 'y') and data.silo.tolist() == [0, 1, 0]


# ---------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    'text, line, field, value',
    [
        ('', 1, None, None),
        ('user,question,correct\n', 1, None, 'skills'),  # A missing column.
        ('user,item,rating,genre\n1,2,3,x\n', 1, None, 'genre'),  # An unknown column.
        ('user,item,rating,rating\n', 1, None, 'rating'),  # A repeated column.
        ('user,item\n1,2\n', 1, None, None),  # Neither kind.
        ('user,item,rating\n', 2, None, None),  # No data rows.
        ('user,item,rating\n1,2,3\n1,3,abc\n', 3, 'rating', 'abc'),
        ('user,item,rating\n1,2,3\n1,3,nan\n', 3, 'rating', 'nan'),
        ('user,item,rating\n1,2,3\n1,2,4\n', 3, 'item', "'2'"),  # A duplicated (user, item).
        ('user,item,rating\n1,2,3\n1,3\n', 3, None, None),  # A missing field.
        ('user,item,rating\n1,2,3\n1,,3\n', 3, 'item', None),  # An empty field.
        ('user,item,rating\n1,2,3\n\n1,3,4\n', 3, None, None),  # A blank line in the middle.
        ('user,item,rating\n1,2,3\n"1,3,4\n', 3, None, None),  # An unclosed quote.
        ('user,item,rating,timestamp\n1,2,3,yesterday\n', 2, 'timestamp', 'yesterday'),
        ('user,question,correct,skills\na,q,2,1\n', 2, 'correct', "'2'"),
        ('user,question,correct,skills\na,q,1,1\na,r,0.5,1\n', 3, 'correct', '--binarize_threshold'),
        ('user,question,correct,skills\na,q,1, ; \n', 2, 'skills', None),
        ('user,question,correct,skills\na,q,1,1;2\nb,q,1,1\n', 3, 'skills', 'line 2'),  # Inconsistent skills.
        ('user,question,correct,skills,silo\na,q,1,1,x\na,r,1,1,y\n', 3, 'silo', "'y'"),  # Two silos per user.
        (b'user,item,rating\n1,2,3\n1,\xff,3\n', 3, None, None),  # Not UTF-8.
    ],
)
def test_errors_name_the_file_line_field_and_value(tmp_path, text, line, field, value):
    path = _write(tmp_path, text)
    with pytest.raises(csv_interactions.CsvFormatError) as raised:
        csv_interactions.load_interactions(path)
    error = raised.value
    assert isinstance(error, errors.InputError)
    assert (error.path, error.line, error.field) == (path, line, field)
    message = str(error)
    assert message.startswith(f'{path} line {line}')
    if field is not None:
        assert f'field {field!r}' in message
    if value is not None:
        assert value in message


def test_the_kind_a_binary_needs_is_checked(tmp_path):
    path = _write(tmp_path, RESPONSES)
    with pytest.raises(csv_interactions.CsvFormatError, match='line 1') as raised:
        csv_interactions.load_interactions(path, kind='ratings')
    assert raised.value.line == 1


def test_a_missing_file_is_named(tmp_path):
    path = str(tmp_path / 'nope.csv')
    with pytest.raises(csv_interactions.CsvFormatError) as raised:
        csv_interactions.load_interactions(path)
    assert raised.value.path == path and path in str(raised.value)


_FIELD = st.one_of(
    st.sampled_from(['1', '0', '0.5', '-3', '1e309', 'nan', '', ' ', 'a;b', ';', '"', '""', 'x', '2024-01-01', '\x00']),
    st.text(alphabet=st.characters(codec='utf-8', exclude_categories=['Cs']), max_size=6),
)
_LINE = st.lists(_FIELD, min_size=0, max_size=7).map(','.join)
_HEADER = st.sampled_from(
    [
        'user,item,rating',
        'user,item,rating,timestamp',
        'user,question,correct,skills',
        'user,question,correct,skills,timestamp,silo',
        'user,question',
        '',
    ]
)


@hypothesis.settings(
    max_examples=300, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    header=_HEADER,
    lines=st.lists(_LINE, max_size=6),
    newline=st.sampled_from(['\n', '\r\n']),
    threshold=st.sampled_from([None, 0.5]),
    order=st.sampled_from(interaction_splits.SPLIT_ORDERS),
)
def test_random_lines_load_or_raise_an_input_error(tmp_path, header, lines, newline, threshold, order):
    path = _write(tmp_path, newline.join([header, *lines]) + newline, 'random.csv')
    try:
        data = csv_interactions.load_interactions(path, binarize_threshold=threshold)
        interaction_splits.order_key(data, order, seed=0)
    except errors.InputError:
        return
    assert data.num_rows == len(data.user) == len(data.item) == len(data.value) >= 1
    assert data.user.max() < data.num_users and data.item.max() < data.num_items


# ---------------------------------------------------------------------------------------------------- split orders
def _table(tmp_path, timestamps=True):
    # One user, rows in file order q5..q0 with timestamps increasing upwards (q0 first in time).
    rows = [f'u,q{i},1,1' + (f',{i}' if timestamps else '') for i in range(5, -1, -1)]
    header = 'user,question,correct,skills' + (',timestamp' if timestamps else '')
    return csv_interactions.load_interactions(_write(tmp_path, '\n'.join([header, *rows]) + '\n'))


def test_split_order_timestamp_file_and_seeded_shuffle(tmp_path):
    data = _table(tmp_path)
    by_time = interaction_splits.order_key(data, 'timestamp', seed=0)
    assert [data.item_names[data.item[i]] for i in np.argsort(by_time)] == ['q0', 'q1', 'q2', 'q3', 'q4', 'q5']
    by_file = interaction_splits.order_key(data, 'file', seed=0)
    assert by_file.tolist() == list(range(6))
    assert interaction_splits.order_key(data, None, seed=0).tolist() == by_time.tolist()  # Default: the timestamps.
    shuffles = [interaction_splits.order_key(data, 'shuffle', seed=s).tolist() for s in (1, 1, 2)]
    assert shuffles[0] == shuffles[1] != shuffles[2]  # Same seed, same order.
    assert sorted(shuffles[0]) == list(range(6))


def test_timestamp_order_without_a_timestamp_column_names_the_flag(tmp_path):
    data = _table(tmp_path, timestamps=False)
    with pytest.raises(errors.ConfigError, match='--split_order'):
        interaction_splits.order_key(data, 'timestamp', seed=0)
    assert interaction_splits.order_key(data, None, seed=0).tolist() == list(range(6))  # Default: file order.


def test_timestamp_ties_keep_file_order(tmp_path):
    path = _write(tmp_path, 'user,item,rating,timestamp\nu,a,1,5\nu,b,1,5\nu,c,1,1\n')
    data = csv_interactions.load_interactions(path)
    assert interaction_splits.order_key(data, 'timestamp', seed=0).tolist() == [1, 2, 0]


def _item_ordered_responses(num_users=20):
    """Every user answers q0..q9, stored in question order (the issue's 'data stored in item order')."""
    rows = ['user,question,correct,skills']
    rng = np.random.default_rng(0)
    for u in range(num_users):
        rows += [f'u{u},q{q},{int(rng.random() < 0.5)},{q % 3}' for q in range(10)]
    return '\n'.join(rows) + '\n'


@pytest.fixture
def absl_warnings(caplog):
    logging.set_verbosity(logging.INFO)
    caplog.set_level(std_logging.INFO, logger='absl')
    return caplog


def test_item_ordered_file_warns_that_test_items_never_occur_in_training(tmp_path, absl_warnings):
    path = _write(tmp_path, _item_ordered_responses())
    data = csv_tasks.load_csv_silos(path, grouping='random', num_clients=2, split_order='file')
    warnings = [r for r in absl_warnings.records if r.levelno == std_logging.WARNING and 'never occur' in r.message]
    assert len(warnings) == 1
    test_rows = sum(int((s.split == user_modeling.SPLIT_TEST).sum()) for s in data.silos)
    assert f'{test_rows} of {test_rows} test rows' in warnings[0].message  # Every test row: q8/q9 only in test.

    absl_warnings.clear()
    csv_tasks.load_csv_silos(path, grouping='random', num_clients=2, split_order='shuffle', seed=0)
    assert not [r for r in absl_warnings.records if 'never occur' in r.message]


def test_warn_unseen_in_training_counts_rows():
    item = np.array([0, 1, 2, 0, 3, 3, 2])
    split = np.array([0, 0, 2, 2, 2, 1, 1])
    assert interaction_splits.warn_unseen_in_training(item, split, source='x') == 2  # Items 2 and 3 (not item 0).
    assert interaction_splits.warn_unseen_in_training(np.array([0, 0]), np.array([0, 2]), source='x') == 0


# ---------------------------------------------------------------------------------------------------- conversions
def test_ratings_become_the_movielens_frame_in_split_order(tmp_path):
    path = _write(tmp_path, 'user,item,rating,timestamp\n7,1,5,30\n7,2,4,10\n7,3,3,20\n8,1,2,0\n')
    frame, description = csv_tasks.load_csv_ratings(path, split_order='timestamp')
    assert description.startswith('csv:data ')
    assert list(frame.columns) == list(movielens.RATING_COLUMNS)
    data = movielens.preprocess_ratings(frame, max_examples_per_user=None)
    train, _, test = movielens.split_by_time(data, train_fraction=0.4, val_fraction=0.3)
    # User 7 by time: item 2, item 3, item 1 -> train item 2, test item 1 (dense ids 1 and 0).
    assert train[train.user_id == 0].item_id.tolist() == [1]
    assert test[test.user_id == 0].item_id.tolist() == [0]
    frame_file, _ = csv_tasks.load_csv_ratings(path, split_order='file')
    assert frame_file.timestamp.tolist() == [0, 1, 2, 3]


def test_responses_become_hpfl_silos_from_the_silo_column(tmp_path):
    path = _write(tmp_path, _responses(), 'school.csv')
    data = csv_tasks.load_csv_silos(path, grouping='column', num_clients=40)
    assert data.name == 'csv:school' and data.task == 'binary'
    assert [s.client_id for s in data.silos] == ['school0', 'school1', 'school2']
    assert all(s.num_users == 4 for s in data.silos)
    assert data.num_attributes == 4 and data.attribute_names == ['skill_0', 'skill_1', 'skill_2', 'skill_3']
    user_modeling.validate(data)


def test_ratings_with_attributes_become_the_hpfl_rating_task(tmp_path):
    rows = ['user,item,rating,attributes,silo']
    for u in range(9):
        rows += [f'{u},m{i},{(u * i) % 5 + 1},g{i % 3};g{(i + 1) % 3},r{u % 3}' for i in range(6)]
    data = csv_tasks.load_csv_silos(
        _write(tmp_path, '\n'.join(rows) + '\n', 'films.csv'), grouping='column', num_clients=3
    )
    assert (data.name, data.task, data.rating_range) == ('csv:films', 'rating', (1.0, 5.0))
    assert data.attribute_names == ['g0', 'g1', 'g2'] and [s.client_id for s in data.silos] == ['r0', 'r1', 'r2']
    assert 0.0 < user_modeling.majority_class_accuracy(data) < 1.0
    without = _write(tmp_path, 'user,item,rating\n' + ''.join(f'{u},{i},3\n' for u in range(3) for i in range(4)))
    with pytest.raises(errors.DataError, match='attributes'):
        csv_tasks.load_csv_silos(without, grouping='random', num_clients=1)


def test_silo_column_and_grouping_must_agree(tmp_path):
    with pytest.raises(errors.ConfigError, match='--assist_grouping=column'):
        csv_tasks.load_csv_silos(_write(tmp_path, _responses()), grouping='exercises', num_clients=3)
    with pytest.raises(errors.ConfigError, match='no silo column'):
        csv_tasks.load_csv_silos(_write(tmp_path, _responses(silos=0)), grouping='column', num_clients=3)


def test_clustering_that_collapses_names_the_real_fix(tmp_path):
    # Every student answers the same questions: exercise sets cannot tell schools apart.
    path = _write(tmp_path, _item_ordered_responses())
    with pytest.raises(errors.DataError) as raised:
        csv_tasks.load_csv_silos(path, grouping='exercises', num_clients=4, split_order='shuffle')
    message = str(raised.value)
    assert '--assist_grouping=random' in message and '--assist_grouping=column' in message
    assert 'fewer' not in message
    data = csv_tasks.load_csv_silos(path, grouping='random', num_clients=4, split_order='shuffle')
    assert len(data.silos) == 4


def _assist_dir(tmp_path, num_students=12):
    """ASSISTments files (record.csv, item.csv) where every student answers exercises 1..10 in exercise order."""
    rng = np.random.default_rng(0)
    records = ['user_id,item_id,score'] + [
        f'{u},{q},{int(rng.random() < 0.5)}' for u in range(num_students) for q in range(1, 11)
    ]
    (tmp_path / 'record.csv').write_text('\n'.join(records) + '\n')
    (tmp_path / 'item.csv').write_text(
        'item_id,knowledge_code\n' + ''.join(f'{q},[{q % 3 + 1}]\n' for q in range(1, 11))
    )
    return str(tmp_path)


def test_assist_data_in_exercise_order(tmp_path, absl_warnings):
    # The case: ASSIST-format data whose students answer the same exercises, stored in exercise order.
    data_dir = _assist_dir(tmp_path)
    with pytest.raises(errors.DataError) as raised:
        hpfl_assistments.load_assist_silos(data_dir, num_clients=3)
    assert '--assist_grouping=random' in str(raised.value) and 'fewer' not in str(raised.value)
    assert 'the students have only 1 distinct exercise set (students with the same exercise set' in str(raised.value)
    hpfl_assistments.load_assist_silos(data_dir, num_clients=3, grouping='random')
    unseen = [r for r in absl_warnings.records if r.levelno == std_logging.WARNING and 'never occur' in r.message]
    assert unseen and all(
        '12 of 12 test rows (100.0%) name exercises that never occur in training (1 distinct exercise);' in r.message
        for r in unseen
    )
    absl_warnings.clear()
    shuffled = hpfl_assistments.load_assist_silos(data_dir, num_clients=3, grouping='random', split_order='shuffle')
    assert not [r for r in absl_warnings.records if 'never occur' in r.message]
    test_items = np.concatenate([s.global_item_ids[s.item[s.split == 2]] for s in shuffled.silos])
    assert np.unique(test_items).size > 2  # Not the same last exercises for everybody.


def test_responses_and_ratings_become_furl_tasks(tmp_path):
    furl = csv_tasks.load_csv_furl(_write(tmp_path, _responses(silos=0), 'r.csv'))
    assert furl.name == 'csv:r' and furl.description.startswith('csv:r ')
    assert furl.num_users == 12 and furl.num_classes == 2 and furl.num_features == 4 and furl.num_items == 10
    ratings = _write(
        tmp_path, 'user,item,rating\n' + ''.join(f'{u},{i},{(u + i) % 5 + 1}\n' for u in range(4) for i in range(5))
    )
    with pytest.raises(errors.ConfigError, match='--like_threshold'):
        csv_tasks.load_csv_furl(ratings)
    likes = csv_tasks.load_csv_furl(ratings, like_threshold=4)
    labels = np.concatenate([likes.arrays(s)['label'] for s in ('train', 'eval', 'test')])
    assert labels.sum() == 8 and labels.size == 20  # Ratings 4 and 5: 2 of every 5.


def test_users_with_fewer_than_three_rows_are_left_out(tmp_path):
    path = _write(tmp_path, _responses(silos=0, timestamps=False) + 'lonely,q1,1,1;2\nlonely,q2,0,2;3\n')
    furl = csv_tasks.load_csv_furl(path)
    assert furl.num_users == 12


# ---------------------------------------------------------------------------------------------------- config
def test_choice_lists_agree_with_the_data_modules():
    assert csv_config.SPLIT_ORDERS == interaction_splits.SPLIT_ORDERS
    assert hpfl_user_modeling_config.GROUPINGS == hpfl_assistments.GROUPINGS


def test_csv_flags_are_checked_by_the_configs(tmp_path):
    path = _write(tmp_path, RESPONSES)
    config_cls = hpfl_user_modeling_config.HpflConfig
    assert config_cls(data_path=path).dataset == 'csv'  # --data_path alone selects csv.
    for kwargs, flag in [
        (dict(dataset='csv'), '--data_path'),
        (dict(dataset='csv', data_path=str(tmp_path / 'missing.csv')), '--data_path'),
        (dict(dataset='csv', data_path=path, data_dir=str(tmp_path)), '--data_dir'),
        (dict(dataset='synthetic', split_order='shuffle'), '--split_order'),
        (dict(dataset='csv', data_path=path, split_order='time'), '--split_order'),
        (dict(dataset='csv', data_path=path, assist_grouping='schools'), '--assist_grouping'),
        (dict(dataset='assist', data_dir=str(tmp_path), split_order='timestamp'), '--split_order'),
        (dict(data_dir=path), '--data_path'),  # A CSV file given as --data_dir.
    ]:
        with pytest.raises(errors.ConfigError, match=flag):
            config_cls(**kwargs)
    assert config_cls(dataset='assist', data_dir=str(tmp_path), split_order='shuffle').split_order == 'shuffle'
    assert config_cls(data_path=path, accuracy_threshold=None).accuracy_threshold is None


def test_accuracy_threshold_none_is_the_training_majority_class_accuracy(tmp_path):
    data = csv_tasks.load_csv_silos(_write(tmp_path, _responses()), grouping='column', num_clients=3)
    labels = np.concatenate([s.label[s.split == user_modeling.SPLIT_TRAIN] for s in data.silos])
    expected = max(labels.mean(), 1 - labels.mean())
    # (n - k) / n against 1 - k / n: float64 in another order, within approx's default.
    assert user_modeling.majority_class_accuracy(data) == pytest.approx(expected)


def test_files_in_the_docs_load(tmp_path):
    # The examples of docs/DATA.md are valid tables.
    docs = os.path.join(os.path.dirname(__file__), '..', '..', 'docs', 'DATA.md')
    with open(docs, encoding='utf-8') as f:
        text = f.read()
    blocks = [b.split('```', 1)[0].strip() for b in text.split('```csv')[1:]]
    assert len(blocks) >= 2
    kinds = {
        csv_interactions.load_interactions(_write(tmp_path, b + '\n', f'b{i}.csv')).kind for i, b in enumerate(blocks)
    }
    assert kinds == {'ratings', 'responses'}


@pytest.mark.parametrize('module', [csv_interactions, interaction_splits, csv_config, user_modeling])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted and result.failed == 0
