"""The configuration an output directory's run belongs to: recorded at the start, checked on resume (TF-free).

Every binary (`experiment_main`, before the task runs) calls `check_output_dir(config)`:

* a new directory, or one whose run was killed before it kept anything (no checkpoint, no finished row): the run
  starts normally and its configuration is recorded in ``run_config.json``;
* a directory holding a run's progress (a checkpoint or a ``results.json``) under the same configuration: the run
  resumes (the training loop restarts from the latest checkpoint, finished rows are read back where the task does);
* the same under another configuration: `ConfigMismatchError`, naming every differing flag as
  ``--flag: recorded -> given``. Fields declared ``config_parts.option(..., may_change_on_resume=True)``
  (``output_dir``, ``rounds_per_checkpoint``, ...) may differ: they cannot change the results (the rule and why
  ``total_rounds`` is not one of them: `fedpersonal.program.config_parts`). Paths (``--data_dir``,
  ``--data_path``: ``option(..., is_path=True)``) are recorded absolute and compared as the files they name:
  another spelling of the same directory resumes, the same relative spelling from another working directory does
  not;
* ``fresh_start=True`` (the binaries' ``--fresh_start``): the previous run's outputs (only what this package writes:
  ``run_config.json``, ``config.json``, ``results.json``, top-level plots and the row directories holding metrics,
  checkpoints or results) are moved to ``previous_runs/<UTC time>/`` inside the directory, nothing is deleted, and
  the run starts over.

`command_line(script, argv)` is the shell command that reruns a run, as the benchmarks' results files record it.

The record is the config's fields without those that may change on resume (as HPFL's ``run_config.json`` has
always been); a directory written before records existed is checked against its ``config.json``, and records
written under deprecated flag names or values (``methods``, ``dataset='assist'``) compare under the new ones
(`config_parts.canonical_record`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import operator
import os
import shlex
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from absl import logging

from fedpersonal import errors
from fedpersonal.program import config_parts

RUN_CONFIG_FILE = 'run_config.json'
LEGACY_CONFIG_FILE = 'config.json'  # Every task writes its full configuration there.
PREVIOUS_RUNS_DIR = 'previous_runs'
# Top-level files every task writes; directories holding one of _ROW_MARKERS are a row's outputs.
_PACKAGE_FILES = frozenset({RUN_CONFIG_FILE, LEGACY_CONFIG_FILE, 'results.json'})
_PACKAGE_SUFFIXES = ('.png',)
_ROW_MARKERS = frozenset({'metrics.csv', 'results.json', RUN_CONFIG_FILE, 'checkpoints', 'tensorboard'})
_CHECKPOINT_PREFIX = 'program_state_'  # tff.program.FileProgramStateManager's (the training loop's checkpoints).


class ConfigMismatchError(errors.ConfigError):
    """A run would resume from checkpoints written under another configuration."""


def _absolute(value: Any) -> Any:
    """A path field's value as an absolute path (``~`` expanded; symlinks kept as spelled)."""
    return os.path.abspath(os.path.expanduser(value)) if isinstance(value, str) else value


def _same_path(recorded: Any, current: Any) -> bool:
    """Whether two values of a path field name the same file (a relative recorded path: from the current
    directory, as records written before paths were recorded absolute)."""
    if not (isinstance(recorded, str) and isinstance(current, str)):
        return recorded == current
    return os.path.realpath(os.path.expanduser(recorded)) == os.path.realpath(os.path.expanduser(current))


def path_fields(config_cls: type) -> frozenset[str]:
    """The fields of `config_cls` that name files or directories (`config_parts.option(..., is_path=True)`)."""
    return frozenset(f.name for f in dataclasses.fields(config_cls) if config_parts.is_path(config_cls, f.name))


