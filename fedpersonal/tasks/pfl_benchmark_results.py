"""The personalization benchmark's rows over seeds, beside PFLlib's leaderboard (no TensorFlow).

A run's metric rows become its row (`summarize`: the accuracy at the last evaluation, the best so far, the slope
of the last 10% of rounds, the worst client's); a method's runs (one such row per seed) become one row
(`over_seeds`): the mean and standard deviation over the seeds of the accuracy at the last round, of the best
accuracy so far and of the worst client's accuracy, the mean slope of the last 10% of rounds, the median seconds per
round, and the accuracy by round as mean and standard deviation (`curve`, `worst_client_curve`: ``[round, mean,
std]``). `docs_rows` turns a partition's results into the rows of ``docs/results/pfl_benchmark.json`` (with PFLlib's
number where its leaderboard has the method), `markdown_table` into the table of ``docs/RESULTS.md``, and
`plot_by_round` draws the accuracy by round, the mean over seeds with a band of one standard deviation. A row
tested once on the model of its best validation round (the MovieLens block, by RMSE) has its validation value
(``validation_rmse``) where the others have the best test value so far, and validation curves.

Example:

>>> runs = [
...     {'name': 'FedAvg', 'method': 'fedavg', 'rounds': 2, 'accuracy': 0.5, 'best_accuracy': 0.6,
...      'worst_client_accuracy': 0.2, 'curve': [[1, 0.6], [2, 0.5]], 'worst_client_curve': [[1, 0.3], [2, 0.2]]},
...     {'name': 'FedAvg', 'method': 'fedavg', 'rounds': 2, 'accuracy': 0.7, 'best_accuracy': 0.7,
...      'worst_client_accuracy': 0.4, 'curve': [[1, 0.4], [2, 0.7]], 'worst_client_curve': [[1, 0.1], [2, 0.4]]},
... ]
>>> row = over_seeds(runs, [0, 1])
>>> row['accuracy'], round(row['accuracy_std'], 4), round(row['best_accuracy'], 4), row['seeds']
(0.6, 0.1414, 0.65, [0, 1])
>>> [round(v, 4) for v in row['curve'][1]]  # Round 2: the mean and std of 0.5 and 0.7.
[2, 0.6, 0.1414]
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors
from fedpersonal.program import seeds as seeds_lib
from fedpersonal.tasks import pfl_benchmark_config

# PFLlib's leaderboard (pfllib.com/benchmark.html; Fashion-MNIST, 20 clients, its 4-layer CNN, 2000 rounds; the best
# test accuracy, mean +- std over its runs) as fractions: (partition, method) -> (accuracy, std).
LEADERBOARD: dict[tuple[str, str], tuple[float, float]] = {
    ('pathological', 'fedavg'): (0.8041, 0.0008),
    ('pathological', 'fedprox'): (0.7808, 0.0015),
    ('pathological', 'per_fedavg'): (0.9918, 0.0008),
    ('pathological', 'pfedme'): (0.9935, 0.0014),
    ('pathological', 'ditto'): (0.9944, 0.0006),
    ('pathological', 'apfl'): (0.9941, 0.0002),
    ('pathological', 'fedala'): (0.9957, 0.0001),
    ('dirichlet', 'fedavg'): (0.8585, 0.0019),
    ('dirichlet', 'fedprox'): (0.8563, 0.0057),
    ('dirichlet', 'per_fedavg'): (0.9510, 0.0010),
    ('dirichlet', 'pfedme'): (0.9725, 0.0017),
    ('dirichlet', 'ditto'): (0.9747, 0.0004),
    ('dirichlet', 'apfl'): (0.9725, 0.0008),
    ('dirichlet', 'fedala'): (0.9766, 0.0002),
}
LEADERBOARD_DATASET = 'fashion_mnist'

# A row's metric -> whether higher is better: classification accuracy (the image block), RMSE of predicted ratings
# (the MovieLens block, `fedpersonal.tasks.pfl_benchmark_movielens`; its rows also carry the rating accuracy).
METRICS = {'accuracy': True, 'rmse': False}


def std_keys(metric: str = 'accuracy', selected_on_validation: bool = False) -> tuple[str, ...]:
    """The keys of a row that also get ``<key>_std`` over the seeds: the metric, the best one so far on test (or,
    for a row whose model was selected on validation, its validation value) and the worst client's."""
    _check_metric(metric)
    return (metric, f'validation_{metric}' if selected_on_validation else f'best_{metric}', f'worst_client_{metric}')


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f'metric must be one of {tuple(METRICS)}, got {metric!r}.')


