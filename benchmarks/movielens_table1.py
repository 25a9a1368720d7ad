"""FedRecon paper Table 1 on MovieLens, to convergence, tuned on validation, over seeds; beside TFF 0.87's FedRecon.

  python benchmarks/movielens_table1.py --flagfile=configs/movielens_100k_table1.flags \
      --data_dir=DIR_WITH_u.data --output_dir=output/table1

For every configuration of the flagfile:

1. *tuning* (federated rows, when a ``--grid_*`` list has several values): every combination of the grids' client,
   server and reconstruction learning rates trains with the first seed, early-stopped on validation RMSE
   (``--early_stopping_patience``); the combination with the lowest best validation RMSE is selected;
2. *seeds*: the selected combination trains with every ``--seeds`` value (the first one's run is the tuning run),
   each early-stopped on validation and tested once, with the model of its best validation round;
3. the row is the mean over seeds, with ``<metric>_std`` (sample standard deviation), ``seeds`` and the per-seed rows.

Then (unless ``--skip_tff``) TFF 0.87's `tff.learning.algorithms.build_fed_recon` trains the `fedrecon` row's
selected configuration with the first seed for the same number of rounds as fedpersonal's run (same model, split,
sampling and ReconEval), and an interleaved speed test runs both on the same sampled clients on alternating rounds.

Every run has its own output directory under ``--output_dir`` (``grid/<row>/<lrs>``, ``seed<k>/<row>``); a rerun skips
the runs that wrote their results and resumes the others from their checkpoints. Writes
`docs/results/movielens_table1.json` (rows with `rmse`, `mae`, `accuracy`, their `_std`, `seeds`,
`seconds_per_round`) and replaces the Table 1 section of `docs/RESULTS.md`. A run of some rows with other settings
(say, one row with a higher round cap) names its own ``--results_json``, whose file name also names its plot and its
section of ``--results_md``, so it does not replace the main table.
"""

import dataclasses
import json
import os
import platform
import sys
import time

import numpy as np
from absl import app
from absl import flags
from absl import logging

from fedpersonal import data as data_lib
from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import movielens_mf

_DEFAULTS = {'output_dir': 'output/table1'}
config_flags.define_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
flags.DEFINE_integer('speed_rounds', 20, 'Rounds of the interleaved speed comparison (per implementation).')
flags.DEFINE_bool('skip_tff', False, 'Skip the TFF reference run.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of every row (initialization, client sampling, reconstruction).')
flags.DEFINE_list('grid_client_learning_rates', [], 'Tuning grid of the federated rows (empty: the flag value).')
flags.DEFINE_list('grid_server_learning_rates', [], 'Tuning grid of the federated rows (empty: the flag value).')
flags.DEFINE_list('grid_reconstruction_learning_rates', [], 'Tuning grid (empty: the flag value).')
flags.DEFINE_string(
    'results_json',
    'docs/results/movielens_table1.json',
    'Machine-readable results; its file name (without .json) also names the learning-curve plot beside it and the '
    'section of --results_md that is replaced.',
)
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file (its section is replaced).')
FLAGS = flags.FLAGS


def interleaved_speed(config: movielens_mf.MovieLensMFConfig, rounds: int) -> dict[str, float]:
    """Median seconds per round of both implementations on identical client samples."""
    prepared = movielens_mf.load_data(config)
    processes = {}
    for impl in ('fedpersonal', 'tff'):
        task = movielens_mf.MovieLensMFTask(dataclasses.replace(config, fedrecon_implementation=impl), prepared)
        process = task.build_fed_recon()
        processes[impl] = (task, process, process.initialize())
    ids = list(prepared.user_train.client_ids)
    times = {impl: [] for impl in processes}
    for round_num in range(1, rounds + 2):
        sampled = program.sample_clients(ids, config.clients_per_round, round_num, config.seed)
        order = list(processes) if round_num % 2 else list(reversed(list(processes)))
        for impl in order:
            task, process, state = processes[impl]
            started = time.time()
            datasets = [task.personal_dataset_fn(prepared.user_train.create_tf_dataset_for_client(c)) for c in sampled]
            run_round = getattr(process, 'run_round', None)  # fedpersonal: packs and runs its fastest round.
            state = (
                run_round(state, datasets, client_ids=sampled) if run_round else process.next(state, datasets)
            ).state
            if round_num > 1:  # Round 1 includes tracing/compilation; reported separately by the runs.
                times[impl].append(time.time() - started)
            processes[impl] = (task, process, state)
        logging.info('speed round %d: %s', round_num, {k: round(v[-1], 2) for k, v in times.items() if v})
    return {impl: float(np.median(t)) for impl, t in times.items()}


FEDERATED = ('fedavg_standard', 'fedavg_recon', 'fedrecon')
_RUN_ORDER = ('fedrecon', 'centralized_recon', 'centralized_standard', 'fedavg_recon', 'fedavg_standard')
_STD_KEYS = ('rmse', 'mae', 'accuracy')


