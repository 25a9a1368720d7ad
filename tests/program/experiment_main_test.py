"""The binaries' shared main: user input errors become one-line usage errors, bugs keep their traceback."""

import dataclasses
import os

import pytest
from absl import app
from absl import flags

from fedpersonal import errors
from fedpersonal.program import experiment_main


@dataclasses.dataclass(frozen=True)
class _Config:
    output_dir: str
    em_test_failure: str = 'none'

    def __post_init__(self):
        if self.em_test_failure not in ('none', 'data', 'bug'):
            raise errors.ConfigError(f'em_test_failure must be none, data or bug, got {self.em_test_failure!r}.')


def _run(config):
    if config.em_test_failure == 'data':
        raise errors.DataError('ratings.csv, line 3, field rating: not a number')
    if config.em_test_failure == 'bug':
        raise ValueError('an internal shape mismatch')
    return {'value': 1}


_MAIN = experiment_main.define_main(
    _Config, _run, lambda results, config: str(results), default_output_dir='/nonexistent'
)


def _main(tmp_path, *argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['binary', f'--output_dir={tmp_path}', *argv])
    _MAIN(['binary'])


def test_configuration_and_data_errors_are_usage_errors(tmp_path):
    with pytest.raises(app.UsageError, match='em_test_failure must be'):
        _main(tmp_path, '--em_test_failure=other')
    with pytest.raises(app.UsageError, match='ratings.csv, line 3'):
        _main(tmp_path, '--em_test_failure=data')


def test_other_exceptions_keep_their_traceback(tmp_path):
    with pytest.raises(ValueError, match='internal shape mismatch') as info:
        _main(tmp_path, '--em_test_failure=bug')
    assert not isinstance(info.value, app.UsageError)
    assert info.traceback[-1].name == '_run'


def test_a_good_run_prints_its_report(tmp_path, capsys):
    _main(tmp_path)
    assert "{'value': 1}" in capsys.readouterr().out


def _report(results, config):
    return f'{results} in {config.output_dir}'


@dataclasses.dataclass(frozen=True)
class _LazyConfig:
    output_dir: str
    em_test_failure: str = 'none'


def test_run_and_report_may_be_named_by_strings(tmp_path, capsys):
    main = experiment_main.define_main(
        _LazyConfig,
        'tests.program.experiment_main_test:_run',
        'tests.program.experiment_main_test:_report',
        default_output_dir='/nonexistent',
    )
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['binary', f'--output_dir={tmp_path}'])
    main(['binary'])
    assert f"{{'value': 1}} in {tmp_path}" in capsys.readouterr().out


@pytest.mark.parametrize('target', ['tests.program.experiment_main_test', 'module:', ':run', 'a:b.c', 3])
def test_a_malformed_target_is_refused_before_anything_is_imported(target):
    with pytest.raises(ValueError, match="'package.module:attribute'"):
        experiment_main.define_main(_LazyConfig, target, repr, default_output_dir='/nonexistent')


def test_usage_lists_every_flag_of_the_config_with_help_and_default():
    text = ' '.join(_MAIN.usage(doc='Test binary.').split())
    assert text.startswith('Test binary. flags:')
    # --output_dir is shared with any other binary's config defined in this process (then its help and default are
    # the first definition's; tests/program/help_test.py checks each real binary's in a fresh interpreter).
    assert '--output_dir:' in text
    assert "--em_test_failure: _Config.em_test_failure (default: 'none')" in text


@pytest.mark.parametrize(
    'argv,wanted',
    [
        (['binary', '--help'], True),
        (['binary', '--total_rounds=3', '-h'], True),
        (['binary', '--helpshort'], True),
        (['binary', '--helpfull'], False),  # absl's.
        (['binary', '--', '--help'], False),
        (['binary', '--output_dir=x'], False),
    ],
)
def test_wants_help(argv, wanted):
    assert experiment_main.wants_help(argv) is wanted


def test_run_prints_the_help_and_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        experiment_main.run(_MAIN, ['binary', '--help'])
    assert info.value.code == 0
    assert '--em_test_failure' in capsys.readouterr().out


