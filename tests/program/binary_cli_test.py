"""A binary's command line, run as a user runs it: usage errors exit 2 with one line naming the flag, a resume with
a changed flag is refused, --fresh_start starts over, and TensorFlow's CUDA/cuDNN log lines stay off.

Each case runs a fresh interpreter on this checkout's code (PYTHONPATH); only the --fresh_start case trains (one
tiny round).
"""

import os
import subprocess
import sys

from fedpersonal.program import run_record
from fedpersonal.tasks import movielens_mf_config

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    '--synthetic_num_users=60',
    '--synthetic_num_items=80',
    '--clients_per_round=5',
    '--eval_clients=5',
    '--rounds_per_eval=1',
    '--batch_size=5',
    '--configurations=fedrecon',
]


def _movielens_mf(*args):
    """(exit status, stdout + stderr lines) of `python experiments/movielens_mf.py args`, TF's log level unset."""
    env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
    env['PYTHONPATH'] = os.pathsep.join([_REPO, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, os.path.join('experiments', 'movielens_mf.py'), *args],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


def test_a_bad_or_unknown_flag_exits_2_naming_it(tmp_path):
    for arg in ('--total_rounds=many', '--total_round=3'):
        status, lines = _movielens_mf(arg, f'--output_dir={tmp_path}')
        assert status == 2, lines
        errors = [line for line in lines if 'Flags parsing error' in line]
        assert len(errors) == 1 and arg.split('=')[0].lstrip('-') in errors[0], lines
        assert not any('Traceback' in line for line in lines)


def test_an_invalid_configuration_exits_2_with_the_error_last(tmp_path):
    status, lines = _movielens_mf('--configurations=fedprox', f'--output_dir={tmp_path}')
    assert status == 2
    assert lines[-1].startswith('configurations must be a non-empty subset of')
    assert not any('Traceback' in line for line in lines)


def test_a_changed_flag_on_resume_exits_2_naming_it_and_fresh_start_starts_over(tmp_path):
    out = str(tmp_path / 'run')
    # A run of these flags with 2 rounds, checkpointed at round 1 (as the binary leaves it when killed there).
    recorded = movielens_mf_config.MovieLensMFConfig(
        output_dir=out,
        synthetic_num_users=60,
        synthetic_num_items=80,
        clients_per_round=5,
        eval_clients=5,
        rounds_per_eval=1,
        batch_size=5,
        configurations=('fedrecon',),
        total_rounds=2,
    )
    run_record.check_output_dir(recorded)
    os.makedirs(os.path.join(out, 'fedrecon', 'checkpoints', 'program_state_1'))

    status, lines = _movielens_mf(*TINY, '--total_rounds=1', f'--output_dir={out}')
    assert status == 2, lines[-20:]
    assert '--total_rounds: 2 -> 1' in lines[-1] and '--fresh_start' in lines[-1]
    assert not any('Traceback' in line for line in lines)
    assert os.path.isdir(os.path.join(out, 'fedrecon', 'checkpoints', 'program_state_1'))  # Left as it was.

    status, lines = _movielens_mf(*TINY, '--total_rounds=1', '--fresh_start', f'--output_dir={out}')
    assert status == 0, lines[-30:]
    (previous,) = os.listdir(os.path.join(out, 'previous_runs'))
    assert os.path.isdir(os.path.join(out, 'previous_runs', previous, 'fedrecon', 'checkpoints', 'program_state_1'))
    assert 'program_state_1' in os.listdir(os.path.join(out, 'fedrecon', 'checkpoints'))  # The new run's.
    assert run_record.read_record(out, type(recorded))['total_rounds'] == 1
    # TensorFlow's C++ log lines (CUDA, cuDNN, TensorRT, CPU features) are off by default.
    noisy = [line for line in lines if any(w in line for w in ('cuda', 'cuDNN', 'TensorRT', 'cpu_feature_guard'))]
    assert not noisy, noisy