def _run(task_config: movielens_mf.MovieLensMFConfig, prepared, name: str) -> dict:
    """One configuration's row in its output directory; an earlier finished run's results are read back."""
    path = os.path.join(task_config.output_dir, name, 'results.json')
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    program.write_json(os.path.join(task_config.output_dir, 'config.json'), dataclasses.asdict(task_config))
    return movielens_mf.run_configuration(movielens_mf.MovieLensMFTask(task_config, prepared), name)


def _grid(config: movielens_mf.MovieLensMFConfig, name: str) -> list[dict[str, float]]:
    """The learning-rate combinations tried for row `name` (only the flag values when no grid is given)."""
    values = lambda flag, default: [float(v) for v in FLAGS[flag].value] or [default]
    clients = values('grid_client_learning_rates', config.client_learning_rate)
    servers = values('grid_server_learning_rates', config.server_learning_rate)
    recons = values('grid_reconstruction_learning_rates', config.reconstruction_learning_rate)
    if name == 'fedavg_standard':  # Never reconstructs.
        recons = [config.reconstruction_learning_rate]
    return [
        dict(client_learning_rate=c, server_learning_rate=s, reconstruction_learning_rate=r)
        for c in clients
        for s in servers
        for r in recons
    ]


def _label(lrs: dict[str, float]) -> str:
    return f'c{lrs["client_learning_rate"]:g}_s{lrs["server_learning_rate"]:g}_r{lrs["reconstruction_learning_rate"]:g}'


def _mean_row(name: str, runs: list[dict], seeds: list[int]) -> dict:
    """The mean over seeds of every numeric metric, with the sample standard deviation of the headline ones."""
    row = program.mean_over_seeds(
        runs, seeds, std_keys=_STD_KEYS, per_seed_keys=('best_round', 'rounds', 'wall_seconds')
    )
    row['configuration'] = name
    return row


def run_row(config, prepared, name: str, seeds: list[int]) -> dict:
    """Tunes (federated rows) on the first seed's validation RMSE, then runs every seed; returns the mean row."""
    selected: dict[str, float] = {}
    first = None
    if name in FEDERATED:
        trials = []
        for lrs in _grid(config, name):
            trial_config = dataclasses.replace(
                config, seed=seeds[0], output_dir=os.path.join(config.output_dir, 'grid', name, _label(lrs)), **lrs
            )
            trials.append((lrs, _run(trial_config, prepared, name)))
            logging.info('[%s] %s: best validation RMSE %.4f', name, _label(lrs), trials[-1][1]['best_validation_rmse'])
        score = lambda trial: trial[1]['best_validation_rmse'] if np.isfinite(trial[1]['best_validation_rmse']) else 1e9
        selected, first = min(trials, key=score)
        grid = [
            {
                **lrs,
                'best_validation_rmse': r['best_validation_rmse'],
                'best_round': r['best_round'],
                'rounds': r['rounds'],
                'wall_seconds': r['wall_seconds'],
            }
            for lrs, r in trials
        ]
    runs = [first] if first is not None else []
    for seed in seeds[len(runs) :]:
        seed_config = dataclasses.replace(
            config, seed=seed, output_dir=os.path.join(config.output_dir, f'seed{seed}'), **selected
        )
        runs.append(_run(seed_config, prepared, name))
    row = _mean_row(name, runs, seeds)
    if selected:
        row.update(selected=selected, grid=grid)
    return row


