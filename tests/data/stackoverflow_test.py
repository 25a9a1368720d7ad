"""Tests for fedpersonal.data.stackoverflow (TFF's Stack Overflow SQLite file -> TextCorpus)."""

import datetime
import sqlite3

import pytest
import tensorflow as tf
from tensorflow_federated.python.simulation.datasets import sql_client_data
from tensorflow_federated.python.simulation.datasets import stackoverflow as tff_stackoverflow

from fedpersonal.data import stackoverflow
from fedpersonal.data.stackoverflow import StackOverflowFormatError


def _ex(date, tokens, *, score=1, tags='python|list', title='how to sort', type_='answer'):
    return {'creation_date': date, 'score': score, 'tags': tags, 'title': title, 'tokens': tokens, 'type': type_}


_SPLITS = {
    'train': {
        'u1': [
            _ex('2010-01-08 09:34:05.313 UTC', 'second post .'),
            _ex('2008-08-10 08:28:52.1 UTC', 'first post with <URL> .', score=-3, type_='question'),
            _ex('2010-01-08 09:34:05.313 UTC', 'same  time keeps   file order .'),
            _ex('2009-01-01 00:00:00 UTC', '   '),  # Blank tokens: skipped.
        ],
        'u2': [_ex('2011-05-05 10:00:00 UTC', 'how do i sort a list ?', tags='python')],
    },
    'heldout': {'h1': [_ex('2012-02-02 12:00:00.5 UTC', 'held out user .')]},
    'test': {
        'u1': [_ex('2018-02-01 00:00:01 UTC', 'later post by a train user .')],
        't9': [_ex('2018-03-01 00:00:00 UTC', 'b .'), _ex('2018-01-02 00:00:00 UTC', 'a .')],
    },
}


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / 'stackoverflow.sqlite')
    stackoverflow.write_stackoverflow_sqlite(path, _SPLITS)
    return path


def test_load_sorts_by_creation_date_and_drops_overlapping_test_clients(db):
    corpus = stackoverflow.load_stackoverflow(db)
    assert corpus.name == 'stackoverflow'
    assert corpus.train == {
        'u1': ['first post with <URL> .', 'second post .', 'same time keeps file order .'],
        'u2': ['how do i sort a list ?'],
    }
    assert corpus.test == {'t9': ['a .', 'b .']}  # u1 is a train client: dropped from the test side.
    assert '1 test clients also in train dropped' in corpus.source and db in corpus.source


def test_load_heldout_split_directory_and_overlap_error(db, tmp_path):
    corpus = stackoverflow.load_stackoverflow(str(tmp_path), test_split='heldout')  # The directory holding the file.
    assert corpus.test == {'h1': ['held out user .']} and set(corpus.train) == {'u1', 'u2'}
    with pytest.raises(ValueError, match="1 clients are in both split 'train' and split 'test'"):
        stackoverflow.load_stackoverflow(db, overlapping_clients='error')
    with pytest.raises(ValueError, match='must differ'):
        stackoverflow.load_stackoverflow(db, test_split='train')
    with pytest.raises(StackOverflowFormatError, match="split 'validation' has no clients"):
        stackoverflow.load_stackoverflow(db, test_split='validation')


def test_writer_output_is_read_by_tff_itself(db):
    """TFF's own SqlClientData + Stack Overflow proto parsing read the writer's file back exactly."""
    client_data = sql_client_data.SqlClientData(db, 'train').preprocess(tff_stackoverflow._add_proto_parsing)
    assert client_data.client_ids == ['u1', 'u2']
    rows = list(client_data.create_tf_dataset_for_client('u1').as_numpy_iterator())
    assert sorted(rows[1]) == sorted(stackoverflow.FEATURES)
    for row, expected in zip(rows, _SPLITS['train']['u1']):
        assert {k: (v.decode() if isinstance(v, bytes) else int(v)) for k, v in row.items()} == expected
    connection = sqlite3.connect(db)
    assert sorted(connection.execute('SELECT client_id, split_name, num_examples FROM client_metadata')) == [
        ('h1', 'heldout', 1),
        ('t9', 'test', 2),
        ('u1', 'test', 1),
        ('u1', 'train', 4),
        ('u2', 'train', 1),
    ]
    connection.close()


