"""The config part of bring-your-own data (`--dataset=csv --data_path=FILE`), shared by the binaries that take it.

A task config that reads CSV interaction tables (`fedpersonal.data.csv_interactions`; format: docs/DATA.md) inherits
`CsvDataConfig` and calls `resolve_csv_dataset(self)` in its `__post_init__` before
`dataset_inference.resolve_dataset`: `--data_path` alone implies `--dataset=csv`; `--dataset=csv` needs an existing
`--data_path` file and contradicts `--data_dir`; the CSV-only options are refused with another dataset. Every
problem is a `ConfigError` naming the flag. TensorFlow-free and pandas-free, like the config modules.

Example:

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True, kw_only=True)
... class Config(CsvDataConfig):
...     dataset: str = 'auto'
...     data_dir: str | None = None
...     def __post_init__(self):
...         resolve_csv_dataset(self)
>>> Config(dataset='csv')
Traceback (most recent call last):
...
fedpersonal.errors.ConfigError: --dataset=csv needs --data_path (the CSV interaction table; format: docs/DATA.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from fedpersonal import errors
from fedpersonal.program import config_parts as parts

CSV = 'csv'
"""The `--dataset` of a CSV interaction table."""
AUTO = 'auto'  # dataset_inference.AUTO (not imported: that module imports absl logging only, but keep this leaf).
# fedpersonal.data.interaction_splits.SPLIT_ORDERS (that module imports numpy; tests/data/csv_interactions_test.py
# checks the two agree).
SPLIT_ORDERS = ('timestamp', 'file', 'shuffle')


@dataclasses.dataclass(frozen=True, kw_only=True)
class CsvDataConfig:
    """Where a CSV interaction table is and how its rows are split and read."""

    data_path: str | None = parts.option(
        None,
        '--dataset=csv: the CSV interaction table, ratings (user,item,rating[,timestamp][,attributes][,silo]) or '
        'responses (user,question,correct,skills[,timestamp][,silo]); format: docs/DATA.md. Given without '
        '--dataset, it selects --dataset=csv.',
        is_path=True,
    )
    split_order: str | None = parts.option(
        None,
        "--dataset=csv: the order of each user's rows for the train/validation/test split: 'timestamp' (the "
        "timestamp column; ties in file order), 'file' (file order) or 'shuffle' (random, seeded by --seed); "
        "'none': 'timestamp' when the file has that column, else 'file'. ASSISTments' record.csv (no timestamps) "
        "takes 'file' (its default) or 'shuffle'; FURL's MovieLens likes 'timestamp' (its default) or 'shuffle'.",
    )
    binarize_threshold: float | None = parts.option(
        None,
        "--dataset=csv responses: a fractional correct score counts as correct (1) when >= this, else 0 ('none': "
        'scores must be 0 or 1).',
    )

    def __post_init__(self):
        if self.split_order is not None and self.split_order not in SPLIT_ORDERS:
            raise errors.ConfigError(f'--split_order must be one of {SPLIT_ORDERS} or none, got {self.split_order!r}.')
        if self.binarize_threshold is not None and not 0.0 < self.binarize_threshold <= 1.0:
            raise errors.ConfigError(f'--binarize_threshold must be in (0, 1], got {self.binarize_threshold}.')


def resolve_csv_dataset(
    config: Any,
    *,
    csv_only: tuple[str, ...] = (),
    untimed_split_order: tuple[str, ...] = (),
    timed_split_order: tuple[str, ...] = (),
) -> None:
    """Checks the CSV options of `config` (a frozen dataclass with `dataset`, `data_dir` and `CsvDataConfig`).

    Sets `config.dataset` to `CSV` when it is `AUTO` and `data_path` is given.

    Args:
      config: The config being validated (called from its `__post_init__`).
      csv_only: Further fields (beyond `split_order` and `binarize_threshold`) that only `--dataset=csv` uses; a
        non-None value with another dataset is an error.
      untimed_split_order: Other datasets whose files have no timestamps that take `--split_order` 'file' or
        'shuffle' (e.g. ASSISTments' record.csv).
      timed_split_order: Other datasets with timestamps that take `--split_order` 'timestamp' (their default) or
        'shuffle' (e.g. MovieLens likes); 'file' is refused (their files are not in time order).

    Raises:
      errors.ConfigError: `--dataset=csv` without `--data_path`, with a `--data_path` that is not a file, or with
        `--data_dir`; `--data_path` or a CSV-only option with another `--dataset`.
    """
    if config.data_path and config.dataset == AUTO:
        object.__setattr__(config, 'dataset', CSV)
    data_dir = getattr(config, 'data_dir', None)
    if config.dataset in (AUTO, CSV) and data_dir and not config.data_path and data_dir.lower().endswith('.csv'):
        raise errors.ConfigError(
            f'--data_dir={data_dir} is a CSV file: pass it as --dataset=csv --data_path={data_dir} (an interaction '
            'table; format: docs/DATA.md).'
        )
    if config.dataset in untimed_split_order and config.split_order == 'timestamp':
        raise errors.ConfigError(
            f'--split_order=timestamp: --dataset={config.dataset} has no timestamps; pass --split_order=file (each '
            "user's rows are in time order in the file) or --split_order=shuffle (a seeded random order)."
        )
    if config.dataset in timed_split_order and config.split_order == 'file':
        raise errors.ConfigError(
            f"--split_order=file: --dataset={config.dataset}'s file is not in time order; pass "
            '--split_order=timestamp (the default) or --split_order=shuffle (a seeded random order).'
        )
    if config.dataset != CSV:
        names = ['data_path', 'binarize_threshold', *csv_only]
        if config.dataset not in untimed_split_order + timed_split_order:
            names.append('split_order')
        given = [name for name in names if getattr(config, name) is not None]
        if given:
            raise errors.ConfigError(
                f'--{given[0]} applies to --dataset=csv only, got --dataset={config.dataset}: pass --dataset=csv '
                'to read a CSV interaction table, or drop it.'
            )
        return
    if not config.data_path:
        raise errors.ConfigError('--dataset=csv needs --data_path (the CSV interaction table; format: docs/DATA.md).')
    if config.data_dir:
        raise errors.ConfigError(
            f'--dataset=csv reads --data_path={config.data_path}; --data_dir={config.data_dir} names another dataset: '
            'drop one of them.'
        )
    if not os.path.isfile(config.data_path):
        state = 'is a directory' if os.path.isdir(config.data_path) else 'does not exist'
        raise errors.ConfigError(f'--data_path={config.data_path} {state} (expected a CSV file; format: docs/DATA.md).')
