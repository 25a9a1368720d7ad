"""Short reruns of every table's binary before and after a change: does it leave the numbers as they were?

Checks out `--before` (a commit) into a temporary git worktree, runs each workload's binary (a few rounds on small
or generated data) once in that tree and once in this one, and compares every number both runs wrote with
`core_equivalence.compare_runs` (``results.json`` files and ``metrics.csv`` rows; wall-clock timings aside; a
metric only one side reports is listed, not counted as a difference). Writes `--output` (rows ``name``,
``values_compared``, ``max_abs_diff``, ``metric_keys_only_in_one``, ``note``) and prints a table.

    PYTHONPATH=. python benchmarks/redesign_equivalence.py --before=9631b79 \\
        --output=docs/results/redesign_equivalence.json [--workloads=furl_engine,ditto_engine]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import core_equivalence  # noqa: E402  # The comparison: every number of results.json and metrics.csv.

FURL = [
    'furl_personalization.py',
    '--configurations=personalized_fl',
    '--synthetic_num_users=40',
    '--epochs=1',
    '--clients_per_round=5',
    '--max_chars=8',
    '--char_embedding_dim=4',
    '--lstm_units=4',
    '--user_embedding_dim=3',
    '--mlp_units=6',
    '--batch_size=8',
    '--eval_clients=8',
    '--rounds_per_eval=4',
]
FEDDVA = [
    'feddva.py',
    '--settings=heterogeneous_inputs',
    '--num_clients=6',
    '--train_per_client=30',
    '--test_per_client=12',
    '--validation_per_client=8',
    '--synthetic_train=300',
    '--synthetic_test=100',
    '--total_rounds=4',
    '--clients_per_round=4',
    '--rounds_per_eval=2',
    '--z_dim=2',
    '--c_dim=2',
    '--batch_size=10',
    '--cnn_channels=4,8',
    '--cnn_dense=8',
    '--projection=pca',
    '--projection_points=40',
    '--grid_size=3',
]
MOVIELENS = [
    'movielens_mf.py',
    '--synthetic_num_users=80',
    '--synthetic_num_items=60',
    '--clients_per_round=8',
    '--eval_clients=8',
    '--batch_size=5',
    '--total_rounds=6',
    '--rounds_per_eval=3',
]
NWP = [
    'next_word_prediction.py',
    '--synthetic_num_clients=20',
    '--vocab_sizes=60',
    '--num_oov_buckets=9',
    '--total_rounds=3',
    '--clients_per_round=3',
    '--embedding_dim=4',
    '--lstm_units=4',
    '--rounds_per_eval=3',
    '--eval_clients=3',
    '--test_clients=3',
    '--max_examples_per_client=16',
    '--configurations=fedrecon,fedyogi',
]
HPFL = [
    'hpfl_user_modeling.py',
    '--synthetic_num_clients=3',
    '--synthetic_users_per_client=8',
    '--total_rounds=3',
    '--centralized_epochs=2',
    '--hidden_dim=4',
    '--batch_size=64',
    '--max_local_clusters=4',
    '--max_global_clusters=4',
    '--kmeans_iterations=2',
    '--ncd_hidden_units=8,4',
    '--ncf_embedding_dim=4',
    '--configurations=hpfl,fedavg',
]
# Every method of the personalization benchmark on generated images, 3 rounds (its own PFLlib-shaped CNN).
PFL = [
    'pfl_benchmark.py',
    '--dataset=synthetic',
    '--synthetic_examples=1200',
    '--num_clients=5',
    '--state_store=memory',
    '--client_learning_rate=0.05',
    '--seeds=0',
    '--total_rounds=3',
    '--rounds_per_eval=3',
    '--configurations=fedavg,fedprox,ditto,apfl,fedper,fedrep,lg_fedavg,fedavg_ft,fedbabu,per_fedavg,per_fedavg_hf,'
    'pfedme,fedala,fedrod,fed_recon,furl_head',
]
WORKLOADS = {
    'furl_engine': (FURL + ['--simulation=engine'], 'FURL (Table 3 shape), engine'),
    'furl_per_client': (FURL + ['--simulation=per_client'], 'FURL, per-client backend'),
    'furl_dp_engine': (FURL + ['--dp_noise_multiplier=0.5', '--dp_clip=0.5'], 'FURL with fixed-clip DP-FedAvg'),
    'ditto_engine': (FEDDVA + ['--configurations=ditto', '--simulation=engine'], 'Ditto row of the FedDVA tables'),
    'ditto_per_client': (FEDDVA + ['--configurations=ditto', '--simulation=per_client'], 'Ditto, per-client'),
    'feddva_engine': (FEDDVA + ['--configurations=feddva,fedavg'], 'FedDVA and FedAvg rows'),
    'feddva_tuned_engine': (FEDDVA + ['--configurations=feddva_tuned'], 'FedDVA, encoders tuned with the head'),
    'feddva_per_client': (
        FEDDVA + ['--configurations=feddva,feddva_tuned', '--simulation=per_client'],
        'FedDVA rows, per-client backend',
    ),
    'movielens_table1': (MOVIELENS + ['--configurations=fedrecon,fedavg_standard'], 'FedRecon Table 1 rows'),
    'movielens_dp': (
        MOVIELENS + ['--configurations=fedrecon', '--dp_noise_multiplier=0.5', '--dp_clip=1'],
        'FedRecon with DP (the DP utility rows)',
    ),
    'movielens_per_client': (
        MOVIELENS + ['--configurations=fedrecon,fedavg_standard', '--simulation=per_client'],
        'FedRecon Table 1 rows, per-client backend',
    ),
    'movielens_joint': (
        MOVIELENS + ['--configurations=fedrecon', '--jointly_train_locals'],
        'FedRecon, locals trained jointly in the update (engine)',
    ),
    'movielens_learned_init': (
        MOVIELENS + ['--configurations=fedrecon', '--learn_local_init', '--jointly_train_locals'],
        'FedRecon with a learned local default, locals trained jointly (engine)',
    ),
    'nwp': (NWP, 'FedRecon Table 2 (next-word prediction)'),
    'furl_global_fl': (FURL[:1] + ['--configurations=global_fl'] + FURL[2:], 'FedAvg row of the FURL tables'),
    'hpfl': (HPFL, 'HPFL tables'),
    'hpfl_per_client': (HPFL + ['--simulation=per_client'], 'HPFL tables, per-client backend (TFF next)'),
    'pfl_engine': (PFL + ['--simulation=engine'], 'The personalization benchmark, every method, engine'),
    'pfl_per_client': (PFL + ['--simulation=per_client'], 'The personalization benchmark, every method, per-client'),
}


def run(tree: str, argv: list[str], out: str, extra: Sequence[str] = ()) -> None:
    env = {**os.environ, 'PYTHONPATH': tree, 'TF_NUM_INTRAOP_THREADS': '1'}
    command = [sys.executable, os.path.join(tree, 'experiments', argv[0]), *argv[1:], *extra, f'--output_dir={out}']
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f'{" ".join(command)} failed:\n{done.stderr[-3000:]}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--before', required=True, help='The commit to compare with.')
    parser.add_argument('--workloads', default=','.join(WORKLOADS))
    parser.add_argument('--output', default=os.path.join(ROOT, 'docs', 'results', 'redesign_equivalence.json'))
    parser.add_argument('--notes', default='{}', help='JSON {workload: note} explaining a difference.')
    parser.add_argument(
        '--after_args', default='', help="Flags for the after runs only, e.g. '--engine_strategy=lockstep'."
    )
    parser.add_argument('--name_suffix', default='', help="Appended to each row's name (e.g. '@lockstep').")
    parser.add_argument('--append', action='store_true', help="Keep --output's rows (other than this run's).")
    args = parser.parse_args()
    notes = json.loads(args.notes)
    after_args = args.after_args.split()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        before = os.path.join(tmp, 'before')
        subprocess.run(['git', '-C', ROOT, 'worktree', 'add', '--detach', before, args.before], check=True)
        try:
            for name in args.workloads.split(','):
                argv, description = WORKLOADS[name]
                started = time.time()
                run(before, argv, os.path.join(tmp, f'{name}_before'))
                run(ROOT, argv, os.path.join(tmp, f'{name}_after'), after_args)
                compared = core_equivalence.compare_runs(
                    os.path.join(tmp, f'{name}_before'), os.path.join(tmp, f'{name}_after'), tolerance=1e-6
                )
                rows.append(
                    {
                        'name': name + args.name_suffix,
                        'workload': description + (f' (after: {args.after_args})' if after_args else ''),
                        'values_compared': compared.count - len(compared.only_one_side),
                        'max_abs_diff': compared.max_abs_both_sides,
                        'metric_keys_only_in_one': sorted({w.rsplit('/', 1)[-1] for w in compared.only_one_side}),
                        'note': notes.get(name + args.name_suffix, notes.get(name, '')),
                        'seconds': round(time.time() - started, 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        finally:
            subprocess.run(['git', '-C', ROOT, 'worktree', 'remove', '--force', before], check=False)
    command = ' '.join(['python', 'benchmarks/redesign_equivalence.py', *sys.argv[1:]])
    commands = [command]
    if args.append and os.path.exists(args.output):
        with open(args.output) as f:
            earlier = json.load(f)
        names = {row['name'] for row in rows}
        rows = [row for row in earlier['rows'] if row['name'] not in names] + rows
        commands = earlier.get('commands', [earlier['command']]) + commands
    with open(args.output, 'w') as f:
        json.dump({'command': commands[0], 'commands': commands, 'before': args.before, 'rows': rows}, f, indent=1)
        f.write('\n')


if __name__ == '__main__':
    main()