CURVES = ('curve', 'worst_client_curve')  # ``[[round, value], ...]`` per seed; ``[[round, mean, std], ...]`` over.
# The keys of a row of docs/results/pfl_benchmark.json, then those only a method on the leaderboard has.
DOCS_KEYS = (
    'name',
    'method',
    'dataset',
    'partition',
    'clients',
    'rounds',
    'accuracy',
    'accuracy_std',
    'best_accuracy',
    'best_accuracy_std',
    'slope_last_10pct',
    'seeds',
    'worst_client_accuracy',
    'seconds_per_round',
    *CURVES,  # So that a later `updated_results` can redraw a partition's figure from the file alone.
)
LEADERBOARD_KEYS = ('pfllib_accuracy', 'explanation')
# Then those of a row whose metric is RMSE (the MovieLens block; its ``accuracy`` is the rating accuracy): test
# metrics of the model of the best validation round, that round and its validation RMSE, the client learning rate
# (and, selected among several, each one's validation RMSE with the first seed).
RMSE_KEYS = (
    'metric',
    'rmse',
    'rmse_std',
    'validation_rmse',
    'validation_rmse_std',
    'best_round',
    'worst_client_rmse',
    'client_learning_rate',
    'learning_rate_selection',
)
PENDING = '(explanation pending)'  # The markdown cell of a leaderboard row whose explanation is not written yet.


def _last_slope(curve: list[tuple[int, float]]) -> float | None:
    """Least-squares slope (accuracy per round) over the evaluations of the last 10% of rounds (at least 2)."""
    if len(curve) < 2:
        return None
    last = curve[-1][0]
    tail = [(r, a) for r, a in curve if r >= last - max(1, round(0.1 * last))] or curve[-2:]
    if len(tail) < 2:
        tail = curve[-2:]
    rounds, accuracies = np.array(tail, dtype=np.float64).T
    return float(np.polyfit(rounds, accuracies, 1)[0])


def summarize(
    rows: Sequence[Mapping[str, float]],
    *,
    seconds_per_round: float | None,
    metric: str = 'accuracy',
    split: str = 'test',
) -> dict[str, Any]:
    """A method's row from its metric rows: the last evaluation, the best `metric` so far (the highest accuracy,
    the lowest RMSE: `METRICS`; of the finite evaluations), the tail's slope; an RMSE row also has the rating
    ``accuracy`` at the last round. With ``split='validation'`` (a row tested once on the model of its best
    validation round, the caller's to add) only the rounds, the slope and the curves, all of the validation
    evaluations.

    >>> rows = [{'round': 1, 'test/rmse': 1.2, 'test/worst_client_rmse': 2.0, 'test/mean_client_rmse': 1.3,
    ...          'test/accuracy': 0.3}, {'round': 2, 'test/rmse': 1.1, 'test/worst_client_rmse': 1.9,
    ...          'test/mean_client_rmse': 1.2, 'test/accuracy': 0.35}]
    >>> row = summarize(rows, seconds_per_round=None, metric='rmse')
    >>> row['rmse'], row['best_rmse'], row['best_round'], row['worst_client_rmse'], row['accuracy']
    (1.1, 1.1, 2, 1.9, 0.35)
    """
    _check_metric(metric)
    key = f'{split}/{metric}'
    evaluated = [r for r in rows if key in r]
    if not evaluated:
        raise ValueError(f'the run has no {split} evaluation (rounds_per_eval > total_rounds?)')
    curve = [(int(r['round']), float(r[key])) for r in evaluated]
    worst = [(int(r['round']), float(r[f'{split}/worst_client_{metric}'])) for r in evaluated]
    if split != 'test':
        return {
            'rounds': int(evaluated[-1]['round']),
            'slope_last_10pct': _last_slope(curve),
            'seconds_per_round': seconds_per_round,
            'curve': curve,
            'worst_client_curve': worst,
        }
    sign = 1.0 if METRICS[metric] else -1.0
    # A diverged evaluation (not finite) is never the best (`max` would keep a NaN met first).
    finite = [r for r in evaluated if np.isfinite(float(r[key]))] or evaluated
    best = max(finite, key=lambda r: sign * r[key])
    last = evaluated[-1]
    row: dict[str, Any] = {
        'rounds': int(last['round']),
        metric: float(last[key]),
        f'best_{metric}': float(best[key]),
        'best_round': int(best['round']),
        'slope_last_10pct': _last_slope(curve),
        f'mean_client_{metric}': float(last[f'test/mean_client_{metric}']),
        f'worst_client_{metric}': float(last[f'test/worst_client_{metric}']),
    }
    if metric != 'accuracy' and 'test/accuracy' in last:
        row['accuracy'] = float(last['test/accuracy'])
    row.update(seconds_per_round=seconds_per_round, curve=curve, worst_client_curve=worst)
    return row


