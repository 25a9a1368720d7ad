"""One chooser: `fedpersonal.backends.use` decides the backend of every training builder and every evaluation builder
(issue 64, part 2). Each builder is called with no backend keyword inside ``backends.use(...)``; the process it
returns names its backend (`PersonalizedProcess.simulation`), an evaluation is the engine's `GroupEvaluation` or a
per-client `tff.Computation`. Only processes are built: no round runs."""

import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import evaluation
from fedpersonal import models
from fedpersonal.simulation import evaluation as engine_evaluation
from tests.algorithms import apfl_test
from tests.algorithms import fedbn_fedbabu_test
from tests.algorithms import feddva_test
from tests.algorithms import fedper_fedrep_test
from tests.algorithms import fedprox_lg_fedavg_test
from tests.algorithms import fedrod_test
from tests.algorithms import furl_test
from tests.algorithms import hpfl_baselines_test

SGD = tff.learning.optimizers.build_sgdm(0.1)
SPEC = apfl_test.SPEC


def _loss():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _global_model_fn():
    """A classifier whose variables are all global (FedAvg's)."""
    keras_model = apfl_test.model_fn()
    return models.from_keras_model(keras_model, input_spec=SPEC, global_variables=keras_model.variables)


HPFL_SMALL = dict(max_clients=4, max_local_clusters=4, max_global_clusters=4, kmeans_iterations=3)
PARTIAL = fedper_fedrep_test.model_fn  # Body global, head local.
KERAS = apfl_test.model_fn

# Every training builder of `fedpersonal.algorithms`, with no backend keyword.
BUILDERS = {
    'apfl': lambda: algorithms.build_apfl(
        KERAS, element_spec=SPEC, client_optimizer=SGD, personal_optimizer=SGD, server_optimizer=SGD
    ),
    'ditto': lambda: algorithms.build_ditto(KERAS, element_spec=SPEC),
    'fed_avg': lambda: algorithms.build_fed_avg(_global_model_fn, loss_fn=_loss),
    'fed_recon': lambda: algorithms.build_fed_recon(PARTIAL, loss_fn=_loss),
    'fedala': lambda: algorithms.build_fedala(KERAS, element_spec=SPEC, client_optimizer=SGD, server_optimizer=SGD),
    'fedbabu': lambda: algorithms.build_fedbabu(
        fedbn_fedbabu_test.body_head_model_fn, loss_fn=_loss, client_optimizer=SGD, server_optimizer=SGD
    ),
    'fedbn': lambda: algorithms.build_fedbn(
        fedbn_fedbabu_test.fedbn_model_fn, loss_fn=_loss, client_optimizer=SGD, server_optimizer=SGD
    ),
    'feddva': lambda: algorithms.build_feddva(
        lambda: feddva_test.fm.DualVae(feddva_test.TINY), element_spec=feddva_test.dataset(0).element_spec
    ),
    'fedper': lambda: algorithms.build_fedper(PARTIAL, loss_fn=_loss, client_optimizer=SGD, server_optimizer=SGD),
    'fedprox': lambda: algorithms.build_fedprox(KERAS, element_spec=SPEC, mu=0.1, client_optimizer=SGD),
    'fedrep': lambda: algorithms.build_fedrep(
        PARTIAL, loss_fn=_loss, head_optimizer=SGD, body_optimizer=SGD, server_optimizer=SGD
    ),
    'fedrod': lambda: algorithms.build_fedrod(
        fedrod_test.model_fn, element_spec=fedrod_test.SPEC, client_optimizer=SGD, server_optimizer=SGD
    ),
    'furl': lambda: algorithms.build_furl(furl_test.furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError),
    'hpfl': lambda: algorithms.build_hpfl(hpfl_baselines_test.CONFIG, **HPFL_SMALL),
    'hpfl_baseline': lambda: algorithms.build_hpfl_baseline('fedavg', hpfl_baselines_test.CONFIG),
    'lg_fedavg': lambda: algorithms.build_lg_fedavg(
        fedprox_lg_fedavg_test.lg_model_fn,
        loss_fn=fedprox_lg_fedavg_test.loss_fn,
        client_optimizer=SGD,
        server_optimizer=SGD,
    ),
    'per_fedavg': lambda: algorithms.build_per_fedavg(
        PARTIAL, loss_fn=_loss, batch_size=10, inner_learning_rate=0.1, outer_optimizer=SGD, server_optimizer=SGD
    ),
    'pfedme': lambda: algorithms.build_pfedme(KERAS, element_spec=SPEC, server_optimizer=SGD),
}


# Every federated evaluation builder of `fedpersonal.evaluation`, with no backend keyword.
EVALUATIONS = {
    'recon_eval': lambda: evaluation.build_recon_eval(PARTIAL, loss_fn=_loss),
    'standard_eval': lambda: evaluation.build_standard_eval(_global_model_fn, loss_fn=_loss),
    'private_state_eval': lambda: evaluation.build_private_state_eval(PARTIAL, loss_fn=_loss),
}


def test_every_builder_is_listed():
    """A new builder in `fedpersonal.algorithms` must join `BUILDERS` (the chooser is checked for each)."""
    exported = {name.removeprefix('build_') for name in algorithms.__all__ if name.startswith('build_')}
    assert exported - {'dataset_split_fn'} == set(BUILDERS)


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_every_builder_honours_the_per_client_context(name):
    with backends.use('per_client'):
        process = BUILDERS[name]()
    assert process.simulation == 'per_client'


@pytest.mark.parametrize('name', ['ditto', 'fed_avg', 'fed_recon', 'feddva', 'furl', 'hpfl'])
def test_a_former_simulation_keyword_builder_follows_the_engine_context_too(name):
    """The builders that had a ``simulation='engine'`` default: on the engine context they build on the engine, so
    the per-client result above is the context's doing, not a fixed default."""
    with backends.use('engine'):
        process = BUILDERS[name]()
    assert process.simulation == 'engine'


def test_an_explicit_simulation_keyword_overrides_the_context():
    with backends.use('per_client'):
        process = algorithms.build_ditto(KERAS, element_spec=SPEC, simulation='engine')
    assert process.simulation == 'engine'


@pytest.mark.parametrize('name', sorted(EVALUATIONS))
def test_every_evaluation_honours_the_context(name):
    with backends.use('per_client'):
        per_client = EVALUATIONS[name]()
    with backends.use('engine'):
        engine = EVALUATIONS[name]()
    assert isinstance(per_client, tff.Computation)
    assert isinstance(engine, engine_evaluation.GroupEvaluation)
