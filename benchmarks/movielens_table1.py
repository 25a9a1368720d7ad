"""FedRecon paper Table 1 on MovieLens, side by side with TFF 0.87's own FedRecon.

  python benchmarks/movielens_table1.py --flagfile=configs/movielens_100k_table1.flags \
      --data_dir=DIR_WITH_u.data --output_dir=output/table1

Runs the configurations of the flagfile with fedpersonal, then the `fedrecon`
configuration again with `tff.learning.algorithms.build_fed_recon` (same model,
data split, hyperparameters, client sampling and ReconEval), then an
interleaved speed test: both processes run the same sampled clients on
alternating rounds, so machine noise hits both equally.

Writes `docs/results/movielens_table1.json` (rows with `rmse`, `mae`,
`accuracy`, `seconds_per_round`) and replaces the Table 1 section of
`docs/RESULTS.md`.
"""

import dataclasses
import json
import os
import platform
import shlex
import sys
import time

import numpy as np
from absl import app
from absl import flags
from absl import logging

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import movielens_mf

_DEFAULTS = {'output_dir': 'output/table1'}
config_flags.define_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
flags.DEFINE_integer('speed_rounds', 20, 'Rounds of the interleaved speed comparison (per implementation).')
flags.DEFINE_bool('skip_tff', False, 'Skip the TFF reference run.')
flags.DEFINE_string('results_json', 'docs/results/movielens_table1.json', 'Machine-readable results.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file (its Table 1 section is replaced).')
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


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = 'python benchmarks/movielens_table1.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:])
    config = config_flags.config_from_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
    with runtime.LocalRuntime():
        results = movielens_mf.run(config)
        rows = results['rows']
        if not FLAGS.skip_tff and 'fedrecon' in config.configurations:
            tff_config = dataclasses.replace(
                config,
                fedrecon_implementation='tff',
                configurations=('fedrecon',),
                output_dir=os.path.join(config.output_dir, 'tff_reference'),
            )
            tff_row = movielens_mf.run(tff_config)['rows'][0]
            tff_row['name'] = 'FedRecon (ReconEval), TFF 0.87 build_fed_recon'
            tff_row['configuration'] = 'fedrecon_tff'
            rows.append(tff_row)
            speed = interleaved_speed(config, FLAGS.speed_rounds)
            for row in rows:
                if row['configuration'] == 'fedrecon':
                    row['seconds_per_round_interleaved'] = speed['fedpersonal']
                elif row['configuration'] == 'fedrecon_tff':
                    row['seconds_per_round_interleaved'] = speed['tff']
    payload = {
        'command': command,
        'dataset': results['dataset'],
        'statistics': {k: v for k, v in results['statistics'].items() if not isinstance(v, dict)},
        'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
        'config': dataclasses.asdict(config),
        'rows': [dict(r) for r in rows],
    }
    program.write_json(FLAGS.results_json, payload)
    table = movielens_mf.format_table(rows)
    interleaved = [r for r in rows if 'seconds_per_round_interleaved' in r]
    speed_lines = ''.join(f'\n- {r["name"]}: {r["seconds_per_round_interleaved"]:.2f} s/round' for r in interleaved)
    section = (
        f'## FedRecon Table 1: MovieLens matrix factorization\n\n'
        f'Command: `{command}`\n\nData: {results["dataset"]}. Machine: {payload["machine"]}.\n\n{table}\n\n'
        f'Interleaved speed test ({FLAGS.speed_rounds} rounds each, identical clients, alternating order):'
        f'{speed_lines}\n\nMachine-readable: `{FLAGS.results_json}`.'
    )
    program.replace_marked_section(FLAGS.results_md, 'movielens_table1', section)
    print(table)
    print(json.dumps({r['name']: r.get('seconds_per_round_interleaved') for r in interleaved}))


if __name__ == '__main__':
    app.run(main)
