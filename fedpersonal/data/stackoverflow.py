"""Stack Overflow (TFF's federated SQLite file) as a next-word-prediction `text_corpus.TextCorpus`.

Reads the file that ``tff.simulation.datasets.stackoverflow.load_data`` downloads (``stackoverflow.sqlite``) directly
with `sqlite3` (no TFF needed), in TFF's schema (``sql_client_data.SqlClientData``):

* table ``examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)``: one row per example;
* table ``client_metadata(client_id TEXT, split_name TEXT, num_examples INTEGER)``: one row per client and split;
* split names ``'train'``, ``'heldout'`` and ``'test'``;
* each proto is a serialized ``tf.train.Example`` with bytes features ``creation_date`` (e.g.
  ``'2010-01-08 09:34:05.313 UTC'``), ``tags`` (``'|'``-separated), ``title``, ``tokens`` (the lower-cased,
  space-separated tokens of one sentence of a question or answer) and ``type`` (``'question'`` or ``'answer'``), and
  the int64 feature ``score``.

The loader uses ``tokens`` as the example and sorts each client's examples by ``creation_date`` (a stable sort, as
the FedRecon paper code does, so the first half of a client's examples -- the reconstruction support set -- is the
earlier half). Examples whose ``tokens`` is blank are skipped; tokens are kept as in the file (including TFF's
special ``<URL>`` token), only runs of whitespace are collapsed.

Note that TFF's ``'train'`` and ``'test'`` splits hold the same users (before / after 2018-01-01), while
``'heldout'`` users are in no other split. A `TextCorpus` needs disjoint train and test clients, so by default the
test side drops clients that are also on the train side (``overlapping_clients='drop'``; the count is in ``source``);
``test_split='heldout'`` gives fully unseen test users.

Problems with the file raise `StackOverflowFormatError` naming the file and the problem (missing table or column,
undecodable proto with its client id, missing or mistyped feature, unparseable date), never a raw sqlite3/protobuf
error. `load_word_counts` reads TFF's ``stackoverflow.word_count`` file. `write_stackoverflow_sqlite` writes a file in
the same schema (for tests and users' own data).
"""

from __future__ import annotations

import collections
import datetime
import os
import random
import re
import sqlite3
import urllib.parse
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NoReturn

from fedpersonal import errors
from fedpersonal.data import text_corpus

__all__ = [
    'FEATURES',
    'SPLITS',
    'SQLITE_FILE',
    'StackOverflowFormatError',
    'load_stackoverflow',
    'load_word_counts',
    'parse_creation_date',
    'write_stackoverflow_sqlite',
]

#: The file name of TFF's database (`load_stackoverflow` also accepts a directory holding it).
SQLITE_FILE = 'stackoverflow.sqlite'
#: The split names of TFF's file.
SPLITS = ('train', 'heldout', 'test')
#: Feature name -> kind ('bytes' or 'int64') of every Stack Overflow `tf.train.Example`.
FEATURES = collections.OrderedDict(
    [
        ('creation_date', 'bytes'),
        ('score', 'int64'),
        ('tags', 'bytes'),
        ('title', 'bytes'),
        ('tokens', 'bytes'),
        ('type', 'bytes'),
    ]
)
_TABLES = collections.OrderedDict(
    [
        ('examples', ('split_name', 'client_id', 'serialized_example_proto')),
        ('client_metadata', ('client_id', 'split_name', 'num_examples')),
    ]
)
_KIND_FIELD = {'bytes': 'bytes_list', 'int64': 'int64_list'}
_DATE_RE = re.compile(
    r'([0-9]{4}-[0-9]{2}-[0-9]{2})[ T]([0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)(?: ?(?:UTC|Z|\+00:?00))?'
)


