"""Bring-your-own data: per-user interaction tables in CSV (ratings or responses), their loader and split order.

Two kinds of table, told apart by the header (docs/DATA.md has the full format, an example and the flags):

* **ratings** ``user,item,rating[,timestamp][,attributes][,silo]``: one rating per (user, item) pair; ``rating`` is
  any finite number; the optional ``attributes`` (e.g. genres ``Action;Comedy``, the same on every line of the item)
  and ``silo`` are what HPFL's rating task needs (item attributes, the user's region);
* **responses** ``user,question,correct,skills[,timestamp][,silo]``: one answer per line (a student may answer a
  question several times); ``correct`` is 0 or 1 (a fractional score is refused unless a binarization threshold
  maps ``score >= t`` to 1, `--binarize_threshold`); ``skills`` are the question's skill (knowledge concept) ids
  separated by ``;`` (e.g. ``12;31``), the same on every line of the question; ``silo`` names the user's school /
  region (one per user), for HPFL's cross-silo clients.

Rules: UTF-8 (a byte-order mark is allowed), comma-separated, standard CSV quoting (``"a,b"``); a header row naming
the columns, in any order, case-insensitive, surrounding spaces ignored; a column the kind does not define is
refused (a misspelt ``timestmp`` is not silently ignored), so is a repeated column. Every field is stripped of
surrounding spaces and must be non-empty. User, item, question, skill and silo ids are strings; ids that are all
non-negative integers keep their integer values (``user_ids``), others are numbered in sorted order. A
``timestamp`` is a number (e.g. unix seconds) or an ISO 8601 date / date-time (``2024-03-01T10:00:00``; without a
zone, UTC). Blank lines are allowed only at the end of the file.

Every problem raises `CsvFormatError` (a `fedpersonal.errors.DataError`) naming the file, the 1-based line (the
header is line 1), the field and the value.

The split order of each user's rows (timestamp, file or seeded shuffle) and the warning about test items unseen in
training: `fedpersonal.data.interaction_splits`.

Example:

>>> import os, tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     path = os.path.join(d, 'answers.csv')
...     with open(path, 'w') as f:
...         _ = f.write('user,question,correct,skills\\ns1,q1,1,7;8\\ns1,q2,0,8\\ns2,q1,0,7;8\\n')
...     data = load_interactions(path)
>>> data.name, data.kind, data.num_users, data.num_items, data.skill_names
('csv:answers', 'responses', 2, 2, ('7', '8'))
>>> data.skill_matrix().tolist()
[[1.0, 1.0], [0.0, 1.0]]
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import math
import os
import re
from collections.abc import Sequence

import numpy as np
from absl import logging

from fedpersonal import errors

__all__ = [
    'KINDS',
    'RATINGS',
    'RESPONSES',
    'COLUMNS',
    'ATTRIBUTE_COLUMN',
    'CsvFormatError',
    'Interactions',
    'load_interactions',
]

RATINGS = 'ratings'
RESPONSES = 'responses'
KINDS = (RATINGS, RESPONSES)
COLUMNS = {
    RATINGS: (('user', 'item', 'rating'), ('timestamp', 'attributes', 'silo')),
    RESPONSES: (('user', 'question', 'correct', 'skills'), ('timestamp', 'silo')),
}
"""Per kind: (required columns, optional columns)."""
SKILL_SEPARATOR = ';'
_ITEM_COLUMN = {RATINGS: 'item', RESPONSES: 'question'}
_KIND_COLUMN = {RATINGS: 'rating', RESPONSES: 'correct'}  # The column that tells the kind.
ATTRIBUTE_COLUMN = {RATINGS: 'attributes', RESPONSES: 'skills'}
"""Per kind: the column of the item's attribute ids (``;``-separated): ratings' optional ``attributes`` (e.g. genres),
responses' ``skills``."""
_INTEGER_ID = re.compile(r'\d{1,18}')


