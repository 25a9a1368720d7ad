"""ASSISTments 2009-2010 ("a0910") as a binary FURL task: does a student answer an exercise correctly?

Students are clients; each response is one example with

* ``label``: the score (1 = correct, 0 = wrong);
* ``features``: float32 multi-hot ``[num_concepts]`` over the exercise's knowledge concepts (concept id ``k`` ->
  feature ``k - 1``; ``num_concepts`` = the largest concept id in ``item.csv``, 110 for a0910);
* ``item_id``: int64 dense exercise index (rank of the exercise id in ``item.csv``; ``num_items`` = number of
  exercises there). **ASSISTments examples always carry ``item_id``**: exercise identity (its difficulty) matters,
  and the FURL model embeds it (``furl_model_fn(num_items=...)``);
* ``chars``: empty, shape ``[0]`` (``max_chars = 0``): the data has no text, and rendering the exercise id as
  characters would only duplicate ``item_id``. Models skip the text encoder when ``max_chars == 0``.

``record.csv`` has no timestamps: the file order of a student's responses is taken as their time order, and each
student's responses are split 0.8/0.1/0.1 in that order (or by a seeded permutation with ``split_order='random'``).
See `fedpersonal.data.furl_tasks` for the common format.

Files (as in the ICD cognitive-diagnosis release, data/a0910):

* ``record.csv``: header ``user_id,item_id,score``, then one ``<int>,<int>,<0|1>`` row per response;
* ``item.csv``: header ``item_id,knowledge_code``, then ``<int>,<JSON list of positive ints>`` (quoted when the list
  has commas, e.g. ``4,"[33, 34, 75]"``); concept ids are at most `MAX_CONCEPT_ID` (one feature column each).

Ids are ASCII digits (at most 18, so they fit in int64); the files are UTF-8 (a BOM is accepted).

Malformed files raise `AssistmentsFormatError` naming the file and the 1-based line (the header is line 1).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re

import numpy as np

from fedpersonal import errors
from fedpersonal.data import furl_tasks

__all__ = [
    'AssistmentsFormatError',
    'load_assistments_records',
    'load_assistments_items',
    'load_assistments',
    'release_name',
]

_RECORD_FILE = 'record.csv'
_ITEM_FILE = 'item.csv'
_RECORD_HEADER = 'user_id,item_id,score'
_ITEM_HEADER = 'item_id,knowledge_code'
_RECORD_ROW = re.compile(r'([0-9]{1,18}),([0-9]{1,18}),([01])')  # ASCII digits: int64 ids, no unicode digits.
# The multi-hot features have one column per concept id up to the largest one (a0910: 110), so an id beyond this
# (a typo or a hashed id) would silently allocate gigabytes.
MAX_CONCEPT_ID = 100_000
# The SHA-256 of the a0910 release's files (its SHA256SUMS): results are labelled a0910 only when they are these
# files, because other data with the same layout (another release, a subset) would be mislabelled otherwise.
_A0910_SHA256 = {
    _RECORD_FILE: '35ee72e5fa05b0848a138f31ea26d75a5059c6e310b738fbae64878296a07e1f',
    _ITEM_FILE: '17decbd2b3ded19ab2eb924f8eeb16d48d6881ac8f396b6f6e2cf476feb56ee2',
}
A0910_NAME = 'assist_a0910'


class AssistmentsFormatError(errors.DataError):
    """An ASSISTments file (or directory) is missing or malformed.

    Attributes:
        path: The offending file or directory.
        line: The 1-based line number (the header is line 1), or None.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


def _read_lines(path: str, header: str) -> list[str]:
    if not os.path.isfile(path):
        raise AssistmentsFormatError(f'{path}: file not found (expected a CSV with header {header!r})', path=path)
    with open(path, 'rb') as f:
        data = f.read()
    try:
        text = data.decode('utf-8-sig')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        raise AssistmentsFormatError(
            f'{path} line {line}: not valid UTF-8 ({e.reason})', path=path, line=line
        ) from None
    lines = text.replace('\r\n', '\n').rstrip('\n').split('\n')
    if lines[0].strip() != header:
        raise AssistmentsFormatError(
            f'{path} line 1: expected the header {header!r}, got {lines[0]!r}', path=path, line=1
        )
    if len(lines) < 2:
        raise AssistmentsFormatError(f'{path} line 2: no data rows after the header', path=path, line=2)
    return lines


