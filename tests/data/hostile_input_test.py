"""Hostile input for every file loader: random, malformed, truncated, empty, mistyped, out-of-range, duplicated and
unicode records. Each input either loads into data that satisfies the loader's contract or raises a
`fedpersonal.errors.InputError` (never a pandas/numpy/json/pickle/zlib exception), and the error names the file.
"""

import contextlib
import gzip
import json
import os
import pickle
import sqlite3
import struct
import tempfile
import zipfile

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.data import assistments
from fedpersonal.data import hpfl_assistments
from fedpersonal.data import hpfl_movielens
from fedpersonal.data import image_datasets
from fedpersonal.data import movielens
from fedpersonal.data import movielens_likes
from fedpersonal.data import shakespeare
from fedpersonal.data import stackoverflow
from fedpersonal.data import text_corpus

SETTINGS = hypothesis.settings(
    max_examples=120, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)

# A field: a plausible value, a hostile one (huge, negative, non-numeric, unicode digits, control characters), or
# random unicode text.
_HOSTILE = [
    '0',
    '1',
    '2',
    '5',
    '6',
    '-1',
    '0.5',
    '4.5',
    '1e3',
    'nan',
    'inf',
    '',
    ' ',
    ' 1',
    '0x10',
    '9' * 18,
    '9' * 19,
    '9' * 40,
    '\u0663',  # ARABIC-INDIC DIGIT THREE: str.isdigit() and regex \d accept it.
    '\uff11',  # FULLWIDTH DIGIT ONE.
    '\x00',
    '"',
    '[1]',
    '[1, 2]',
    '[]',
    '[0]',
    '[1e9]',
    '[99999999999]',
    '"[3, 4]"',
    'é',
    '\r',
]
_FIELD = st.one_of(
    st.sampled_from(_HOSTILE),
    st.integers(0, 12).map(str),
    st.text(alphabet=st.characters(codec='utf-8', exclude_categories=['Cs']), max_size=5),
)


@st.composite
def _lines(draw, valid_line, sep, max_fields=6, max_lines=8, base=None):
    """A valid file's lines (`base`, or random `valid_line`s) with 0 to 2 lines replaced or inserted by random
    fields joined by `sep`: about half the files are valid, the rest differ from a valid one in a line or two."""
    lines = list(draw(base)) if base is not None else draw(st.lists(valid_line, max_size=max_lines))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        bad = sep.join(draw(st.lists(_FIELD, max_size=max_fields)))
        position = draw(st.integers(0, len(lines)))
        if lines and position < len(lines) and draw(st.booleans()):
            lines[position] = bad
        else:
            lines.insert(position, bad)
    return lines


_NEWLINE = st.sampled_from(['\n', '\r\n'])
_END = st.sampled_from(['', '\n', '\n\n'])


def _write(directory, name, text, encoding='utf-8'):
    path = os.path.join(directory, name)
    with open(path, 'wb') as f:
        f.write(text.encode(encoding, errors='replace') if isinstance(text, str) else text)
    return path


def _kept(lines):
    """The lines a loader reads: blank lines at the end of a file are ignored (a line of just '\r' is a blank line
    with a Windows ending when a newline follows it; when nothing follows, the loaders reject it)."""
    lines = list(lines)
    while lines and lines[-1] in ('', '\r'):
        lines.pop()
    return lines


def _loads_or_names_file(fn, path, what=''):
    """Runs `fn`; returns its result, or None after checking an InputError names `path` (or its directory)."""
    try:
        result = fn()
        hypothesis.event(f'{what or path.rsplit(os.sep, 1)[-1]}: loaded')
        return result
    except errors.InputError as e:
        hypothesis.event(f'{what or path.rsplit(os.sep, 1)[-1]}: {type(e).__name__}')
        assert os.path.dirname(path) in str(e) or 'min_' in str(e) or 'students' in str(e) or 'no user' in str(e), e
        return None


# ------------------------------------------------------------------------------------------------------ MovieLens
def _every_id(line, n):
    """Lines of `line` (whose first field is an id) for ids 1..n, in order."""
    return st.tuples(*[line for _ in range(n)]).map(
        lambda lines: [
            f'{i}{text[text.index(text.lstrip("0123456789")[:1] or "|") :]}' for i, text in enumerate(lines, 1)
        ]
    )


