"""The binaries' shared main: user input errors become one-line usage errors, bugs keep their traceback."""

import dataclasses

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
