"""The MovieLens binary end to end on the generated default: outputs, results table, resume."""

import csv
import json
import os
import shutil

import pytest
from absl import app
from absl import flags

from experiments import movielens_mf as binary

FLAGS = flags.FLAGS
TINY = [
    '--synthetic_num_users=60',
    '--synthetic_num_items=80',
    '--clients_per_round=5',
    '--eval_clients=5',
    '--rounds_per_eval=1',
    '--centralized_max_epochs=2',
    '--batch_size=5',
]


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['movielens_mf'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def _rounds(path):
    with open(path) as f:
        return [int(float(row['round'])) for row in csv.DictReader(f)]


def test_all_five_configurations_two_rounds(tmp_path, capsys):
    out = str(tmp_path / 'run')
    _run(
        TINY
        + [
            '--total_rounds=2',
            f'--output_dir={out}',
            '--configurations=centralized_standard,centralized_recon,fedavg_standard,fedavg_recon,fedrecon',
        ]
    )
    printed = capsys.readouterr().out
    for name in (
        'Centralized + StandardEval',
        'Centralized + ReconEval',
        'FedAvg + StandardEval',
        'FedAvg + ReconEval',
        'FedRecon (ReconEval)',
    ):
        assert name in printed
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    assert [r['configuration'] for r in results['rows']] == [
        'centralized_standard',
        'centralized_recon',
        'fedavg_standard',
        'fedavg_recon',
        'fedrecon',
    ]
    for row in results['rows']:
        assert 0 < row['rmse'] < 10 and 0 <= row['accuracy'] <= 1
        assert row['per_client']['rmse']['clients'] > 0
    assert 'generated' in results['dataset']
    with open(os.path.join(out, 'fedrecon', 'metrics.csv')) as f:
        header = f.readline()
    assert 'eval/per_client/rmse/p50' in header and 'eval/per_client/accuracy/p90' in header
    for name in ('fedrecon', 'fedavg_recon'):
        assert _rounds(os.path.join(out, name, 'metrics.csv')) == [1, 2]
        assert os.listdir(os.path.join(out, name, 'checkpoints'))
        assert os.listdir(os.path.join(out, name, 'tensorboard'))
        assert os.path.getsize(os.path.join(out, name, 'learning_curve.png')) > 1000
    assert os.path.getsize(os.path.join(out, 'learning_curves.png')) > 1000
    with open(os.path.join(out, 'config.json')) as f:
        assert json.load(f)['total_rounds'] == 2


def test_resumes_from_checkpoint_only_under_the_same_flags(tmp_path, caplog):
    out = str(tmp_path / 'resume')
    flags_ = TINY + ['--total_rounds=2', '--rounds_per_checkpoint=1', f'--output_dir={out}']
    _run(flags_)
    metrics_csv = os.path.join(out, 'fedrecon', 'metrics.csv')
    assert _rounds(metrics_csv) == [1, 2]
    with open(os.path.join(out, 'results.json')) as f:
        straight = json.load(f)['rows'][0]
    # As if killed after round 1's checkpoint: the rerun resumes there and ends with the same numbers.
    checkpoints = os.path.join(out, 'fedrecon', 'checkpoints')
    shutil.rmtree(os.path.join(checkpoints, 'program_state_2'))
    caplog.set_level('INFO', logger='absl')
    _run(flags_)
    assert '[fedrecon] resumed from checkpoint at round 1' in caplog.text
    assert _rounds(metrics_csv) == [1, 2]
    with open(os.path.join(out, 'results.json')) as f:
        resumed = json.load(f)['rows'][0]
    assert resumed['rmse'] == straight['rmse']  # Same seed, same machine: the same bits (README, Reproducibility).
    # Another configuration (even only more rounds: the 2-round run evaluated its last round, which a 3-round run
    # would not) is refused, naming the flag; --fresh_start starts over.
    with pytest.raises(app.UsageError, match=r'--total_rounds: 2 -> 3'):
        _run(TINY + ['--total_rounds=3', f'--output_dir={out}'])
    _run(TINY + ['--total_rounds=3', '--fresh_start', f'--output_dir={out}'])
    assert _rounds(metrics_csv) == [1, 2, 3]
    assert os.listdir(os.path.join(out, 'previous_runs'))


def test_bad_data_dir_gives_a_clear_error(tmp_path):
    (tmp_path / 'u.data').write_text('1\t2\t3\t881250949\n1\t2\n')
    with pytest.raises(app.UsageError, match=r'u\.data.*line 2'):
        _run(TINY + ['--total_rounds=1', f'--data_dir={tmp_path}', f'--output_dir={tmp_path / "o"}'])


def test_bad_flag_values_give_clear_errors(tmp_path):
    with pytest.raises(app.UsageError, match='configurations must be a non-empty subset'):
        _run(TINY + ['--configurations=fedprox', f'--output_dir={tmp_path}'])
    with pytest.raises(app.UsageError, match=r"--recon_steps_max='many': expected int or 'none'"):
        _run(TINY + ['--recon_steps_max=many', f'--output_dir={tmp_path}'])


def test_early_stopping_ends_the_run_after_patience_stale_evaluations(tmp_path):
    out = str(tmp_path / 'stopping')
    # Client SGD at 3 on this tiny data: validation RMSE is noisy and soon stops improving (seeded: best at round 6
    # of 40); 2 stale evaluations end the run, which is then tested with the best validation round's model.
    _run(
        TINY
        + [
            '--total_rounds=40',
            '--client_learning_rate=3',
            '--early_stopping_patience=2',
            '--configurations=fedrecon',
            f'--output_dir={out}',
        ]
    )
    with open(os.path.join(out, 'results.json')) as f:
        row = json.load(f)['rows'][0]
    assert row['early_stopped'] and row['rounds'] == row['best_round'] + 2 < 40
    assert _rounds(os.path.join(out, 'fedrecon', 'metrics.csv'))[-1] == row['rounds']
    assert row['best_round'] >= 1 and 0 < row['best_validation_rmse'] < 10 and 0 < row['rmse'] < 10


def test_a_diverging_run_stops_naming_the_round_and_clients(tmp_path):
    out = str(tmp_path / 'diverging')
    with pytest.raises(app.UsageError, match=r'round \d+: non-finite training loss .* from client\(s\) \[') as raised:
        _run(
            TINY
            + ['--total_rounds=3', '--client_learning_rate=1e6', '--configurations=fedrecon', f'--output_dir={out}']
        )
    assert '--non_finite_clients=zero' in str(raised.value)