def load_assistments_records(data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads ``record.csv``: int64 arrays ``(user_id, item_id, score)`` in file order (original ids)."""
    path = os.path.join(os.fspath(data_dir), _RECORD_FILE)
    lines = _read_lines(path, _RECORD_HEADER)
    fullmatch = _RECORD_ROW.fullmatch
    for lineno, line in enumerate(lines[1:], start=2):
        if fullmatch(line) is None:
            fields = line.split(',')
            if not line.strip():
                reason = 'empty line'
            elif len(fields) != 3:
                reason = f'expected 3 comma-separated fields (user_id, item_id, score), got {len(fields)}: {line!r}'
            elif fields[2] not in ('0', '1'):
                reason = f'score {fields[2]!r} is not 0 or 1'
            else:
                reason = f'user_id and item_id must be non-negative integers: {line!r}'
            raise AssistmentsFormatError(f'{path} line {lineno}: {reason}', path=path, line=lineno)
    values = np.loadtxt(io.StringIO('\n'.join(lines[1:])), delimiter=',', dtype=np.int64, ndmin=2)
    return values[:, 0], values[:, 1], values[:, 2]


def load_assistments_items(data_dir: str) -> tuple[np.ndarray, list[list[int]]]:
    """Reads ``item.csv``: (int64 item ids in file order, list of concept-id lists)."""
    path = os.path.join(os.fspath(data_dir), _ITEM_FILE)
    lines = _read_lines(path, _ITEM_HEADER)
    ids, concepts = [], []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):

        def fail(reason: str):
            raise AssistmentsFormatError(f'{path} line {lineno}: {reason}', path=path, line=lineno)

        try:
            row = next(csv.reader([line]), [])
        except csv.Error as e:  # E.g. a lone carriage return inside the line.
            fail(f'not a CSV row ({e}): {line!r}')

        if len(row) != 2:
            fail(f'expected 2 fields (item_id, knowledge_code), got {len(row)}: {line!r}')
        if not re.fullmatch(r'[0-9]{1,18}', row[0]):
            fail(f'item_id {row[0]!r} is not a non-negative integer')
        item = int(row[0])
        if item in seen:
            fail(f'duplicate item_id {item} (first on line {seen[item]})')
        seen[item] = lineno
        try:
            codes = json.loads(row[1])
        except (ValueError, RecursionError):
            codes = None
        if (
            not isinstance(codes, list)
            or not codes
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in codes)
        ):
            fail(f'knowledge_code {row[1]!r} is not a non-empty JSON list of positive integer concept ids')
        if max(codes) > MAX_CONCEPT_ID:
            fail(f'knowledge_code: concept id {max(codes)} of item {item} is larger than {MAX_CONCEPT_ID:,}')
        ids.append(item)
        concepts.append(codes)
    return np.asarray(ids, dtype=np.int64), concepts


def release_name(data_dir: str) -> str:
    """How results on the files in `data_dir` are labelled: what was read, not what the file names suggest.

    ``'assist_a0910'`` when ``record.csv`` and ``item.csv`` are the a0910 release's files (their SHA-256), else
    ``'assistments:<directory name>'`` (as a CSV table is labelled ``csv:<file name>``).

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     mine = os.path.join(d, 'assist-2012')
    ...     os.mkdir(mine)
    ...     for name in ('record.csv', 'item.csv'):
    ...         open(os.path.join(mine, name), 'w').close()
    ...     release_name(mine)
    'assistments:assist-2012'
    """
    data_dir = os.fspath(data_dir)
    for name, digest in _A0910_SHA256.items():
        try:
            with open(os.path.join(data_dir, name), 'rb') as f:
                if hashlib.file_digest(f, 'sha256').hexdigest() != digest:
                    break
        except OSError:
            break
    else:
        return A0910_NAME
    return f'assistments:{os.path.basename(os.path.normpath(data_dir))}'


def load_assistments(
    data_dir: str, *, min_responses: int = 16, seed: int = 0, split_order: str = 'time'
) -> furl_tasks.FurlData:
    """Loads the ASSISTments FURL task (see the module docstring for the example format).

    Args:
        data_dir: Directory with ``record.csv`` and ``item.csv`` (e.g. ``/work/shared/data/assist-a0910``).
        min_responses: Students with fewer responses are dropped (>= 3; a0910 students all have >= 16).
        seed: Seed of ``split_order='random'``.
        split_order: ``'time'`` (file order) or ``'random'`` (seeded permutation per student).

    Returns:
        A `furl_tasks.FurlData` with ``num_classes=2``, ``max_chars=0``, ``num_features`` = number of concepts and
        ``num_items`` = number of exercises; users are students in increasing order of ``user_id``.

    Raises:
        AssistmentsFormatError: A file is missing or malformed, or a response names an exercise that ``item.csv``
            does not list (the message names the file and line).
        ValueError: Bad arguments, or no student has `min_responses` responses.
    """
    if min_responses < 3:
        raise errors.ConfigError(
            f'min_responses must be >= 3 (every student needs train, eval and test examples), got {min_responses}'
        )
    users, items, scores = load_assistments_records(data_dir)
    item_ids, concepts = load_assistments_items(data_dir)

    item_order = np.argsort(item_ids, kind='stable')
    sorted_ids = item_ids[item_order]
    position = np.minimum(np.searchsorted(sorted_ids, items), len(sorted_ids) - 1)
    unknown = np.flatnonzero(sorted_ids[position] != items)
    if unknown.size:
        i = int(unknown[0])
        path = os.path.join(os.fspath(data_dir), _RECORD_FILE)
        raise AssistmentsFormatError(
            f'{path} line {i + 2}: item_id {int(items[i])} is not in '
            f'{os.path.join(os.fspath(data_dir), _ITEM_FILE)} ({unknown.size} responses have unknown items)',
            path=path,
            line=i + 2,
        )
    item_index = position.astype(np.int64)

    num_concepts = max(max(c) for c in concepts)
    multi_hot = np.zeros((len(item_ids), num_concepts), dtype=np.float32)
    for row, codes in enumerate(concepts[i] for i in item_order):
        multi_hot[row, np.asarray(codes) - 1] = 1.0

    _, inverse, counts = np.unique(users, return_inverse=True, return_counts=True)
    keep = counts[inverse] >= min_responses
    if not keep.any():
        raise errors.DataError(f'no student has at least min_responses={min_responses} responses')
    users, item_index, scores = users[keep], item_index[keep], scores[keep]
    user_ids, user_index = np.unique(users, return_inverse=True)

    release = 'ASSISTments 2009-2010 a0910' if release_name(data_dir) == A0910_NAME else 'ASSISTments-layout data'
    description = (
        f'{release} ({os.fspath(data_dir)}): students are clients, one example per response; '
        f'label = correct, features = multi-hot over {num_concepts} knowledge concepts, item_id = exercise '
        f'({len(item_ids)}), no text; students with >= {min_responses} responses; per-student '
        f'{"file" if split_order == "time" else "random"}-ordered 0.8/0.1/0.1 split.'
    )
    return furl_tasks.build_furl_data(
        name='assistments',
        description=description,
        user_id=user_index,
        order_key=np.arange(users.size),
        doc_index=item_index,
        label=scores,
        doc_texts=None,
        doc_features=multi_hot,
        num_classes=2,
        max_chars=0,
        user_ids=user_ids,
        item_id=item_index,
        num_items=len(item_ids),
        split_order=split_order,
        seed=seed,
    )