def _raw_example(date: bytes, tokens: bytes, drop=(), score_as_bytes=False) -> bytes:
    features = {
        'creation_date': tf.train.Feature(bytes_list=tf.train.BytesList(value=[date])),
        'score': (
            tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'7']))
            if score_as_bytes
            else tf.train.Feature(int64_list=tf.train.Int64List(value=[7]))
        ),
        'tags': tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'c|c++'])),
        'title': tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'a title'])),
        'tokens': tf.train.Feature(bytes_list=tf.train.BytesList(value=[tokens])),
        'type': tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'question'])),
    }
    for name in drop:
        del features[name]
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _raw_db(
    path,
    rows,
    *,
    metadata=None,
    examples_columns='split_name TEXT, client_id TEXT, serialized_example_proto BLOB',
    tables=('examples', 'client_metadata'),
):
    """A file written independently of `write_stackoverflow_sqlite`: plain sqlite3 + tf.train.Example."""
    connection = sqlite3.connect(path)
    if 'examples' in tables:
        connection.execute(f'CREATE TABLE examples ({examples_columns})')
        connection.executemany(
            'INSERT INTO examples (split_name, client_id, serialized_example_proto) VALUES (?, ?, ?)', rows
        )
    if 'client_metadata' in tables:
        connection.execute('CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)')
        if metadata is None:
            counts = {}
            for split, client, _ in rows:
                counts[(client, split)] = counts.get((client, split), 0) + 1
            metadata = [(client, split, n) for (client, split), n in counts.items()]
        connection.executemany('INSERT INTO client_metadata VALUES (?, ?, ?)', metadata)
    connection.commit()
    connection.close()
    return str(path)


def test_load_independently_written_file(tmp_path):
    rows = [
        ('test', '42', _raw_example(b'2018-05-01 10:00:00 UTC', b'new answer .')),
        ('train', '7', _raw_example(b'2015-01-01 00:00:00.25 UTC', b'b')),
        ('train', '7', _raw_example(b'2014-12-31 23:59:59.999 UTC', b'a')),
        ('train', '8', _raw_example(b'2013-01-01 00:00:00 UTC', b'x y z')),
    ]
    path = _raw_db(
        tmp_path / 'so.sqlite',
        rows,
        examples_columns='split_name TEXT, client_id TEXT, serialized_example_proto BLOB, extra INTEGER',
    )  # Extra columns are fine.
    corpus = stackoverflow.load_stackoverflow(path)
    assert corpus.train == {'7': ['a', 'b'], '8': ['x y z']} and corpus.test == {'42': ['new answer .']}


def test_max_clients_samples_deterministically(tmp_path):
    splits = {
        'train': {
            f'u{i:02d}': [_ex(f'2010-01-{1 + j:02d} 00:00:00 UTC', f'w{i} {j} .') for j in range(3)] for i in range(30)
        },
        'test': {f't{i:02d}': [_ex('2018-06-01 00:00:00 UTC', f'v{i} .')] for i in range(20)},
    }
    path = str(tmp_path / 'so.sqlite')
    stackoverflow.write_stackoverflow_sqlite(path, splits)
    corpus = stackoverflow.load_stackoverflow(path, max_clients=5, seed=0)
    assert len(corpus.train) == 5 and len(corpus.test) == 5
    assert set(corpus.train) <= set(splits['train']) and set(corpus.test) <= set(splits['test'])
    assert all(len(examples) == 3 for examples in corpus.train.values())  # Sampled clients are read whole.
    assert list(corpus.train) == sorted(corpus.train)
    assert stackoverflow.load_stackoverflow(path, max_clients=5, seed=0) == corpus
    assert any(
        set(stackoverflow.load_stackoverflow(path, max_clients=5, seed=s).train) != set(corpus.train) for s in (1, 2, 3)
    )
    assert len(stackoverflow.load_stackoverflow(path, max_clients=100).train) == 30
    with pytest.raises(ValueError, match='max_clients'):
        stackoverflow.load_stackoverflow(path, max_clients=0)


def test_missing_or_unreadable_file(tmp_path):
    with pytest.raises(StackOverflowFormatError, match='file not found'):
        stackoverflow.load_stackoverflow(str(tmp_path / 'none.sqlite'))
    text = tmp_path / 'text.sqlite'
    text.write_text('not a database, just text that is long enough to fill a header ' * 4)
    with pytest.raises(StackOverflowFormatError, match='not a readable SQLite database') as info:
        stackoverflow.load_stackoverflow(str(text))
    assert str(text) in str(info.value) and info.value.__cause__ is None


def test_missing_table_and_column(tmp_path):
    rows = [('train', 'a', _raw_example(b'2010-01-01 00:00:00 UTC', b'x'))]
    path = _raw_db(tmp_path / 'a.sqlite', rows, tables=('examples',))
    with pytest.raises(StackOverflowFormatError, match="no table 'client_metadata'") as info:
        stackoverflow.load_stackoverflow(path)
    assert info.value.path == path
    path = _raw_db(
        tmp_path / 'b.sqlite', rows, examples_columns='split_name TEXT, client_id TEXT, serialized_example_proto BLOB'
    )
    connection = sqlite3.connect(path)
    connection.execute('ALTER TABLE examples RENAME COLUMN serialized_example_proto TO proto')
    connection.commit()
    connection.close()
    with pytest.raises(StackOverflowFormatError, match="table 'examples' has no column 'serialized_example_proto'"):
        stackoverflow.load_stackoverflow(path)