def recorded_config(config: Any) -> dict[str, Any]:
    """The JSON record of `config`: its fields, without those that may change on resume; paths absolute."""
    paths = path_fields(type(config))
    values = {
        f.name: _absolute(getattr(config, f.name)) if f.name in paths else getattr(config, f.name)
        for f in dataclasses.fields(config)
        if not config_parts.may_change_on_resume(type(config), f.name)
    }
    return json.loads(json.dumps(values, default=str))


def _flag_value(value: Any) -> str:
    """A recorded value as it is spelled on the command line."""
    if value is None:
        return 'none'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ','.join(map(str, value))
    return str(value)


def differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, paths: frozenset[str] = frozenset()
) -> list[str]:
    """``'--flag: recorded -> current'`` for every field both have with different values, sorted by flag.

    A field only one side has (added or removed since the record was written) is not compared; a field in `paths`
    differs only if the two name different files (``data`` and ``./data`` are the same value).
    """
    return [
        f'--{name}: {_flag_value(recorded[name])} -> {_flag_value(current[name])}'
        for name in sorted(set(recorded) & set(current))
        if not (_same_path if name in paths else operator.eq)(recorded[name], current[name])
    ]


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None  # Missing or cut short (a kill while writing it): as no record.
    return record if isinstance(record, dict) else None


def read_record(output_dir: str, config_cls: type) -> dict[str, Any] | None:
    """The configuration recorded in `output_dir` under the current names (None: none there).

    ``run_config.json``, else (directories written before it existed) ``config.json``.
    """
    for name in (RUN_CONFIG_FILE, LEGACY_CONFIG_FILE):
        record = _read_json(os.path.join(output_dir, name))
        if record is not None:
            return config_parts.canonical_record(config_cls, record)
    return None


def _walk(output_dir: str):
    """`os.walk(output_dir)` without `PREVIOUS_RUNS_DIR`."""
    for root, dirs, files in os.walk(output_dir):
        if root == output_dir and PREVIOUS_RUNS_DIR in dirs:
            dirs.remove(PREVIOUS_RUNS_DIR)
        yield root, dirs, files


def has_progress(output_dir: str) -> bool:
    """Whether `output_dir` holds something a run would resume from: a checkpoint or a finished row's results."""
    for _, dirs, files in _walk(output_dir):
        if 'results.json' in files or any(d.startswith(_CHECKPOINT_PREFIX) for d in dirs):
            return True
    return False


def _is_package_entry(path: str) -> bool:
    """Whether the top-level entry `path` of an output directory is one this package writes."""
    name = os.path.basename(path)
    if os.path.isfile(path):
        return name in _PACKAGE_FILES or name.endswith(_PACKAGE_SUFFIXES)
    if not os.path.isdir(path) or name == PREVIOUS_RUNS_DIR:
        return False
    return any(_ROW_MARKERS & set(dirs + files) for _, dirs, files in os.walk(path))


def move_previous_outputs(output_dir: str) -> str | None:
    """Moves the outputs this package wrote in `output_dir` to ``previous_runs/<UTC time>/`` there.

    Returns:
      Where they went (None: there was nothing to move). Any other entry stays where it is.
    """
    if not os.path.isdir(output_dir):
        return None
    entries = sorted(e for e in os.listdir(output_dir) if _is_package_entry(os.path.join(output_dir, e)))
    if not entries:
        return None
    stamp = datetime.datetime.now(datetime.UTC).strftime('%Y%m%dT%H%M%SZ')
    target = os.path.join(output_dir, PREVIOUS_RUNS_DIR, stamp)
    suffix = 1
    while os.path.exists(target):
        suffix += 1
        target = os.path.join(output_dir, PREVIOUS_RUNS_DIR, f'{stamp}_{suffix}')
    os.makedirs(target)
    for entry in entries:
        os.rename(os.path.join(output_dir, entry), os.path.join(target, entry))
    return target


def _write_json(path: str, value: Mapping[str, Any]) -> None:
    """Writes `value` to `path` atomically (a kill leaves the old file or the new one)."""
    with open(path + '.tmp', 'w') as f:
        json.dump(value, f, indent=2, sort_keys=True)
    os.replace(path + '.tmp', path)


