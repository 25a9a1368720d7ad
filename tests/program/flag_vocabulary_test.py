"""One flag vocabulary across the binaries; renamed flags and values kept as deprecated aliases for one release."""

import dataclasses
import logging
import pathlib

import pytest
from absl import flags

from fedpersonal import errors
from fedpersonal.program import config_flags
from fedpersonal.program import config_parts
from fedpersonal.tasks import feddva_config
from fedpersonal.tasks import furl_personalization_config
from fedpersonal.tasks import hpfl_user_modeling_config
from fedpersonal.tasks import movielens_mf_config
from fedpersonal.tasks import next_word_prediction_config
from fedpersonal.tasks import pfl_benchmark_config

Feddva = feddva_config.FeddvaConfig
Furl = furl_personalization_config.FurlConfig
Hpfl = hpfl_user_modeling_config.HpflConfig
MovieLens = movielens_mf_config.MovieLensMFConfig
Nwp = next_word_prediction_config.NextWordPredictionConfig
Pfl = pfl_benchmark_config.PflBenchmarkConfig
CONFIGS = (Feddva, Furl, Hpfl, MovieLens, Nwp, Pfl)


def _config(config_cls, argv):
    """`config_cls` from `argv`, with its flags defined in fresh flag values (as one binary does)."""
    fv = flags.FlagValues()
    config_flags.define_flags(config_cls, flag_values=fv)
    fv(['binary', *argv])
    return config_flags.config_from_flags(config_cls, flag_values=fv)


@pytest.fixture(autouse=True)
def _absl_warnings_reach_caplog(caplog):
    caplog.set_level(logging.WARNING, logger='absl')


@pytest.mark.parametrize('config_cls', CONFIGS, ids=lambda c: c.__name__)
def test_shared_names_mean_the_same_in_every_binary(config_cls):
    names = {f.name for f in dataclasses.fields(config_cls)}
    assert {'dataset', 'data_dir', 'total_rounds', 'configurations', 'output_dir'} <= names
    assert ('clients_per_round' in names) == (config_cls not in (Hpfl, Pfl))  # Every client every round.
    for name in ('total_rounds', 'clients_per_round', 'output_dir'):  # HPFL's data_dir help lists its files.
        if name in names:
            assert config_parts.help_text(config_cls, name) == config_parts.help_text(
                config_parts.CrossDeviceRunConfig, name
            ), name
    deprecated = {'methods', 'generated_train', 'generated_test', 'val_fraction', 'max_examples_per_user'}
    assert not names & (deprecated | {'max_elements_per_client'})  # Only as deprecated aliases.


# (config, its argv under the deprecated names, the same under the new names, the new flags the warnings name)
RENAMED = [
    (Hpfl, ['--methods=gum,hpfl'], ['--configurations=gum,hpfl'], ['--configurations']),
    (Hpfl, ['--rounds=5'], ['--total_rounds=5'], ['--total_rounds']),
    (
        Hpfl,
        ['--dataset=assist', '--data_dir=/data/a0910'],
        ['--dataset=assistments', '--data_dir=/data/a0910'],
        ['--dataset=assistments'],
    ),
    (Feddva, ['--methods=ditto,fedavg'], ['--configurations=ditto,fedavg'], ['--configurations']),
    (
        Feddva,
        ['--generated_train=50', '--generated_test=20'],
        ['--synthetic_train=50', '--synthetic_test=20'],
        ['--synthetic_train', '--synthetic_test'],
    ),
    (Feddva, ['--dataset=generated', '--z_dim=3'], ['--dataset=synthetic', '--z_dim=3'], ['--dataset=synthetic']),
    (
        MovieLens,
        ['--max_examples_per_user=none', '--val_fraction=0.2'],
        ['--max_examples_per_client=none', '--validation_fraction=0.2'],
        ['--max_examples_per_client', '--validation_fraction'],
    ),
    (Nwp, ['--max_elements_per_client=16'], ['--max_examples_per_client=16'], ['--max_examples_per_client']),
]


