"""The record of a run's configuration in its output directory: resume refused under another configuration."""

import dataclasses
import json
import logging
import os
import re

import pytest

from fedpersonal.program import config_parts
from fedpersonal.program import run_record
from fedpersonal.tasks import feddva_config
from fedpersonal.tasks import furl_personalization_config
from fedpersonal.tasks import hpfl_user_modeling_config
from fedpersonal.tasks import movielens_mf_config
from fedpersonal.tasks import next_word_prediction_config

# Every binary's config with tiny settings (nothing is run: the record and its check only).
CONFIGS = {
    'feddva': feddva_config.FeddvaConfig(num_clients=4, total_rounds=2),
    'furl_personalization': furl_personalization_config.FurlConfig(synthetic_num_users=12, total_rounds=2),
    'hpfl_user_modeling': hpfl_user_modeling_config.HpflConfig(synthetic_num_clients=2, total_rounds=2),
    'movielens_mf': movielens_mf_config.MovieLensMFConfig(synthetic_num_users=12, total_rounds=2),
    'next_word_prediction': next_word_prediction_config.NextWordPredictionConfig(vocab_sizes=(50,), total_rounds=2),
}


def _checkpointed(output_dir, row='row', round_num=1):
    """Makes `output_dir` look like a run with a checkpoint of `row` (what the training loop writes)."""
    os.makedirs(os.path.join(output_dir, row, 'checkpoints', f'program_state_{round_num}'))
    with open(os.path.join(output_dir, row, 'metrics.csv'), 'w') as f:
        f.write('round,train/loss\n1,0.5\n')


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_binary_refuses_a_changed_configuration_and_resumes_an_unchanged_one(tmp_path, name):
    config = dataclasses.replace(CONFIGS[name], output_dir=str(tmp_path))
    run_record.check_output_dir(config)  # A new directory: recorded.
    _checkpointed(str(tmp_path))
    run_record.check_output_dir(config)  # Same configuration: resumes.
    changed = dataclasses.replace(config, total_rounds=3, seed=7)
    with pytest.raises(run_record.ConfigMismatchError, match='--seed: 0 -> 7; --total_rounds: 2 -> 3') as info:
        run_record.check_output_dir(changed)
    assert 'fresh_start' in str(info.value)
    # Fields that cannot change the results may change.
    moved = dataclasses.replace(config, output_dir=str(tmp_path), rounds_per_checkpoint=1)
    run_record.check_output_dir(moved)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_a_tasks_run_called_directly_refuses_a_changed_configuration_before_writing_anything(tmp_path, name):
    """Notebooks and benchmarks call `run(config)` without a binary: the same check, before anything is written."""
    import importlib  # pylint: disable=g-import-not-at-top

    task = importlib.import_module(f'fedpersonal.tasks.{name}')
    config = dataclasses.replace(CONFIGS[name], output_dir=str(tmp_path))
    run_record.check_output_dir(config)
    _checkpointed(str(tmp_path))
    with pytest.raises(run_record.ConfigMismatchError, match='--total_rounds: 2 -> 3'):
        task.run(dataclasses.replace(config, total_rounds=3))
    assert sorted(os.listdir(tmp_path)) == sorted([run_record.RUN_CONFIG_FILE, 'row'])  # Nothing else written.


def test_a_run_killed_before_its_first_checkpoint_starts_over_under_any_configuration(tmp_path):
    config = dataclasses.replace(CONFIGS['movielens_mf'], output_dir=str(tmp_path))
    run_record.check_output_dir(config)
    os.makedirs(tmp_path / 'fedrecon' / 'checkpoints')  # Created, but nothing saved yet.
    changed = dataclasses.replace(config, client_learning_rate=0.01)
    run_record.check_output_dir(changed)
    assert run_record.read_record(str(tmp_path), type(config))['client_learning_rate'] == 0.01


_PREVIOUS_RUN_LOG = 'stopped before its first checkpoint'


