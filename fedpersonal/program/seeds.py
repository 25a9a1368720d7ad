"""Results over seeds: every headline row is run with several seeds and reported as mean and standard deviation.

>>> runs = [{'name': 'FedRecon', 'rmse': 0.96, 'best_round': 380}, {'name': 'FedRecon', 'rmse': 0.98, 'best_round': 400}]
>>> row = mean_over_seeds(runs, [0, 1], std_keys=('rmse',))
>>> row['rmse'], round(row['rmse_std'], 4), row['best_round'], row['seeds']
(0.97, 0.0141, 390.0, [0, 1])
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np


def mean_over_seeds(
    runs: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    *,
    std_keys: Sequence[str],
    per_seed_keys: Sequence[str] = (),
) -> dict[str, Any]:
    """One row from the same configuration's runs with `seeds` (one run per seed, in order).

    Non-numeric fields come from the first run; every numeric field is the mean over the runs that have a finite
    value of it; each of `std_keys` also gets ``<key>_std``, the sample standard deviation (0 for one run); the
    row lists its ``seeds`` and, under ``per_seed``, each run's `std_keys` and `per_seed_keys`.
    """
    if not runs or len(runs) != len(seeds):
        raise ValueError(f'{len(runs)} runs for seeds {list(seeds)}.')
    row: dict[str, Any] = {}
    for key, first in runs[0].items():
        # None: a diverged run's non-finite metric, read back from JSON (`outputs.write_json`).
        numeric = _number(first) or (first is None and any(_number(r.get(key)) for r in runs))
        if not numeric:
            row[key] = first
            continue
        values = [float(r[key]) for r in runs if _finite(r.get(key))]
        row[key] = float(np.mean(values)) if values else math.nan
    for key in std_keys:
        values = [float(r[key]) for r in runs if _finite(r.get(key))]
        row[f'{key}_std'] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    row['seeds'] = [int(s) for s in seeds]
    row['per_seed'] = [{k: r.get(k) for k in (*std_keys, *per_seed_keys)} for r in runs]
    return row


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _number(value) and math.isfinite(value)


def run_seeds(
    run: Callable[[Any], Mapping[str, Any]],
    config: Any,
    seeds: Sequence[int],
    *,
    row_key: str | Sequence[str],
    std_keys: Sequence[str],
    per_seed_keys: Sequence[str] = (),
    results_file: str = 'results.json',
    rows_of: Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]] = lambda results: results['rows'],
) -> dict[str, Any]:
    """Runs an experiment once per seed and averages its rows over the seeds.

    Each seed runs ``run(config)`` with ``config.seed`` set and its own output directory
    ``<config.output_dir>/seed<k>``; a seed whose `results_file` exists there is read back instead of rerun (a
    rerun after an interruption finishes the missing seeds; each run resumes from its own checkpoints).

    Args:
      run: ``config -> results`` with ``results['rows']``, writing `results_file` into ``config.output_dir``.
      config: A frozen dataclass config with ``seed`` and ``output_dir``.
      seeds: The seeds.
      row_key: The row field naming a row (e.g. ``'configuration'``); rows are matched across seeds by it, or a
        tuple of fields.
      std_keys: Row metrics that also get a ``<key>_std`` (`mean_over_seeds`).
      per_seed_keys: Other row fields kept per seed.
      results_file: The JSON file `run` writes.
      rows_of: The rows of one seed's results (default ``results['rows']``).

    Returns:
      The first seed's results, with ``rows`` (the rows of `rows_of`) averaged over the seeds and ``seeds``.
    """
    per_seed = []
    for seed in seeds:
        seed_config = dataclasses.replace(config, seed=seed, output_dir=seed_output_dir(config.output_dir, seed))
        path = os.path.join(seed_config.output_dir, results_file)
        if os.path.exists(path):
            with open(path) as f:
                per_seed.append(json.load(f))
        else:
            per_seed.append(dict(run(seed_config)))
    keys = (row_key,) if isinstance(row_key, str) else tuple(row_key)
    name = lambda row: tuple(row[k] for k in keys)
    results = dict(per_seed[0])
    results['rows'] = [
        mean_over_seeds(
            [next(r for r in rows_of(run_results) if name(r) == name(row)) for run_results in per_seed],
            seeds,
            std_keys=std_keys,
            per_seed_keys=per_seed_keys,
        )
        for row in rows_of(per_seed[0])
    ]
    results['seeds'] = [int(s) for s in seeds]
    return results


def seed_output_dir(output_dir: str, seed: int) -> str:
    """The output directory of one seed's run under an experiment's `output_dir`."""
    return os.path.join(output_dir, f'seed{seed}')