# ------------------------------------------------------------------------------- usage errors, resume, logging
def test_usage_errors_exit_with_status_2(tmp_path):
    with pytest.raises(app.UsageError) as info:
        _main(tmp_path, '--em_test_failure=other')
    assert info.value.exitcode == 2
    with pytest.raises(app.UsageError) as info:
        _MAIN(['binary', 'stray_argument'])
    assert info.value.exitcode == 2


if 'em_test_count' not in flags.FLAGS:  # An integer flag of this test's own (other tests redefine config flags).
    flags.DEFINE_integer('em_test_count', 1, 'A count (experiment_main_test).')


@pytest.mark.parametrize('argv', [['binary', '--em_test_count=many'], ['binary', '--no_such_flag=1']])
def test_bad_or_unknown_flags_exit_with_status_2_naming_the_flag(argv, capsys):
    flags.FLAGS.unparse_flags()
    with pytest.raises(SystemExit) as info:
        experiment_main.parse_flags(argv)
    flags.FLAGS.unparse_flags()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert argv[1].split('=')[0].lstrip('-') in err and 'Traceback' not in err


@dataclasses.dataclass(frozen=True)
class _RunConfig:
    output_dir: str
    em_test_rate: float = 0.5


_RUNS = []


def _record_run(config):
    """A task that checkpoints its first row, as the training loop does."""
    _RUNS.append(config)
    os.makedirs(os.path.join(config.output_dir, 'row', 'checkpoints', 'program_state_1'), exist_ok=True)
    return {'value': config.em_test_rate}


_RESUMABLE = experiment_main.define_main(_RunConfig, _record_run, _report, default_output_dir='/nonexistent')


def _resumable(tmp_path, *argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['binary', f'--output_dir={tmp_path}', *argv])
    try:
        _RESUMABLE(['binary'])
    finally:
        flags.FLAGS.unparse_flags()


def test_a_changed_flag_on_resume_is_a_usage_error_naming_it_and_fresh_start_starts_over(tmp_path, monkeypatch):
    monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '3')
    _RUNS.clear()
    _resumable(tmp_path)
    _resumable(tmp_path)  # The same flags: resumes.
    with pytest.raises(app.UsageError, match=r'--em_test_rate: 0.5 -> 0.25') as info:
        _resumable(tmp_path, '--em_test_rate=0.25')
    assert info.value.exitcode == 2
    assert len(_RUNS) == 2  # Refused before the task ran.
    _resumable(tmp_path, '--em_test_rate=0.25', '--fresh_start')
    assert [c.em_test_rate for c in _RUNS] == [0.5, 0.5, 0.25]
    assert os.listdir(tmp_path / 'previous_runs')
    _resumable(tmp_path, '--em_test_rate=0.25')  # Resumes the new run.
    with pytest.raises(app.UsageError, match=r'--em_test_rate: 0.25 -> 0.5'):
        _resumable(tmp_path)


def test_tensorflow_logs_are_off_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL', raising=False)
    monkeypatch.delenv('FEDPERSONAL_VERBOSE_TF', raising=False)
    _resumable(tmp_path / 'a')
    assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '3' and 'FEDPERSONAL_VERBOSE_TF' not in os.environ
    monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL')
    _resumable(tmp_path / 'b', '--verbosity=1')
    assert 'TF_CPP_MIN_LOG_LEVEL' not in os.environ
    assert os.environ.pop('FEDPERSONAL_VERBOSE_TF') == '1'  # Nothing filtered either (fedpersonal.quiet).
    monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '1')
    _resumable(tmp_path / 'c')
    assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '1'  # The user's setting stays.


def test_quiet_tensorflow():
    environ = {}
    assert experiment_main.quiet_tensorflow(0, environ) and environ == {'TF_CPP_MIN_LOG_LEVEL': '3'}
    assert not experiment_main.quiet_tensorflow(0, environ)  # Already set.
    environ = {}
    assert not experiment_main.quiet_tensorflow(1, environ) and environ == {'FEDPERSONAL_VERBOSE_TF': '1'}
    environ = {'FEDPERSONAL_VERBOSE_TF': '0'}
    assert not experiment_main.quiet_tensorflow(1, environ) and environ == {'FEDPERSONAL_VERBOSE_TF': '0'}
