"""MovieLens 100K / 1M ratings files: reading and validating the GroupLens layouts (`load_ratings`).

The loader reads the standard GroupLens layouts from a directory the caller names; nothing is downloaded.

* MovieLens 100K: ``u.data`` with one ``user<TAB>item<TAB>rating<TAB>timestamp`` line per rating.
* MovieLens 1M: ``ratings.dat`` with one ``UserID::MovieID::Rating::Timestamp`` line per rating.

Neither file has a header. Every line is validated; problems raise `MovieLensFormatError` with the file path, the
1-based line number and what is wrong. Preprocessing, splits and `ClientData`: `fedpersonal.data.movielens`.
"""

from __future__ import annotations

import io
import math
import os
import re
from typing import Any

import numpy as np
import pandas as pd

from fedpersonal import errors

RATING_COLUMNS = ('user_id', 'item_id', 'rating', 'timestamp')
"""Column names (in order) of every ratings frame produced or accepted by this package."""

_FILE_100K = 'u.data'
_FILE_1M = 'ratings.dat'
_VARIANTS = ('auto', '100k', '1m')

# One rating line per layout. Ids and timestamps are non-negative integers (at most 18 digits so they fit in
# int64); the rating is a non-negative decimal number (range-checked to 1..5 after parsing).
_INT = r'\d{1,18}'
_NUM = r'\d{1,6}(?:\.\d{1,6})?'
_LAYOUTS: dict[str, dict[str, Any]] = {
    '100k': dict(file=_FILE_100K, sep='\t', sep_name='tab', pattern=re.compile(f'{_INT}\t{_INT}\t{_NUM}\t{_INT}')),
    '1m': dict(file=_FILE_1M, sep='::', sep_name="'::'", pattern=re.compile(f'{_INT}::{_INT}::{_NUM}::{_INT}')),
}
_FIELD_NAMES = ('user id', 'item id', 'rating', 'timestamp')
_MIN_RATING = 1.0
_MAX_RATING = 5.0


class MovieLensFormatError(errors.DataError):
    """A MovieLens ratings file (or directory) is missing or malformed.

    Attributes:
        path: The offending file or directory.
        line: The 1-based line number of the problem, or None when it concerns the whole directory.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


# ----------------------------------------------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------------------------------------------


def _missing_files_error(data_dir: str, reason: str) -> MovieLensFormatError:
    return MovieLensFormatError(
        f'{reason}: {data_dir!r}. Expected a MovieLens ratings file in GroupLens layout there: '
        f'{_FILE_100K!r} (MovieLens 100K, "user<TAB>item<TAB>rating<TAB>timestamp") or '
        f'{_FILE_1M!r} (MovieLens 1M, "UserID::MovieID::Rating::Timestamp").',
        path=data_dir,
    )


def _resolve_ratings_file(data_dir: str, variant: str) -> tuple[str, str]:
    """Returns (path, layout key) of the ratings file to read."""
    if variant not in _VARIANTS:
        raise errors.ConfigError(f'variant must be one of {_VARIANTS}, got {variant!r}')
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        reason = 'not a directory' if os.path.exists(data_dir) else 'directory does not exist'
        raise _missing_files_error(data_dir, reason)
    candidates = ['100k', '1m'] if variant == 'auto' else [variant]
    found = [v for v in candidates if os.path.isfile(os.path.join(data_dir, _LAYOUTS[v]['file']))]
    if not found:
        wanted = ' or '.join(repr(_LAYOUTS[v]['file']) for v in candidates)
        raise _missing_files_error(data_dir, f'no {wanted} file in directory')
    if len(found) > 1:
        raise MovieLensFormatError(
            f'both {_FILE_100K!r} and {_FILE_1M!r} exist in {data_dir!r}; pass variant="100k" or variant="1m" '
            'to choose one.',
            path=data_dir,
        )
    return os.path.join(data_dir, _LAYOUTS[found[0]]['file']), found[0]


def _diagnose_rating(value: str) -> str:
    """Explains why a rating field is not a plain non-negative decimal (e.g. ``-1``, ``1e1``, ``five``)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or value != value.strip():
        return f'rating {value!r} is not a number'
    if not _MIN_RATING <= number <= _MAX_RATING:
        return f'rating {value} is outside the valid range {_MIN_RATING:g}..{_MAX_RATING:g}'
    return f'rating {value!r} is not a plain decimal number (at most 6 digits before and after the point)'


