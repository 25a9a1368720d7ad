"""Tests for the experiment output writers (metrics rows, JSON, marked Markdown sections, figures)."""

import json
import os

import numpy as np

from fedpersonal import program


def test_metrics_rows_resume_replaces_rows_from_the_restart_round(tmp_path):
    outputs = program.ExperimentOutputs(str(tmp_path), 'run')
    for round_num in (1, 2, 3):
        outputs.release_metrics(round_num, {'train': {'loss': float(round_num)}})
    resumed = program.ExperimentOutputs(str(tmp_path), 'run')
    resumed.release_metrics(2, {'train': {'loss': 20.0}})
    rows = resumed.read_metrics()
    assert [(r['round'], r['train/loss']) for r in rows] == [(1.0, 1.0), (2.0, 20.0)]


def test_write_json_handles_numpy_and_leaves_no_temp_file(tmp_path):
    path = str(tmp_path / 'deep' / 'results.json')
    program.write_json(path, {'auc': np.float32(0.5), 'rows': [np.int64(3)], 'vector': np.arange(2)})
    with open(path) as f:
        assert json.load(f) == {'auc': 0.5, 'rows': [3], 'vector': [0, 1]}
    assert os.listdir(tmp_path / 'deep') == ['results.json']


def test_replace_marked_section_keeps_other_sections(tmp_path):
    path = str(tmp_path / 'RESULTS.md')
    program.replace_marked_section(path, 'a', 'first A')
    program.replace_marked_section(path, 'b', 'only B')
    program.replace_marked_section(path, 'a', 'second A')
    with open(path) as f:
        text = f.read()
    assert 'second A' in text and 'first A' not in text and 'only B' in text
    assert text.index('<!-- a:start -->') < text.index('<!-- b:start -->')
    assert text.count('<!-- a:start -->') == 1