@pytest.mark.parametrize('config_cls,old,new,named', RENAMED, ids=lambda v: getattr(v, '__name__', None))
def test_old_and_new_names_give_the_same_config_and_the_old_one_warns_once(config_cls, old, new, named, caplog):
    assert _config(config_cls, new) != config_cls()  # The test changes something.
    assert not caplog.records
    assert _config(config_cls, old) == _config(config_cls, new)
    deprecated = [r.getMessage() for r in caplog.records]
    assert len(deprecated) == len(named), deprecated  # One warning per deprecated name or value.
    for message, new_name in zip(sorted(deprecated), sorted(named)):
        assert 'deprecated' in message and f'use {new_name}' in message


def test_an_old_name_in_a_flagfile_works(tmp_path):
    flagfile = tmp_path / 'old.flags'
    flagfile.write_text('# written before the rename\n--methods=fedavg,hpfl\n--dataset=assist\n--data_dir=/data\n')
    config = _config(Hpfl, [f'--flagfile={flagfile}'])
    assert (config.configurations, config.dataset) == (('fedavg', 'hpfl'), 'assistments')


def test_old_and_new_name_together_is_an_error_naming_both():
    with pytest.raises(flags.IllegalFlagValueError, match='--configurations and --methods') as info:
        _config(Hpfl, ['--methods=gum', '--configurations=hpfl'])
    assert isinstance(info.value, flags.Error)


@pytest.mark.parametrize(
    'config_cls,argv,field',
    [
        (Hpfl, ['--dataset=assistment', '--data_dir=/d'], 'dataset'),
        (Hpfl, ['--methods=hpfl,bogus'], 'configurations'),
        (Feddva, ['--dataset=generated_digits'], 'dataset'),
        (Feddva, ['--methods=bogus'], 'configurations'),
    ],
)
def test_unknown_values_are_still_errors(config_cls, argv, field):
    with pytest.raises(errors.ConfigError, match=f'{field} must be'):
        _config(config_cls, argv)


def test_deprecated_values_are_mapped_in_python_too(caplog):
    assert Hpfl(dataset='assist', data_dir='/d').dataset == 'assistments'
    assert any('--dataset=assistments' in r.getMessage() for r in caplog.records)


def test_the_short_help_lists_new_names_only():
    fv = flags.FlagValues()
    config_flags.define_flags(Hpfl, flag_values=fv)
    text = fv.module_help(config_flags.help_module(Hpfl))
    assert '--configurations' in text and '--methods' not in text
    assert 'Deprecated name of --configurations' in fv['methods'].help


def test_records_under_old_names_compare_under_new_ones():
    record = {'methods': ['gum'], 'dataset': 'assist', 'hidden_dim': 4}
    assert config_parts.canonical_record(Hpfl, record) == {
        'configurations': ['gum'],
        'dataset': 'assistments',
        'hidden_dim': 4,
    }


_REPO = pathlib.Path(__file__).resolve().parents[2]
_FLAGFILE_CONFIGS = {
    'feddva': Feddva,
    'furl': Furl,
    'hpfl': Hpfl,
    'movielens': MovieLens,
    'nwp': Nwp,
    'pfllib': Pfl,
    'pfl': Pfl,
}


@pytest.mark.parametrize('flagfile', sorted(p.name for p in (_REPO / 'configs').glob('*.flags')))
def test_every_flagfile_builds_its_config_with_the_current_names_only(flagfile, caplog, monkeypatch):
    monkeypatch.chdir(_REPO)  # A flagfile may include another by its path from the repository root.
    config_cls = _FLAGFILE_CONFIGS[flagfile.split('_')[0]]
    text = (_REPO / 'configs' / flagfile).read_text()
    argv = [f'--flagfile={_REPO / "configs" / flagfile}']
    if '--dataset=synthetic' not in text and '--dataset=' in text:
        argv.append('--data_dir=/data')  # Real data: the flagfile asks for --data_dir.
    config = _config(config_cls, argv)
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # No deprecated name or value.
    assert config.dataset.startswith('synthetic') == ('--data_dir=/data' not in argv)
