"""An output directory that cannot be created or becomes unwritable mid-run: a usage error (exit status 2) naming the
path and the operation, no traceback, nothing left that stops a rerun once the cause is fixed. And
``clients_per_round`` above the number of training clients is refused, naming both numbers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal import program
from fedpersonal.program import output_dir
from tests.program import training_loop_test as toy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = (
    '--configurations=fedrecon',
    '--synthetic_num_users=60',
    '--synthetic_num_items=80',
    '--clients_per_round=5',
    '--eval_clients=5',
    '--batch_size=5',
    '--rounds_per_eval=100',
)


def _command(out: str, *extra: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, 'experiments', 'movielens_mf.py'), *TINY, *extra, f'--output_dir={out}']


def _env() -> dict[str, str]:
    return {**os.environ, 'PYTHONPATH': ROOT, 'TF_NUM_INTRAOP_THREADS': '1'}


def test_an_output_directory_that_cannot_be_created_is_a_usage_error(tmp_path):
    regular_file = tmp_path / 'a_file'
    regular_file.write_text('not a directory')
    out = str(regular_file / 'out')
    expected = f'Cannot create the output directory {out}'
    with pytest.raises(output_dir.OutputDirectoryNotWritableError, match=expected), output_dir.lock(out):
        pass
    done = subprocess.run(_command(out, '--total_rounds=1'), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert 'Traceback' not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f'Cannot create the output directory {out}: Not a directory')
    # The error alone: not the binary's description first (that is --help's).
    assert 'MovieLens matrix factorization' not in done.stderr + done.stdout


def _chattr(path: str, flag: str) -> bool:
    return subprocess.run(['chattr', '-R', flag, path], capture_output=True, check=False).returncode == 0


def _immutable_supported(tmp_path) -> bool:
    probe = tmp_path / 'probe'
    probe.mkdir()
    try:
        if not _chattr(str(probe), '+i'):
            return False
        try:
            (probe / 'x').write_text('')
        except PermissionError:
            return True
        return False
    finally:
        _chattr(str(probe), '-i')


def test_a_directory_made_read_only_before_the_first_checkpoint_is_a_usage_error_and_reruns(tmp_path):
    """`chattr -R +i` once round 1 is logged: the run's own error (not the cleanup's), exit 2; fixed, a rerun works."""
    if not _immutable_supported(tmp_path):
        pytest.skip('chattr +i needs root and a file system with the immutable attribute (ext4, xfs, btrfs)')
    out = str(tmp_path / 'out')
    flags = ('--total_rounds=60', '--rounds_per_checkpoint=60')
    with subprocess.Popen(
        _command(out, *flags), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as run:
        assert run.stderr is not None
        seen = []
        deadline = time.time() + 300
        for line in run.stderr:
            seen.append(line)
            if '] round 1/60' in line:
                assert _chattr(out, '+i')
                break
            assert time.time() < deadline, ''.join(seen[-20:])
        try:
            _, rest = run.communicate(timeout=300)
        finally:
            _chattr(out, '-i')
    stderr = ''.join(seen) + rest
    assert run.returncode == 2, stderr[-3000:]
    assert 'Traceback' not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith('Cannot write to the output directory') and out in last, last
    rerun = subprocess.run(_command(out, *flags), env=_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]


def test_more_clients_per_round_than_clients_is_refused_naming_both_numbers(tmp_path):
    client_data = tff.simulation.datasets.TestClientData({c: [x] for c, x in toy.INPUTS.items()})
    with pytest.raises(program.TooManyClientsPerRoundError, match='is 4, more than the 3 training clients') as raised:
        program.run_learning_process(
            toy.build_process(),
            client_data=client_data,
            dataset_fn=lambda dataset: np.float32(next(iter(dataset))),
            clients_per_round=4,
            total_rounds=1,
            outputs=program.ExperimentOutputs(str(tmp_path), 'run'),
        )
    assert isinstance(raised.value, errors.InputError)  # A binary reports it as a usage error (exit status 2).
    assert '--clients_per_round=3' in str(raised.value)