def format_table(rows: list[dict]) -> str:
    """Markdown: mean +- std over seeds, the selected learning rates and the early-stopping rounds."""
    lines = [
        '| configuration | RMSE | MAE | accuracy | selected lrs (client/server/recon) | best round (of) | seeds | s/round |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        pm = lambda k: f'{r[k]:.3f} +- {r.get(k + "_std", 0.0):.3f}'
        lrs = r.get('selected')
        lrs_text = (
            '/'.join(
                f'{lrs[k]:g}' for k in ('client_learning_rate', 'server_learning_rate', 'reconstruction_learning_rate')
            )
            if lrs
            else '-'
        )
        rounds = f'{r["best_round"]:.0f} ({r["rounds"]:.0f})' if 'best_round' in r else '-'
        spr = r.get('seconds_per_round')
        lines.append(
            f'| {r["name"]} | {pm("rmse")} | {pm("mae")} | {pm("accuracy")} | {lrs_text} | {rounds} | '
            f'{len(r.get("seeds", [0]))} | {"" if spr is None else f"{spr:.2f}"} |'
        )
    return '\n'.join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line('benchmarks/movielens_table1.py', sys.argv[1:])
    config = config_flags.config_from_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
    seeds = [int(s) for s in FLAGS.seeds]
    started = time.time()
    with runtime.LocalRuntime():
        prepared = movielens_mf.load_data(config)
        # The headline row first (a long run interrupted early still has it); the table keeps the flag's order.
        order = sorted(config.configurations, key=lambda n: _RUN_ORDER.index(n))
        done = {name: run_row(config, prepared, name, seeds) for name in order}
        rows = [done[name] for name in config.configurations]
        fedrecon = next((r for r in rows if r['configuration'] == 'fedrecon'), None)
        if not FLAGS.skip_tff and fedrecon is not None:
            tff_config = dataclasses.replace(
                config,
                seed=seeds[0],
                fedrecon_implementation='tff',
                total_rounds=int(fedrecon['per_seed'][0]['rounds']),  # fedpersonal's budget, early stopping aside.
                early_stopping_patience=0,
                output_dir=os.path.join(config.output_dir, 'tff_reference'),
                **fedrecon.get('selected', {}),
            )
            tff_row = _mean_row('fedrecon_tff', [_run(tff_config, prepared, 'fedrecon')], seeds[:1])
            tff_row['name'] = 'FedRecon (ReconEval), TFF 0.87 build_fed_recon'
            rows.append(tff_row)
            speed = interleaved_speed(
                dataclasses.replace(tff_config, fedrecon_implementation='fedpersonal'), FLAGS.speed_rounds
            )
            fedrecon['seconds_per_round_interleaved'] = speed['fedpersonal']
            tff_row['seconds_per_round_interleaved'] = speed['tff']
    runs = {  # Federated rows only: the centralized rows' curves are over epochs, not rounds.
        r['name']: program.ExperimentOutputs(
            os.path.join(config.output_dir, 'grid', r['configuration'], _label(r['selected'])), r['configuration']
        ).read_metrics()
        for r in rows
        if r['configuration'] in FEDERATED
    }
    name = os.path.splitext(os.path.basename(FLAGS.results_json))[0]  # Names the plot and the RESULTS section.
    curves = os.path.join(os.path.dirname(FLAGS.results_json), f'{name}_learning_curves.png')
    program.plot_curves(
        runs,
        ['train/loss', 'eval/rmse', 'eval/accuracy'],
        curves,
        title=f'MovieLens Table 1, federated rows, seed {seeds[0]} (eval = validation users)',
    )
    stats = data_lib.dataset_statistics(prepared.data)
    payload = {
        'command': command,
        'dataset': prepared.description,
        'statistics': {k: v for k, v in stats.items() if not isinstance(v, dict)},
        'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
        'wall_seconds': time.time() - started,
        'config': dataclasses.asdict(config),
        'rows': rows,
    }
    program.write_json(FLAGS.results_json, payload)
    table = format_table(rows)
    compute_s = sum(
        sum(p['wall_seconds'] for p in r['per_seed'][1 if 'grid' in r else 0 :])
        + sum(g['wall_seconds'] for g in r.get('grid', []))
        for r in rows
    )
    tuning = ''.join(
        f'\n- {r["name"]}: '
        + ', '.join(
            f'{_label(g).replace("_", "/")} {g["best_validation_rmse"]:.4f} (round {g["best_round"]} of {g["rounds"]})'
            for g in r['grid']
        )
        for r in rows
        if len(r.get('grid', [])) > 1
    )
    interleaved = [r for r in rows if 'seconds_per_round_interleaved' in r]
    speed_lines = ''.join(f'\n- {r["name"]}: {r["seconds_per_round_interleaved"]:.3f} s/round' for r in interleaved)
    subset = set(config.configurations) != set(movielens_mf.CONFIGURATIONS)
    section = (
        '## FedRecon Table 1: MovieLens matrix factorization'
        + (f' ({", ".join(r["name"] for r in rows)}, at most {config.total_rounds:,} rounds)' if subset else '')
        + f'\n\nCommand: `{command}` (its runs: {compute_s / 60:.0f} min of training and evaluation; a rerun skips '
        f'finished runs)\n\n'
        f'Data: {prepared.description}. Machine: {payload["machine"]}. Mean +- standard deviation over seeds '
        f'{seeds}; each run early-stopped on validation RMSE (patience {config.early_stopping_patience} evaluations '
        f'of every {config.rounds_per_eval} rounds, at most {config.total_rounds:,} rounds) and tested once with its '
        f"best validation round's model; "
        f"learning rates selected on the first seed's validation RMSE.\n\n{table}\n\n"
        + (f'Tuning (first seed; best validation RMSE, nan = diverged):{tuning}\n\n' if tuning else '')
        + (
            f'Interleaved speed test ({FLAGS.speed_rounds} rounds each, identical clients):{speed_lines}\n\n'
            if interleaved
            else ''
        )
        + f'Learning curves (first seed): `{curves}`. Machine-readable: `{FLAGS.results_json}`.'
    )
    program.replace_marked_section(FLAGS.results_md, name, section)
    print(table)


if __name__ == '__main__':
    app.run(main)
