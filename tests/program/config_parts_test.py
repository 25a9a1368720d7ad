"""Shared config parts: one definition per option, the same meaning and help in every task config."""

import dataclasses

import pytest

from fedpersonal import errors
from fedpersonal.program import config_parts
from fedpersonal.program import optimizers
from fedpersonal.tasks import feddva
from fedpersonal.tasks import furl_personalization
from fedpersonal.tasks import movielens_mf
from fedpersonal.tasks import next_word_prediction

CONFIGS = (
    movielens_mf.MovieLensMFConfig,
    furl_personalization.FurlConfig,
    next_word_prediction.NextWordPredictionConfig,
    feddva.FeddvaConfig,
)


def test_optimizer_names_agree_with_the_builder():
    assert config_parts.OPTIMIZERS == optimizers.OPTIMIZERS


@pytest.mark.parametrize(
    'name',
    [
        'output_dir',
        'data_dir',
        'total_rounds',
        'clients_per_round',
        'seed',
        'rounds_per_checkpoint',
        'rounds_per_eval',
        'batch_size',
    ],
)
def test_a_shared_option_has_one_help_text_in_every_config(name):
    helps = {config_parts.help_text(config, name) for config in CONFIGS}
    assert len(helps) == 1 and None not in helps, helps


def test_every_field_is_documented():
    for config in CONFIGS:
        undocumented = [f.name for f in dataclasses.fields(config) if not config_parts.help_text(config, f.name)]
        assert not undocumented, (config.__name__, undocumented)


@pytest.mark.parametrize(
    'field, value',
    [
        ('clients_per_round', 0),
        ('rounds_per_checkpoint', 0),
        ('rounds_per_eval', 0),
        ('batch_size', 0),
        ('client_learning_rate', -1.0),
        ('server_optimizer', 'adamw'),
        ('total_rounds', 0),
    ],
)
def test_parts_validate_in_every_config_that_has_them(tmp_path, field, value):
    for config in CONFIGS:
        if field in {f.name for f in dataclasses.fields(config)}:
            with pytest.raises(errors.ConfigError, match=field.split('_optimizer')[0]):
                config(output_dir=str(tmp_path), **{field: value})


def test_a_task_default_overrides_the_part_default_only():
    assert movielens_mf.MovieLensMFConfig(output_dir='x').clients_per_round == 100
    assert next_word_prediction.NextWordPredictionConfig(output_dir='x').server_optimizer == 'yogi'
    assert config_parts.SamplingConfig().clients_per_round == 10
