"""Which dataset a `--data_dir` holds, told from its files (TensorFlow-free; used by the task configs).

A config with both `dataset` and `data_dir` defaults `dataset` to `AUTO`: generated data without `--data_dir`, and
with it the one dataset of the binary whose files are there (`resolve_dataset`, called by the config's
`__post_init__`). A directory that matches no dataset of the binary, or several (MNIST and Fashion-MNIST have the
same files), is a `ConfigError` naming `--dataset`, its choices and what the directory holds; so is `--dataset=`
the generated default together with `--data_dir`. A run given `--data_dir` never trains on generated data.

The layouts below are the files each loader in `fedpersonal.data` requires (tests/program/dataset_inference_test.py
checks that they agree). File names alone are not enough for CSV files with a header: another release of a dataset
may use the same names with other columns, so such a layout also names the columns of each header, and a directory
with the right names but other columns is a `DataLayoutError` naming the files, their columns and the expected ones
(rather than a run that fails later in the loader, or worse, a result labelled with the wrong dataset).

Example:

>>> import os, tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     for name, header in (('record.csv', 'user_id,item_id,score'), ('item.csv', 'item_id,knowledge_code')):
...         with open(os.path.join(d, name), 'w') as f:
...             print(header, file=f)
...     matching_datasets(d, {'assistments': ASSISTMENTS, 'movielens_likes': MOVIELENS_LIKES})
['assistments']
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from fedpersonal import errors

AUTO = 'auto'
"""The `dataset` default: generated data without `data_dir`, else inferred from the files in `data_dir`."""

_LISTED_ENTRIES = 12  # Directory entries an error message lists.
_HEADER_BYTES = 64 * 1024  # A header line longer than this is not one of ours.


class DataLayoutError(errors.DataError):
    """`--data_dir` holds a dataset's file names but not its columns (e.g. another release of the data).

    Attributes:
      data_dir: The directory.
      columns: {file name: the columns of its header line, or None if it has none that can be read}.
    """

    def __init__(self, message: str, *, data_dir: str, columns: Mapping[str, tuple[str, ...] | None]):
        super().__init__(message)
        self.data_dir = data_dir
        self.columns = dict(columns)


def header_columns(path: str) -> tuple[str, ...] | None:
    """The comma-separated columns of the first line of the file `path`, or None if it cannot be read.

    A UTF-8 byte-order mark, surrounding spaces and a Windows line end are allowed, as the loaders allow them.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with open(os.path.join(d, 'record.csv'), 'w') as f:
    ...         _ = f.write('\\ufeffuser_id,item_id,score \\r\\n1,2,1\\n')
    ...     header_columns(os.path.join(d, 'record.csv'))
    ('user_id', 'item_id', 'score')
    """
    try:
        with open(path, 'rb') as f:
            head = f.read(_HEADER_BYTES)
        line = head.split(b'\n', 1)[0].decode('utf-8-sig')
    except (OSError, UnicodeDecodeError):
        return None
    return tuple(line.strip().split(','))


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """The files that identify a dataset in a directory.

    Attributes:
      description: How messages name the files, e.g. 'u.data and u.item (MovieLens 100K)'.
      files: One tuple of alternative names per required file (any one name of a tuple satisfies it).
      magic: When `data_dir` is a file rather than a directory: the leading bytes that identify it (a file whose
        name is one of a single-file layout's names matches too).
      columns: ((file name, the columns of its header line), ...) for the files of `files` that are CSV files with
        a header: a directory matches only if each such file's header has exactly these columns, in this order
        (the loaders require exactly that header).
    """

    description: str
    files: tuple[tuple[str, ...], ...]
    magic: bytes | None = None
    columns: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def has_files(self, path: str) -> bool:
        """Whether `path` is a directory holding this layout's file names (whatever their contents)."""
        return os.path.isdir(path) and all(
            any(os.path.isfile(os.path.join(path, name)) for name in names) for names in self.files
        )

    def found_columns(self, directory: str) -> dict[str, tuple[str, ...] | None]:
        """{file name: the columns of its header} for each file of `columns` in `directory`."""
        return {name: header_columns(os.path.join(directory, name)) for name, _ in self.columns}

    def matches(self, path: str) -> bool:
        """Whether `path` (a directory or a file) holds this layout."""
        if os.path.isdir(path):
            return self.has_files(path) and all(
                self.found_columns(path)[name] == expected for name, expected in self.columns
            )
        if not os.path.isfile(path):
            return False
        if len(self.files) == 1 and os.path.basename(path) in self.files[0]:
            return True
        if self.magic is not None:
            try:
                with open(path, 'rb') as f:
                    return f.read(len(self.magic)) == self.magic
            except OSError:
                return False
        return False


def _idx_names(split: str, kind: str) -> tuple[str, ...]:
    """The names `fedpersonal.data.image_datasets` accepts for one IDX file."""
    dims = 3 if kind == 'images' else 1
    return tuple(f'{split}-{kind}{sep}idx{dims}-ubyte{ext}' for sep in ('-', '.') for ext in ('.gz', ''))


IDX_FILES = tuple(_idx_names(split, kind) for split in ('train', 't10k') for kind in ('images', 'labels'))
MNIST = DataLayout('the IDX files train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-*', IDX_FILES)
FASHION_MNIST = DataLayout(MNIST.description, IDX_FILES)  # The same file names as MNIST.
CIFAR10 = DataLayout(
    'data_batch_1..5 and test_batch (CIFAR-10 python)',
    tuple((f'data_batch_{i}',) for i in range(1, 6)) + (('test_batch',),),
)
MOVIELENS_RATINGS = DataLayout('u.data (MovieLens 100K) or ratings.dat (MovieLens 1M)', (('u.data', 'ratings.dat'),))
MOVIELENS_LIKES = DataLayout('u.data and u.item (MovieLens 100K)', (('u.data',), ('u.item',)))
MOVIELENS_USERS = DataLayout('u.data, u.item and u.user (MovieLens 100K)', (('u.data',), ('u.item',), ('u.user',)))
ASSISTMENTS = DataLayout(
    'record.csv (user_id,item_id,score) and item.csv (item_id,knowledge_code): the ASSISTments layout of the ICD '
    'release',
    (('record.csv',), ('item.csv',)),
    columns=(('record.csv', ('user_id', 'item_id', 'score')), ('item.csv', ('item_id', 'knowledge_code'))),
)
SHAKESPEARE = DataLayout('shakespeare.txt or shakespeare.txt.zip', (('shakespeare.txt', 'shakespeare.txt.zip'),))
STACKOVERFLOW = DataLayout(
    'stackoverflow.sqlite (or an SQLite file)', (('stackoverflow.sqlite',),), magic=b'SQLite format 3\x00'
)


def matching_datasets(data_dir: str, layouts: Mapping[str, DataLayout]) -> list[str]:
    """The names of `layouts` whose files `data_dir` holds, in the order of `layouts`."""
    return [name for name, layout in layouts.items() if layout.matches(data_dir)]


def _columns_text(columns: tuple[str, ...] | None) -> str:
    return 'no readable header line' if columns is None else f'columns {",".join(columns)!r}'


def _check_columns(data_dir: str, layouts: Mapping[str, DataLayout]) -> None:
    """Raises `DataLayoutError` if `data_dir` has a layout's file names but other columns (of the first such)."""
    for name, layout in layouts.items():
        if not layout.columns or not layout.has_files(data_dir):
            continue
        found = layout.found_columns(data_dir)
        wrong = [(file, expected) for file, expected in layout.columns if found[file] != expected]
        if not wrong:
            continue
        details = '; '.join(
            f'{file} has {_columns_text(found[file])}, expected {",".join(expected)!r}' for file, expected in wrong
        )
        raise DataLayoutError(
            f'--data_dir={data_dir}: its files {" and ".join(file for file, _ in layout.columns)} have the names of '
            f'--dataset={name} ({layout.description}) but not its columns: {details}. These are other data (e.g. '
            'another release); to use them, write them as a --dataset=csv table (--data_path=FILE; docs/DATA.md).',
            data_dir=data_dir,
            columns=found,
        )


def _contents(data_dir: str) -> str:
    """What `data_dir` is or holds, for an error message."""
    if not os.path.exists(data_dir):
        return f'{data_dir} does not exist'
    if not os.path.isdir(data_dir):
        return f'{data_dir} is a file'
    try:
        entries = sorted(os.listdir(data_dir))
    except OSError as error:
        return f'{data_dir} cannot be listed ({error.strerror})'
    if not entries:
        return f'{data_dir} is empty'
    shown = ', '.join(entries[:_LISTED_ENTRIES])
    more = f' and {len(entries) - _LISTED_ENTRIES} more' if len(entries) > _LISTED_ENTRIES else ''
    return f'{data_dir} holds {shown}{more}'


def resolve_dataset(config: Any, *, generated: str, layouts: Mapping[str, DataLayout]) -> None:
    """Sets `config.dataset` (a frozen dataclass with `dataset` and `data_dir`) when it is `AUTO`.

    `AUTO` without `data_dir` becomes `generated`; with `data_dir`, the one dataset of `layouts` whose files are
    there (logged). Any other value is left as it is (the config checks it against its choices).

    Args:
      config: The config being validated (called from its `__post_init__`).
      generated: The binary's generated dataset (what it trains on without `--data_dir`).
      layouts: {dataset: its files} for every dataset the binary reads from `--data_dir`.

    Raises:
      errors.ConfigError: `dataset` is `generated` and `data_dir` is given; or `dataset` is `AUTO`, `data_dir` is
        given and it holds the files of no dataset of `layouts`, or of several.
      DataLayoutError: `dataset` is `AUTO` and `data_dir` holds no dataset of `layouts`, but the file names of one
        whose header columns differ (the message names the files, their columns and the expected ones).
    """
    dataset, data_dir = config.dataset, config.data_dir
    choices = tuple(layouts)
    if dataset == generated and data_dir:
        raise errors.ConfigError(
            f'--dataset={generated} (generated data) contradicts --data_dir={data_dir}: drop --data_dir to train on '
            f'generated data, or pass the --dataset of the files there (one of {choices}).'
        )
    if dataset != AUTO:
        return
    if not data_dir:
        object.__setattr__(config, 'dataset', generated)
        return
    found = matching_datasets(data_dir, layouts)
    if len(found) == 1:
        logging.info(
            '--dataset inferred from --data_dir=%s: %s (%s found).', data_dir, found[0], layouts[found[0]].description
        )
        object.__setattr__(config, 'dataset', found[0])
        return
    if not found:
        _check_columns(data_dir, layouts)
    expected = '; '.join(f'{name}: {layout.description}' for name, layout in layouts.items())
    if found:
        problem = f'its files fit several datasets ({", ".join(found)})'
    else:
        problem = f'its files are those of no dataset of this binary ({expected})'
    raise errors.ConfigError(
        f'--data_dir={data_dir} without --dataset: cannot tell the dataset, {problem}; {_contents(data_dir)}. '
        f'Pass --dataset, one of {choices}.'
    )


def dataset_help(datasets: tuple[str, ...], generated: str) -> str:
    """The help of a config's `dataset` field."""
    return (
        f'One of {datasets}, or {AUTO!r} (default): {generated!r} (generated data) without --data_dir, else the '
        'dataset whose files --data_dir holds (an error if that is unclear).'
    )
