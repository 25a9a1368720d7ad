"""Every experiment binary answers --help at once: exit status 0, its own flags listed, no TensorFlow imported.

Each case runs a fresh interpreter (the test session itself has imported TensorFlow long before).
"""

import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# binary -> (its --output_dir default, its round flag, one of its own flags with that flag's help text).
BINARIES = {
    'feddva': ('output/feddva', '--total_rounds', '--z_dim: Dimension of the shared latent z.'),
    'furl_personalization': (
        'output/furl',
        '--total_rounds',
        '--user_embedding_dim: Dimension of the private user embedding.',
    ),
    'hpfl_user_modeling': ('output/hpfl', '--total_rounds', '--hidden_dim: GUM width h of skill_W/know_W.'),
    'movielens_mf': ('output/movielens_mf', '--total_rounds', '--num_latent_factors: Embedding dimension.'),
    'next_word_prediction': (
        'output/next_word_prediction',
        '--total_rounds',
        '--vocab_sizes: Vocabulary sizes (one table per size).',
    ),
    'pfl_benchmark': ('output/pfl_benchmark', '--total_rounds', "--apfl_alpha: APFL's initial mixing weight alpha."),
}

OUTPUT_DIR_HELP = (
    '--output_dir: Directory for metrics (CSV, TensorBoard), checkpoints, results and plots; rerunning with the '
    'same directory resumes the run (under the same configuration; see --fresh_start).'
)

CONFIG_MODULES = (
    'fedpersonal.tasks.feddva_config',
    'fedpersonal.tasks.furl_personalization_config',
    'fedpersonal.tasks.hpfl_user_modeling_config',
    'fedpersonal.tasks.movielens_mf_config',
    'fedpersonal.tasks.next_word_prediction_config',
    'fedpersonal.tasks.pfl_benchmark_config',
)


def _binary(name, *args):
    """(exit status, stdout + stderr with whitespace runs collapsed) of `python experiments/<name>.py args`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    env['PYTHONPATH'] = os.pathsep.join([_REPO, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)  # This checkout.
    done = subprocess.run(
        [sys.executable, os.path.join('experiments', f'{name}.py'), *args],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, ' '.join((done.stdout + done.stderr).split())  # absl wraps help at 80 columns.


@pytest.mark.parametrize('name', sorted(BINARIES))
def test_help_lists_the_binarys_flags_and_exits_0(name):
    output_dir, rounds_flag, own_flag = BINARIES[name]
    status, out = _binary(name, '--help')
    assert status == 0, out[-2000:]
    assert f"{OUTPUT_DIR_HELP} (default: '{output_dir}')" in out
    assert f'{rounds_flag}: Federated training rounds.' in out
    assert own_flag in out
    assert '--helpfull' in out  # Where the rest is.


@pytest.mark.parametrize('arg', ['-h', '--helpshort'])
def test_short_help_spellings(arg):
    status, out = _binary('movielens_mf', '--total_rounds=3', arg)
    assert status == 0, out[-2000:]
    assert 'MovieLens matrix factorization with Federated Reconstruction' in out  # The binary's docstring.
    assert "--configurations: Table 1 rows to run, a subset of ('centralized_standard'," in out


def test_a_configuration_error_is_a_usage_error():
    status, out = _binary('movielens_mf', '--configurations=bogus', '--output_dir=/nonexistent/none')
    assert status == 2
    assert "configurations must be a non-empty subset of ('centralized_standard'," in out
    assert out.endswith("unknown: ['bogus'].")  # The last line: the error, without a traceback.


@pytest.mark.parametrize(
    'modules',
    [
        ('fedpersonal.program',),
        ('fedpersonal.program.config_flags', 'fedpersonal.program.experiment_main'),
        *[(m,) for m in CONFIG_MODULES],
        *[(f'experiments.{name}',) for name in sorted(BINARIES)],
    ],
    ids=lambda modules: modules[-1],
)
def test_flags_and_configs_import_no_tensorflow(modules):
    imports = '; '.join(f'import {m}' for m in modules)
    check = "import sys; heavy = sorted(m for m in ('tensorflow', 'tensorflow_federated') if m in sys.modules)"
    done = subprocess.run(
        [sys.executable, '-c', f'{imports}; {check}; print(heavy)'],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == '[]', f'{modules} imported {done.stdout.strip()}'