class CsvFormatError(errors.DataError):
    """A CSV interaction table that cannot be used.

    Attributes:
        path: The file.
        line: The 1-based line (the header is line 1), or None when the problem concerns the whole file.
        field: The column, or None.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None, field: str | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.field = field


def _fail(path: str, line: int | None, message: str, field: str | None = None) -> CsvFormatError:
    where = path if line is None else f'{path} line {line}'
    if field is not None:
        where += f' field {field!r}'
    return CsvFormatError(f'{where}: {message}', path=path, line=line, field=field)


@dataclasses.dataclass(frozen=True, eq=False)
class Interactions:
    """A loaded interaction table: one entry per row, in file order, with dense ids.

    Attributes:
        path: The file.
        kind: `RATINGS` or `RESPONSES`.
        name: The dataset name outputs show: ``'csv:<file name without extension>'``.
        user: int64 ``[N]`` dense user index.
        item: int64 ``[N]`` dense item (ratings) or question (responses) index.
        value: float64 ``[N]``: the rating, or the 0/1 correctness (after `binarize_threshold`).
        line: int64 ``[N]`` the row's 1-based line in the file.
        user_ids: int64 ``[num_users]`` id of each dense user: its integer id when every user id is an integer,
            else its dense index (the names are in `user_names`).
        user_names: The user ids as written, in dense order.
        item_ids: int64 ``[num_items]``, like `user_ids`.
        item_names: The item (question) ids as written, in dense order.
        timestamp: float64 ``[N]`` seconds, or None without a timestamp column.
        item_skills: Per dense item (question), its sorted dense skill (attribute) indices; None without a skills
            (attributes) column.
        skill_names: The skill (attribute) ids in dense order (``()`` without that column).
        silo: int64 ``[N]`` dense silo index, or None without a silo column.
        silo_names: The silo names in dense order (``()`` without a silo column).
        num_binarized: Fractional scores mapped to 0/1 by the binarization threshold.
    """

    path: str
    kind: str
    name: str
    user: np.ndarray
    item: np.ndarray
    value: np.ndarray
    line: np.ndarray
    user_ids: np.ndarray
    user_names: tuple[str, ...]
    item_ids: np.ndarray
    item_names: tuple[str, ...]
    timestamp: np.ndarray | None = None
    item_skills: tuple[tuple[int, ...], ...] | None = None
    skill_names: tuple[str, ...] = ()
    silo: np.ndarray | None = None
    silo_names: tuple[str, ...] = ()
    num_binarized: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.user.size)

    @property
    def num_users(self) -> int:
        return len(self.user_names)

    @property
    def num_items(self) -> int:
        return len(self.item_names)

    @property
    def item_column(self) -> str:
        """``'item'`` (ratings) or ``'question'`` (responses)."""
        return _ITEM_COLUMN[self.kind]

    def skill_matrix(self) -> np.ndarray:
        """float32 ``[num_items, num_skills]`` multi-hot skills (attributes) of each item."""
        if self.item_skills is None:
            raise errors.DataError(f'{self.path}: the file has no {ATTRIBUTE_COLUMN[self.kind]} column')
        out = np.zeros((self.num_items, len(self.skill_names)), dtype=np.float32)
        for i, skills in enumerate(self.item_skills):
            out[i, list(skills)] = 1.0
        return out

    def subset(self, rows: np.ndarray) -> Interactions:
        """The rows `rows` (a boolean mask or indices), ids and names unchanged (dense indices may go unused)."""

        def take(a):
            return None if a is None else a[rows]

        return dataclasses.replace(
            self,
            user=self.user[rows],
            item=self.item[rows],
            value=self.value[rows],
            line=self.line[rows],
            timestamp=take(self.timestamp),
            silo=take(self.silo),
        )


# ----------------------------------------------------------------------------------------------------------------
# Parsing.
# ----------------------------------------------------------------------------------------------------------------


def _dense(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(dense index per entry, int64 ids, names in dense order): integer ids in numeric order, others sorted."""
    distinct = sorted(set(names))
    numeric = all(_INTEGER_ID.fullmatch(n) for n in distinct) and len({int(n) for n in distinct}) == len(distinct)
    if numeric:
        distinct.sort(key=int)
    rank = {n: i for i, n in enumerate(distinct)}
    index = np.fromiter((rank[n] for n in names), dtype=np.int64, count=len(names))
    ids = np.asarray([int(n) for n in distinct] if numeric else range(len(distinct)), dtype=np.int64)
    return index, ids, tuple(distinct)