def _previous_run_lines(caplog):
    return [r.getMessage() for r in caplog.records if _PREVIOUS_RUN_LOG in r.getMessage()]


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_a_new_directory_logs_no_previous_run(tmp_path, caplog, name):
    config = dataclasses.replace(CONFIGS[name], output_dir=str(tmp_path / 'new'))
    with caplog.at_level(logging.INFO, logger='absl'):
        run_record.check_output_dir(config)
        run_record.check_output_dir(config)  # The task's own check of the same run (its record is its own).
    assert os.path.exists(tmp_path / 'new' / run_record.RUN_CONFIG_FILE)
    assert _previous_run_lines(caplog) == []


def test_a_run_killed_before_its_first_checkpoint_is_logged_naming_the_changed_flags(tmp_path, caplog):
    config = dataclasses.replace(CONFIGS['movielens_mf'], output_dir=str(tmp_path))
    run_record.check_output_dir(config)  # The killed run: recorded, started a row, saved nothing.
    os.makedirs(tmp_path / 'fedrecon' / 'checkpoints')
    with caplog.at_level(logging.INFO, logger='absl'):
        run_record.check_output_dir(config)  # The same configuration again: nothing to say.
        assert _previous_run_lines(caplog) == []
        run_record.check_output_dir(dataclasses.replace(config, seed=3))
    (line,) = _previous_run_lines(caplog)
    assert line == (
        f'{tmp_path}: a previous run with another configuration (--seed: 0 -> 3) stopped before its first '
        'checkpoint; starting over.'
    )


def test_fresh_start_moves_only_the_packages_outputs_and_starts_over(tmp_path):
    out = str(tmp_path)
    config = dataclasses.replace(CONFIGS['furl_personalization'], output_dir=out)
    run_record.check_output_dir(config)
    _checkpointed(out, 'global_fl')
    for name in ('results.json', 'learning_curves.png', 'config.json'):
        (tmp_path / name).write_text('{}')
    (tmp_path / 'my_notes.txt').write_text('mine')
    os.makedirs(tmp_path / 'my_data')
    (tmp_path / 'my_data' / 'ratings.csv').write_text('1,2,3\n')
    changed = dataclasses.replace(config, seed=3)
    with pytest.raises(run_record.ConfigMismatchError):
        run_record.check_output_dir(changed)

    run_record.check_output_dir(changed, fresh_start=True)
    assert sorted(os.listdir(out)) == ['my_data', 'my_notes.txt', 'previous_runs', 'run_config.json']
    (previous,) = os.listdir(tmp_path / 'previous_runs')
    moved = tmp_path / 'previous_runs' / previous
    assert sorted(os.listdir(moved)) == [
        'config.json',
        'global_fl',
        'learning_curves.png',
        'results.json',
        'run_config.json',
    ]
    assert json.loads((moved / 'run_config.json').read_text())['seed'] == 0
    assert run_record.read_record(out, type(config))['seed'] == 3
    assert not run_record.has_progress(out)  # The previous run's checkpoints are not resumed from.
    _checkpointed(out, 'global_fl')
    run_record.check_output_dir(changed)  # The new run resumes under its own configuration.


def test_total_rounds_may_not_change_on_resume():
    # Extending a run would evaluate (and maybe select or stop at) the shorter run's last round: not one run's numbers.
    for config in CONFIGS.values():
        assert not config_parts.may_change_on_resume(type(config), 'total_rounds')
        assert config_parts.may_change_on_resume(type(config), 'output_dir')
        assert config_parts.may_change_on_resume(type(config), 'rounds_per_checkpoint')