def _mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """``[[round, mean, std], ...]`` of the same rounds' values in every curve (std: sample, 0 for one curve)."""
    rounds = [[int(r) for r, _ in curve] for curve in curves]
    if any(r != rounds[0] for r in rounds):
        raise ValueError(f'the seeds were evaluated at different rounds: {rounds}')
    values = np.array([[v for _, v in curve] for curve in curves], dtype=np.float64)
    std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(values.shape[1])
    return [[r, float(m), float(s)] for r, m, s in zip(rounds[0], values.mean(axis=0), std)]


def over_seeds(runs: Sequence[Mapping[str, Any]], seeds: Sequence[int], metric: str = 'accuracy') -> dict[str, Any]:
    """One method's row from its runs, one per seed (in the order of `seeds`); see the module docstring. `metric`
    names the row's keys with a std over the seeds (`std_keys`); an RMSE row's rating accuracy gets one too.

    Raises:
      ValueError: The runs have different numbers of rounds or evaluation rounds, or are not one per seed.
    """
    if len({int(r['rounds']) for r in runs}) > 1:
        raise ValueError(f'the seeds ran different rounds: {[r["rounds"] for r in runs]}')
    scalars = [{k: v for k, v in r.items() if k not in (*CURVES, 'seed')} for r in runs]
    selected = all(f'validation_{metric}' in r for r in runs)
    keys = std_keys(metric, selected)
    keys += ('accuracy',) if metric != 'accuracy' and all('accuracy' in r for r in runs) else ()
    per_seed = ('best_round', 'slope_last_10pct', f'mean_client_{metric}', 'seconds_per_round')
    row = seeds_lib.mean_over_seeds(scalars, seeds, std_keys=keys, per_seed_keys=per_seed)
    # The median over seeds: on a shared machine, other work only ever adds to a run's seconds.
    seconds = [r['seconds_per_round'] for r in runs if r.get('seconds_per_round') is not None]
    row['seconds_per_round'] = float(np.median(seconds)) if seconds else None
    row['rounds'] = int(runs[0]['rounds'])
    for key in CURVES:
        if all(key in r for r in runs):
            row[key] = _mean_curve([r[key] for r in runs])
    return row


def _explanation(explanations: Mapping[str, Any], partition: str, row: Mapping[str, Any]) -> str | None:
    """The lead's text for a row: ``explanations[partition][name or method]``; None when not written."""
    texts = explanations.get(partition) or {}
    text = texts.get(row['name'], texts.get(row.get('method', '')))
    return str(text) if text else None