def _number(path: str, line: int, field: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _fail(path, line, f'{value!r} is not a number', field) from None
    if not math.isfinite(number):
        raise _fail(path, line, f'{value!r} is not a finite number', field)
    return number


def _timestamp(path: str, line: int, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number):
            raise _fail(path, line, f'{value!r} is not a finite number', 'timestamp')
        return number
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise _fail(
            path, line, f'{value!r} is neither a number (e.g. unix seconds) nor an ISO 8601 date', 'timestamp'
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _read_text(path: str) -> str:
    if not os.path.isfile(path):
        reason = 'is a directory' if os.path.isdir(path) else 'does not exist'
        raise _fail(path, None, f'{reason} (expected a CSV interaction table, format in docs/DATA.md)')
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        return raw.decode('utf-8-sig')
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b'\n') + 1
        raise _fail(path, line, f'not UTF-8 (byte {raw[error.start : error.start + 1]!r})') from None


def _header(path: str, row: list[str], kind: str | None) -> tuple[str, list[str]]:
    """(kind, the column names in file order) of the header row."""
    names = [n.strip().lower() for n in row]
    expected = '; '.join(f'{k}: {",".join(req)}' + ''.join(f'[,{o}]' for o in opt) for k, (req, opt) in COLUMNS.items())
    if not any(names):
        raise _fail(path, 1, f'empty header line (expected the column names, {expected})')
    found = [k for k in KINDS if _KIND_COLUMN[k] in names]
    if len(found) != 1:
        problem = 'names both rating and correct' if found else 'names neither rating nor correct'
        raise _fail(path, 1, f'the header {",".join(names)!r} {problem}: cannot tell the kind of table ({expected})')
    detected = found[0]
    required, optional = COLUMNS[detected]
    if kind is not None and kind != detected:
        raise _fail(
            path,
            1,
            f'this binary reads a {kind} table ({",".join(COLUMNS[kind][0])}...), the header {",".join(names)!r} '
            f'is that of a {detected} table',
        )
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _fail(path, 1, f'column {name!r} appears twice in the header')
        if name not in required + optional:
            raise _fail(
                path,
                1,
                f'unknown column {name!r} in the header; a {detected} table has the columns '
                f'{", ".join(required)} and optionally {", ".join(optional)}',
            )
    missing = [c for c in required if c not in names]
    if missing:
        raise _fail(
            path,
            1,
            f'the header {",".join(names)!r} lacks the column(s) {", ".join(missing)} of a {detected} table '
            f'({",".join(required)}' + ''.join(f'[,{o}]' for o in optional) + ')',
        )
    return detected, names


def load_interactions(path: str, *, kind: str | None = None, binarize_threshold: float | None = None) -> Interactions:
    """Reads and validates a ratings or responses table (the module docstring has the format).

    Args:
        path: The CSV file.
        kind: `RATINGS` or `RESPONSES` to require that kind (the header tells it), or None for either.
        binarize_threshold: Responses: a fractional ``correct`` score ``s`` in (0, 1) becomes ``1 if s >= t else 0``;
            None refuses fractional scores (the error names ``--binarize_threshold``).

    Returns:
        The `Interactions`, rows in file order.

    Raises:
        CsvFormatError: The file is missing, empty or malformed, naming the file, line, field and value.
        errors.ConfigError: `kind` or `binarize_threshold` is invalid.
    """
    if kind is not None and kind not in KINDS:
        raise errors.ConfigError(f'kind must be one of {KINDS} or None, got {kind!r}')
    if binarize_threshold is not None and not 0.0 < binarize_threshold <= 1.0:
        raise errors.ConfigError(f'--binarize_threshold must be in (0, 1], got {binarize_threshold}')
    path = os.fspath(path)
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text, newline=''), strict=True)
    try:
        row = next(reader, None)
        if row is None:
            raise _fail(path, 1, 'the file is empty (expected a header row, then one row per interaction)')
        detected, names = _header(path, row, kind)
        column = {name: i for i, name in enumerate(names)}
        item_column = _ITEM_COLUMN[detected]
        attribute_column = ATTRIBUTE_COLUMN[detected]
        users: list[str] = []
        items: list[str] = []
        values: list[float] = []
        lines: list[int] = []
        stamps: list[float] = []
        silos: list[str] = []
        question_skills: dict[str, tuple[tuple[str, ...], int]] = {}
        user_silo: dict[str, tuple[str, int]] = {}
        pairs: dict[tuple[str, str], int] = {}
        binarized = 0
        blank: int | None = None
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                blank = lineno if blank is None else blank
                continue
            if blank is not None:
                raise _fail(path, blank, 'blank line (blank lines are allowed only at the end of the file)')
            if len(row) != len(names):
                raise _fail(
                    path, lineno, f'expected {len(names)} comma-separated fields ({",".join(names)}), got {len(row)}'
                )
            fields = {name: row[i].strip() for name, i in column.items()}
            for name, text in fields.items():
                if not text:
                    raise _fail(path, lineno, 'is empty', name)
            user, item = fields['user'], fields[item_column]
            if detected == RATINGS:
                value = _number(path, lineno, 'rating', fields['rating'])
                first = pairs.setdefault((user, item), lineno)
                if first != lineno:
                    raise _fail(
                        path,
                        lineno,
                        f'user {user!r} rates item {item!r} a second time (first on line {first}); a ratings table '
                        'has one rating per (user, item)',
                        'item',
                    )
            else:
                value = _number(path, lineno, 'correct', fields['correct'])
                if not 0.0 <= value <= 1.0:
                    raise _fail(path, lineno, f'{fields["correct"]!r} is outside [0, 1]', 'correct')
                if value not in (0.0, 1.0):
                    if binarize_threshold is None:
                        raise _fail(
                            path,
                            lineno,
                            f'fractional score {fields["correct"]!r}: correct must be 0 or 1; pass '
                            '--binarize_threshold=T to count a score >= T as correct',
                            'correct',
                        )
                    value = 1.0 if value >= binarize_threshold else 0.0
                    binarized += 1
            if attribute_column in fields:
                text = fields[attribute_column]
                skills = tuple(sorted({a.strip() for a in text.split(SKILL_SEPARATOR)} - {''}))
                if not skills:
                    raise _fail(path, lineno, f'{text!r} names no id', attribute_column)
                known, first = question_skills.setdefault(item, (skills, lineno))
                if known != skills:
                    raise _fail(
                        path,
                        lineno,
                        f'{item_column} {item!r} has {attribute_column} {";".join(skills)!r} here and '
                        f'{";".join(known)!r} on line {first}; they must be the same on every line of that '
                        f'{item_column}',
                        attribute_column,
                    )
            if 'silo' in fields:
                silo, first = user_silo.setdefault(user, (fields['silo'], lineno))
                if silo != fields['silo']:
                    raise _fail(
                        path,
                        lineno,
                        f'user {user!r} is in silo {fields["silo"]!r} here and in {silo!r} on line {first}; '
                        'a user belongs to one silo',
                        'silo',
                    )
                silos.append(fields['silo'])
            if 'timestamp' in fields:
                stamps.append(_timestamp(path, lineno, fields['timestamp']))
            users.append(user)
            items.append(item)
            values.append(value)
            lines.append(lineno)
    except csv.Error as error:
        raise _fail(path, reader.line_num, f'malformed CSV ({error})') from None
    if not users:
        raise _fail(path, 2, 'no data rows after the header')

    user_index, user_ids, user_names = _dense(users)
    item_index, item_ids, item_names = _dense(items)
    data = Interactions(
        path=path,
        kind=detected,
        name=f'csv:{os.path.splitext(os.path.basename(path))[0]}',
        user=user_index,
        item=item_index,
        value=np.asarray(values, dtype=np.float64),
        line=np.asarray(lines, dtype=np.int64),
        user_ids=user_ids,
        user_names=user_names,
        item_ids=item_ids,
        item_names=item_names,
        timestamp=np.asarray(stamps, dtype=np.float64) if 'timestamp' in column else None,
        num_binarized=binarized,
    )
    item_skills: tuple[tuple[int, ...], ...] | None = None
    skill_names: tuple[str, ...] = ()
    if attribute_column in column:
        _, _, skill_names = _dense([s for skills, _ in question_skills.values() for s in skills])
        skill_rank = {n: i for i, n in enumerate(skill_names)}
        item_skills = tuple(tuple(sorted(skill_rank[s] for s in question_skills[n][0])) for n in item_names)
    silo_index: np.ndarray | None = None
    silo_names: tuple[str, ...] = ()
    if 'silo' in column:
        silo_index, _, silo_names = _dense(silos)
    if binarized:
        logging.info(
            '%s: %d fractional scores binarized (score >= %g counts as correct).', path, binarized, binarize_threshold
        )
    return dataclasses.replace(
        data, item_skills=item_skills, skill_names=skill_names, silo=silo_index, silo_names=silo_names
    )