def test_hpfl_directories_written_before_the_rename_resume(tmp_path):
    """HPFL's earlier record (run_config.json without output_dir, methods, rounds_per_checkpoint; dataset 'assist')
    and a row's record of the training loop, as they were written before the flags were renamed."""
    out = str(tmp_path)
    config = hpfl_user_modeling_config.HpflConfig(dataset='assistments', data_dir='/data/a0910', output_dir=out)
    old = json.loads(json.dumps(dataclasses.asdict(config)))
    newer = ('output_dir', 'configurations', 'rounds_per_checkpoint', 'non_finite_clients', 'packed_cache_mb')
    for key in newer:  # Fields added since that record was written.
        del old[key]
    old['dataset'] = 'assist'
    _checkpointed(out, 'fedavg')
    for path in (tmp_path / 'run_config.json', tmp_path / 'fedavg' / 'run_config.json'):
        path.write_text(json.dumps(old))
    run_record.check_output_dir(dataclasses.replace(config, configurations=('fedavg',)))  # Rows may change.
    assert json.loads((tmp_path / 'fedavg' / 'run_config.json').read_text()) == run_record.recorded_config(config)
    with pytest.raises(run_record.ConfigMismatchError, match='--hidden_dim: 16 -> 8'):
        run_record.check_output_dir(dataclasses.replace(config, hidden_dim=8))


def test_a_legacy_config_json_is_the_record(tmp_path):
    out = str(tmp_path)
    config = dataclasses.replace(CONFIGS['feddva'], output_dir=out)
    legacy = json.loads(json.dumps(dataclasses.asdict(config)))
    legacy['methods'] = legacy.pop('configurations')
    legacy['dataset'] = 'generated'
    legacy['output_dir'] = '/somewhere/else'
    (tmp_path / 'config.json').write_text(json.dumps(legacy))
    _checkpointed(out, 'heterogeneous_inputs/feddva')
    with pytest.raises(run_record.ConfigMismatchError, match='--configurations: feddva,feddva_tuned,fedavg,'):
        run_record.check_output_dir(dataclasses.replace(config, configurations=('ditto',)))
    assert not (tmp_path / 'run_config.json').exists()
    run_record.check_output_dir(config)  # Under the new names, the same configuration.


def test_a_path_is_compared_as_the_file_it_names(tmp_path, monkeypatch):
    """``--data_dir`` spelled another way (relative, through ``..``, a symlink) resumes; the same relative spelling
    from another working directory names another directory and is refused; rows' loop records follow."""
    data = tmp_path / 'work' / 'data'
    data.mkdir(parents=True)
    (tmp_path / 'elsewhere' / 'data').mkdir(parents=True)
    os.symlink(data, tmp_path / 'link')
    out = str(tmp_path / 'out')
    monkeypatch.chdir(tmp_path / 'work')
    config = hpfl_user_modeling_config.HpflConfig(dataset='movielens', data_dir='data', output_dir=out)
    assert run_record.path_fields(type(config)) == {'data_dir', 'data_path'}
    run_record.check_output_dir(config)
    assert run_record.read_record(out, type(config))['data_dir'] == str(data)  # Recorded absolute.
    _checkpointed(out, 'fedavg')
    relative_record = dict(run_record.recorded_config(config), data_dir='data')  # As recorded before: relative.
    (tmp_path / 'out' / 'fedavg' / 'run_config.json').write_text(json.dumps(relative_record))
    for spelling in ('./data', f'{tmp_path}/work/../work/data', str(tmp_path / 'link'), str(data) + '/'):
        run_record.check_output_dir(dataclasses.replace(config, data_dir=spelling))
        row_record = json.loads((tmp_path / 'out' / 'fedavg' / 'run_config.json').read_text())
        assert row_record == run_record.recorded_config(dataclasses.replace(config, data_dir=spelling))
    monkeypatch.chdir(tmp_path / 'elsewhere')
    expected = f'--data_dir: {data} -> {tmp_path}/elsewhere/data'  # The last record: absolute and normalized.
    with pytest.raises(run_record.ConfigMismatchError, match=re.escape(expected)):
        run_record.check_output_dir(config)
    # Every binary's data flags are paths.
    for config in CONFIGS.values():
        assert 'data_dir' in run_record.path_fields(type(config))