def docs_rows(results: Mapping[str, Any], explanations: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of ``docs/results/pfl_benchmark.json`` for one partition's results (`pfl_benchmark.run`'s).

    Args:
      results: A run's results (its ``rows`` averaged over seeds).
      explanations: ``{partition: {row name or method: text}}``: why a row differs from PFLlib's number,
        written after the runs; a leaderboard row without one gets ``explanation`` None.

    Returns:
      One row per method (`DOCS_KEYS`, plus `LEADERBOARD_KEYS` where PFLlib's leaderboard has the method on this
      dataset and partition).
    """
    explanations = explanations or {}
    partition, dataset = results['partition'], results['dataset']
    metric = results.get('metric', 'accuracy')
    keys = DOCS_KEYS if metric == 'accuracy' else DOCS_KEYS + RMSE_KEYS
    rows = []
    for row in results['rows']:
        out = {'dataset': dataset, 'partition': partition, 'clients': results['clients'], 'metric': metric, **row}
        out = {key: out.get(key) for key in keys}
        reference = LEADERBOARD.get((partition, row.get('method', ''))) if dataset == LEADERBOARD_DATASET else None
        if reference is not None:
            out['pfllib_accuracy'] = reference[0]
            out['explanation'] = _explanation(explanations, partition, row)
        rows.append(out)
    return rows


def _percent(value: Any, std: Any = None) -> str:
    if value is None:
        return '-'
    return f'{100 * value:.2f}' + ('' if std is None else f' +- {100 * std:.2f}')


def _rmse_table(group: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rows of an RMSE partition (the MovieLens block): the test RMSE (lower is better) and rating accuracy of
    each seed's model of its best validation round, that round and its validation RMSE, the learning rate."""
    first = group[0]
    seeds = ', '.join(str(s) for s in first['seeds'])
    lines = [
        f'{first["dataset"]}, {first["partition"]} partition, {first["clients"]} clients, {first["rounds"]} rounds, '
        f'mean +- std over seeds {seeds}; each seed tested once with its model of the best validation round: RMSE '
        'of the predicted ratings over all test ratings (lower is better), rating accuracy in % (predictions within '
        'the threshold of the rating):',
        '',
        '| method | test RMSE | validation RMSE | best round (mean) | client learning rate (validation RMSE, first '
        'seed) | slope of last 10% (validation RMSE/100 rounds) | worst client test RMSE | rating accuracy | s/round |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in group:
        slope, seconds, best_round = r.get('slope_last_10pct'), r['seconds_per_round'], r.get('best_round')

        def number(value: Any, std: Any = None) -> str:
            return '-' if value is None else f'{value:.4f}' + ('' if std is None else f' +- {std:.4f}')

        rates = r.get('learning_rate_selection') or {}
        chosen = r.get('client_learning_rate')
        rate = '-' if chosen is None else f'**{chosen:g}**' if rates else f'{chosen:g}'
        if rates:
            shown = (f'{float(k):g}: {"diverged" if v is None else number(v)}' for k, v in rates.items())
            rate += ' (' + ', '.join(shown) + ')'
        lines.append(
            f'| {r["name"]} | {number(r["rmse"], r.get("rmse_std"))} '
            f'| {number(r.get("validation_rmse"), r.get("validation_rmse_std"))} '
            f'| {"-" if best_round is None else f"{best_round:.0f}"} | {rate} '
            f'| {"-" if slope is None else f"{100 * slope:+.4f}"} | {number(r.get("worst_client_rmse"))} '
            f'| {_percent(r.get("accuracy"), r.get("accuracy_std"))} | {"-" if seconds is None else f"{seconds:.3f}"} |'
        )
    return lines


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`docs_rows` (any partitions) as markdown, one table per partition, accuracies in % (RMSE partitions:
    `_rmse_table`)."""
    lines: list[str] = []
    for partition in dict.fromkeys(r['partition'] for r in rows):
        group = [r for r in rows if r['partition'] == partition]
        first = group[0]
        seeds = ', '.join(str(s) for s in first['seeds'])
        if lines:
            lines.append('')
        if first.get('metric', 'accuracy') != 'accuracy':
            lines += _rmse_table(group)
            continue
        lines += [
            f'{first["dataset"]}, {partition} partition, {first["clients"]} clients, {first["rounds"]} rounds, '
            f'mean +- std over seeds {seeds}; accuracy in % (correct test predictions over all test examples):',
            '',
            '| method | accuracy at last round | best so far | slope of last 10% (points/100 rounds) | worst client '
            '| s/round | PFLlib (2000 rounds, best) | difference |',
            '|---|---|---|---|---|---|---|---|',
        ]
        for r in group:
            slope, seconds = r.get('slope_last_10pct'), r['seconds_per_round']
            reference = r.get('pfllib_accuracy')
            difference = '' if reference is None else (r.get('explanation') or PENDING)
            lines.append(
                f'| {r["name"]} | {_percent(r["accuracy"], r["accuracy_std"])} '
                f'| {_percent(r.get("best_accuracy"), r.get("best_accuracy_std"))} '
                f'| {"-" if slope is None else f"{1e4 * slope:+.2f}"} | {_percent(r["worst_client_accuracy"])} '
                f'| {"-" if seconds is None else f"{seconds:.3f}"} '
                f'| {_percent(reference)} | {difference} |'
            )
    return '\n'.join(lines)


def plot_by_round(results: Mapping[str, Any], path: str) -> str | None:
    """Test accuracy (or the results' ``metric``, on its ``curve_split``) and the worst client's by round, each
    method's mean over seeds
    with a band of +- one std; a panel whose values span more than 100x (a diverged evaluation) on a log scale."""
    from fedpersonal import program  # pylint: disable=g-import-not-at-top  # TFF: only to plot.

    rows = [r for r in results['rows'] if r.get('curve')]
    if not rows:
        return None
    metric = {'accuracy': 'accuracy', 'rmse': 'RMSE'}[results.get('metric', 'accuracy')]
    split = results.get('curve_split', 'test')  # The MovieLens block's curves are its validation evaluations.
    panels = (('curve', f'{split} {metric} (all clients)'), ('worst_client_curve', f"worst client's {split} {metric}"))
    fig, axes = program.new_figure(1, len(panels), figsize=(4.6 * len(panels) + 2.2, 3.6), squeeze=False)
    colours = program.colormap('tab10' if len(rows) <= 10 else 'tab20', 10 if len(rows) <= 10 else 20).colors
    for ax, (key, label) in zip(axes[0], panels):
        for i, row in enumerate(rows):
            if not row.get(key):
                continue
            rounds, mean, std = np.array(row[key], dtype=np.float64).T
            colour = colours[i % len(colours)]
            ax.plot(rounds, mean, color=colour, label=row['name'], linestyle='-' if i < len(colours) else '--')
            ax.fill_between(rounds, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
        ax.set_xlabel('round')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        values = np.array([v for row in rows for _, v, _ in row.get(key) or []], dtype=np.float64)
        values = values[np.isfinite(values) & (values > 0)]
        if values.size and values.max() > 100 * values.min():  # A diverged evaluation would flatten the rest.
            ax.set_yscale('log')
    seeds = ', '.join(str(s) for s in rows[0].get('seeds', []))
    title = (
        f'{results["dataset"]}, {results["partition"]} partition, {results["clients"]} clients: '
        f'mean over seeds {seeds}, band +- 1 std'
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    return program.save_figure_with_side_legend(fig, handles, labels, path, legend_inches=2.0, title=title)


def command_for(config: Mapping[str, Any], script: str = 'experiments/pfl_benchmark.py') -> str:
    """The command that reruns a recorded configuration (``config.json``): the flags that differ from the defaults.

    >>> command_for({'partition': 'dirichlet', 'total_rounds': 300, 'seeds': [0, 1, 2], 'batch_size': 10})
    'python experiments/pfl_benchmark.py --partition=dirichlet --total_rounds=300'
    """
    defaults = {f.name: f.default for f in dataclasses.fields(pfl_benchmark_config.PflBenchmarkConfig)}
    flags = []
    for name, value in config.items():
        default = defaults.get(name, dataclasses.MISSING)
        if isinstance(default, tuple):
            default = list(default)
        if name not in defaults or value == default:
            continue
        shown = ','.join(str(v) for v in value) if isinstance(value, (list, tuple)) else value
        flags.append(f'--{name}={"none" if shown is None else shown}')
    return ' '.join(['python', script, *flags])


def read_run(run_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(results, config)`` of a finished `pfl_benchmark.run` in `run_dir` (its results.json and config.json).

    Raises:
      errors.InputError: Either file is missing or unreadable, or the results are not the benchmark's.
    """
    loaded = []
    for name in ('results.json', 'config.json'):
        path = os.path.join(run_dir, name)
        try:
            with open(path) as f:
                loaded.append(json.load(f))
        except (OSError, ValueError) as error:
            raise errors.InputError(f'{path}: not a finished benchmark run ({error}).') from None
    results, config = loaded
    if not {'partition', 'dataset', 'clients', 'rows'} <= set(results) or any(
        'seeds' not in r for r in results['rows']
    ):
        raise errors.InputError(f'{run_dir}/results.json is not the rows over seeds of experiments/pfl_benchmark.py.')
    return results, config


def previous_explanations(path: str) -> dict[str, dict[str, str]]:
    """``{partition: {name: text}}`` of the explanations already written in the results file `path` (if any)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = json.load(f).get('rows', [])
    texts: dict[str, dict[str, str]] = {}
    for row in rows:
        if row.get('explanation'):
            texts.setdefault(row['partition'], {})[row['name']] = row['explanation']
    return texts


def docs_results(
    run_dirs: Sequence[str], explanations: Mapping[str, Mapping[str, str]] | None = None
) -> dict[str, Any]:
    """The contents of ``docs/results/pfl_benchmark.json`` from finished runs, one per partition.

    Args:
      run_dirs: The runs' ``--output_dir`` (e.g. the pathological and the Dirichlet partition's).
      explanations: ``{partition: {row name or method: text}}`` (`docs_rows`).

    Returns:
      ``rows`` (`docs_rows` of every run) and ``runs``: per partition the command that reruns it and its directory.

    Raises:
      errors.InputError: A directory holds no finished run, or two hold the same dataset and partition.
    """
    rows: list[dict[str, Any]] = []
    runs: dict[str, Any] = {}
    for run_dir in run_dirs:
        results, config = read_run(run_dir)
        key = f'{results["dataset"]}/{results["partition"]}'
        if key in runs:
            raise errors.InputError(f'{run_dir} and {runs[key]["output_dir"]} both hold {key}.')
        runs[key] = {'output_dir': run_dir, 'command': command_for(config), 'statistics': results.get('statistics')}
        rows += docs_rows(results, explanations)
    return {'rows': rows, 'runs': runs}


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return row['dataset'], row['partition'], row['method']


def updated_results(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`previous` contents of ``docs/results/pfl_benchmark.json`` with `new`'s rows (`docs_results` of some
    methods' runs) in place of its rows of the same dataset, partition and method, the others kept in their places
    (a method new to a partition goes after its rows); each partition's ``runs`` entry keeps the run that made it
    and lists every later one under ``updates`` (its methods, command and directory).

    Raises:
      errors.InputError: A new row ran other rounds than the rows it joins (a partition's rows share one R).
    """
    rounds = {_key(r)[:2]: r['rounds'] for r in previous['rows']}
    for row in new['rows']:
        if rounds.get(_key(row)[:2], row['rounds']) != row['rounds']:
            raise errors.InputError(
                f'{row["partition"]}/{row["name"]}: {row["rounds"]} rounds, the rows it joins '
                f"{rounds[_key(row)[:2]]}: a partition's rows run the same rounds."
            )
    replacing = {_key(r): r for r in new['rows']}
    rows = [replacing.pop(_key(r), r) for r in previous['rows']]
    for row in replacing.values():  # Methods new to their partition: after its last row.
        last = max((i for i, r in enumerate(rows) if _key(r)[:2] == _key(row)[:2]), default=len(rows) - 1)
        rows.insert(last + 1, row)
    runs = {k: dict(v) for k, v in previous.get('runs', {}).items()}
    for name, run in new['runs'].items():
        if name not in runs:
            runs[name] = run
            continue
        methods = [r['method'] for r in new['rows'] if f'{r["dataset"]}/{r["partition"]}' == name]
        update = {'methods': methods, 'command': run['command'], 'output_dir': run['output_dir']}
        runs[name]['updates'] = [*runs[name].get('updates', []), update]
    return {**previous, 'rows': rows, 'runs': runs}
