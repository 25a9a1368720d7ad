"""The benchmark's results for the docs (`fedpersonal.tasks.pfl_benchmark_results`, benchmarks/pfl_benchmark_table.py):
the rows' keys, PFLlib's numbers only where its leaderboard has the method, explanations only as written by a
person (kept across reruns of the tool), the markdown table and one plot per partition."""

import json
import os
import subprocess
import sys

import pytest

from fedpersonal import errors
from fedpersonal.tasks import pfl_benchmark_results as results_lib

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
REQUIRED = {
    'name',
    'dataset',
    'partition',
    'clients',
    'rounds',
    'accuracy',
    'accuracy_std',
    'seeds',
    'worst_client_accuracy',
    'seconds_per_round',
}


def _seed_row(method, name, seed, final):
    return {
        'name': name,
        'method': method,
        'seed': seed,
        'rounds': 4,
        'accuracy': final,
        'best_accuracy': max(final, 0.5),
        'best_round': 4,
        'slope_last_10pct': (final - 0.5) / 2,
        'mean_client_accuracy': final,
        'worst_client_accuracy': final / 2,
        'seconds_per_round': 0.5,
        'curve': [[2, 0.5], [4, final]],
        'worst_client_curve': [[2, 0.25], [4, final / 2]],
    }


METHODS = (('fedavg', 'FedAvg'), ('fedper', 'FedPer'), ('ditto', 'Ditto'))


def _write_run(run_dir, partition, dataset='fashion_mnist', seeds=(0, 1, 2), methods=METHODS, base=0.6):
    """A finished run's results.json and config.json as experiments/pfl_benchmark.py writes them."""
    rows = [results_lib.over_seeds([_seed_row(m, n, s, base + 0.1 * s) for s in seeds], seeds) for m, n in methods]
    os.makedirs(run_dir)
    results = {'dataset': dataset, 'partition': partition, 'clients': 20, 'seeds': list(seeds), 'rows': rows}
    with open(os.path.join(run_dir, 'results.json'), 'w') as f:
        json.dump(results, f)
    config = {'dataset': dataset, 'partition': partition, 'total_rounds': 4, 'seeds': list(seeds), 'batch_size': 10}
    with open(os.path.join(run_dir, 'config.json'), 'w') as f:
        json.dump(config, f)
    return results


def test_rows_have_the_docs_keys_and_pfllib_numbers_only_for_leaderboard_methods(tmp_path):
    results = _write_run(str(tmp_path / 'pat'), 'pathological')
    rows = {r['name']: r for r in results_lib.docs_rows(results, {'pathological': {'Ditto': 'Fewer rounds.'}})}
    for row in rows.values():
        assert set(row) >= REQUIRED and row['seeds'] == [0, 1, 2] and row['rounds'] == 4 and row['clients'] == 20
    assert rows['FedAvg']['pfllib_accuracy'] == 0.8041 and rows['FedAvg']['explanation'] is None  # Not written yet.
    assert rows['Ditto']['pfllib_accuracy'] == 0.9944 and rows['Ditto']['explanation'] == 'Fewer rounds.'
    assert 'pfllib_accuracy' not in rows['FedPer'] and 'explanation' not in rows['FedPer']  # Not on the leaderboard.
    assert rows['FedAvg']['accuracy'] == pytest.approx(0.7) and rows['FedAvg']['accuracy_std'] == pytest.approx(0.1)
    other = _write_run(str(tmp_path / 'mnist'), 'pathological', dataset='mnist')
    assert all('pfllib_accuracy' not in r for r in results_lib.docs_rows(other))  # The leaderboard is Fashion-MNIST.


def test_markdown_table_shows_percent_with_std_and_pending_explanations(tmp_path):
    results = _write_run(str(tmp_path / 'dir'), 'dirichlet')
    table = results_lib.markdown_table(results_lib.docs_rows(results))
    lines = table.splitlines()
    assert 'dirichlet partition, 20 clients, 4 rounds' in lines[0] and 'seeds 0, 1, 2' in lines[0]
    fedavg = next(line for line in lines if line.startswith('| FedAvg '))
    assert '| 70.00 +- 10.00 |' in fedavg and '| 85.85 |' in fedavg and results_lib.PENDING in fedavg
    fedper = next(line for line in lines if line.startswith('| FedPer '))
    assert fedper.endswith('| - |  |')  # No PFLlib number, no explanation.


def test_seeds_evaluated_at_different_rounds_are_refused():
    runs = [_seed_row('fedavg', 'FedAvg', 0, 0.6), {**_seed_row('fedavg', 'FedAvg', 1, 0.7), 'curve': [[3, 0.7]]}]
    with pytest.raises(ValueError, match='different rounds'):
        results_lib.over_seeds(runs, [0, 1])


def test_a_directory_without_a_finished_run_is_named(tmp_path):
    with pytest.raises(errors.InputError, match='not a finished benchmark run'):
        results_lib.docs_results([str(tmp_path)])


