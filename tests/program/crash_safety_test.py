"""Crash safety: binaries killed with SIGKILL at named points and restarted end with an uninterrupted run's results.

A run is killed deterministically through the fault hook (`fedpersonal.faults`, ``FEDPERSONAL_FAULT=<point>:<n>``)
and restarted with the same command line; a chain of such kills (each restart dies at the next point) ends with a
run without a fault. Its ``results.json`` files and ``metrics.csv`` must equal those of an uninterrupted run exactly
(wall-clock timings aside), ``metrics.csv`` must have one whole row per round, and the FURL client state store the
same committed states, nothing pending. The sweep over every point: ``benchmarks/fault_sweep.py``.

Also: one run per output directory (a lock), a full or read-only output directory (a clear error, the previous
checkpoint intact), leftover temporary files of a killed write. The chains also stop a run with SIGTERM and with
Ctrl-C (SIGINT to its process group) mid-round, and check after every run that no process it started (TFF's
worker) is left.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from concurrent import futures

import pytest

from fedpersonal.program import output_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMING = ('round_seconds', 'wall_seconds', 'seconds_per_round')
BINARIES = {
    'fedrecon': (
        'movielens_mf.py',
        [
            '--synthetic_num_users=60',
            '--synthetic_num_items=80',
            '--clients_per_round=5',
            '--eval_clients=5',
            '--batch_size=5',
            '--configurations=fedrecon',
            '--total_rounds=4',
            '--rounds_per_eval=2',
            '--rounds_per_checkpoint=2',
        ],
    ),
    'furl': (
        'furl_personalization.py',
        [
            '--configurations=personalized_fl',
            '--synthetic_num_users=8',
            '--epochs=2',  # 4 rounds of 4 clients.
            '--clients_per_round=4',
            '--max_chars=8',
            '--char_embedding_dim=4',
            '--lstm_units=4',
            '--user_embedding_dim=3',
            '--mlp_units=6',
            '--batch_size=8',
            '--eval_clients=8',
            '--rounds_per_eval=2',
            '--rounds_per_checkpoint=2',
            '--state_store=sqlite',
            '--simulation=per_client',
        ],
    ),
}
RUN_NAME = {'fedrecon': 'fedrecon', 'furl': 'personalized_fl'}
RUN_TAG = 'FEDPERSONAL_TEST_RUN'


def run_binary(algorithm: str, out: str, fault: str | None = None, *, extra: tuple[str, ...] = (), timeout=600):
    """Runs the algorithm's binary on `out` (with ``FEDPERSONAL_FAULT=fault``) in a session of its own (a ``sigint``
    fault signals the binary's process group); returns the finished process, after checking that no process it
    started (TFF's worker) outlives it."""
    script, flags = BINARIES[algorithm]
    tag = uuid.uuid4().hex
    env = {**os.environ, 'PYTHONPATH': ROOT, RUN_TAG: tag}  # Inherited by every process the run starts.
    env.pop('FEDPERSONAL_FAULT', None)
    if fault:
        env['FEDPERSONAL_FAULT'] = fault
    finished = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', script), *flags, *extra, f'--output_dir={out}'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )
    deadline = time.time() + 10  # A worker dies with its parent (PR_SET_PDEATHSIG), a moment later.
    while _tagged(tag) and time.time() < deadline:
        time.sleep(0.1)
    assert not _tagged(tag), f'{fault}: processes left running by the run: {_tagged(tag)}\n{finished.stderr[-3000:]}'
    return finished


def _tagged(tag: str) -> list[str]:
    """The command lines of the live processes whose environment has ``RUN_TAG=tag``."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/environ', 'rb') as f:
                    if f'{RUN_TAG}={tag}'.encode() not in f.read().split(b'\0'):
                        continue
                with open(f'/proc/{entry}/stat') as f:
                    if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                        continue
                with open(f'/proc/{entry}/cmdline', 'rb') as f:
                    found.append(f.read().replace(b'\0', b' ').decode(errors='replace')[:200])
            except OSError:
                pass
    return found


def _without_timing(value, out):
    if isinstance(value, dict):
        return {k: _without_timing(v, out) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v, out) for v in value]
    return value.replace(out, '<out>') if isinstance(value, str) else value


def outcome(algorithm: str, out: str) -> dict:
    """What must not change: both results.json (timings aside), metrics.csv's rows (checked whole and unique) and,
    for FURL, the store's committed states."""
    run = os.path.join(out, RUN_NAME[algorithm])
    found = {}
    for name, path in (('results', out), ('run_results', run)):
        with open(os.path.join(path, 'results.json')) as f:
            found[name] = _without_timing(json.load(f), out)
    with open(os.path.join(run, 'metrics.csv'), newline='') as f:
        text = f.read()
    assert text.endswith('\n'), 'metrics.csv ends in a torn row'
    rows = list(csv.DictReader(text.splitlines()))
    assert all(None not in row and None not in row.values() for row in rows), 'a row with missing or extra fields'
    rounds = [int(row['round']) for row in rows]
    assert rounds == list(range(1, len(rounds) + 1)), f'metrics.csv rounds {rounds}'
    found['metrics'] = [{k: v for k, v in row.items() if k not in TIMING} for row in rows]
    store = os.path.join(run, 'client_states.sqlite')
    if os.path.exists(store):
        with sqlite3.connect(store) as conn:
            found['states'] = conn.execute('SELECT client_id, round, blob FROM states ORDER BY client_id').fetchall()
            found['pending'] = conn.execute('SELECT COUNT(*) FROM pending').fetchone()[0]
            found['committed'] = conn.execute("SELECT value FROM meta WHERE key = 'committed_round'").fetchone()
        ids = sorted(row[0] for row in found['states'])  # 8 users' latest states and those of the best round.
        assert found['pending'] == 0 and ids == sorted([str(u) for u in range(8)] + [f'best/{u}' for u in range(8)])
    leftovers = [
        os.path.join(d, f)
        for d, dirs, files in os.walk(out)
        for f in dirs + files
        if '_temp' in f or f.endswith('.tmp')
    ]
    assert not leftovers, f'temporary files left: {leftovers}'
    staging = os.path.join(run, 'checkpoints', '.staging')
    assert not os.path.isdir(staging) or not os.listdir(staging)
    return found


def killed_chain(algorithm: str, out: str, faults: list[str]) -> list[str]:
    """Runs the binary once per fault, each dying there (SIGKILL; ``enospc``: the usage error of a full disk;
    ``sigterm``/``sigint``: the round in flight checkpointed, then a clean stop; asserted), then once without;
    returns the logs."""
    logs = []
    for fault in faults:
        failed = run_binary(algorithm, out, fault)
        logs.append(failed.stderr)
        run = os.path.join(out, RUN_NAME[algorithm])
        checkpoints = os.path.join(run, 'checkpoints')
        published = (
            [e for e in os.listdir(checkpoints) if e.startswith('program_state_')] if os.path.isdir(checkpoints) else []
        )
        if fault.endswith(':enospc'):
            assert failed.returncode == 2 and 'Traceback' not in failed.stderr, failed.stderr[-3000:]  # UsageError.
            assert f'Cannot write to the output directory {run}: ' in failed.stderr
            assert 'No space left on device' in failed.stderr
            assert published, 'the checkpoints written before the full disk are kept'
        elif fault.endswith((':sigterm', ':sigint')):
            name = 'SIGTERM' if fault.endswith(':sigterm') else 'SIGINT'
            with open(os.path.join(run, 'metrics.csv')) as f:
                last = int(list(csv.DictReader(f))[-1]['round'])
            assert f'stopped by {name} after round {last}' in failed.stderr, failed.stderr[-3000:]
            assert f'program_state_{last}' in published, published  # Checkpointed off its schedule.
            if name == 'SIGTERM':  # SIGINT ends in Python's KeyboardInterrupt (a traceback, a non-zero status).
                assert failed.returncode == 143 and 'Traceback' not in failed.stderr, failed.stderr[-3000:]
            else:
                assert failed.returncode != 0, failed.stderr[-3000:]
        else:
            assert failed.returncode == -signal.SIGKILL, f'{fault}: exit {failed.returncode}\n{failed.stderr[-3000:]}'
    final = run_binary(algorithm, out)
    assert final.returncode == 0, final.stderr[-3000:]
    return logs + [final.stderr]


# One chain per algorithm, 2 rounds per checkpoint; every kill point of `fedpersonal.faults` for both algorithms is
# in benchmarks/fault_sweep.py (CI runs these chains only: each run is a subprocess importing TF and TFF).
CHAINS = {
    # SIGTERM during round 1 (it finishes, is checkpointed off schedule, exit 143); resumed from round 1, round 3
    # dies mid-round; resumed from round 2, the disk is full when round 4 is checkpointed (a usage error naming the
    # directory, round 2's checkpoint kept); the restart resumes from round 2's checkpoint. (Killed while writing
    # results.json and every other point: the sweep.)
    'fedrecon': ['round:1:sigterm', 'round:2', 'checkpoint_write:1:enospc'],
    # Ctrl-C (SIGINT to the process group) during round 1: checkpointed with its client states; resumed from round
    # 1, killed between staging round 2's checkpoint and the store's commit (the store's pending states died with it:
    # resume from round 1), then while publishing round 2's checkpoint after the store committed it (the
    # restart publishes it).
    'furl': ['round:1:sigint', 'checkpoint_staged:1', 'checkpoint_committed:1'],
}


@pytest.mark.parametrize('algorithm', sorted(CHAINS))
def test_killed_anywhere_and_restarted_ends_like_an_uninterrupted_run(tmp_path, algorithm):
    straight, killed = str(tmp_path / 'straight'), str(tmp_path / 'killed')
    with futures.ThreadPoolExecutor(1) as pool:  # The uninterrupted run alongside the chain (2 cores).
        reference = pool.submit(run_binary, algorithm, straight)
        logs = killed_chain(algorithm, killed, CHAINS[algorithm])
        assert reference.result().returncode == 0, reference.result().stderr[-3000:]
    assert 'resumed from checkpoint at round' in ''.join(logs[1:])
    assert outcome(algorithm, killed) == outcome(algorithm, straight)


# ------------------------------------------------------------------------------------- one run per directory
def _lock_once(directory):
    with output_dir.lock(directory):
        pass


# A process that holds a directory's lock until a line arrives on its stdin. A plain subprocess: a
# multiprocessing 'spawn' child re-imports the pytest session's main module (TF and TFF, ~15 s each time).
_HOLDER = """
import sys
from fedpersonal.program import output_dir
with output_dir.lock(sys.argv[1]):
    print('locked', flush=True)
    sys.stdin.readline()
print('released', flush=True)
"""


def _lock_holder(directory: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, '-c', _HOLDER, directory],
        cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': ROOT},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == 'locked'
    return holder


def _release(holder: subprocess.Popen) -> str:
    out, _ = holder.communicate('\n', timeout=30)
    return out.strip()


def test_a_second_run_on_the_same_directory_is_refused_and_a_killed_one_releases_it(tmp_path):
    directory = str(tmp_path / 'out')
    first = _lock_holder(directory)
    with pytest.raises(output_dir.OutputDirectoryInUseError, match=rf'{directory}.*process {first.pid}'):
        _lock_once(directory)
    assert _release(first) == 'released'
    assert not os.path.exists(directory)  # Created by the lock, left empty: removed with it.

    # A run killed while holding the lock does not block its restart.
    killed = _lock_holder(directory)
    assert os.path.exists(os.path.join(directory, output_dir.LOCK_FILE))
    killed.kill()
    killed.communicate(timeout=30)
    with output_dir.lock(directory), output_dir.lock(directory):  # Re-entrant in one process.
        assert os.path.exists(os.path.join(directory, output_dir.LOCK_FILE))


def test_a_binary_on_a_directory_in_use_is_refused(tmp_path):
    """A binary started on the --output_dir of a running process stops at once with a usage error naming the
    directory and that process, and writes nothing there."""
    out = str(tmp_path / 'out')
    holder = _lock_holder(out)
    try:
        refused = run_binary('fedrecon', out)
    finally:
        assert _release(holder) == 'released'
    assert refused.returncode == 2 and 'Traceback' not in refused.stderr, refused.stderr[-3000:]  # UsageError.
    assert out in refused.stderr and f'process {holder.pid}' in refused.stderr
    assert not os.path.exists(out)  # Nothing written (the holder removed its lock file and the empty directory).


# ------------------------------------------------------------------------------ full or read-only directory
def test_a_read_only_output_directory_is_a_clear_error(tmp_path):
    out = tmp_path / 'read_only'
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.access(out, os.W_OK) and open(out / 'probe', 'w'):  # noqa: SIM115  # root ignores permissions.
            pytest.skip('running as root: a read-only directory is writable; the full-disk test covers the error')
        with pytest.raises(output_dir.OutputDirectoryNotWritableError, match=str(out)):
            _lock_once(str(out))
    finally:
        out.chmod(0o755)


def test_write_failures_name_the_directory(tmp_path, monkeypatch):
    """`writing` turns OS and TensorFlow write errors into one error naming the directory; not other errors."""
    import errno  # pylint: disable=g-import-not-at-top

    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    for error in (
        OSError(errno.EROFS, 'Read-only file system'),
        PermissionError(errno.EACCES, 'Permission denied'),
        tf.errors.PermissionDeniedError(None, None, 'x is not writable'),
    ):
        with (
            pytest.raises(output_dir.OutputDirectoryNotWritableError, match=f'{tmp_path}.*'),
            output_dir.writing(str(tmp_path)),
        ):
            raise error
    with pytest.raises(FileNotFoundError), output_dir.writing(str(tmp_path)):
        raise FileNotFoundError('gone')
    monkeypatch.setenv('FEDPERSONAL_FAULT', 'json:1:enospc')
    from fedpersonal import program  # pylint: disable=g-import-not-at-top

    with pytest.raises(output_dir.OutputDirectoryNotWritableError, match='No space left'):
        program.write_json(str(tmp_path / 'a.json'), {'a': 1})
    assert not os.path.exists(tmp_path / 'a.json')


# ---------------------------------------------------------------------------- leftovers of a killed write
def test_leftovers_of_killed_writes_are_cleaned_on_restart(tmp_path):
    """A torn last metrics row, the CSV writer's and tf.saved_model's temporary files, staged checkpoints."""
    from fedpersonal import program  # pylint: disable=g-import-not-at-top
    from fedpersonal.program import checkpoints as checkpoints_lib  # pylint: disable=g-import-not-at-top

    outputs = program.ExperimentOutputs(str(tmp_path), 'run')
    outputs.release_metrics(1, {'loss': 1.5})
    outputs.release_metrics(2, {'loss': 1.25})
    with open(outputs.metrics_csv, 'a') as f:
        f.write('3,1.')  # Killed mid-append.
    open(f'{outputs.metrics_csv}_temp1234', 'w').close()  # Killed mid-rewrite.
    root = tmp_path / 'run' / 'checkpoints'
    for path in (root / 'program_state_4_temp5678', root / '.staging' / 'program_state_6_temp1111'):
        path.mkdir(parents=True)
    outputs = program.ExperimentOutputs(str(tmp_path), 'run')
    assert outputs.read_metrics() == [{'round': 1.0, 'loss': 1.5}, {'round': 2.0, 'loss': 1.25}]
    assert not os.path.exists(f'{outputs.metrics_csv}_temp1234')
    outputs.release_metrics(3, {'loss': 1.0})
    assert [row['round'] for row in outputs.read_metrics()] == [1.0, 2.0, 3.0]
    checkpoints_lib.Checkpoints(outputs).recover(None)
    assert os.listdir(root) == ['.staging'] and not os.listdir(root / '.staging')
