"""Utility against epsilon: FedRecon on MovieLens and FURL's personalized row under user-level DP.

  python benchmarks/dp_utility.py movielens --flagfile=configs/movielens_100k_table1.flags --data_dir=DIR \
      --total_rounds=300 --select_over=dp_clip=1,3 --select_over=server_learning_rate=1,0.3 \
      --target_epsilons=1,3,8 --calibrate_under=both --output_dir=output/dp_movielens
  python benchmarks/dp_utility.py furl --flagfile=configs/furl_assistments.flags --data_dir=DIR \
      --total_rounds=2000 --select_over=dp_clip=0.1,0.5 --target_epsilons=1,3,8 --output_dir=output/dp_furl

The first argument picks the task (its binary's flags follow). For every target epsilon the noise multiplier z is the
one whose epsilon after ``--total_rounds`` rounds at the run's delta equals the target under the accounting
``--calibrate_under`` names (`fedpersonal.privacy.dp`, RDP accountant): ``replace_one`` (`dp.epsilon`: replace-one
user, fixed-size sampling of ``--clients_per_round`` of the N training clients without replacement, the sampling
the runs do: a formal bound), ``add_remove_poisson`` (`dp.epsilon_add_remove_poisson`: add/remove-one user, Poisson
sampling at q = m / N, what most DP-FedAvg papers report; the runs still sample a fixed-size subset, so it is for
comparison, not a guarantee) or ``both`` (a row per target under each); every row reports both epsilons. Then the
task's federated row trains with that z (with a fixed ``--dp_clip`` on the fast engine, which
clips each logical client; adaptive clipping on the per-client TFF path) and is
tested once with the model of its best validation round; one more run has no DP (same rounds, same rows).
The epsilon reported is that of the rounds actually run (early stopping can end a run sooner); validation-based
model selection itself is not covered by the accountant (stated in each row's ``privacy``).

``--reuse_rows_from`` names an earlier ``--results_json``: its rows (and their ``tried`` entries) whose run has the
noise multiplier this sweep calibrates are taken as they are instead of run again (their add/remove epsilon is
computed from their noise multiplier and rounds when they lack it).

Writes ``--results_json`` (rows ``task``, ``calibrated_under``, ``target_epsilon``, ``epsilon`` (replace-one),
``epsilon_add_remove_poisson``, ``noise_multiplier``, the task's metrics, ``rounds``) and the ``dp_utility_<task>``
section of ``--results_md`` (a hand-written paragraph from ``Reading:`` to the section's end is kept).
"""

import dataclasses
import json
import os
import sys
import time