_UDATA_LINE = st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**40)).map(
    lambda t: '\t'.join(map(str, t))
)
_UITEM_LINE = st.tuples(
    st.integers(1, 6),
    st.sampled_from(['Toy Story (1995)', 'Ça (1990)', '名前']),  # Hostile titles come from the mutations.
    st.lists(st.sampled_from(['0', '1']), min_size=19, max_size=19),
).map(lambda t: f'{t[0]}|{t[1]}|01-Jan-1995||http://x|' + '|'.join(t[2]))
_UUSER_LINE = st.tuples(
    st.integers(1, 6),
    st.integers(0, 120),
    st.sampled_from(['M', 'F', '']),
    st.sampled_from(['writer', 'é']),
    st.sampled_from(['02139', '90210', 'T8H1N', '9']),
).map(lambda t: '|'.join(map(str, t)))


@SETTINGS
@hypothesis.given(
    u_data=_lines(_UDATA_LINE, '\t', max_lines=14),
    u_item=_lines(_UITEM_LINE, '|', max_fields=26, base=_every_id(_UITEM_LINE, 6)),
    u_user=_lines(_UUSER_LINE, '|', base=_every_id(_UUSER_LINE, 3)),
    newline=_NEWLINE,
    end=_END,
    encoding=st.sampled_from(['utf-8', 'latin-1']),
    non_numeric_zip=st.sampled_from(hpfl_movielens.NON_NUMERIC_ZIP),
    one_m=st.booleans(),
)
def test_movielens_files_load_or_raise_an_input_error(
    tmp_path, u_data, u_item, u_user, newline, end, encoding, non_numeric_zip, one_m
):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        if one_m:  # MovieLens 1M layout: ratings.dat with '::' separators (the other files are 100K only).
            path = _write(d, 'ratings.dat', newline.join(line.replace('\t', '::') for line in u_data) + end, encoding)
            ratings = _loads_or_names_file(lambda: movielens.load_ratings(d), path, 'load_ratings_1m')
            if ratings is not None:
                assert len(ratings) == len(_kept(u_data)) >= 1 and ratings['rating'].between(1, 5).all()
            return
        data_path = _write(d, 'u.data', newline.join(u_data) + end, encoding)
        _write(d, 'u.item', newline.join(u_item) + end, encoding)
        _write(d, 'u.user', newline.join(u_user) + end, encoding)
        ratings = _loads_or_names_file(lambda: movielens.load_ratings(d), data_path, 'load_ratings')
        if ratings is not None:
            assert len(ratings) == len(_kept(u_data)) >= 1
            assert ratings['rating'].between(1, 5).all() and (ratings[['user_id', 'item_id']] >= 0).all().all()
            data = movielens.preprocess_ratings(ratings)
            assert data.num_users == ratings['user_id'].nunique()
        items = _loads_or_names_file(lambda: movielens_likes.load_movie_items(d), data_path, 'load_movie_items')
        if items is not None:
            assert len(items) == len(_kept(u_item)) and items['item_id'].is_unique
        users = _loads_or_names_file(lambda: hpfl_movielens.load_movie_users(d), data_path, 'load_movie_users')
        if users is not None:
            assert len(users) == len(_kept(u_user)) and users['user_id'].is_unique
        likes = _loads_or_names_file(lambda: movielens_likes.load_movielens_likes(d, min_ratings=3), data_path, 'likes')
        if likes is not None:
            assert ratings is not None and items is not None
        silos = _loads_or_names_file(
            lambda: hpfl_movielens.load_movielens_silos(d, non_numeric_zip=non_numeric_zip), data_path, 'silos'
        )
        if silos is not None:
            assert ratings is not None and items is not None and users is not None
            assert sum(len(s.label) for s in silos.silos) <= len(ratings)


# ---------------------------------------------------------------------------------------------------- ASSISTments
_RECORD_LINE = st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(0, 1)).map(lambda t: ','.join(map(str, t)))
_ITEM_LINE = st.tuples(st.integers(0, 6), st.lists(st.integers(1, 12), min_size=1, max_size=3)).map(
    lambda t: f'{t[0]},"{json.dumps(t[1])}"' if len(t[1]) > 1 else f'{t[0]},{json.dumps(t[1])}'
)
_CONCEPT_NAMES = st.one_of(
    st.none(),
    st.sampled_from(['{"a": 1, "b": 2}', '{"a": "1"}', '[1, 2]', '{', '', '\xff', '{"a": true}', '[' * 100000]),
    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(-3, 20), st.floats(), st.text(max_size=2))).map(
        json.dumps
    ),
)


