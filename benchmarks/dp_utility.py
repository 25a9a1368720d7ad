"""Utility against epsilon: FedRecon on MovieLens and FURL's personalized row under user-level DP.

  python benchmarks/dp_utility.py movielens --flagfile=configs/movielens_100k_table1.flags --data_dir=DIR \
      --total_rounds=300 --select_over=dp_clip=1,3 --select_over=server_learning_rate=1,0.3 \
      --target_epsilons=1,3,8 --output_dir=output/dp_movielens
  python benchmarks/dp_utility.py furl --flagfile=configs/furl_assistments.flags --data_dir=DIR \
      --total_rounds=2000 --select_over=dp_clip=0.1,0.5 --target_epsilons=1,3,8 --output_dir=output/dp_furl

The first argument picks the task (its binary's flags follow). For every target epsilon the noise multiplier z is the
one whose epsilon after ``--total_rounds`` rounds at the run's delta equals the target (`fedpersonal.privacy.dp`:
RDP accountant, replace-one user, fixed-size sampling of ``--clients_per_round`` of the N training clients without
replacement); then the task's federated row trains with that z (with a fixed ``--dp_clip`` on the fast engine, which
clips each logical client; adaptive clipping on the per-client TFF path) and is
tested once with the model of its best validation round; one more run has no DP (same rounds, same rows).
The epsilon reported is that of the rounds actually run (early stopping can end a run sooner); validation-based
model selection itself is not covered by the accountant (stated in each row's ``privacy``).

Writes ``--results_json`` (rows ``task``, ``target_epsilon``, ``epsilon``, ``noise_multiplier``, the task's metrics,
``rounds``) and the ``dp_utility_<task>`` section of ``--results_md``.
"""

import dataclasses
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

_MODULE_NAME, _CONFIG_NAME, ROW, METRICS = TASKS[TASK]
task_lib = importlib.import_module(_MODULE_NAME)
config_cls = getattr(task_lib, _CONFIG_NAME)
config_flags.define_flags(config_cls, overrides={'output_dir': f'output/dp_{TASK}'})
flags.DEFINE_list('target_epsilons', ['1', '3', '8'], 'Epsilons to reach after --total_rounds rounds.')
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


def noise_for_epsilon(target: float, *, num_clients: int, clients_per_round: int, rounds: int, delta: float) -> float:
    """The noise multiplier whose epsilon after `rounds` rounds is `target` (bisection in log space, 1% tolerance)."""
    low, high = 0.05, 500.0
    for _ in range(40):
        mid = (low * high) ** 0.5
        eps = dp.epsilon(
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


def main(argv):
    del argv
    config = config_flags.config_from_flags(config_cls, overrides={'output_dir': f'output/dp_{TASK}'})
    if not config.total_rounds:
        raise app.UsageError('Give --total_rounds: the epsilon is set for a fixed round budget.')
    config = dataclasses.replace(config, configurations=(ROW,))
    n = num_training_clients(config)
    per_round = min(config.clients_per_round, n)
    delta = config.dp_target_delta or dp.default_target_delta(n)
    runs = [(None, None)] + [
        (
            float(t),
            noise_for_epsilon(
                float(t), num_clients=n, clients_per_round=per_round, rounds=config.total_rounds, delta=delta
            ),
        )
        for t in FLAGS.target_epsilons
    ]
    grid = select_over_grid(config, FLAGS.select_over)
    rows, tried = [], []
    for target, z in runs:
        name = 'no_dp' if z is None else f'epsilon_{target:g}'
        candidates = []
        for choice in [{}] if z is None else grid:
            run_name = '_'.join([name] + [f'{k}_{v}' for k, v in choice.items()])
            # One replace: validated with the noise and the choice together.
            run_config = dataclasses.replace(
                config, dp_noise_multiplier=z, output_dir=os.path.join(config.output_dir, run_name), **choice
            )
            logging.info('[dp_utility] %s: noise multiplier %s', run_name, z)
            started = time.time()
            try:
                with runtime.LocalRuntime():
                    results = task_lib.run(run_config)
            except non_finite.NonFiniteLossError as error:  # Diverged: recorded as such; the sweep goes on.
                logging.warning('[dp_utility] %s diverged: %s', run_name, error)
                worst = float('inf') if SELECTION[TASK] is min else float('-inf')
                row = {'rounds': None, f'best_validation_{METRICS[0]}': worst, 'diverged': str(error).split(':')[0]}
            else:
                row = next(r for r in results['rows'] if r['configuration'] == ROW)
            privacy = row.get('privacy') or {}
            validation = next(v for k, v in row.items() if k.startswith('best_validation_'))
            candidates.append(
                {
                    'task': TASK,
                    'name': name,
                    'target_epsilon': target,
                    'epsilon': privacy.get('epsilon'),
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
    program.write_json(
        FLAGS.results_json,
        {
            'command': command,
            'num_clients': n,
            'clients_per_round': per_round,
            'delta': delta,
            'rows': rows,
            'tried': tried,
        },
    )
    chosen = [k for k in (grid[0] if grid else {}) if k != 'dp_clip']
    header = '| run | target epsilon | epsilon | noise multiplier | clip | ' + ''.join(f'{k} | ' for k in chosen)
    header += 'rounds | validation | '
    lines = [header + ' | '.join(METRICS) + ' |', '|' + '---|' * (7 + len(chosen) + len(METRICS))]
    for r in rows:
        if r['noise_multiplier'] is None:
            eps = 'inf (no DP)'
        else:
            eps = f'{r["epsilon"]:.2f}' if r['epsilon'] is not None else f'({r["target_epsilon"]:g}, diverged)'
        z = '-' if r['noise_multiplier'] is None else f'{r["noise_multiplier"]:.3f}'
        target = '-' if r['target_epsilon'] is None else f'{r["target_epsilon"]:g}'
        clip = '-' if r['clip'] is None else f'{r["clip"]:g}'
        metrics = ' | '.join('n/a (diverged)' if r[m] is None else f'{r[m]:.4f}' for m in METRICS)
        picked = ''.join(f'{r["choice"].get(k, getattr(config, k))} | ' for k in chosen)
        lines.append(
            f'| {r["name"]} | {target} | {eps} | {z} | {clip} | {picked}{r["rounds"]} | {r["validation"]:.4f} | '
            f'{metrics} |'
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
    section = (
        f'## Differential privacy: utility against epsilon ({TASK}, row {ROW})\n\n'
        f'Command: `{command}`\n\nN = {n} training clients, {per_round} sampled per round without replacement, '
        f'delta = {delta:.2e}; RDP accountant, replace-one user (sensitivity 2 C: the Gaussian event has z / 2), '
        'epsilon of the rounds run. Local parameters never leave the clients and are not covered (nor needed); '
        'metrics and validation-based model selection are not noised.\n\n' + '\n'.join(lines)
    )
    program.replace_marked_section(FLAGS.results_md, f'dp_utility_{TASK}', section)
    print(section)


if __name__ == '__main__':
    app.run(main)
