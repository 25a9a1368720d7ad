"""The builders' defaults are the personalization benchmark's (issue 64: a user of the Python API and of the
binary get the same method by default): each default hyperparameter of `build_ditto`, `build_apfl` and
`build_pfedme` equals the benchmark config's, optimizers included (SGD of the config's learning rate)."""

import inspect

import numpy as np
import tensorflow as tf

from fedpersonal.algorithms import apfl
from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import pfedme
from fedpersonal.tasks import pfl_benchmark_config

CONFIG = pfl_benchmark_config.PflBenchmarkConfig(dataset='synthetic')


def _defaults(builder):
    return {k: p.default for k, p in inspect.signature(builder).parameters.items() if p.default is not p.empty}


def _step(optimizer, gradient=2.0):
    """The change one step of `optimizer` makes to a weight of 0 with this `gradient` (fresh state)."""
    spec = tf.TensorSpec([], tf.float32)
    _, weights = optimizer.next(optimizer.initialize(spec), tf.constant(0.0), tf.constant(gradient))
    return float(weights)


def test_ditto_defaults_are_the_benchmarks():
    d = _defaults(ditto.build_ditto)
    assert d['lam'] == CONFIG.ditto_lambda
    assert d['client_epochs'] == CONFIG.client_epochs and d['personal_epochs'] == CONFIG.personal_epochs
    # Plain SGD of the benchmark's rate: -lr * g, in float32: lr rounded to float32 and one product rounded, each
    # within 2^-24 relative, so within 2^-23 of the float64 value.
    for name in ('client_optimizer', 'personal_optimizer'):
        np.testing.assert_allclose(_step(d[name]), -2.0 * CONFIG.client_learning_rate, rtol=2.0**-23, atol=0)
    np.testing.assert_allclose(_step(d['server_optimizer'], 1.0), -1.0)  # The plain average.


def test_apfl_defaults_are_the_benchmarks():
    d = _defaults(apfl.build_apfl)
    assert d['initial_alpha'] == CONFIG.apfl_alpha
    assert d['client_epochs'] == CONFIG.client_epochs


def test_pfedme_defaults_are_the_benchmarks():
    d = _defaults(pfedme.build_pfedme)
    assert d['lam'] == CONFIG.pfedme_lambda and d['inner_steps'] == CONFIG.pfedme_k
    assert d['personal_learning_rate'] == CONFIG.pfedme_personal_learning_rate
    assert d['learning_rate'] == CONFIG.client_learning_rate and d['client_epochs'] == CONFIG.client_epochs
    assert d['mu'] == pfedme.PFLLIB_WEIGHT_DECAY == 0.001  # PFLlib's pFedMeOptimizer; the benchmark row's too.
