"""The runtime owns the TFF C++ worker: no worker outlives a run, even a killed one."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import runtime

_CHILD = r"""
import os, sys
import fedpersonal, numpy as np, tensorflow_federated as tff
from fedpersonal import runtime
runtime.install_worker_tracking()

@tff.tensorflow.computation(np.int32)
def add_one(x):
    return x + 1

assert add_one(1) == 2
print(runtime.running_workers()[0], flush=True)
if sys.argv[1] == 'kill':
    os.kill(os.getpid(), 9)
"""


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def _run_child(mode):
    proc = subprocess.run(
        [sys.executable, '-c', _CHILD, mode],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'},
    )
    worker = int(proc.stdout.strip().splitlines()[-1])
    return proc, worker


def _wait_dead(pid, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline and _alive(pid):
        time.sleep(0.1)
    return not _alive(pid)


def test_worker_stops_when_the_program_exits_normally():
    proc, worker = _run_child('normal')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'Exception ignored' not in proc.stderr
    assert _wait_dead(worker)


def test_worker_dies_with_a_killed_program():
    proc, worker = _run_child('kill')
    assert proc.returncode == -signal.SIGKILL
    assert _wait_dead(worker)


@tff.tensorflow.computation(np.int32)
def _double(x):
    return x * 2


def test_local_runtime_and_shutdown_in_process():
    with runtime.LocalRuntime():
        assert _double(3) == 6
        workers = runtime.running_workers()
        assert workers
    assert runtime.running_workers() == []
    assert all(_wait_dead(pid) for pid in workers)
    assert _double(4) == 8  # A fresh context starts a new worker on demand...
    assert runtime.running_workers()
    runtime.shutdown()
    assert runtime.running_workers() == []  # ...and shutdown() stops it again.
    assert runtime.worker_pids_of_this_process() == []


def test_a_restored_context_whose_worker_was_stopped_recovers():
    """LocalRuntime restores the previous context; its worker was stopped too, and it must restart cleanly."""
    assert _double(1) == 2  # The outer (default) context starts its worker.
    with runtime.LocalRuntime():
        assert _double(2) == 4
    assert _double(5) == 10  # Outer context again: its old worker is gone, a new one starts.
    runtime.shutdown()
    assert runtime.worker_pids_of_this_process() == []


def test_shutdown_kills_a_worker_that_ignores_sigint():
    """A busy worker may ignore SIGINT; shutdown must still return (SIGKILL after the timeout), before any context
    replacement could wait on it."""
    from fedpersonal.runtime import execution_context  # pylint: disable=g-import-not-at-top

    # Workers an earlier test of this process left to its shared TFF context are not this test's subject.
    runtime.shutdown(timeout_seconds=10.0)
    assert runtime.running_workers() == []
    stubborn = execution_context._TrackedPopen(  # pylint: disable=protected-access
        [
            sys.executable,
            '-c',
            'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); '
            'print("ready", flush=True); time.sleep(120)',
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout.readline().strip() == 'ready'
    assert stubborn.pid in runtime.running_workers()
    started = time.time()
    assert runtime.shutdown(timeout_seconds=1.0) == 1
    assert time.time() - started < 10
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert runtime.running_workers() == []


def test_importing_the_package_patches_nothing_in_tff():
    """`import fedpersonal` (and its modules) leaves TFF's worker start alone; LocalRuntime patches it explicitly."""
    script = r"""
import subprocess
import fedpersonal
from fedpersonal import algorithms, core, runtime
from tests import tolerances
from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
from tensorflow_federated.python.core.impl.executors import remote_executor
assert executor_factory.remote_executor is remote_executor
assert executor_factory.subprocess is subprocess, executor_factory.subprocess
with runtime.LocalRuntime():
    assert executor_factory.subprocess is not subprocess
    assert executor_factory.remote_executor.RemoteExecutor is not remote_executor.RemoteExecutor
print('ok')
"""
    proc = subprocess.run(
        [sys.executable, '-c', script],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith('ok')


def test_tracked_popen_execs_the_program_itself_in_the_same_pid_and_bound_to_this_process():
    from fedpersonal.runtime import execution_context

    proc = execution_context._TrackedPopen(['sleep', '30'])
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            with open(f'/proc/{proc.pid}/cmdline', 'rb') as f:
                if f.read().split(b'\0')[0] == b'sleep':
                    break
            time.sleep(0.01)
        with open(f'/proc/{proc.pid}/cmdline', 'rb') as f:
            assert f.read().split(b'\0')[:2] == [b'sleep', b'30']
        assert proc.pid in runtime.running_workers()
    finally:
        proc.kill()
        proc.wait()
        execution_context.shutdown()


def test_the_launcher_does_not_start_a_worker_whose_parent_is_already_gone():
    from fedpersonal.runtime import execution_context

    not_the_parent = str(os.getpid() + 1_000_000)
    argv = execution_context._launched_with_parent_death_signal(['sleep', '30'])
    argv[argv.index(str(os.getpid()))] = not_the_parent
    started = time.time()
    assert subprocess.run(argv, timeout=30).returncode == 1
    assert time.time() - started < 10


def _rss_mb(pid):
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith('VmRSS'))


def test_the_worker_frees_each_large_argument_once_dropped():
    """Passing a 16 MB dataset 8 times leaves the worker's memory where the first call left it. As TFF ships (values
    freed in batches of 20, glibc keeping freed buffers), each call added ~60 MB (+300 MB or more by the 8th)."""
    # 16 MB of 0s and 1s: every partial sum is an integer below 2**24, so float32 sums it exactly in any order.
    rows = np.random.default_rng(0).integers(0, 2, (16384, 256)).astype(np.float32)
    element = tff.TensorType(np.float32, [None, 256])

    @tff.tensorflow.computation(tff.SequenceType(element))
    def total(dataset):
        return dataset.reduce(np.float32(0.0), lambda s, b: s + tf.reduce_sum(b))

    others = set(runtime.worker_pids_of_this_process())  # E.g. the worker of TFF's default context, left running.
    with runtime.LocalRuntime():
        rss = []
        for _ in range(8):
            assert total(tf.data.Dataset.from_tensor_slices(rows).batch(1024)) == rows.sum()
            (worker,) = set(runtime.worker_pids_of_this_process()) - others
            rss.append(_rss_mb(worker))
        with open(f'/proc/{worker}/environ', 'rb') as f:
            environment = f.read().split(b'\0')
    assert max(rss[1:]) - rss[0] < 100, rss
    assert b'MALLOC_MMAP_THRESHOLD_=1048576' in environment


def test_a_malloc_setting_of_the_user_reaches_the_worker_unchanged():
    from fedpersonal.runtime import execution_context

    assert execution_context._worker_environment({'MALLOC_MMAP_THRESHOLD_': '65536', 'A': 'b'}) == {
        'MALLOC_MMAP_THRESHOLD_': '65536',
        'A': 'b',
    }
    assert execution_context._worker_environment({})['MALLOC_MMAP_THRESHOLD_'] == '1048576'
