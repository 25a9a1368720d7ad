"""Tests of `fedpersonal.program.task_runner`: the arguments taken from config parts, the store and the registries."""

import dataclasses

import numpy as np
import pytest

from fedpersonal import client_state
from fedpersonal import errors
from fedpersonal import program
from fedpersonal.program import config_parts
from fedpersonal.program import task_runner


@dataclasses.dataclass(frozen=True, kw_only=True)
class _CrossDevice(config_parts.CrossDeviceRunConfig):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class _EveryClient(config_parts.RoundsConfig, config_parts.EvaluationConfig):
    pass


def test_cross_device_config_gives_sampling_and_evaluation_arguments():
    config = _CrossDevice(
        total_rounds=7,
        seed=3,
        rounds_per_checkpoint=2,
        non_finite_clients='zero',
        clients_per_round=4,
        client_dropout_rate=0.25,
        overselection=1.5,
        rounds_per_eval=5,
    )
    assert task_runner.process_arguments(config) == {
        'total_rounds': 7,
        'rounds_per_checkpoint': 2,
        'non_finite_clients': 'zero',
        'clients_per_round': 4,
        'dropout_rate': 0.25,
        'overselection': 1.5,
        'seed': 3,
        'rounds_per_evaluation': 5,
    }
    assert task_runner.process_arguments(config, total_rounds=11)['total_rounds'] == 11


def test_every_client_config_gives_no_sampling_argument_nor_seed():
    arguments = task_runner.process_arguments(_EveryClient(total_rounds=2, seed=9))
    assert set(arguments) == {'total_rounds', 'rounds_per_checkpoint', 'non_finite_clients', 'rounds_per_evaluation'}


def test_run_process_refuses_an_argument_the_config_gives():
    with pytest.raises(TypeError, match='from the config'):
        task_runner.run_process(None, _CrossDevice(), outputs=None, client_data=None, name='x', seed=1)


def test_open_store_kinds(tmp_path):
    outputs = program.ExperimentOutputs(str(tmp_path), 'row')
    spec = [((2,), np.float32)]
    default = lambda cid: [np.zeros(2, np.float32)]
    assert isinstance(task_runner.open_store('memory', outputs, spec, default), client_state.InMemoryClientStateStore)
    with task_runner.open_store('sqlite', outputs, spec, default, filename='s.sqlite') as store:
        assert isinstance(store, client_state.SqliteClientStateStore)
    assert (tmp_path / 'row' / 's.sqlite').exists()
    with pytest.raises(errors.ConfigError, match="state_store must be one of .* got 'disk'"):
        task_runner.open_store('disk', outputs, spec, default)


def test_runner_for_names_the_registered_names():
    with pytest.raises(errors.ConfigError, match=r"unknown method 'x'; one of \['a', 'b'\]"):
        task_runner.runner_for({'b': 1, 'a': 2}, 'x', 'method')


def test_every_task_registers_exactly_the_names_its_config_allows():
    from fedpersonal.tasks import feddva
    from fedpersonal.tasks import feddva_config
    from fedpersonal.tasks import furl_personalization
    from fedpersonal.tasks import furl_personalization_config
    from fedpersonal.tasks import hpfl_centralized
    from fedpersonal.tasks import hpfl_user_modeling_config
    from fedpersonal.tasks import movielens_mf
    from fedpersonal.tasks import movielens_mf_config
    from fedpersonal.tasks import next_word_prediction
    from fedpersonal.tasks import next_word_prediction_config

    assert set(feddva.RUNNERS) == set(feddva_config.METHODS)
    assert set(furl_personalization.RUNNERS) == set(furl_personalization_config.CONFIGURATIONS)
    assert set(hpfl_centralized.MODELS) == set(hpfl_user_modeling_config.CENTRALIZED)
    assert set(movielens_mf.RUNNERS) == set(movielens_mf_config.CONFIGURATIONS)
    assert set(next_word_prediction._Runner.RUNNERS) == set(next_word_prediction_config.CONFIGURATIONS)
