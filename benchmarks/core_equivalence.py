"""Same numbers before and after a refactor: compares two experiment output trees value by value.

  python benchmarks/core_equivalence.py --before=/tmp/equiv/before --after=/tmp/equiv/after \
      --before_commit=SHA --after_commit=SHA \
      '--run_command=table1=python experiments/movielens_mf.py ... --output_dir=/tmp/equiv/{side}/table1' \
      --output=docs/results/core_equivalence.json

--before and --after each hold one output directory per run (``<root>/<run>/results.json``, as written by the
experiment binaries' --output_dir), or are one run's output directory themselves. For every run present on both
sides it compares

* every numeric leaf of the run's ``results.json`` files (the top-level one and each configuration's), rows matched
  by their ``configuration`` (or ``name``) rather than by position, and
* every ``metrics.csv`` (per-round metrics of each configuration), rows matched by ``round``, column by column,

skipping timing values (keys or columns naming seconds, time, wall, elapsed or duration) and strings (paths and
commands differ between the two trees). A value on one side only, or a NaN against a number, counts as an infinite
difference. Relative difference: |a - b| / max(|a|, |b|) (0 when both are 0).

Writes one row per run to --output: ``name``, ``before_commit``, ``after_commit``, ``max_abs_diff``,
``max_rel_diff``, ``num_values_compared``, ``command`` (the run's command, from --run_command with ``{side}``
left in), where the largest differences are, the first value (in file order, rounds ascending) whose relative
difference exceeds --tolerance, and a per-file breakdown. Prints a Markdown table.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterator
from typing import Any

from absl import app
from absl import flags

_BEFORE = flags.DEFINE_string('before', None, 'Output root of the "before" side.', required=True)
_AFTER = flags.DEFINE_string('after', None, 'Output root of the "after" side.', required=True)
_OUTPUT = flags.DEFINE_string('output', 'docs/results/core_equivalence.json', 'JSON file written.')
_BEFORE_COMMIT = flags.DEFINE_string('before_commit', '', 'Commit the "before" side ran (recorded only).')
_AFTER_COMMIT = flags.DEFINE_string('after_commit', '', 'Commit the "after" side ran (recorded only).')
_RUN_COMMAND = flags.DEFINE_multi_string(
    'run_command', [], 'NAME=COMMAND: the command of run NAME (recorded only; write {side} for the side).'
)
_TOLERANCE = flags.DEFINE_float(
    'tolerance', 1e-5, 'Relative difference above which a value counts as different (for first_difference).'
)

_TIMING = re.compile(r'seconds|(^|_)time($|_)|timing|wall|elapsed|duration', re.IGNORECASE)
_ROW_KEYS = ('configuration', 'name')


def _is_timing(key: str) -> bool:
    return bool(_TIMING.search(key))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _flatten(value: Any, path: str = '') -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs; list items that are dicts with a configuration/name are keyed by it."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _is_timing(str(key)):
                continue
            yield from _flatten(item, f'{path}.{key}' if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            label = str(i)
            if isinstance(item, dict):
                label = next((str(item[k]) for k in _ROW_KEYS if isinstance(item.get(k), str)), label)
            yield from _flatten(item, f'{path}[{label}]')
    else:
        yield path, value


def _csv_values(path: str) -> Iterator[tuple[str, Any]]:
    """(round/column, value) pairs of a metrics.csv, rounds ascending, timing columns skipped."""
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    key = 'round' if rows and 'round' in rows[0] else None
    rows.sort(key=lambda r: float(r[key]) if key and r[key] not in ('', None) else 0.0)
    for i, row in enumerate(rows):
        label = f'round {row[key]}' if key else f'row {i}'
        for column, value in row.items():
            if column == key or _is_timing(column):
                continue
            if value in ('', None):
                yield f'{label}/{column}', None
                continue
            try:
                yield f'{label}/{column}', float(value)
            except ValueError:
                yield f'{label}/{column}', value


def _difference(a: float, b: float) -> tuple[float, float]:
    if math.isnan(a) and math.isnan(b):
        return 0.0, 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return (0.0, 0.0) if a == b else (math.inf, math.inf)
    diff = abs(a - b)
    scale = max(abs(a), abs(b))
    return diff, (diff / scale if scale > 0 else 0.0)


class _Comparison:
    """Accumulates the differences of one run."""

    def __init__(self, tolerance: float):
        self.tolerance = tolerance
        self.max_abs = 0.0
        self.max_abs_both_sides = 0.0  # Over the values both sides have (renamed metrics aside).
        self.max_rel = 0.0
        self.max_abs_at: str | None = None
        self.max_rel_at: str | None = None
        self.count = 0
        self.first_difference: dict[str, Any] | None = None
        self.only_one_side: list[str] = []
        self.string_differences: list[str] = []
        self.files: dict[str, dict[str, Any]] = {}

    def compare(self, file: str, before: list[tuple[str, Any]], after: list[tuple[str, Any]]) -> None:
        stats = {'max_abs_diff': 0.0, 'max_rel_diff': 0.0, 'num_values_compared': 0}
        after_map = dict(after)
        before_keys = {k for k, _ in before}
        missing = [(k, v, None) for k, v in before if k not in after_map]
        extra = [(k, None, v) for k, v in after if k not in before_keys]
        pairs = [(k, v, after_map[k]) for k, v in before if k in after_map]
        for key, a, b in pairs + missing + extra:
            where = f'{file}: {key}'
            na, nb = _number(a), _number(b)
            if na is None and nb is None:
                if a is None or b is None:
                    if (a is None) != (b is None):
                        if isinstance(a if a is not None else b, str):
                            self.string_differences.append(where)
                        else:
                            self.only_one_side.append(where)
                            self._record(where, math.inf, math.inf, a, b, stats)
                elif a != b:
                    self.string_differences.append(where)
                continue
            if na is None or nb is None:
                self.only_one_side.append(where)
                self._record(where, math.inf, math.inf, a, b, stats)
                continue
            diff, rel = _difference(na, nb)
            self.max_abs_both_sides = max(self.max_abs_both_sides, diff)
            self._record(where, diff, rel, na, nb, stats)
        self.files[file] = stats

    def _record(self, where: str, diff: float, rel: float, a: Any, b: Any, stats: dict[str, Any]) -> None:
        self.count += 1
        stats['num_values_compared'] += 1
        stats['max_abs_diff'] = max(stats['max_abs_diff'], diff)
        stats['max_rel_diff'] = max(stats['max_rel_diff'], rel)
        if self.max_abs_at is None or diff > self.max_abs:
            self.max_abs, self.max_abs_at = diff, where
        if self.max_rel_at is None or rel > self.max_rel:
            self.max_rel, self.max_rel_at = rel, where
        if self.first_difference is None and rel > self.tolerance:
            self.first_difference = {'where': where, 'before': a, 'after': b, 'abs_diff': diff, 'rel_diff': rel}


def _result_files(root: str) -> list[str]:
    """Relative paths of results.json and metrics.csv files under a run's output directory, sorted."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name in ('results.json', 'metrics.csv'):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    # Per-round metrics first (they locate the first difference in time), then the results.
    return sorted(found, key=lambda p: (not p.endswith('metrics.csv'), p.count(os.sep) == 0, p))