TASKS = {
    'movielens': ('fedpersonal.tasks.movielens_mf', 'MovieLensMFConfig', 'fedrecon', ('rmse', 'accuracy')),
    'furl': ('fedpersonal.tasks.furl_personalization', 'FurlConfig', 'personalized_fl', ('auc', 'accuracy')),
}
# A row's validation score (`best_validation_<metric>`, the model selection's) picks among --select_over's runs.
SELECTION = {'movielens': min, 'furl': max}
if len(sys.argv) < 2 or sys.argv[1] not in TASKS:
    sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TASKS)}}} [the binary's flags] (see the module docstring)")
TASK = sys.argv.pop(1)

import importlib  # noqa: E402

import tensorflow  # noqa: E402,F401  # Before absl's app.run (see fedpersonal.program.experiment_main.run).
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from fedpersonal import program  # noqa: E402
from fedpersonal import runtime  # noqa: E402
from fedpersonal.privacy import dp  # noqa: E402
from fedpersonal.program import config_flags  # noqa: E402
from fedpersonal.program import non_finite  # noqa: E402
from fedpersonal.program.outputs import NON_FINITE_KEY  # noqa: E402

_MODULE_NAME, _CONFIG_NAME, ROW, METRICS = TASKS[TASK]
task_lib = importlib.import_module(_MODULE_NAME)
config_cls = getattr(task_lib, _CONFIG_NAME)
config_flags.define_flags(config_cls, overrides={'output_dir': f'output/dp_{TASK}'})
flags.DEFINE_list('target_epsilons', ['1', '3', '8'], 'Epsilons to reach after --total_rounds rounds.')
flags.DEFINE_enum(
    'calibrate_under',
    'both',
    ['replace_one', 'add_remove_poisson', 'both'],
    'The accounting whose epsilon the noise multiplier is set to reach (module docstring); both: rows for each.',
)
flags.DEFINE_string(
    'reuse_rows_from', None, 'An earlier --results_json whose rows with the same run and noise are reused, not rerun.'
)
flags.DEFINE_multi_string(
    'select_over',
    [],
    'FIELD=V1,V2,...: values of a config field (e.g. dp_clip, server_learning_rate) tried at every epsilon, every '
    'combination of the given fields; each epsilon reports the combination best on validation, tested once, and '
    'lists the others with their validation scores. The run without DP takes the flags as given.',
)
flags.DEFINE_string('results_json', f'docs/results/dp_utility_{TASK}.json', 'Machine-readable results.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', f'Markdown results (section dp_utility_{TASK}).')
FLAGS = flags.FLAGS


ACCOUNTINGS = {'replace_one': dp.epsilon, 'add_remove_poisson': dp.epsilon_add_remove_poisson}


def noise_for_epsilon(
    target: float,
    *,
    num_clients: int,
    clients_per_round: int,
    rounds: int,
    delta: float,
    accounting: str = 'replace_one',
) -> float:
    """The noise multiplier whose epsilon after `rounds` rounds is `target` (bisection in log space, 1% tolerance).

    Args:
      target: The epsilon to reach.
      num_clients: N.
      clients_per_round: m.
      rounds: The round budget.
      delta: The delta of the epsilon.
      accounting: A key of `ACCOUNTINGS`: the epsilon function calibrated against.

    Returns:
      The smallest z found whose epsilon is at most `target` (within 1% of the exact one).
    """
    low, high = 0.05, 500.0
    for _ in range(40):
        mid = (low * high) ** 0.5
        eps = ACCOUNTINGS[accounting](
            noise_multiplier=mid,
            num_clients=num_clients,
            clients_per_round=clients_per_round,
            rounds=rounds,
            target_delta=delta,
        )
        low, high = (mid, high) if eps > target else (low, mid)
        if high / low < 1.01:
            break
    return high


def select_over_grid(config, specs: list[str]) -> list[dict]:
    """Every combination of the ``FIELD=V1,V2`` specs, as `dataclasses.replace` keyword arguments (a value is parsed
    as the field's current type; the flags' string for a field that is None or a string)."""
    import itertools  # pylint: disable=g-import-not-at-top

    axes = []
    for spec in specs:
        field, _, values = spec.partition('=')
        if not values or not hasattr(config, field):
            raise app.UsageError(f'--select_over={spec}: expected FIELD=V1,V2,... with FIELD a config field.')
        kind = type(getattr(config, field))
        parse = kind if kind in (int, float) else str
        axes.append([(field, parse(v)) for v in values.split(',')])
    return [dict(combination) for combination in itertools.product(*axes)] or [{}]


def num_training_clients(config) -> int:
    if TASK == 'movielens':
        return len(task_lib.load_data(config).user_train.client_ids)
    return len(task_lib.load_data(config).train.client_ids)


CONVENTIONS = {'replace_one': 'replace-one', 'add_remove_poisson': 'add/remove, Poisson'}


def run_name(target: float | None, accounting: str | None) -> str:
    """``no_dp``, ``epsilon_<target>`` (replace-one) or ``epsilon_<target>_add_remove_poisson``."""
    if target is None:
        return 'no_dp'
    return f'epsilon_{target:g}' + ('' if accounting == 'replace_one' else f'_{accounting}')


def with_both_epsilons(row: dict, accounting: str | None, *, n: int, per_round: int, delta: float) -> dict:
    """`row` with ``calibrated_under`` after ``name`` and ``epsilon_add_remove_poisson`` after ``epsilon`` (computed
    from its noise multiplier and rounds when missing, e.g. in rows of an earlier results file)."""
    z, rounds = row.get('noise_multiplier'), row.get('rounds')
    literature = row.get('epsilon_add_remove_poisson')
    if literature is None and z is not None and rounds is not None and row.get('epsilon') is not None:
        literature = dp.epsilon_add_remove_poisson(
            noise_multiplier=z, num_clients=n, clients_per_round=per_round, rounds=rounds, target_delta=delta
        )
    out = {}
    for key, value in row.items():
        if key in ('calibrated_under', 'epsilon_add_remove_poisson'):
            continue
        out[key] = value
        if key == 'name':
            out['calibrated_under'] = row.get('calibrated_under', accounting)
        if key == 'epsilon':
            out['epsilon_add_remove_poisson'] = literature
    return out


def earlier_results(path: str | None) -> dict:
    """The results file of `--reuse_rows_from` (empty without one)."""
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def moved_paths(earlier: dict, old_prefix: str, new_prefix: str) -> list[str]:
    """The earlier file's non-finite paths (`program.write_json`) under `old_prefix`, moved to `new_prefix`."""
    paths = earlier.get(NON_FINITE_KEY) or []
    return [new_prefix + p[len(old_prefix) :] for p in paths if p.startswith(old_prefix)]


def kept_reading(path: str, marker: str) -> str:
    """The hand-written part of section `marker` of `path`, from its ``Reading:`` paragraph to its end ('' if none)."""
    if not os.path.exists(path):
        return ''
    with open(path) as f:
        text = f.read()
    start, end = f'<!-- {marker}:start -->', f'<!-- {marker}:end -->'
    if start not in text or end not in text:
        return ''
    section = text[text.index(start) : text.index(end)]
    return section[section.index('\nReading:') :].strip() if '\nReading:' in section else ''


def train(run_config, run_name_: str, z: float | None) -> dict:
    """One run's row (its best validation round's test metrics and privacy), or a diverged placeholder."""
    logging.info('[dp_utility] %s: noise multiplier %s', run_name_, z)
    try:
        with runtime.LocalRuntime():
            results = task_lib.run(run_config)
    except non_finite.NonFiniteLossError as error:  # Diverged: recorded as such; the sweep goes on.
        logging.warning('[dp_utility] %s diverged: %s', run_name_, error)
        worst = float('inf') if SELECTION[TASK] is min else float('-inf')
        return {'rounds': None, f'best_validation_{METRICS[0]}': worst, 'diverged': str(error).split(':')[0]}
    return next(r for r in results['rows'] if r['configuration'] == ROW)


def main(argv):
    del argv
    config = config_flags.config_from_flags(config_cls, overrides={'output_dir': f'output/dp_{TASK}'})
    if not config.total_rounds:
        raise app.UsageError('Give --total_rounds: the epsilon is set for a fixed round budget.')
    config = dataclasses.replace(config, configurations=(ROW,))
    n = num_training_clients(config)
    per_round = min(config.clients_per_round, n)
    delta = config.dp_target_delta or dp.default_target_delta(n)
    both = FLAGS.calibrate_under == 'both'
    accountings = list(ACCOUNTINGS) if both else [FLAGS.calibrate_under]
    runs = [(None, None, None)] + [
        (
            accounting,
            float(t),
            noise_for_epsilon(
                float(t),
                num_clients=n,
                clients_per_round=per_round,
                rounds=config.total_rounds,
                delta=delta,
                accounting=accounting,
            ),
        )
        for accounting in accountings
        for t in FLAGS.target_epsilons
    ]
    earlier = earlier_results(FLAGS.reuse_rows_from)
    earlier_rows = {r['name']: (i, r) for i, r in enumerate(earlier.get('rows', []))}
    non_finite: list[str] = []  # The earlier file's non-finite paths of what is reused, at their new places.
    grid = select_over_grid(config, FLAGS.select_over)
    rows, tried, reused = [], [], []
    for accounting, target, z in runs:
        name = run_name(target, accounting)
        index, old = earlier_rows.get(name, (None, None))
        if old is not None and (old['noise_multiplier'] == z or (z and abs(old['noise_multiplier'] / z - 1) < 1e-9)):
            non_finite += moved_paths(earlier, f'rows/{index}/', f'rows/{len(rows)}/')
            rows.append(with_both_epsilons(old, accounting, n=n, per_round=per_round, delta=delta))
            for i, t in enumerate(earlier.get('tried', [])):
                if t['name'] == name:
                    non_finite += moved_paths(earlier, f'tried/{i}/', f'tried/{len(tried)}/')
                    tried.append(t)
            reused.append(name)
            logging.info('[dp_utility] %s: reused from %s', name, FLAGS.reuse_rows_from)
            continue
        candidates = []
        for choice in [{}] if z is None else grid:
            run_name_ = '_'.join([name] + [f'{k}_{v}' for k, v in choice.items()])
            # One replace: validated with the noise and the choice together.
            run_config = dataclasses.replace(
                config, dp_noise_multiplier=z, output_dir=os.path.join(config.output_dir, run_name_), **choice
            )
            started = time.time()
            row = train(run_config, run_name_, z)
            privacy = row.get('privacy') or {}
            validation = next(v for k, v in row.items() if k.startswith('best_validation_'))
            candidates.append(
                {
                    'task': TASK,
                    'name': name,
                    'calibrated_under': accounting,
                    'target_epsilon': target,
                    'epsilon': privacy.get('epsilon'),
                    'epsilon_add_remove_poisson': privacy.get('epsilon_add_remove_poisson'),
                    'delta': privacy.get('delta', delta),
                    'noise_multiplier': z,
                    'clip': privacy.get('clip'),
                    'choice': {k: getattr(run_config, k) for k in choice},
                    'validation': validation,
                    'diverged': 'diverged' in row,
                    'rounds': privacy.get('rounds', row.get('rounds')),
                    **{m: row.get(m) for m in METRICS},
                    'wall_seconds': time.time() - started,
                }
            )
            logging.info('[dp_utility] %s', candidates[-1])
        best = SELECTION[TASK](candidates, key=lambda r: r['validation'])
        rows.append(best)
        tried += [
            {k: r[k] for k in ('name', 'choice', 'validation', 'diverged')} for r in candidates if len(candidates) > 1
        ]
    command = program.command_line('benchmarks/dp_utility.py', [TASK] + sys.argv[1:])
    reuse = {'path': FLAGS.reuse_rows_from, 'command': earlier.get('command'), 'rows': reused} if reused else None
    program.write_json(
        FLAGS.results_json,
        {
            'command': command,
            'num_clients': n,
            'clients_per_round': per_round,
            'delta': delta,
            **({'reused': reuse} if reuse else {}),
            'rows': rows,
            'tried': tried,
            **({NON_FINITE_KEY: non_finite} if non_finite else {}),
        },
    )
    section = render_section(config, grid, rows, tried, command=command, n=n, per_round=per_round, delta=delta)
    if reuse:
        section += (
            f'\n\nRows {", ".join(reused)} are read back unchanged from `{reuse["path"]}` (their add/remove epsilon '
            f'computed from their noise multiplier and rounds), written by `{reuse["command"]}`; the other rows ran '
            'with the command above.'
        )
    reading = kept_reading(FLAGS.results_md, f'dp_utility_{TASK}')
    program.replace_marked_section(
        FLAGS.results_md, f'dp_utility_{TASK}', section + (f'\n\n{reading}' if reading else '')
    )
    print(section)


def _cell(value: float | None, empty: str = '-') -> str:
    return empty if value is None else f'{value:.2f}'


def render_section(config, grid, rows, tried, *, command: str, n: int, per_round: int, delta: float) -> str:
    """The Markdown section: the conventions, the table (a row per run, both epsilons) and the grid tried."""
    chosen = [k for k in (grid[0] if grid else {}) if k != 'dp_clip']
    header = (
        '| run | calibrated under | target epsilon | epsilon (replace-one, without replacement) | '
        'epsilon (add/remove, Poisson) | noise multiplier | clip | ' + ''.join(f'{k} | ' for k in chosen)
    )
    header += 'rounds | validation | '
    lines = [header + ' | '.join(METRICS) + ' |', '|' + '---|' * (9 + len(chosen) + len(METRICS))]
    for r in rows:
        if r['noise_multiplier'] is None:
            eps, literature = 'inf (no DP)', 'inf (no DP)'
        else:
            eps = _cell(r['epsilon'], f'({r["target_epsilon"]:g}, diverged)')
            literature = _cell(r.get('epsilon_add_remove_poisson'), 'n/a (diverged)')
        under = CONVENTIONS.get(r.get('calibrated_under'), '-')
        z = '-' if r['noise_multiplier'] is None else f'{r["noise_multiplier"]:.3f}'
        target = '-' if r['target_epsilon'] is None else f'{r["target_epsilon"]:g}'
        clip = '-' if r['clip'] is None else f'{r["clip"]:g}'
        metrics = ' | '.join('n/a (diverged)' if r[m] is None else f'{r[m]:.4f}' for m in METRICS)
        picked = ''.join(f'{r["choice"].get(k, getattr(config, k))} | ' for k in chosen)
        lines.append(
            f'| {r["name"]} | {under} | {target} | {eps} | {literature} | {z} | {clip} | {picked}{r["rounds"]} | '
            f'{r["validation"]:.4f} | {metrics} |'
        )
    if tried:
        lines.append(
            '\nTried at every epsilon (validation score of each; the table reports the best, tested once): '
            + '; '.join(
                f'{t["name"]} '
                + ', '.join(f'{k}={v}' for k, v in t['choice'].items())
                + (': diverged (non-finite loss)' if t['diverged'] else f': {t["validation"]:.4f}')
                for t in tried
            )
            + '.'
        )
    return (
        f'## Differential privacy: utility against epsilon ({TASK}, row {ROW})\n\n'
        f'Command: `{command}`\n\nN = {n} training clients, {per_round} sampled per round (a fixed-size uniform '
        f'sample without replacement, every round), delta = {delta:.2e}, RDP accountant, epsilon of the rounds run, '
        'under two conventions. **epsilon (replace-one, without replacement)**: replace-one user, the sampling the '
        'runs do (sensitivity 2 C: the Gaussian event has z / 2); the formal bound of these runs. **epsilon '
        '(add/remove, Poisson)**: add/remove-one user, Poisson sampling at q = m / N (the Gaussian event has z), '
        'what most DP-FedAvg papers report; for comparison with published tables only: these runs sample a '
        'fixed-size subset, not a Poisson sample, so it is not a formal guarantee for them (fixed-size sampling '
        'accounted as Poisson, as much of the literature does; the mean divides the noised sum by m, the expected '
        'size of a Poisson sample, as that analysis needs). Rows `epsilon_<t>` set z so that the replace-one epsilon is t; rows `epsilon_<t>_add_remove_poisson` '
        'so that the add/remove Poisson epsilon is t. Local parameters never leave the clients and are not covered '
        '(nor needed); metrics and validation-based model selection are not noised.\n\n' + '\n'.join(lines)
    )


if __name__ == '__main__':
    app.run(main)
