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
