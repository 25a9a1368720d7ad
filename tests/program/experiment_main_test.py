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