@SETTINGS
@hypothesis.given(
    records=_lines(_RECORD_LINE, ',', max_lines=14),
    items=_lines(_ITEM_LINE, ',', max_fields=3, base=_every_id(_ITEM_LINE, 6)),
    record_header=st.sampled_from(
        [assistments._RECORD_HEADER] * 4 + ['\ufeff' + assistments._RECORD_HEADER, 'a,b,c', '']
    ),
    item_header=st.sampled_from([assistments._ITEM_HEADER] * 4 + ['item_id,knowledge_code ', 'x']),
    names=_CONCEPT_NAMES,
    newline=_NEWLINE,
    end=_END,
    raw_bytes=st.sampled_from([b''] * 6 + [b'\xff\xfe', b'\x80', b'\x00']),
    grouping=st.sampled_from(['random', 'exercises']),
)
def test_assistments_files_load_or_raise_an_input_error(
    tmp_path, records, items, record_header, item_header, names, newline, end, raw_bytes, grouping
):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        record_text = newline.join([record_header, *records]) + end
        record_path = _write(d, 'record.csv', record_text.encode('utf-8') + raw_bytes)
        _write(d, 'item.csv', newline.join([item_header, *items]) + end)
        if names is not None:
            _write(d, 'dict_knowledge_code.json', names)
        loaded = _loads_or_names_file(lambda: assistments.load_assistments_records(d), record_path, 'records')
        if loaded is not None:
            assert len(loaded[0]) == len(_kept(records)) and set(np.unique(loaded[2])) <= {0, 1}
        furl = _loads_or_names_file(lambda: assistments.load_assistments(d, min_responses=3), record_path, 'furl')
        if furl is not None:
            assert loaded is not None
        silos = _loads_or_names_file(
            lambda: hpfl_assistments.load_assist_silos(
                d, num_clients=1, min_records_per_user=3, grouping=grouping, split_order='file'
            ),
            record_path,
            'silos',
        )
        if silos is not None:
            assert loaded is not None and len(silos.attribute_names) == silos.num_attributes


def test_assistments_unicode_digits_and_huge_concept_ids_are_named(tmp_path):
    _write(tmp_path, 'record.csv', 'user_id,item_id,score\n1,\u0663,1\n')
    _write(tmp_path, 'item.csv', 'item_id,knowledge_code\n3,[1]\n')
    with pytest.raises(assistments.AssistmentsFormatError, match=r'record\.csv line 2') as raised:
        assistments.load_assistments_records(tmp_path)
    assert raised.value.line == 2
    _write(tmp_path, 'record.csv', 'user_id,item_id,score\n' + '1,3,1\n' * 5)
    _write(tmp_path, 'item.csv', 'item_id,knowledge_code\n3,[1]\n4,"[2, 123456789012]"\n')
    with pytest.raises(assistments.AssistmentsFormatError, match=r'item\.csv line 3.*123456789012') as raised:
        assistments.load_assistments(tmp_path, min_responses=3)
    _write(tmp_path, 'item.csv', 'item_id,knowledge_code\n3,' + '[' * 100000 + '\n')
    with pytest.raises(assistments.AssistmentsFormatError, match=r'item\.csv line 2'):
        assistments.load_assistments_items(tmp_path)


# ---------------------------------------------------------------------------------------------------- Shakespeare
_SPEAKERS = ['HAMLET', 'ANTIPHOLUS', 'OF EPHESUS', 'ACT I', 'SCENE II', 'DRAMATIS PERSONAE', 'CASSIO: Good', '', '']
_TEXTS = ['To be, or not to be.', '[Exit]', '[Enter', 'Ghost]', '|', 'PROLOGUE', '', 'é 名前 \u2019tis', 'a\tb']
_PLAY_LINE = st.tuples(
    st.sampled_from(['hamlet', 'x@y', ' w', 'w ', '']),
    st.sampled_from(['0', '1', '2', '3', '5', '10', '-1', '9' * 16, '\u0663', 'a']),
    st.sampled_from(_SPEAKERS),
    st.sampled_from(_TEXTS),
).map(lambda t: f'{t[0]}@{t[1]}\t{t[2]}\t{t[3]}')