def _runs(root: str) -> dict[str, str]:
    if os.path.exists(os.path.join(root, 'results.json')):
        return {os.path.basename(os.path.normpath(root)): root}
    return {
        name: os.path.join(root, name)
        for name in sorted(os.listdir(root))
        if os.path.exists(os.path.join(root, name, 'results.json'))
    }


def _values(path: str) -> list[tuple[str, Any]]:
    if path.endswith('.csv'):
        return list(_csv_values(path))
    with open(path) as f:
        return list(_flatten(json.load(f)))


def compare_runs(before_dir: str, after_dir: str, tolerance: float) -> _Comparison:
    comparison = _Comparison(tolerance)
    before_files, after_files = _result_files(before_dir), _result_files(after_dir)
    for file in before_files + [f for f in after_files if f not in before_files]:
        b = _values(os.path.join(before_dir, file)) if file in before_files else []
        a = _values(os.path.join(after_dir, file)) if file in after_files else []
        comparison.compare(file, b, a)
    return comparison


def _json_safe(value: Any) -> Any:
    """Infinities and NaNs as strings (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _fmt(x: float) -> str:
    return 'inf' if math.isinf(x) else ('0' if x == 0 else f'{x:.2e}')


def main(argv):
    del argv
    commands = dict(c.split('=', 1) for c in _RUN_COMMAND.value)
    before_runs, after_runs = _runs(_BEFORE.value), _runs(_AFTER.value)
    if not before_runs or not after_runs:
        raise app.UsageError(f'no results.json under {_BEFORE.value} or {_AFTER.value}')
    rows = []
    for name in sorted(set(before_runs) | set(after_runs)):
        if name not in before_runs or name not in after_runs:
            rows.append(
                {
                    'name': name,
                    'before_commit': _BEFORE_COMMIT.value,
                    'after_commit': _AFTER_COMMIT.value,
                    'error': f'run only in {"before" if name in before_runs else "after"}',
                }
            )
            continue
        c = compare_runs(before_runs[name], after_runs[name], _TOLERANCE.value)
        rows.append(
            {
                'name': name,
                'before_commit': _BEFORE_COMMIT.value,
                'after_commit': _AFTER_COMMIT.value,
                'max_abs_diff': c.max_abs,
                'max_rel_diff': c.max_rel,
                'num_values_compared': c.count,
                'command': commands.get(name, ''),
                'max_abs_diff_at': c.max_abs_at,
                'max_rel_diff_at': c.max_rel_at,
                'first_difference_above_tolerance': c.first_difference,
                'values_on_one_side_only': c.only_one_side,
                'differing_strings': c.string_differences,
                'files': c.files,
            }
        )
    out = {
        'command': 'python benchmarks/core_equivalence.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]),
        'tolerance': _TOLERANCE.value,
        'relative_difference': '|a - b| / max(|a|, |b|)',
        'skipped': 'timing values (keys/columns naming seconds, time, wall, elapsed, duration) and strings',
        'rows': rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
    with open(_OUTPUT.value, 'w') as f:
        json.dump(_json_safe(out), f, indent=2, allow_nan=False, default=str)
        f.write('\n')
    print('| run | values compared | max abs diff | max rel diff | first difference > tolerance |')
    print('|---|---|---|---|---|')
    for r in rows:
        if 'error' in r:
            print(f'| {r["name"]} | {r["error"]} | | | |')
            continue
        first = r['first_difference_above_tolerance']
        print(
            f'| {r["name"]} | {r["num_values_compared"]} | {_fmt(r["max_abs_diff"])} | {_fmt(r["max_rel_diff"])} | '
            f'{first["where"] if first else "none"} |'
        )


if __name__ == '__main__':
    app.run(main)
