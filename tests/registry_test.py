"""The registry: algorithm modules declare their benchmark options and rows; the benchmark's flags, validation and
rows come from them, read without importing TensorFlow."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from absl import flags

from fedpersonal import errors
from fedpersonal import registry
from fedpersonal.program import config_flags
from fedpersonal.tasks import pfl_benchmark_config

# A new algorithm as a user would add it: one module, nothing else edited (its options and one row).
NEW_MODULE = '''
"""A new algorithm: FedProx's plan under another name, with options of its own."""

from __future__ import annotations

import dataclasses

from fedpersonal import errors
from fedpersonal import registry
from fedpersonal.algorithms import fedprox


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """The new algorithm's options."""

    mu: float = registry.option(0.25, 'Its proximal weight.', minimum=0.0)
    kind: str = registry.option('a', 'Its kind.', choices=('a', 'b'))
    steps: int = registry.option(3, 'Its steps.', above=0)

    def __post_init__(self):
        if self.kind == 'b' and self.mu == 0:
            raise errors.ConfigError('kind b needs mu > 0.')


def _plan(settings, options):
    return fedprox.fedprox_plan(mu=options.mu, client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (registry.Row('newalg', 'NewAlg', _plan, local_layers=registry.HEAD),)
'''


def _write(tmp_path: pathlib.Path, name: str, source: str) -> pathlib.Path:
    path = tmp_path / f'{name}.py'
    path.write_text(textwrap.dedent(source))
    return path


def test_the_benchmark_rows_are_the_modules_declarations_in_the_leaderboards_order():
    # PFLlib's leaderboard order of the 16 default rows, as the benchmark's tables print them.
    assert pfl_benchmark_config.METHODS == (
        'fedavg',
        'fedprox',
        'ditto',
        'apfl',
        'fedper',
        'fedrep',
        'lg_fedavg',
        'fedavg_ft',
        'fedbabu',
        'fed_recon',
        'furl_head',
        'per_fedavg',
        'per_fedavg_hf',
        'pfedme',
        'fedala',
        'fedrod',
    )
    # Rows run when named: every module's that declares no leaderboard position, by name (a new one adds to them).
    extras = pfl_benchmark_config.EXTRA_METHODS
    assert {'fedamp', 'feddbe', 'moon', 'scaffold'} <= set(extras) and list(extras) == sorted(extras)
    assert pfl_benchmark_config.METHOD_NAMES['per_fedavg_hf'] == 'Per-FedAvg (HF)'
    modules = {d.module for d in pfl_benchmark_config.DECLARATIONS}
    assert {'fedprox', 'per_fedavg', 'moon', 'feddbe'} <= modules and 'fedbn' not in modules


def test_the_flags_keep_their_names_and_defaults():
    config = pfl_benchmark_config.PflBenchmarkConfig(dataset='synthetic')
    expected = {
        'fedprox_mu': 0.01,
        'ditto_lambda': 0.1,
        'apfl_alpha': 0.5,
        'apfl_variant': 'pfllib',
        'fedrep_head_epochs': 1,
        'per_fedavg_trains_per_round': 2,
        'furl_private_norm': 1e-3,
        'pfedme_lambda': 1.0,
        'pfedme_k': 5,
        'pfedme_personal_learning_rate': 0.01,
        'moon_mu': 1.0,
        'moon_tau': 0.5,
        'fedala_eta': 1.0,
        'fedala_rand_percent': 80,
        'fedala_layer_idx': 2,
        'fedala_threshold': 0.1,
        'fedala_num_pre_loss': 10,
        'fedala_max_epochs': 100,
    }
    assert {name: getattr(config, name) for name in expected} == expected
    flag_values = flags.FlagValues()
    config_flags.define_flags(pfl_benchmark_config.PflBenchmarkConfig, flag_values=flag_values)
    assert "MOON's temperature" in flag_values['moon_tau'].help
    flag_values(['binary', '--moon_tau=0.25', '--ditto_lambda=0.5', '--dataset=synthetic'])
    config = config_flags.config_from_flags(pfl_benchmark_config.PflBenchmarkConfig, flag_values=flag_values)
    assert (config.moon_tau, config.ditto_lambda) == (0.25, 0.5)


@pytest.mark.parametrize(
    'values, message',
    [
        ({'moon_tau': 0.0}, '--moon_tau must be > 0.0, got 0.0.'),
        ({'fedprox_mu': -1.0}, '--fedprox_mu must be >= 0'),
        ({'apfl_alpha': 1.5}, '--apfl_alpha must be <= 1.0'),
        ({'apfl_variant': 'other'}, "--apfl_variant must be one of ('pfllib', 'paper'), got 'other'"),
        ({'pfedme_k': 0}, '--pfedme_k must be >= 1'),
        ({'fedala_rand_percent': 0}, '--fedala_rand_percent must be > 0'),
        ({'fedala_max_epochs': 10}, 'fedala options (--fedala_*): max_epochs (10) must be > num_pre_loss'),
    ],
)
def test_each_algorithm_checks_its_own_options_naming_the_flag(values, message):
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        pfl_benchmark_config.PflBenchmarkConfig(dataset='synthetic', **values)


def test_the_runtime_options_class_is_the_one_read_from_source():
    # The class compiled alone from the source and the module's own: the same fields, defaults and bounds.
    for name, (row, declaration, options_class) in registry.load_rows(pfl_benchmark_config.DECLARATIONS).items():
        assert name in pfl_benchmark_config.METHOD_NAMES and row.display_name == pfl_benchmark_config.METHOD_NAMES[name]
        read = [(f.name, f.default, dict(f.metadata)) for f in declaration.fields()]
        own = (
            [(f.name, f.default, dict(f.metadata)) for f in dataclasses.fields(options_class)] if options_class else []
        )
        assert read == own, name


def test_a_new_module_brings_its_rows_options_flags_and_checks(tmp_path):
    _write(tmp_path, 'newalg', NEW_MODULE)
    _write(tmp_path, 'not_an_algorithm', 'VALUE = 1\n')
    (declaration,) = registry.declarations(tmp_path)
    assert (declaration.module, declaration.rows) == ('newalg', (('newalg', 'NewAlg', None),))
    assert registry.row_names((declaration,)) == ((), ('newalg',), {'newalg': 'NewAlg'})

    @dataclasses.dataclass(frozen=True, kw_only=True)
    @registry.add_option_fields((declaration,))
    class Config:
        other: int = 1

    config = Config(newalg_mu=0.5)
    assert (config.newalg_mu, config.newalg_kind, config.newalg_steps) == (0.5, 'a', 3)
    assert registry.options_from(declaration, config).mu == 0.5
    for values, message in (
        ({'newalg_steps': 0}, '--newalg_steps must be > 0, got 0'),
        ({'newalg_kind': 'c'}, "--newalg_kind must be one of \\('a', 'b'\\)"),
        ({'newalg_kind': 'b', 'newalg_mu': 0.0}, r'newalg options \(--newalg_\*\): kind b needs mu > 0'),
    ):
        with pytest.raises(errors.ConfigError, match=message):
            registry.options_from(declaration, Config(**values))

    # At run time the module is imported and its row builds a plan from the benchmark's settings.
    (row, _, options_class) = registry.load_rows((declaration,))['newalg']
    settings = registry.Settings(
        client_epochs=2, client_learning_rate=0.1, batch_size=5, seed=0, personal_epochs=1, num_clients=4
    )
    plan = row.plan(settings, registry.options_from(declaration, config, options_class))
    assert plan.phases[0].epochs == 2 and plan.phases[0].penalty.strength == 0.5
    assert row.local_layers == registry.HEAD


@pytest.mark.parametrize(
    'source, message',
    [
        (
            NEW_MODULE.replace("registry.Row('newalg', 'NewAlg'", "registry.Row(NAME, 'NewAlg'"),
            'needs literal name, display_name and leaderboard',
        ),
        (
            NEW_MODULE.replace("'Its steps.', above=0)", "'Its steps.', above=fedprox.MINIMUM)"),
            'BenchmarkOptions may use only dataclasses, registry and errors',
        ),
        (NEW_MODULE.replace('BENCHMARK_ROWS = (', 'BENCHMARK_ROWS = 1 + ('), 'must be a tuple of registry.Row'),
    ],
)
def test_a_declaration_that_cannot_be_read_without_importing_is_refused_naming_the_line(tmp_path, source, message):
    path = _write(tmp_path, 'newalg', source)
    with pytest.raises(errors.ConfigError, match=f'{path}:[0-9]+: .*{message}'):
        registry.read_declaration(path)


def test_two_modules_declaring_one_row_are_refused(tmp_path):
    _write(tmp_path, 'one', NEW_MODULE)
    _write(tmp_path, 'two', NEW_MODULE)
    with pytest.raises(errors.ConfigError, match="row 'newalg' is declared by both one and two"):
        registry.declarations(tmp_path)


def test_reading_the_declarations_imports_no_tensorflow():
    code = (
        'import json, sys\n'
        'from fedpersonal.tasks import pfl_benchmark_config as c\n'
        'c.PflBenchmarkConfig(dataset="synthetic", moon_mu=2.0)\n'
        'print(json.dumps([len(c.METHODS), "tensorflow" in sys.modules]))\n'
    )
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep))
    done = subprocess.run([sys.executable, '-c', code], cwd=repo, env=env, check=True, capture_output=True, text=True)
    out = done.stdout
    assert json.loads(out) == [16, False]