_SPEECH = st.tuples(st.sampled_from(['HAMLET', 'HORATIO', 'OF EPHESUS', '']), st.sampled_from(_TEXTS[:2] + _TEXTS[7:]))
_PLAY = st.lists(_SPEECH, min_size=1, max_size=10).map(
    lambda speeches: (
        ['hamlet@0\t\tDRAMATIS PERSONAE', 'hamlet@20\tACT I\t']
        + [f'hamlet@{100 + 10 * i}\t{speaker}\t{text}' for i, (speaker, text) in enumerate(speeches)]
    )
)


@SETTINGS
@hypothesis.given(
    lines=_lines(_PLAY_LINE, '\t', base=_PLAY),
    newline=_NEWLINE,
    tail=st.sampled_from([b'', b'\n', b'\xff', b'\xc3']),
    container=st.sampled_from(['txt', 'zip', 'bad_zip', 'dir']),
    plays_only=st.booleans(),
)
def test_shakespeare_file_loads_or_raises_an_input_error(tmp_path, lines, newline, tail, container, plays_only):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        data = newline.join(lines).encode('utf-8') + tail
        path = _write(d, 'shakespeare.txt', data)
        if container == 'zip':
            path = os.path.join(d, 'shakespeare.txt.zip')
            with zipfile.ZipFile(path, 'w') as archive:
                archive.writestr('shakespeare.txt', data)
            os.remove(os.path.join(d, 'shakespeare.txt'))
        elif container == 'bad_zip':
            path = os.path.join(d, 'shakespeare.txt.zip')
            with zipfile.ZipFile(path, 'w') as archive:
                archive.writestr('shakespeare.txt', data)
            with open(path, 'r+b') as f:  # Truncated archive: the central directory survives, the member does not.
                f.seek(30)
                f.write(b'\x00' * 8)
            os.remove(os.path.join(d, 'shakespeare.txt'))
        elif container == 'dir':
            path = d
        corpus = _loads_or_names_file(
            lambda: shakespeare.load_shakespeare(path, min_examples=1, test_fraction=0.5, plays_only=plays_only),
            os.path.join(d, 'x'),
        )
        if corpus is not None:
            assert corpus.train.keys().isdisjoint(corpus.test.keys())
            assert all(e.strip() for examples in corpus.train.values() for e in examples)


# -------------------------------------------------------------------------------------------------- StackOverflow
_WORD_COUNT_LINE = st.tuples(st.sampled_from(['the', 'a', 'é', '名', 'x y']), st.integers(0, 10)).map(
    lambda t: f'{t[0]}\t{t[1]}'
)


@SETTINGS
@hypothesis.given(
    lines=_lines(_WORD_COUNT_LINE, '\t'),
    tail=st.sampled_from([b'', b'\n', b'\xff\n', b'\r\n']),
    vocab_size=st.sampled_from([None, 1, 3]),
)
def test_stackoverflow_word_counts_load_or_raise_an_input_error(tmp_path, lines, tail, vocab_size):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = _write(d, 'stackoverflow.word_count', '\n'.join(lines).encode('utf-8') + tail)
        counts = _loads_or_names_file(lambda: stackoverflow.load_word_counts(path, vocab_size), path)
        if counts is not None:
            values = list(counts.values())
            assert values == sorted(values, reverse=True) and all(v >= 0 for v in values)


_DATES = ['2010-01-08 09:34:05.313 UTC', '2010-13-45 99:99:99', '2010-02-30 00:00:00', '', 'yesterday', '\u0662' * 4]


def _example_blob(date, tokens, score, drop):
    import tensorflow as tf

    example = tf.train.Example()
    for name, kind in stackoverflow.FEATURES.items():
        if name == drop:
            continue
        feature = example.features.feature[name]
        if kind == 'int64':
            feature.int64_list.value.append(score)
        else:
            value = {'creation_date': date, 'tokens': tokens}.get(name, 'x')
            feature.bytes_list.value.append(value if isinstance(value, bytes) else value.encode('utf-8'))
    return example.SerializeToString()


_ROW = st.tuples(
    st.sampled_from(['train', 'test', 'heldout']),
    st.one_of(st.sampled_from(['u1', 'u2', 'u3', '', '名', b'u1']), st.integers(-1, 3), st.none()),
    st.one_of(
        st.tuples(
            st.sampled_from(_DATES),
            st.sampled_from(['how do i ?', '', ' ', 'é']).map(str),
            st.integers(-(2**63), 2**63 - 1),
            st.sampled_from([None, None, None, 'tokens', 'creation_date']),
        ).map(lambda t: _example_blob(*t)),
        st.sampled_from([b'', b'\x00\x01garbage', 'text', 3, None, b'\n\x03\n\x01x']),
    ),
)