@pytest.mark.parametrize(
    'blob, message',
    [
        (b'\x0a\x05abc', "client 'bad': serialized_example_proto is not a tf.train.Example"),
        (
            _raw_example(b'2010-01-01 00:00:00 UTC', b'x', drop=('title',)),
            "client 'bad': example has no feature 'title'",
        ),
        (
            _raw_example(b'2010-01-01 00:00:00 UTC', b'x', score_as_bytes=True),
            "client 'bad': feature 'score' must hold exactly one int64 value, got bytes_list",
        ),
        (_raw_example(b'yesterday', b'x'), "client 'bad': creation_date 'yesterday' is not like"),
        (_raw_example(b'2010-01-01 00:00:00 UTC', b'\xff\xfe'), "client 'bad': creation_date or tokens is not UTF-8"),
        ('a text value', "client 'bad': serialized_example_proto is str, not a BLOB"),
    ],
    ids=['truncated_proto', 'missing_feature', 'wrong_kind', 'bad_date', 'bad_utf8', 'text_not_blob'],
)
def test_bad_example_names_file_and_client(tmp_path, blob, message):
    rows = [
        ('train', 'good', _raw_example(b'2010-01-01 00:00:00 UTC', b'x')),
        ('train', 'bad', blob),
        ('test', 'z', _raw_example(b'2019-01-01 00:00:00 UTC', b'y')),
    ]
    path = _raw_db(tmp_path / 'so.sqlite', rows)
    with pytest.raises(StackOverflowFormatError, match=message) as info:
        stackoverflow.load_stackoverflow(path)
    assert str(info.value).startswith(path) and info.value.client_id == 'bad'
    assert info.value.__context__ is None and info.value.__cause__ is None  # No protobuf/sqlite trace attached.


def test_writer_rejects_bad_examples(tmp_path):
    with pytest.raises(ValueError, match=r"client 'a', example 0: features must be exactly .* missing \['title'\]"):
        bad = _ex('2010-01-01 00:00:00 UTC', 'x')
        del bad['title']
        stackoverflow.write_stackoverflow_sqlite(str(tmp_path / 'x.sqlite'), {'train': {'a': [bad]}})
    with pytest.raises(ValueError, match="feature 'score' must be an int"):
        stackoverflow.write_stackoverflow_sqlite(
            str(tmp_path / 'y.sqlite'), {'train': {'a': [_ex('2010-01-01 00:00:00 UTC', 'x', score='1')]}}
        )
    path = tmp_path / 'exists.sqlite'
    path.write_text('')
    with pytest.raises(ValueError, match='already exists'):
        stackoverflow.write_stackoverflow_sqlite(str(path), _SPLITS)


def test_parse_creation_date():
    assert stackoverflow.parse_creation_date('2010-01-08 09:34:05.313 UTC') == datetime.datetime(
        2010, 1, 8, 9, 34, 5, 313000
    )
    assert stackoverflow.parse_creation_date('2008-08-10 08:28:52.1 UTC') == datetime.datetime(
        2008, 8, 10, 8, 28, 52, 100000
    )
    assert stackoverflow.parse_creation_date('2008-08-10T08:28:52') == datetime.datetime(2008, 8, 10, 8, 28, 52)
    for bad in ('2008-08-10', 'yesterday', '2008-13-10 08:28:52 UTC'):
        with pytest.raises(ValueError):
            stackoverflow.parse_creation_date(bad)


def test_load_word_counts(tmp_path):
    path = tmp_path / 'stackoverflow.word_count'
    path.write_text('the\t100\nto 50\n<URL>\t50\nc++  3\n\n')
    assert list(stackoverflow.load_word_counts(str(path)).items()) == [
        ('the', 100),
        ('to', 50),
        ('<URL>', 50),
        ('c++', 3),
    ]
    assert list(stackoverflow.load_word_counts(str(path), vocab_size=2)) == ['the', 'to']


@pytest.mark.parametrize(
    'text, message',
    [
        ('the 100\nto\n', 'line 2: expected "word<TAB>count", got 1 fields'),
        ('the 100\nto 5 x\n', 'line 2: expected "word<TAB>count", got 3 fields'),
        ('the 100\nto five\n', "line 2: count 'five' of 'to' is not a non-negative integer"),
        ('the 100\nto 5\nthe 3\n', r"line 3: word 'the' repeated \(first on line 1\)"),
        ('the 100\nto 5\na 6\n', 'line 3: counts must not increase'),
        ('the 100\n\nto 5\n', 'line 2: expected "word<TAB>count", got 0 fields'),
    ],
)
def test_load_word_counts_errors(tmp_path, text, message):
    path = tmp_path / 'stackoverflow.word_count'
    path.write_text(text)
    with pytest.raises(StackOverflowFormatError, match=message) as info:
        stackoverflow.load_word_counts(str(path))
    assert str(info.value).startswith(str(path)) and info.value.line is not None
    with pytest.raises(StackOverflowFormatError, match='file not found'):
        stackoverflow.load_word_counts(str(tmp_path / 'missing'))
