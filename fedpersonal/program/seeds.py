"""Results over seeds: every headline row is run with several seeds and reported as mean and standard deviation.

>>> runs = [{'name': 'FedRecon', 'rmse': 0.96, 'best_round': 380}, {'name': 'FedRecon', 'rmse': 0.98, 'best_round': 400}]
>>> row = mean_over_seeds(runs, [0, 1], std_keys=('rmse',))
>>> row['rmse'], round(row['rmse_std'], 4), row['best_round'], row['seeds']
(0.97, 0.0141, 390.0, [0, 1])
"""

from __future__ import annotations

import math
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
        numeric = isinstance(first, (int, float, np.number)) and not isinstance(first, bool)
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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