_VALID_ROWS = [
    ('train', 'u1', _example_blob(_DATES[0], 'how do i ?', 1, None)),
    ('test', 'u9', _example_blob(_DATES[0], 'why ?', 1, None)),
]


@SETTINGS
@hypothesis.given(rows=st.lists(_ROW, max_size=4), max_clients=st.sampled_from([None, 1]))
def test_stackoverflow_sqlite_loads_or_raises_an_input_error(tmp_path, rows, max_clients):
    rows = _VALID_ROWS + rows
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = os.path.join(d, stackoverflow.SQLITE_FILE)
        connection = sqlite3.connect(path)
        with connection:
            connection.execute('CREATE TABLE examples (split_name, client_id, serialized_example_proto)')
            connection.execute('CREATE TABLE client_metadata (client_id, split_name, num_examples)')
            connection.executemany('INSERT INTO examples VALUES (?, ?, ?)', rows)
            connection.executemany(
                'INSERT INTO client_metadata VALUES (?, ?, 1)', sorted({(r[1], r[0]) for r in rows}, key=repr)
            )
        connection.close()
        corpus = _loads_or_names_file(lambda: stackoverflow.load_stackoverflow(d, max_clients=max_clients), path)
        if corpus is not None:
            assert corpus.train.keys().isdisjoint(corpus.test.keys())


def test_stackoverflow_not_a_database(tmp_path):
    path = _write(tmp_path, stackoverflow.SQLITE_FILE, b'SQLite format 3\x00' + b'\xff' * 200)
    with pytest.raises(stackoverflow.StackOverflowFormatError, match='stackoverflow.sqlite'):
        stackoverflow.load_stackoverflow(path)


def test_creation_date_out_of_range_is_a_data_error():
    with pytest.raises(errors.DataError, match='2010-13-45'):
        stackoverflow.parse_creation_date('2010-13-45 09:34:05 UTC')


# ---------------------------------------------------------------------------------------------------- text corpus
_CLIENTS = st.dictionaries(
    st.one_of(st.text(max_size=3), st.integers(), st.none()),
    st.one_of(
        st.lists(st.one_of(st.text(max_size=6), st.integers(), st.none(), st.binary(max_size=2)), max_size=3),
        st.text(max_size=3),
        st.integers(),
        st.none(),
    ),
    max_size=3,
)


@SETTINGS
@hypothesis.given(
    train=_CLIENTS,
    test=_CLIENTS,
    vocab=st.one_of(st.integers(-2, 5), st.floats(), st.text(max_size=1), st.none()),
    limit=st.one_of(st.integers(-1, 3), st.floats(), st.none()),
    test_fraction=st.one_of(st.floats(-1, 2), st.sampled_from([0.0, 0.5, float('nan')])),
)
def test_text_corpus_from_hostile_clients_builds_or_raises_an_input_error(train, test, vocab, limit, test_fraction):
    try:
        corpus = text_corpus.TextCorpus(name='t', train=train, test=test, source='hypothesis')
    except errors.InputError:
        return
    for step in (
        lambda: text_corpus.vocabulary(text_corpus.word_counts(corpus.train), vocab),
        lambda: text_corpus.limit_examples(corpus, limit),
        lambda: text_corpus.split_clients(corpus.train, test_fraction, 0),
        lambda: text_corpus.corpus_statistics(corpus),
    ):
        with contextlib.suppress(errors.InputError):
            step()


# ------------------------------------------------------------------------------------------------- image datasets
def _idx(array, code=0x08, dims=None):
    shape = array.shape if dims is None else dims
    return struct.pack('>HBB', 0, code, len(shape)) + struct.pack('>' + 'I' * len(shape), *shape) + array.tobytes()


_IDX_CODES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}


