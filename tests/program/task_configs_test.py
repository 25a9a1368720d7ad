"""The TensorFlow-free config modules of the tasks agree with the TensorFlow modules they stand in for."""

import dataclasses

import pytest

from fedpersonal import errors
from fedpersonal import program
from fedpersonal.algorithms import hpfl
from fedpersonal.models import feddva_models
from fedpersonal.models import gum
from fedpersonal.tasks import feddva
from fedpersonal.tasks import feddva_analysis
from fedpersonal.tasks import feddva_config
from fedpersonal.tasks import furl_personalization
from fedpersonal.tasks import furl_personalization_config
from fedpersonal.tasks import hpfl_user_modeling
from fedpersonal.tasks import hpfl_user_modeling_config
from fedpersonal.tasks import movielens_mf
from fedpersonal.tasks import movielens_mf_config
from fedpersonal.tasks import next_word_prediction
from fedpersonal.tasks import next_word_prediction_config

# (task module, its config module, the names the task module re-exports)
REEXPORTS = [
    (feddva, feddva_config, ('FeddvaConfig', 'DATASETS', 'SETTINGS', 'METHODS', 'ARCHITECTURE_NAMES')),
    (feddva_analysis, feddva_config, ('SETTINGS', 'METHODS')),
    (furl_personalization, furl_personalization_config, ('FurlConfig', 'DATASETS', 'CONFIGURATIONS')),
    (
        hpfl_user_modeling,
        hpfl_user_modeling_config,
        ('HpflConfig', 'DATASETS', 'CENTRALIZED', 'HPFL_METHODS', 'METHODS', 'NDCG_GAINS'),
    ),
    (movielens_mf, movielens_mf_config, ('MovieLensMFConfig', 'DATASETS', 'CONFIGURATIONS')),
    (next_word_prediction, next_word_prediction_config, ('NextWordPredictionConfig', 'DATASETS', 'CONFIGURATIONS')),
]


@pytest.mark.parametrize('task,config_module,names', REEXPORTS, ids=lambda v: getattr(v, '__name__', ''))
def test_task_modules_reexport_their_config(task, config_module, names):
    for name in names:
        assert getattr(task, name) is getattr(config_module, name), name


def test_hpfl_names_agree_with_the_algorithms_and_the_model():
    c = hpfl_user_modeling_config
    assert c.BASELINES == hpfl.BASELINES
    assert c.HPFL_METHODS == hpfl.HPFL_VARIANTS
    assert c.ROW_UPDATES == hpfl.ROW_UPDATES
    assert c.CENTER_WEIGHTINGS == hpfl.CENTER_WEIGHTINGS
    assert c.TASKS == gum.TASKS


def test_feddva_architectures_and_decoder_sources_agree_with_the_model():
    assert tuple(feddva_config.architectures()) == feddva_config.ARCHITECTURE_NAMES
    assert feddva_config.architectures() == feddva.ARCHITECTURES
    assert feddva.ARCHITECTURES['paper'] == feddva_models.PAPER
    for source in feddva_config.DECODER_C_SOURCES:
        feddva_models.LossWeights(decoder_c_source=source)  # Accepted by the model too.
    with pytest.raises(errors.ConfigError, match="decoder_c_source must be 'prior' or 'posterior'"):
        feddva_models.LossWeights(decoder_c_source='both')
    config = feddva_config.FeddvaConfig(architecture='paper', z_dim=3)
    arch = config.dva_architecture((28, 28, 1), 10)
    assert arch == dataclasses.replace(
        feddva_models.PAPER, image_shape=(28, 28, 1), z_dim=3, c_dim=8, head_hidden=0, num_classes=10
    )


def test_reconstruction_split_properties_import_the_algorithms_on_use():
    split = movielens_mf_config.MovieLensMFConfig(split_strategy='order').split
    assert (split.strategy, split.recon_steps_max) == ('order', 50)
    assert next_word_prediction_config.NextWordPredictionConfig().split.support_fraction == 0.5


def test_lazy_program_package_exports_every_name():
    for name in program.__all__:
        assert getattr(program, name) is not None, name
    assert program.outputs.ExperimentOutputs is program.ExperimentOutputs
    assert 'config_flags' in dir(program)
    with pytest.raises(AttributeError, match='no_such_name'):
        program.no_such_name  # noqa: B018