def _canonicalize_nested_records(output_dir: str, config_cls: type, current: Mapping[str, Any]) -> None:
    """Rewrites the rows' ``run_config.json`` records (the training loop's) written under deprecated names or
    with another spelling of a path than `current` (the run's record, already checked to name the same files).

    The loop compares its record verbatim on resume; after a rename (HPFL's ``dataset='assist'``) or with
    ``--data_dir`` spelled differently, the record of a row checkpointed before would otherwise no longer match.
    """
    paths = path_fields(config_cls)
    for root, _, files in _walk(output_dir):
        if root == output_dir or RUN_CONFIG_FILE not in files:
            continue
        path = os.path.join(root, RUN_CONFIG_FILE)
        record = _read_json(path)
        if record is None:
            continue
        canonical = config_parts.canonical_record(config_cls, record)
        for name in paths & set(canonical) & set(current):
            if _same_path(canonical[name], current[name]):
                canonical[name] = current[name]
        if canonical != record:
            _write_json(path, canonical)


def check_output_dir(config: Any, *, fresh_start: bool = False) -> None:
    """Refuses to resume the run in ``config.output_dir`` under another configuration; records this one.

    See the module docstring for the rules.

    Args:
      config: The run's config (a dataclass with ``output_dir``).
      fresh_start: Move the previous run's outputs aside and start over.

    Raises:
      ConfigMismatchError: The directory holds the progress of a run whose configuration differs (every differing
        flag named as ``--flag: recorded -> given``).
    """
    output_dir = config.output_dir
    current = recorded_config(config)
    paths = path_fields(type(config))
    if fresh_start:
        moved = move_previous_outputs(output_dir)
        if moved:
            logging.warning('--fresh_start: the previous outputs in %s were moved to %s.', output_dir, moved)
    elif os.path.isdir(output_dir):
        recorded = read_record(output_dir, type(config))
        if recorded is not None and has_progress(output_dir):
            changed = differences(recorded, current, paths=paths)
            if changed:
                raise ConfigMismatchError(
                    f'--output_dir={output_dir} holds a run with another configuration ({"; ".join(changed)}): '
                    'rerun with its flags to resume it, pass another --output_dir, or pass --fresh_start to move '
                    f'its outputs to {os.path.join(output_dir, PREVIOUS_RUNS_DIR)}/ and start over.'
                )
            _canonicalize_nested_records(output_dir, type(config), current)
        elif recorded is not None and (changed := differences(recorded, current, paths=paths)):
            # Only a record of another configuration is a previous run: a new directory has none, and a record of
            # this configuration is this run's own (rerun before its first checkpoint).
            logging.info(
                '%s: a previous run with another configuration (%s) stopped before its first checkpoint; '
                'starting over.',
                output_dir,
                '; '.join(changed),
            )
    os.makedirs(output_dir, exist_ok=True)
    _write_json(os.path.join(output_dir, RUN_CONFIG_FILE), current)


def command_line(script: str, argv: Sequence[str], *, omit: Sequence[str] = ('--notes',)) -> str:
    """The shell command that reruns `script` with `argv`, leaving out flags that only add prose (`omit`).

    >>> command_line('benchmarks/nwp_table2.py', ['--seeds=0,1', '--notes=Resumed once.', '--vocab_sizes', '250'])
    'python benchmarks/nwp_table2.py --seeds=0,1 --vocab_sizes 250'
    >>> command_line('b.py', ['--notes', 'Resumed once.', '--data_dir=my data'])
    "python b.py '--data_dir=my data'"
    """
    kept: list[str] = []
    skip_value = False
    for a in argv:
        if skip_value:
            skip_value = False
        elif a.split('=')[0] in omit:
            skip_value = '=' not in a  # `--notes TEXT`: its value is the next argument.
        else:
            kept.append(a)
    return shlex.join(['python', script, *kept])
