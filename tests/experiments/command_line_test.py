"""A binary run from the command line, as a user runs it (a subprocess: the import order is the real one)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_movielens_binary_runs_from_the_command_line(tmp_path):
    out = tmp_path / 'run'
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, 'experiments', 'movielens_mf.py'),
            '--synthetic_num_users=60',
            '--synthetic_num_items=80',
            '--clients_per_round=5',
            '--eval_clients=5',
            '--batch_size=5',
            '--configurations=fedrecon',
            '--total_rounds=2',
            f'--output_dir={out}',
        ],
        cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': ROOT},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr
    with open(out / 'results.json') as f:
        results = json.load(f)
    assert [row['configuration'] for row in results['rows']] == ['fedrecon']
    assert results['baseline']['rmse'] > 0 and 'Mean rating (baseline)' in result.stdout