def test_plot_curves_writes_a_png_and_skips_missing_keys(tmp_path):
    rows = [{'round': 1.0, 'loss': 2.0}, {'round': 2.0, 'loss': 1.0}]
    path = program.plot_curves({'run': rows}, ['loss', 'absent'], str(tmp_path / 'plots' / 'c.png'), title='t')
    with open(path, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert program.plot_curves({'run': rows}, ['absent'], str(tmp_path / 'none.png')) is None
    assert not os.path.exists(tmp_path / 'none.png')


def test_median_round_seconds_counts_the_rounds_of_a_resumed_run(tmp_path):
    first = program.ExperimentOutputs(str(tmp_path), 'run')
    assert first.median_round_seconds() is None
    for round_num, seconds in ((1, 1.0), (2, 2.0)):
        first.release_metrics(round_num, {'round_seconds': seconds, 'train': {'loss': 0.0}})
    resumed = program.ExperimentOutputs(str(tmp_path), 'run')
    resumed.release_metrics(3, {'round_seconds': 9.0, 'train': {'loss': 0.0}})
    assert resumed.median_round_seconds() == 2.0


def _strict_json(text):
    """`json.loads` that rejects NaN and Infinity (which `json.loads` accepts by default)."""

    def reject(constant):
        raise ValueError(f'invalid JSON constant {constant}')

    return json.loads(text, parse_constant=reject)


def test_write_json_writes_non_finite_numbers_as_null_and_lists_their_paths(tmp_path):
    path = str(tmp_path / 'results.json')
    program.write_json(
        path,
        {
            'rows': [{'name': 'diverged', 'rmse': float('nan'), 'mae': np.float32('inf')}, {'rmse': 0.9}],
            'curve': np.array([1.0, -np.inf, 0.5]),
            'nested': {'deep': [np.float64('nan'), 2, True, None]},
            'ok': 1.5,
        },
    )
    with open(path) as f:
        results = _strict_json(f.read())
    assert results['rows'] == [{'name': 'diverged', 'rmse': None, 'mae': None}, {'rmse': 0.9}]
    assert results['curve'] == [1.0, None, 0.5]
    assert results['nested'] == {'deep': [None, 2, True, None]}  # The original None is not listed below.
    assert results['ok'] == 1.5
    assert results['non_finite'] == ['rows/0/rmse', 'rows/0/mae', 'curve/1', 'nested/deep/0']


def test_write_json_of_finite_values_has_no_non_finite_key_and_keeps_an_earlier_list(tmp_path):
    path = str(tmp_path / 'results.json')
    program.write_json(path, {'rows': [{'rmse': 0.9}]})
    with open(path) as f:
        assert _strict_json(f.read()) == {'rows': [{'rmse': 0.9}]}
    program.write_json(path, {'rmse': None, 'non_finite': ['rmse'], 'mae': float('nan')})  # A row read back.
    with open(path) as f:
        assert _strict_json(f.read()) == {'rmse': None, 'non_finite': ['rmse', 'mae'], 'mae': None}
    program.write_json(path, [float('inf')])  # Not a mapping: nulls, nowhere to list them.
    with open(path) as f:
        assert _strict_json(f.read()) == [None]


def test_mean_over_seeds_of_rows_read_back_with_a_null_metric(tmp_path):
    runs = [{'name': 'a', 'rmse': None, 'non_finite': ['rmse']}, {'name': 'a', 'rmse': 0.5}]
    row = program.mean_over_seeds(runs, [0, 1], std_keys=('rmse',))
    assert row['rmse'] == 0.5 and row['rmse_std'] == 0.0 and row['name'] == 'a'


def test_tables_of_results_read_back_with_null_metrics_show_n_a():
    from fedpersonal.tasks import feddva_analysis  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import movielens_mf  # pylint: disable=g-import-not-at-top

    row = {'name': 'FedRecon', 'rmse': None, 'mae': 0.75, 'accuracy': 0.5, 'per_client': {'rmse': {'p50': None}}}
    assert '| FedRecon | n/a | 0.750 | 0.500 | n/a [n/a, n/a] |' in movielens_mf.format_table([row])
    row = {'method': 'feddva', 'setting': 'heterogeneous_inputs', 'accuracy': None}
    row.update(client_mean_accuracy=0.5, client_min_accuracy=None)
    assert '| n/a | 0.5000 | n/a |' in feddva_analysis.format_tables([row])
    # A mean over seeds shows each metric's spread and each seed's selected round.
    row = {'method': 'fedavg', 'setting': 'heterogeneous_inputs', 'seeds': [0, 1], 'seconds_per_round': 1.0}
    row.update(accuracy=0.9, accuracy_std=0.01, client_mean_accuracy=0.9, client_min_accuracy=0.8)
    row.update(per_seed=[{'best_round': 240, 'rounds': 290}, {'best_round': 200, 'rounds': 250}], best_round=220)
    table = feddva_analysis.format_tables([row])
    assert '| FedAvg | heterogeneous inputs | 0.9000 +- 0.0100 | 0.9000 | 0.8000 | 1.00 | 240/290, 200/250 |' in table


def test_plots_written_to_files_leave_the_sessions_matplotlib_backend_and_pyplot_alone(tmp_path):
    # A notebook's inline plots stop showing if a library call switches the backend (matplotlib.use('Agg')) or
    # leaves figures registered with pyplot.
    import matplotlib  # pylint: disable=g-import-not-at-top
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    from fedpersonal import data  # pylint: disable=g-import-not-at-top

    previous = matplotlib.get_backend()
    matplotlib.use('svg')
    try:
        rows = [{'round': r, 'loss': 1.0 / r} for r in range(1, 4)]
        assert program.plot_curves({'a': rows, 'b': rows}, ['loss'], str(tmp_path / 'c.png'), references={'r': {}})
        silos = data.generate_user_modeling(num_clients=3, users_per_client=5, seed=0)
        data.user_modeling.plot_attribute_distribution(silos, str(tmp_path / 'd.png'))
        assert matplotlib.get_backend() == 'svg'
        assert plt.get_fignums() == []
        assert os.path.getsize(tmp_path / 'c.png') > 0 and os.path.getsize(tmp_path / 'd.png') > 0
    finally:
        matplotlib.use(previous)
