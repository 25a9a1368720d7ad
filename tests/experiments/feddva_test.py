"""The FedDVA binary end to end on the generated default (tiny sizes), and its configuration errors."""

import csv
import json
import os

import pytest
from absl import app
from absl import flags

from experiments import feddva as binary

FLAGS = flags.FLAGS


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['feddva'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def test_generated_default_end_to_end(tmp_path, capsys):
    out = str(tmp_path / 'feddva')
    argv = [
        '--settings=heterogeneous_inputs',
        '--num_clients=4',
        '--train_per_client=24',
        '--test_per_client=12',
        '--validation_per_client=8',  # Rows selected on validation, as the converged tables run.
        '--early_stopping_patience=1',
        '--synthetic_train=200',
        '--synthetic_test=100',
        '--total_rounds=2',
        '--clients_per_round=4',
        '--rounds_per_eval=1',
        '--z_dim=2',
        '--c_dim=2',
        '--batch_size=12',
        '--cnn_channels=4,8',
        '--cnn_dense=8',
        '--projection=pca',
        '--projection_points=40',
        '--grid_size=3',
        '--simulation=per_client',  # Faster at this size; the engine equals it (tests/simulation/feddva_engine_test).
        f'--output_dir={out}',
    ]
    _run(argv)
    printed = capsys.readouterr().out
    for name in (
        'FedDVA head on [z, c]',
        'FedDVA, encoders tuned with the head',
        'FedAvg',
        'FedAvg + fine-tuning',
        'Ditto',
        'Linear probes',
    ):
        assert name in printed
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    rows = {r['method']: r for r in results['rows'] if 'accuracy' in r}
    assert set(rows) == {'feddva', 'feddva_tuned', 'fedavg', 'fedavg_ft', 'ditto'}
    for method, row in rows.items():
        assert 0 <= row['accuracy'] <= 1 and row['seconds_per_round'] > 0
        # The row is the test accuracy measured at its best validation round (read back from the run's metrics).
        run = 'fedavg' if method == 'fedavg_ft' else method
        with open(os.path.join(out, 'heterogeneous_inputs', run, 'metrics.csv')) as f:
            evaluations = [r for r in csv.DictReader(f) if r.get('eval/accuracy')]
        prefix = 'ft_' if method == 'fedavg_ft' else ''
        validation = [float(r[f'eval/{prefix}accuracy']) for r in evaluations]
        best = evaluations[validation.index(max(validation))]
        assert row['best_round'] == int(float(best['round'])) and row['best_validation_accuracy'] == max(validation)
        assert row['accuracy'] == pytest.approx(float(best[f'eval/{prefix}test_accuracy'])), method
        assert row['rounds'] == 2
    probes = next(r for r in results['rows'] if 'probe_client_from_c' in r)
    assert probes['method'] == 'feddva'  # The representations trained without labels.
    for key in ('probe_client_from_z', 'probe_label_from_z', 'probe_label_from_c', 'probe_mark_from_c'):
        assert 0 <= probes[key] <= 1
    assert [r for r, _ in results['curves']['heterogeneous_inputs/feddva']] == [1, 2]
    for figure in ('accuracy_vs_rounds', 'heterogeneous_inputs_manifold', 'heterogeneous_inputs_projections'):
        assert os.path.getsize(results['figures'][figure]) > 1000

    # Running it again resumes every method from its checkpoint with the clients' stored private states
    # (decoders, heads, Ditto's personal models): the same numbers, not a fresh start.
    _run(argv)
    with open(os.path.join(out, 'results.json')) as f:
        again = {r['method']: r for r in json.load(f)['rows'] if 'accuracy' in r}
    for method, row in rows.items():
        assert again[method]['accuracy'] == row['accuracy'], method  # Same seed, same machine: the same bits.
        assert again[method]['seconds_per_round'] == row['seconds_per_round'], method


@pytest.mark.parametrize(
    'argv,message',
    [
        (['--dataset=mnist'], 'needs --data_dir'),
        (['--configurations=fedprox'], 'configurations must be a non-empty subset'),
        (['--decoder_c_source=both'], "decoder_c_source must be 'prior' or 'posterior'"),
        (['--simulation=lockstep'], "simulation must be 'engine' or 'per_client'"),
        (['--group_size=0'], 'group_size must be >= 1'),
        (['--early_stopping_patience=3'], 'early_stopping_patience needs a validation split'),
    ],
)
def test_configuration_errors(tmp_path, argv, message):
    with pytest.raises(app.UsageError, match=message):
        _run(argv + [f'--output_dir={tmp_path}'])


def test_engine_is_the_default():
    from fedpersonal.tasks import feddva as task

    assert task.FeddvaConfig().simulation == 'engine' and task.FeddvaConfig().group_size is None