def test_table_tool_writes_rows_plots_and_keeps_written_explanations(tmp_path):
    _write_run(str(tmp_path / 'pat'), 'pathological')
    _write_run(str(tmp_path / 'dir'), 'dirichlet')
    output = tmp_path / 'docs' / 'pfl_benchmark.json'
    explanations = tmp_path / 'explanations.json'
    explanations.write_text(json.dumps({'dirichlet': {'fedavg': 'Seed noise.'}}))
    command = [
        sys.executable,
        os.path.join(ROOT, 'benchmarks', 'pfl_benchmark_table.py'),
        f'--runs={tmp_path / "pat"},{tmp_path / "dir"}',
        f'--output={output}',
    ]
    env = {**os.environ, 'PYTHONPATH': os.path.abspath(ROOT)}
    done = subprocess.run(command + [f'--explanations={explanations}'], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert '| FedAvg | 70.00 +- 10.00 |' in done.stdout and 'pathological/FedAvg' in done.stdout  # Pending listed.
    assert 'Exception ignored' not in done.stderr, done.stderr  # TFF's context is released before exit.
    with open(output) as f:
        written = json.load(f)
    assert [(r['partition'], r['name']) for r in written['rows']] == [
        (p, n) for p in ('pathological', 'dirichlet') for n in ('FedAvg', 'FedPer', 'Ditto')
    ]
    for row in written['rows']:
        assert set(row) == set(results_lib.DOCS_KEYS) | (
            set(results_lib.LEADERBOARD_KEYS) if row['name'] != 'FedPer' else set()
        )
    assert written['rows'][3]['explanation'] == 'Seed noise.'
    assert 'python experiments/pfl_benchmark.py --partition=dirichlet --total_rounds=4' in str(written['runs'])
    for partition in ('pathological', 'dirichlet'):
        assert os.path.getsize(tmp_path / 'docs' / f'pfl_benchmark_{partition}.png') > 0
    # A rerun without --explanations keeps the written ones (what the tool passes on: those already in --output).
    kept = results_lib.previous_explanations(str(output))
    assert kept == {'dirichlet': {'FedAvg': 'Seed noise.'}}
    rows = results_lib.docs_results([str(tmp_path / 'dir')], kept)['rows']
    assert [r.get('explanation') for r in rows] == ['Seed noise.', None, None]
    assert 'explanation' not in rows[1]
    # A new file replaces the written ones (keyed by method here, by name in --output: the file still wins).
    explanations.write_text(json.dumps({'dirichlet': {'fedavg': 'Unfinished training.'}}))
    done = subprocess.run(command + [f'--explanations={explanations}'], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    with open(output) as f:
        assert json.load(f)['rows'][3]['explanation'] == 'Unfinished training.'
    # --update: a rerun of one method replaces its row alone, and the figure is redrawn from the file's rows.
    _write_run(str(tmp_path / 'dir2'), 'dirichlet', methods=[('ditto', 'Ditto')], base=0.3)
    os.remove(tmp_path / 'docs' / 'pfl_benchmark_dirichlet.png')
    command = [*command[:2], f'--runs={tmp_path / "dir2"}', command[3], '--update']
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    with open(output) as f:
        updated = json.load(f)
    assert [r['accuracy'] for r in updated['rows']] == pytest.approx([0.7, 0.7, 0.7, 0.7, 0.7, 0.4])
    assert updated['runs']['fashion_mnist/dirichlet']['updates'][0]['methods'] == ['ditto']
    assert os.path.getsize(tmp_path / 'docs' / 'pfl_benchmark_dirichlet.png') > 0


def test_an_update_replaces_its_methods_rows_only_and_keeps_one_r_per_partition(tmp_path):
    previous = results_lib.docs_results([_dir(tmp_path, 'pat', 'pathological'), _dir(tmp_path, 'dir', 'dirichlet')])
    rerun = _dir(tmp_path, 'new', 'dirichlet', methods=[('fedper', 'FedPer'), ('apfl', 'APFL')], base=0.2)
    updated = results_lib.updated_results(previous, results_lib.docs_results([rerun]))
    names = [(r['partition'][:3], r['name'], round(r['accuracy'], 4)) for r in updated['rows']]
    kept = [(p, n, 0.7) for p in ('pat', 'dir') for n in ('FedAvg', 'FedPer', 'Ditto')]
    assert names == [*kept[:4], ('dir', 'FedPer', 0.3), kept[5], ('dir', 'APFL', 0.3)]
    assert updated['runs']['fashion_mnist/dirichlet']['updates'][0]['output_dir'] == rerun
    assert 'updates' not in updated['runs']['fashion_mnist/pathological']
    longer = results_lib.docs_results([_dir(tmp_path, 'r8', 'dirichlet', rounds=8)])
    with pytest.raises(errors.InputError, match='dirichlet/FedAvg: 8 rounds, the rows it joins 4'):
        results_lib.updated_results(previous, longer)


def _dir(tmp_path, name, partition, rounds=4, **kwargs):
    _write_run(str(tmp_path / name), partition, **kwargs)
    if rounds != 4:
        path = tmp_path / name / 'results.json'
        results = json.loads(path.read_text())
        for row in results['rows']:
            row['rounds'] = rounds
        path.write_text(json.dumps(results))
    return str(tmp_path / name)
