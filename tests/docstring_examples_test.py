"""The examples in the public API's docstrings run (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

from fedpersonal import algorithms

MODULES = (
    'fedpersonal',
    'fedpersonal.baselines.centralized',
    'fedpersonal.algorithms.fed_recon',
    'fedpersonal.algorithms.fed_avg',
    'fedpersonal.algorithms.furl',
    'fedpersonal.algorithms.ditto',
    'fedpersonal.algorithms.fedprox',
    'fedpersonal.algorithms.fedala',
    'fedpersonal.algorithms.fedrod',
    'fedpersonal.backends',
    'fedpersonal.core.client_plan',
    'fedpersonal.core.eval_plan',
    'fedpersonal.core.input_checks',
    'fedpersonal.core.non_finite',
    'fedpersonal.core.step_kinds',
    'fedpersonal.models.image_classifiers',
    'fedpersonal.models.keras_factory',
    'fedpersonal.algorithms.feddva',
    'fedpersonal.algorithms.hpfl.process',
    'fedpersonal.algorithms.hpfl.baselines',
    'fedpersonal.data.npz_images',
    'fedpersonal.data.assistments',
    'fedpersonal.data.client_data',
    'fedpersonal.data.partition',
    'fedpersonal.data.pfllib',
    'fedpersonal.simulation.functional',
    'fedpersonal.program',
    'fedpersonal.program.experiment_main',
    'fedpersonal.program.dataset_inference',
    'fedpersonal.program.non_finite',
    'fedpersonal.program.participation',
    'fedpersonal.program.task_runner',
    'fedpersonal.progress',
    'fedpersonal.quiet',
    'fedpersonal.runtime.balance',
    'fedpersonal.runtime.engine_workers',
    'fedpersonal.privacy.accounting',
    'fedpersonal.privacy.dp',
    'fedpersonal.tasks.feddva_config',
    'fedpersonal.tasks.furl_personalization_config',
    'fedpersonal.tasks.hpfl_user_modeling_config',
    'fedpersonal.tasks.movielens_mf_config',
    'fedpersonal.tasks.next_word_prediction_config',
    'fedpersonal.wording',
)


def _algorithm_modules_with_examples() -> list[str]:
    """Every algorithm module whose docstrings have an example (a new algorithm's are run with no edit here)."""
    names = []
    for info in pkgutil.walk_packages(algorithms.__path__, 'fedpersonal.algorithms.'):
        module = importlib.import_module(info.name)
        if any(t.examples for t in doctest.DocTestFinder(exclude_empty=True).find(module)):
            names.append(info.name)
    return names


@pytest.mark.parametrize('name', sorted(set(MODULES) | set(_algorithm_modules_with_examples())))
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    examples = sum(len(t.examples) for t in finder.find(module))
    assert examples, f'{name} has no docstring example'
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f'{result.failed} of {result.attempted} docstring examples of {name} failed'