@st.composite
def _idx_file(draw, kind, n):
    code = draw(st.sampled_from([0x08] * 8 + [0x09, 0x0C, 0x0D, 0x0E]))
    shape = (n, draw(st.integers(1, 3)), draw(st.integers(1, 3))) if kind == 'images' else (n,)
    values = draw(
        st.lists(
            st.integers(0, 9) if kind == 'labels' and draw(st.integers(0, 5)) else st.integers(-300, 300),
            min_size=int(np.prod(shape)),
            max_size=int(np.prod(shape)),
        )
    )
    array = np.asarray(values, dtype=np.float64).astype(_IDX_CODES[code], casting='unsafe').reshape(shape)
    if code in (0x0D, 0x0E) and draw(st.booleans()):
        array = (array / 300.0).astype(_IDX_CODES[code])
    dims = None
    mutation = draw(st.sampled_from(['none'] * 24 + ['dims', 'huge_dims', 'truncate', 'magic', 'gzip', 'bad_gzip']))
    if mutation == 'dims':
        dims = tuple(draw(st.integers(0, 5)) for _ in range(draw(st.integers(0, 4))))
    elif mutation == 'huge_dims':
        dims = (2**32 - 1,) * draw(st.integers(1, 4))
    raw = _idx(array, code, dims)
    if mutation == 'truncate':
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif mutation == 'magic':
        raw = bytes([draw(st.integers(0, 255))]) + raw[1:]
    elif mutation == 'gzip':
        raw = gzip.compress(raw)
    elif mutation == 'bad_gzip':
        raw = gzip.compress(raw)
        raw = raw[:12] + bytes(b ^ 0xFF for b in raw[12:-8]) + raw[-8:]
    return raw


@st.composite
def _idx_split(draw):
    """(images file, labels file) of one split, usually with the same number of examples."""
    n = draw(st.sampled_from([1, 2, 3, 0]))
    return draw(_idx_file('images', n)), draw(_idx_file('labels', draw(st.sampled_from([n, n, n, n + 1]))))


@SETTINGS
@hypothesis.given(train=_idx_split(), test=_idx_split())
def test_idx_files_load_or_raise_an_input_error(tmp_path, train, test):
    (train_images, train_labels), (test_images, test_labels) = train, test
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        for name, raw in (
            ('train-images-idx3-ubyte', train_images),
            ('train-labels-idx1-ubyte', train_labels),
            ('t10k-images-idx3-ubyte', test_images),
            ('t10k-labels-idx1-ubyte', test_labels),
        ):
            path = _write(d, name, raw)
        data = _loads_or_names_file(lambda: image_datasets.load_idx_dataset(d), path)
        if data is not None:
            for images, labels in ((data.train_images, data.train_labels), (data.test_images, data.test_labels)):
                assert images.shape[0] == labels.shape[0] >= 1
                assert np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
                assert labels.min() >= 0 and labels.max() <= 9


_PICKLED = st.one_of(
    st.fixed_dictionaries(
        {
            b'data': st.sampled_from(
                [
                    np.zeros((2, 3072), np.uint8),
                    np.zeros((2, 3072), np.float32),
                    np.zeros((2, 3071), np.uint8),
                    [[0] * 3072] * 2,
                    [[0], [0, 1]],
                    'text',
                ]
            ),
            b'labels': st.sampled_from([[0, 9], [0, 10], [-1, 0], [0.5, 1], ['a', 'b'], [0], None, [[0], [1]]]),
        }
    ),
    st.sampled_from([[1, 2], {b'data': 1}, 'x', None]),
).map(lambda obj: pickle.dumps(obj))
_CIFAR_BYTES = st.one_of(
    st.just(pickle.dumps({b'data': np.full((1, 3072), 7, np.uint8), b'labels': [3]})),
    _PICKLED,
    _PICKLED.map(lambda raw: raw[: len(raw) // 2]),
    st.binary(max_size=40),
    st.sampled_from(
        [b'\x80\x04K\x01.', b'\x80\x04\x94.', b'\x80\x04h\x05.', b'(((((((((' * 10000, b'\x80\x02]q\x00a.']
    ),
)


@SETTINGS
@hypothesis.given(batch=_CIFAR_BYTES, valid_elsewhere=st.booleans())
def test_cifar_batches_load_or_raise_an_input_error(tmp_path, batch, valid_elsewhere):
    good = pickle.dumps({b'data': np.zeros((2, 3072), np.uint8), b'labels': [0, 9]})
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        names = [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']
        for i, name in enumerate(names):
            path = _write(d, name, good if valid_elsewhere and i else batch)
        data = _loads_or_names_file(lambda: image_datasets.load_cifar10(d), path)
        if data is not None:
            assert data.train_labels.dtype == np.int32 and data.train_labels.max() <= 9 and data.train_labels.min() >= 0
            assert data.train_images.shape[1:] == (32, 32, 3)