class StackOverflowFormatError(errors.DataError):
    """A Stack Overflow SQLite or word-count file is missing or malformed.

    Attributes:
        path: The offending file.
        client_id: The client whose example is malformed, or None.
        line: The 1-based line of a word-count file, or None.
    """

    def __init__(self, message: str, *, path: str, client_id: str | None = None, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.client_id = client_id
        self.line = line


def parse_creation_date(value: str) -> datetime.datetime:
    """Parses a Stack Overflow ``creation_date`` such as ``'2010-01-08 09:34:05.313 UTC'`` (UTC, naive result).

    Raises:
        ValueError: `value` is not ``YYYY-MM-DD HH:MM:SS[.fraction][ UTC]``.
    """
    match = _DATE_RE.fullmatch(value.strip())
    if match is None:
        raise errors.DataError(f'creation_date {value!r} is not like 2010-01-08 09:34:05.313 UTC')
    date, time = match.groups()
    if '.' in time:  # fromisoformat wants 3 or 6 fraction digits on older Pythons: normalize to 6.
        whole, fraction = time.split('.')
        time = f'{whole}.{(fraction + "000000")[:6]}'
    try:
        return datetime.datetime.fromisoformat(f'{date} {time}')
    except ValueError as e:  # E.g. month 13 or 25:00:00.
        raise errors.DataError(f'creation_date {value!r} is not a valid date ({e})') from None


def _connect(path: str) -> sqlite3.Connection:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise StackOverflowFormatError(f"{path}: file not found (expected TFF's stackoverflow.sqlite)", path=path)
    connection = None
    try:
        connection = sqlite3.connect(f'{_file_uri(path)}?mode=ro', uri=True)
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, columns in _TABLES.items():
            if table not in tables:
                raise StackOverflowFormatError(
                    f"{path}: no table {table!r} (TFF's schema has tables {list(_TABLES)}; found {sorted(tables)})",
                    path=path,
                )
            found = {row[1] for row in connection.execute(f'PRAGMA table_info({table})')}
            missing = [c for c in columns if c not in found]
            if missing:
                raise StackOverflowFormatError(
                    f'{path}: table {table!r} has no column {", ".join(map(repr, missing))} (expected columns '
                    f'{list(columns)}; found {sorted(found)})',
                    path=path,
                )
    except (sqlite3.DatabaseError, StackOverflowFormatError) as e:
        if connection is not None:
            connection.close()
        if isinstance(e, StackOverflowFormatError):
            raise
        raise StackOverflowFormatError(f'{path}: not a readable SQLite database ({e})', path=path) from None
    return connection


def _file_uri(path: str) -> str:
    return 'file:' + urllib.parse.quote(os.path.abspath(path))


def _parse_example(example_cls: Any, path: str, split: str, client_id: str, blob: Any) -> tuple[datetime.datetime, str]:
    """(creation date, normalized tokens) of one serialized example."""

    def fail(problem: str) -> NoReturn:
        raise StackOverflowFormatError(
            f'{path}: split {split!r}, client {client_id!r}: {problem}', path=path, client_id=client_id
        )

    if not isinstance(blob, bytes):
        fail(f'serialized_example_proto is {type(blob).__name__}, not a BLOB')
    try:
        example, error = example_cls.FromString(blob), None
    except Exception as e:  # pylint: disable=broad-except  (protobuf's DecodeError, reported without its trace)
        example, error = None, f'{type(e).__name__}: {e}'
    if error is not None:
        fail(f'serialized_example_proto is not a tf.train.Example ({error})')
    features = example.features.feature
    values = {}
    for name, kind in FEATURES.items():
        if name not in features:
            fail(f'example has no feature {name!r} (has {sorted(features)})')
        feature = features[name]
        field = feature.WhichOneof('kind')
        if field != _KIND_FIELD[kind] or len(getattr(feature, field).value) != 1:
            fail(
                f'feature {name!r} must hold exactly one {kind} value, got {field or "nothing"} with '
                f'{len(getattr(feature, field).value) if field else 0} values'
            )
        values[name] = getattr(feature, field).value[0]
    try:
        date_text, tokens = values['creation_date'].decode('utf-8'), values['tokens'].decode('utf-8')
    except UnicodeDecodeError:
        date_text = tokens = None
    if date_text is None:
        fail('creation_date or tokens is not UTF-8 text')
    date = _date_or_none(date_text)
    if date is None:
        fail(f'creation_date {date_text!r} is not like 2010-01-08 09:34:05.313 UTC')
    return date, ' '.join(tokens.split())


def _date_or_none(value: str) -> datetime.datetime | None:
    try:
        return parse_creation_date(value)
    except ValueError:
        return None


def _split_clients(connection: sqlite3.Connection, path: str, split: str) -> list[str]:
    try:
        return sorted(
            str(row[0])
            for row in connection.execute(
                'SELECT DISTINCT client_id FROM client_metadata WHERE split_name = ?', (split,)
            )
        )
    except sqlite3.DatabaseError as e:
        raise StackOverflowFormatError(f'{path}: cannot read client_metadata ({e})', path=path) from None


def _read_split(
    connection: sqlite3.Connection, path: str, split: str, client_ids: Sequence[str] | None
) -> dict[str, list[str]]:
    """Client id -> tokens sorted by creation date, for the clients of `split` (all, or `client_ids`)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (only for the tf.train.Example proto)

    query = 'SELECT e.client_id, e.serialized_example_proto FROM examples AS e WHERE e.split_name = ? ORDER BY e.rowid'
    if client_ids is not None:
        connection.execute('CREATE TEMP TABLE IF NOT EXISTS wanted_clients (client_id TEXT PRIMARY KEY)')
        connection.execute('DELETE FROM wanted_clients')
        connection.executemany('INSERT INTO wanted_clients VALUES (?)', ((c,) for c in client_ids))
        query = (
            'SELECT e.client_id, e.serialized_example_proto FROM examples AS e WHERE e.split_name = ? '
            'AND e.client_id IN (SELECT client_id FROM temp.wanted_clients) ORDER BY e.rowid'
        )
    rows: dict[str, list[tuple[datetime.datetime, int, str]]] = {}
    try:
        for index, (client_id, blob) in enumerate(connection.execute(query, (split,))):
            if client_id is None or client_id == '' or isinstance(client_id, bytes):
                raise StackOverflowFormatError(
                    f'{path}: split {split!r}, row {index + 1} of table examples: client_id is {client_id!r}, '
                    'expected a non-empty text id',
                    path=path,
                )
            client_id = str(client_id)
            date, tokens = _parse_example(tf.train.Example, path, split, client_id, blob)
            if tokens:
                rows.setdefault(client_id, []).append((date, index, tokens))
    except sqlite3.DatabaseError as e:
        raise StackOverflowFormatError(
            f'{path}: cannot read split {split!r} of table examples ({e})', path=path
        ) from None
    # Stable sort by date (ties keep file order); clients in sorted id order.
    return {c: [tokens for _, _, tokens in sorted(rows[c], key=lambda r: (r[0], r[1]))] for c in sorted(rows)}


def load_stackoverflow(
    sqlite_path: str,
    *,
    train_split: str = 'train',
    test_split: str = 'test',
    max_clients: int | None = None,
    seed: int = 0,
    overlapping_clients: str = 'drop',
) -> text_corpus.TextCorpus:
    """Loads a TFF Stack Overflow SQLite file as a `text_corpus.TextCorpus` (see the module docstring).

    Args:
        sqlite_path: TFF's ``stackoverflow.sqlite`` (or a file in the same schema), or a directory holding
            ``stackoverflow.sqlite``.
        train_split: Split name of the train side (``'train'``, ``'heldout'`` or ``'test'``).
        test_split: Split name of the test side (must differ from `train_split`).
        max_clients: When set, at most this many clients per split, sampled from the split's ``client_metadata``
            ids with ``random.Random(seed)`` (deterministic); only their examples are read.
        seed: Seed of that sampling (the train and test sides use different streams derived from it).
        overlapping_clients: What to do with clients on both sides: ``'drop'`` them from the test side, or
            ``'error'``.

    Returns:
        The corpus, named ``'stackoverflow'``; clients in sorted id order, each client's examples (its ``tokens``
        strings) sorted by creation date. Clients without a non-blank example are left out.

    Raises:
        StackOverflowFormatError: The file is missing or malformed (names the file and the problem).
        ValueError: Bad arguments, or overlapping clients with ``overlapping_clients='error'``.
    """
    if train_split == test_split:
        raise errors.ConfigError(f'train_split and test_split must differ, both are {train_split!r}')
    if max_clients is not None and (
        isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 1
    ):
        raise errors.ConfigError(f'max_clients must be None or a positive integer, got {max_clients!r}')
    if overlapping_clients not in ('drop', 'error'):
        raise errors.ConfigError(f"overlapping_clients must be 'drop' or 'error', got {overlapping_clients!r}")
    path = os.fspath(sqlite_path)
    if os.path.isdir(path):
        path = os.path.join(path, SQLITE_FILE)
    connection = _connect(path)
    try:
        sides = {}
        for stream, split in enumerate((train_split, test_split)):
            ids = _split_clients(connection, path, split)
            if not ids:
                raise StackOverflowFormatError(
                    f'{path}: split {split!r} has no clients in client_metadata (splits '
                    f'there: {_split_names(connection)})',
                    path=path,
                )
            wanted = None
            if max_clients is not None and max_clients < len(ids):
                wanted = sorted(random.Random(f'{seed}/{stream}').sample(ids, max_clients))
            sides[split] = _read_split(connection, path, split, wanted)
    finally:
        connection.close()
    train, test = sides[train_split], sides[test_split]
    shared = sorted(train.keys() & test.keys())
    if shared and overlapping_clients == 'error':
        raise errors.DataError(
            f'{path}: {len(shared)} clients are in both split {train_split!r} and split {test_split!r} '
            f"(e.g. {shared[:3]}); use overlapping_clients='drop' or test_split='heldout'"
        )
    test = {c: e for c, e in test.items() if c not in train}
    source = (
        f'{path} (TFF Stack Overflow SQLite; train split {train_split!r}, test split {test_split!r}'
        f'{f", at most {max_clients} clients per split (seed {seed})" if max_clients is not None else ""}'
        f'{f", {len(shared)} test clients also in train dropped" if shared else ""})'
    )
    return text_corpus.TextCorpus(name='stackoverflow', train=train, test=test, source=source)


def _split_names(connection: sqlite3.Connection) -> list[str]:
    return sorted(str(row[0]) for row in connection.execute('SELECT DISTINCT split_name FROM client_metadata'))


def load_word_counts(path: str, vocab_size: int | None = None) -> collections.OrderedDict:
    """Reads TFF's ``stackoverflow.word_count`` file: one ``word count`` pair per line, most frequent first.

    Args:
        path: The file (word and count separated by a tab or spaces; blank lines at the end are ignored).
        vocab_size: When set, only the first `vocab_size` words.

    Returns:
        An ordered dict word -> count, in file order.

    Raises:
        StackOverflowFormatError: Missing file, a line that is not ``word<whitespace>count`` with a non-negative
            integer count, a repeated word, or counts that increase (names the file and 1-based line).
    """
    path = os.fspath(path)
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
        raise errors.ConfigError(f'vocab_size must be None or a positive integer, got {vocab_size!r}')
    if not os.path.isfile(path):
        raise StackOverflowFormatError(f"{path}: file not found (expected TFF's stackoverflow.word_count)", path=path)
    counts: collections.OrderedDict = collections.OrderedDict()
    first_line: dict[str, int] = {}
    previous = None
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    while lines and not lines[-1].strip():
        lines.pop()
    for lineno, raw in enumerate(lines, start=1):

        def fail(reason: str):
            raise StackOverflowFormatError(f'{path} line {lineno}: {reason}', path=path, line=lineno)

        try:
            line = raw.decode('utf-8').rstrip('\r')
        except UnicodeDecodeError as e:
            fail(f'not valid UTF-8 ({e.reason})')
        fields = line.split()
        if len(fields) != 2:
            fail(f'expected "word<TAB>count", got {len(fields)} fields: {line[:80]!r}')
        word, count_text = fields
        if not re.fullmatch(r'[0-9]{1,18}', count_text):
            fail(f'count {count_text!r} of {word!r} is not a non-negative integer')
        count = int(count_text)
        if word in first_line:
            fail(f'word {word!r} repeated (first on line {first_line[word]})')
        if previous is not None and count > previous:
            fail(f'counts must not increase (the file is sorted by count): {word!r} has {count} after {previous}')
        first_line[word] = lineno
        counts[word] = previous = count
        if vocab_size is not None and len(counts) >= vocab_size:
            break
    return counts


def _feature(tf: Any, name: str, kind: str, value: Any, where: str) -> Any:
    feature = tf.train.Feature()
    if kind == 'int64':
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.DataError(f'{where}: feature {name!r} must be an int, got {value!r}')
        feature.int64_list.value.append(value)
    else:
        if isinstance(value, str):
            value = value.encode('utf-8')
        if not isinstance(value, bytes):
            raise errors.DataError(f'{where}: feature {name!r} must be str or bytes, got {value!r}')
        feature.bytes_list.value.append(value)
    return feature


def write_stackoverflow_sqlite(path: str, splits: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]) -> None:
    """Writes a SQLite file in TFF's Stack Overflow schema (for tests and users' own data).

    Args:
        path: The file to create (must not exist).
        splits: Split name -> client id -> examples; each example is a dict with exactly the features of `FEATURES`:
            ``creation_date``, ``tags``, ``title``, ``tokens``, ``type`` (str or bytes) and ``score`` (int). Rows are
            written in the given order; ``client_metadata`` gets one row per (client, split) with its count.

    Raises:
        ValueError: An example lacks a feature, has an unknown one or a value of the wrong type (names the split,
            client and example index), or `path` exists.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (only for the tf.train.Example proto)

    path = os.fspath(path)
    if os.path.exists(path):
        raise errors.DataError(f'{path} already exists')
    example_rows, metadata_rows = [], []
    for split, clients in splits.items():
        for client_id, examples in clients.items():
            for index, values in enumerate(examples):
                where = f'split {split!r}, client {client_id!r}, example {index}'
                missing, unknown = sorted(set(FEATURES) - set(values)), sorted(set(values) - set(FEATURES))
                if missing or unknown:
                    raise errors.DataError(
                        f'{where}: features must be exactly {list(FEATURES)}; missing {missing}, unknown {unknown}'
                    )
                example = tf.train.Example()
                for name, kind in FEATURES.items():
                    example.features.feature[name].CopyFrom(_feature(tf, name, kind, values[name], where))
                example_rows.append((split, client_id, example.SerializeToString()))
            metadata_rows.append((client_id, split, len(examples)))
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(
                'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                'serialized_example_proto BLOB NOT NULL)'
            )
            connection.execute(
                'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
                'num_examples INTEGER NOT NULL)'
            )
            connection.executemany('INSERT INTO examples VALUES (?, ?, ?)', example_rows)
            connection.executemany('INSERT INTO client_metadata VALUES (?, ?, ?)', metadata_rows)
    finally:
        connection.close()