def _diagnose_line(line: str, layout: dict[str, Any]) -> str:
    """Explains why `line` does not match `layout` (called only for lines that failed the fast check)."""
    if not line.strip():
        return 'empty line (expected user, item, rating, timestamp)'
    fields = line.split(layout['sep'])
    if len(fields) != 4:
        return (
            f'expected 4 {layout["sep_name"]}-separated fields (user, item, rating, timestamp), '
            f'got {len(fields)}: {line!r}'
        )
    for name, value in zip(_FIELD_NAMES, fields):
        if name == 'rating':
            if not re.fullmatch(_NUM, value):
                return _diagnose_rating(value)
        elif not re.fullmatch(_INT, value):
            if re.fullmatch(r'\d+', value):
                return f'{name} {value!r} is too large for a 64-bit integer'
            return f'{name} {value!r} is not a non-negative integer'
    return f'malformed line {line!r}'  # pragma: no cover (the checks above cover every mismatch)


def load_ratings(data_dir: str, *, variant: str = 'auto') -> pd.DataFrame:
    """Loads MovieLens ratings (100K ``u.data`` or 1M ``ratings.dat``) with the original GroupLens ids.

    Every line is validated: it must have exactly four fields separated by a tab (100K) or by ``::`` (1M); the
    user id, item id and timestamp must be non-negative integers and the rating a number in 1..5. Windows line
    endings and blank lines at the end of the file are accepted; a blank line anywhere else is an error.
    Duplicate (user, item) pairs are not rejected (the GroupLens files have none).

    Args:
        data_dir: Directory that holds ``u.data`` (100K layout) or ``ratings.dat`` (1M layout).
        variant: ``'100k'``, ``'1m'`` or ``'auto'`` (use whichever of the two files exists; an error if neither or
            both exist).

    Returns:
        A DataFrame with columns ``user_id`` (int64), ``item_id`` (int64), ``rating`` (float32) and ``timestamp``
        (int64, unix seconds), one row per line of the file, in file order, with a default RangeIndex.

    Raises:
        MovieLensFormatError: If the directory or file is missing, the file is empty, or a line is malformed
            (the message names the file and the 1-based line number).
        ValueError: If `variant` is not one of the accepted values.
    """
    path, key = _resolve_ratings_file(data_dir, variant)
    layout = _LAYOUTS[key]
    with open(path, 'rb') as f:
        text = f.read().decode('latin-1')
    if '\r' in text:
        text = text.replace('\r\n', '\n')
    text = text.rstrip('\n')
    if not text.strip():
        raise MovieLensFormatError(
            f'{path} line 1: file is empty (expected one "user{layout["sep"]}item{layout["sep"]}rating'
            f'{layout["sep"]}timestamp" line per rating)',
            path=path,
            line=1,
        )
    lines = text.split('\n')

    fullmatch = layout['pattern'].fullmatch
    bad = next((i for i, line in enumerate(lines) if fullmatch(line) is None), None)
    if bad is not None:
        raise MovieLensFormatError(
            f'{path} line {bad + 1}: {_diagnose_line(lines[bad], layout)}', path=path, line=bad + 1
        )

    # Every line now matches the strict pattern, so pandas' C parser reads exactly what was validated.
    if layout['sep'] != '\t':
        text = text.replace(layout['sep'], '\t')
    frame = pd.read_csv(
        io.StringIO(text),
        sep='\t',
        header=None,
        names=list(RATING_COLUMNS),
        engine='c',
        dtype={'user_id': np.int64, 'item_id': np.int64, 'rating': np.float64, 'timestamp': np.int64},
    )
    if len(frame) != len(lines):  # pragma: no cover (defensive: the validation makes this impossible)
        raise MovieLensFormatError(f'{path}: parsed {len(frame)} rows from {len(lines)} lines', path=path)
    rating = frame['rating'].to_numpy()
    out_of_range = np.flatnonzero((rating < _MIN_RATING) | (rating > _MAX_RATING))
    if out_of_range.size:
        i = int(out_of_range[0])
        raise MovieLensFormatError(
            f'{path} line {i + 1}: rating {lines[i].split(layout["sep"])[2]} is outside the valid range '
            f'{_MIN_RATING:g}..{_MAX_RATING:g}',
            path=path,
            line=i + 1,
        )
    frame['rating'] = rating.astype(np.float32)
    return frame
