"""The HPFL binary end to end on the generated default (tiny settings): every row, outputs, sane metrics."""

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from absl import app
from absl import flags

from experiments import hpfl_user_modeling as binary
from fedpersonal.models import gum
from fedpersonal.tasks import hpfl_user_modeling

FLAGS = flags.FLAGS
TINY = [
    '--synthetic_num_clients=3',
    '--synthetic_users_per_client=8',
    '--total_rounds=2',
    '--centralized_epochs=2',
    '--hidden_dim=4',
    '--batch_size=64',
    '--max_local_clusters=4',
    '--max_global_clusters=4',
    '--kmeans_iterations=2',
    '--ncd_hidden_units=8,4',
    '--ncf_embedding_dim=4',
    '--rounds_per_checkpoint=2',  # Not every round (the default): each save is a server checkpoint and a store commit.
]
# One of each kind (centralized, federated baseline, HPFL) keeps the test short; every baseline and HPFL variant is
# built by the same two code paths (tests/algorithms/hpfl*_test.py test them one by one).
METHODS = ('ncd', 'ncf', 'gum', 'distributed', 'fedavg', 'hpfl')


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['hpfl_user_modeling'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def test_every_method_on_generated_data(tmp_path, capsys):
    out = str(tmp_path / 'hpfl')
    _run(TINY + [f'--configurations={",".join(METHODS)}', f'--output_dir={out}'])
    printed = capsys.readouterr().out
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    names = [r['name'] for r in results['rows']]
    expected = [hpfl_user_modeling.ROW_NAMES[m] for m in METHODS if m != 'ncf']
    assert names == expected  # Binary generated default: NCD, not NCF.
    assert results['skipped'] == ['ncf']
    for name in expected:
        assert f'| {name} |' in printed
    for row in results['rows']:
        assert 0.0 <= row['accuracy'] <= 1.0 and 0.0 <= row['auc'] <= 1.0, row
        assert 0.0 < row['rmse'] < 1.0 and 0.0 <= row['doa'] <= 1.0 and 0.0 < row['ndcg'] <= 1.0, row
        if row['method'] not in hpfl_user_modeling.CENTRALIZED:
            assert row['seconds_per_round'] > 0 and 1 <= row['best_round'] <= 2
            metrics = os.path.join(out, row['method'], 'metrics.csv')
            with open(metrics) as f:
                header = f.readline()
            assert 'validation/rmse' in header
    analysis = results['private_components']['methods']
    assert set(analysis) == {'distributed', 'fedavg', 'hpfl'}
    assert all(0.0 <= a['probe_accuracy'] <= 1.0 and -1.0 <= a['silhouette'] <= 1.0 for a in analysis.values())
    for png in ('learning_curves.png', 'attribute_distribution.png', 'private_components.png'):
        assert os.path.getsize(os.path.join(out, png)) > 1000


def test_a_derived_accuracy_threshold_starts_a_new_directory_quietly_and_resumes(tmp_path, caplog):
    """--accuracy_threshold=none: the run's record keeps `none` (p is derived from the data, not a flag), so a new
    directory has no "previous run" and a rerun with the same flags reads the finished run back."""
    out = str(tmp_path / 'hpfl')
    argv = TINY + ['--accuracy_threshold=none', '--configurations=gum', f'--output_dir={out}']
    with caplog.at_level(logging.INFO, logger='absl'):
        _run(argv)
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        _run(argv)  # Was refused: "--accuracy_threshold: 0.58... -> none".
        second = [r.getMessage() for r in caplog.records]
    assert any("--accuracy_threshold=none: HPFL's p = " in m for m in first)
    assert any(m.startswith('[gum] epoch 2/2  eta 0s  train_loss=') for m in first)  # Epochs: of how many, ETA.
    assert not any('previous run' in m for m in first + second)
    assert any('holds the finished run' in m for m in second)


def test_private_components_analysis_separates_separated_clients(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 30)
    separated = rng.normal(size=[90, 4]) + 5.0 * np.eye(4)[labels]
    mixed = rng.normal(size=[90, 4])
    result = hpfl_user_modeling.private_components_analysis(
        {'distributed': separated, 'hpfl': mixed}, labels, ['a', 'b', 'c'], str(tmp_path / 'p.png')
    )
    methods = result['methods']
    assert methods['distributed']['probe_accuracy'] > 0.95 and methods['distributed']['silhouette'] > 0.5
    assert methods['hpfl']['probe_accuracy'] < 0.6 and abs(methods['hpfl']['silhouette']) < 0.1
    assert methods['hpfl']['chance'] == pytest.approx(1 / 3)
    assert os.path.getsize(result['figure']) > 1000


def test_doa_pairs_stay_within_a_silo():
    # Two silos, stacked items 0 (silo 0) and 1 (silo 1); a pair needs the same stacked item.
    metrics = hpfl_user_modeling.evaluate_predictions(
        'binary',
        (0.0, 1.0),
        np.array([1, 0, 1, 0.0]),
        np.array([0.9, 0.1, 0.8, 0.3]),
        user=np.array([0, 1, 2, 3]),
        item=np.array([0, 0, 1, 1]),
        user_scores=np.array([[1.0], [0.0], [0.0], [1.0]]),
        item_attributes=np.ones([2, 1]),
    )
    assert metrics['doa'] == 0.5  # Silo 0's pair agrees, silo 1's disagrees.
    assert metrics['accuracy'] == 1.0 and metrics['auc'] == 1.0


def test_real_dataset_needs_a_data_dir(tmp_path):
    with pytest.raises(app.UsageError, match='needs --data_dir'):
        _run(['--dataset=assistments', f'--output_dir={tmp_path}'])


def test_unknown_method_is_a_usage_error(tmp_path):
    with pytest.raises(app.UsageError, match='unknown'):
        _run(['--configurations=hpfl,fedbn', f'--output_dir={tmp_path}'])


def test_unknown_row_updates_is_a_usage_error(tmp_path):
    with pytest.raises(app.UsageError, match='row_updates'):
        _run(['--row_updates=sparse', f'--output_dir={tmp_path}'])


def test_gum_proficiency_orders_predictions_on_single_attribute_items():
    config = gum.GumConfig(num_attributes=3, max_users=20, max_items=1, hidden_dim=4)
    weights = gum.initial_weights(config, 1, 2)
    rng = np.random.default_rng(0)
    public = gum.PublicWeights(*[v + rng.normal(0, 0.5, v.shape).astype(np.float32) for v in weights.public])
    theta = rng.normal(0, 2, (20, 3)).astype(np.float32)
    weights = gum.GumWeights(public, weights.private._replace(theta=theta))
    proficiency = hpfl_user_modeling.gum_attribute_proficiency(public, theta)
    for k in range(3):
        attributes = np.zeros([20, 3], np.float32)
        attributes[:, k] = 1
        y = gum.predict(weights, tf.range(20, dtype=tf.int64), tf.zeros([20], tf.int64), attributes).numpy()
        # Same item for every user: the prediction is increasing in the proficiency on k.
        order = np.argsort(proficiency[:, k])
        assert np.all(np.diff(y[order]) >= -1e-6)


# ------------------------------------------------------------------------------------------------ kill and resume
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TIMING = {'wall_seconds', 'seconds_per_round', 'seconds_per_epoch'}


def _start_binary(argv, log_path):
    import subprocess  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top

    with open(log_path, 'ab') as log:  # A file, not a pipe: TFF's worker keeps inherited pipes open.
        return subprocess.Popen(
            [sys.executable, os.path.join(_REPO, 'experiments', 'hpfl_user_modeling.py'), *argv],
            cwd=_REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _without_timing(value, output_dir):
    if isinstance(value, dict):
        return {k: _without_timing(v, output_dir) for k, v in value.items() if k not in _TIMING}
    if isinstance(value, list):
        return [_without_timing(v, output_dir) for v in value]
    if isinstance(value, str):
        return value.replace(output_dir, '<output_dir>')
    return value


def _read(path):
    with open(path) as f:
        return f.read()


def _results(output_dir):
    with open(os.path.join(output_dir, 'results.json')) as f:
        return _without_timing(json.load(f), output_dir)


def test_binary_killed_mid_run_resumes_to_the_results_of_an_uninterrupted_run(tmp_path):
    """SIGKILL the binary once a federated method wrote its first checkpoint, restart it with the same flags: the
    finished rows are read back (not retrained), the method resumes from its checkpoint and the final results equal
    those of an uninterrupted run exactly; a third start of the finished run evaluates nothing again."""
    import signal  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top

    flags = [f for f in TINY if not f.startswith('--total_rounds=')] + [
        '--total_rounds=4',  # Checkpoints at rounds 2 and 4 (TINY): killed after round 2's, resumed for rounds 3-4.
        '--rounds_per_eval=2',
        # A finished row (ncd) read back and a federated method resumed (fedavg); every method checkpoints and
        # reads back through the same code (`fedpersonal.program`).
        '--configurations=ncd,fedavg',
    ]
    straight, killed = str(tmp_path / 'straight'), str(tmp_path / 'killed')
    log = str(tmp_path / 'killed.log')

    run = _start_binary(flags + [f'--output_dir={killed}'], log)
    checkpoints = os.path.join(killed, 'fedavg', 'checkpoints')
    deadline = time.time() + 600
    while run.poll() is None and time.time() < deadline:
        if os.path.isdir(checkpoints) and any(e.startswith('program_state_') for e in os.listdir(checkpoints)):
            run.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert run.wait(timeout=60) == -signal.SIGKILL, _read(log)[-3000:]
    assert not os.path.exists(os.path.join(killed, 'fedavg', 'results.json'))  # Killed mid-run.
    finished = {m: os.path.getmtime(os.path.join(killed, m, 'results.json')) for m in ('ncd',)}
    assert not os.path.exists(os.path.join(killed, 'results.json'))

    with open(log, 'a') as f:
        f.write('\n==== restart ====\n')
    assert _start_binary(flags + [f'--output_dir={killed}'], log).wait(timeout=900) == 0
    restarted = _read(log).split('==== restart ====')[1]
    for method in finished:
        assert f'[{method}] finished earlier: row read back' in restarted
        assert os.path.getmtime(os.path.join(killed, method, 'results.json')) == finished[method]  # Not retrained.
    assert '[fedavg] resumed from checkpoint at round' in restarted
    assert not os.path.exists(os.path.join(killed, 'fedavg', 'client_states.sqlite'))  # Removed once finished.

    assert _start_binary(flags + [f'--output_dir={straight}'], str(tmp_path / 'straight.log')).wait(timeout=900) == 0
    assert _results(killed) == _results(straight)

    # A finished run is not evaluated again: same results file, nothing trained or evaluated.
    results_mtime = os.path.getmtime(os.path.join(killed, 'results.json'))
    with open(log, 'a') as f:
        f.write('\n==== finished ====\n')
    assert _start_binary(flags + [f'--output_dir={killed}'], log).wait(timeout=300) == 0
    again = _read(log).split('==== finished ====')[1]
    assert 'holds the finished run' in again and 'round 1/' not in again and 'read back from' not in again
    assert os.path.getmtime(os.path.join(killed, 'results.json')) == results_mtime
    # Resuming under other flags is refused, naming the flag: tests/program/binary_cli_test.py (one check for every
    # binary, `fedpersonal.program.run_record`).


def test_early_stopping_ends_a_run_whose_validation_rmse_stops_improving(tmp_path):
    """With (almost) no local training the validation RMSE never improves on the first evaluation by min_delta: the
    run stops after `early_stopping_patience` more evaluations, keeping the first evaluation's states."""
    out = str(tmp_path / 'hpfl')
    argv = [a for a in TINY if not a.startswith('--total_rounds')]
    _run(
        argv
        + [
            '--total_rounds=20',
            '--client_learning_rate=1e-9',
            '--early_stopping_patience=2',
            '--early_stopping_min_delta=0.001',
            '--configurations=distributed',
            f'--output_dir={out}',
        ]
    )
    with open(os.path.join(out, 'results.json')) as f:
        (row,) = json.load(f)['rows']
    assert (row['best_round'], row['rounds'], row['early_stopped']) == (1, 3, True)


def test_tables_of_results_read_back_with_null_metrics():
    from fedpersonal.tasks import hpfl_analysis  # pylint: disable=g-import-not-at-top

    # A diverged run's results.json holds null for its non-finite numbers (program.write_json).
    rows = [{'name': 'HPFL', 'method': 'hpfl', 'accuracy': None, 'auc': 0.7, 'rmse': None, 'seconds_per_round': 1.0}]
    assert '| HPFL | - | 0.700 | - | 1.00 |' in hpfl_analysis.format_accuracy_table(rows, 'binary')
    # Selected rounds and epochs are means over seeds: whole ones as integers, others with one decimal.
    seeds = [{'name': 'A', 'best_round': 7.333333, 'rounds': 17.0}, {'name': 'B', 'best_epoch': 3.0}]
    table = hpfl_analysis.format_accuracy_table(seeds, 'binary')
    assert '| 7.3 (of 17) |' in table and '| 3 |' in table
    assert '| - |' in hpfl_analysis.format_ranking_table([{'name': 'HPFL', 'doa': None, 'ndcg': 0.5}])
    private = {'methods': {'hpfl': {'probe_accuracy': 0.5, 'chance': 0.25, 'silhouette': None}}}
    assert '| 0.500 | 0.250 | - |' in hpfl_analysis.format_private_table(private)
    assert '| # of clients | - |' in hpfl_analysis.format_statistics_table({'num_clients': None}, 'x')
