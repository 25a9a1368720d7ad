"""Ownership of TFF's execution context and of its C++ `worker_binary` processes.

TFF 0.87 installs a local C++ execution context when it is imported. That context
starts a `worker_binary` subprocess on first use and keeps the `subprocess.Popen`
handle in a closure, so nothing ever stops it: the worker outlives the Python
process (and keeps any pipe it inherited open, which hangs `python ... | tee`).

This module owns that lifetime:

* `install_worker_tracking()` is the one patch of TFF the package makes, and it
  is explicit: `LocalRuntime` calls it when entered (importing `fedpersonal`
  changes nothing). It replaces the `subprocess` and `remote_executor` names inside TFF's executor
  factory module (`tensorflow_federated.python.core.impl.executor_stacks.
  executor_factory`) with proxies. The first one's `Popen` records every worker it starts
  and asks the kernel to kill the worker when the process that started it dies
  (`PR_SET_PDEATHSIG`, Linux), so even a `SIGKILL`ed experiment leaves no
  orphan. The signal is armed by a tiny exec launcher (`_LAUNCHER`), not by a
  `preexec_fn`: a `preexec_fn` makes Python fork (not vfork) a process full of
  TF and gRPC threads and run Python in the child, which aborted the child
  before its exec once in CI; TFF then waited forever for a worker that never
  came up. Code that runs TFF computations outside `LocalRuntime` (TFF's default
  context) may call it once before the first computation.
* The same patch bounds the worker's memory, which otherwise grows with every call that passes it a large value
  (a round's serialized client data): TFF's `RemoteExecutor` releases a worker value only after 20 values have
  been dropped in Python (`dispose_batch_size=20`), and the worker's glibc keeps freed buffers below its (dynamic,
  up to 32 MB) mmap threshold in fragmented heap arenas. Values are released as soon as they are dropped
  (`DISPOSE_BATCH_SIZE`) and the worker starts with a fixed 1 MB mmap threshold (`WORKER_ENVIRONMENT`, unless
  the variable is set already), so large buffers go back to the kernel when freed. Measured with a 20 MB sequence
  passed 20 times: the worker grew from 250 MB to 1.0-1.2 GB as TFF ships, and stayed at ~105 MB with both
  changes (either alone: 560 MB, or a 100-650 MB sawtooth). HPFL on ASSISTments, 2 methods x 10 rounds in one
  process: 4.2 GB before, 0.55 GB after (docs/RELIABILITY.md). The multi-worker runtime (`distributed`) and
  `scripts/start_workers.sh` apply the same two settings to their workers.
* `shutdown()` stops every tracked worker (SIGINT, then SIGKILL after a grace
  period). It runs at interpreter exit and is idempotent.
* `release_at_exit()` registers that exit run (once), which also stops workers started before tracking was
  installed and replaces TFF's default context while the interpreter is intact. `fedpersonal.quiet` calls it
  when TFF is first imported after `fedpersonal`: TFF's default context holds a `ServiceManager` whose
  `__del__` otherwise runs during module teardown, fails ("Exception ignored in: ... ServiceManager.__del__
  ... 'NoneType' object has no attribute 'Popen'") and leaves a worker it started running with no parent.
* `LocalRuntime` is a context manager that installs a fresh C++ context with the
  given options and shuts its workers down on exit.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Any

_PR_SET_PDEATHSIG = 1
_lock = threading.Lock()
_workers: list[subprocess.Popen] = []
_installed = False
# Its own lock: `install_worker_tracking` imports TFF while holding `_lock`, and that import registers the exit run.
_exit_lock = threading.Lock()
_exit_registered = False


# Run as `python -I -S -c _LAUNCHER <parent pid> <worker argv...>`: arms PR_SET_PDEATHSIG (kept across exec), exits
# if the parent is already gone, then becomes the worker (same pid). About 20 ms, once per worker.
_LAUNCHER = (
    'import ctypes, os, sys\n'
    'try:\n'
    f'    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n'
    'except (OSError, AttributeError):\n'
    '    pass\n'
    'if os.getppid() != int(sys.argv[1]):\n'
    '    os._exit(1)\n'
    'os.execvp(sys.argv[2], sys.argv[2:])\n'
)


def _launched_with_parent_death_signal(args: Any) -> Any:
    """The argv that starts `args` (a list, program first) under `_LAUNCHER`; other forms unchanged."""
    if not sys.platform.startswith('linux') or not isinstance(args, (list, tuple)) or not args:
        return args
    return [sys.executable, '-I', '-S', '-c', _LAUNCHER, str(os.getpid()), *(os.fspath(a) for a in args)]


def _has_fileno(stream: Any) -> bool:
    if stream is None or isinstance(stream, int):
        return True
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


# The worker's allocator: buffers of >= 1 MB are mapped on their own and unmapped when freed (see the docstring).
WORKER_ENVIRONMENT = {'MALLOC_MMAP_THRESHOLD_': str(1 << 20)}
# TFF's `RemoteExecutor` batches its requests to free worker values by 20; 1 frees each value when Python drops it.
DISPOSE_BATCH_SIZE = 1


def _worker_environment(env: Any) -> dict[str, str]:
    """`env` (None: this process's environment) with `WORKER_ENVIRONMENT` added where not set."""
    env = dict(os.environ if env is None else env)
    for name, value in WORKER_ENVIRONMENT.items():
        env.setdefault(name, value)
    return env


class _TrackedPopen(subprocess.Popen):
    """`subprocess.Popen` that registers the process and binds it to its parent."""

    def __init__(self, args: Any, **kwargs: Any) -> None:
        # No `preexec_fn` (see the module docstring): Python can then vfork and exec at once.
        args = _launched_with_parent_death_signal(args)
        # Its own process group: a Ctrl-C in the terminal reaches the experiment (which finishes and checkpoints its
        # round, `fedpersonal.program.stop_signals`), not the worker computing that round.
        kwargs.setdefault('process_group', 0)
        kwargs['env'] = _worker_environment(kwargs.get('env'))
        for stream in ('stdout', 'stderr'):
            # TFF passes sys.stdout/sys.stderr, which may be replaced by objects with no
            # file descriptor (pytest capture, notebooks): then inherit the real fds.
            if not _has_fileno(kwargs.get(stream)):
                kwargs[stream] = None
        super().__init__(args, **kwargs)
        with _lock:
            _workers.append(self)


class _ModuleStandIn(types.ModuleType):
    """Stands in for `module` inside TFF's executor factory module: `overrides` replace some of its names."""

    def __init__(self, module: types.ModuleType, **overrides: Any) -> None:
        super().__init__(module.__name__)
        self._module = module
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:  # Only called for names not overridden.
        return getattr(self._module, name)


def install_worker_tracking() -> None:
    """Makes every TFF C++ worker started from now on tracked, parent-bound and bounded in memory.

    Idempotent. Patches TFF's executor factory module (see the module docstring);
    `LocalRuntime` calls it; call it yourself before the first TFF computation
    when running in TFF's default context.
    """
    global _installed
    with _lock:
        if _installed:
            return
        from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

        executor_factory.subprocess = _ModuleStandIn(subprocess, Popen=_TrackedPopen)
        remote_executor = executor_factory.remote_executor
        executor_factory.remote_executor = _ModuleStandIn(
            remote_executor,
            RemoteExecutor=functools.partial(remote_executor.RemoteExecutor, dispose_batch_size=DISPOSE_BATCH_SIZE),
        )
        _installed = True
    release_at_exit()


def release_at_exit() -> None:
    """Stops this process's TFF workers and releases TFF's default context at interpreter exit.

    Idempotent. Registers (once) the exit run of `shutdown`, which also stops workers TFF started before
    `install_worker_tracking` (computations in its default context) and then drops the default context while
    the interpreter is intact, so TFF's own cleanup of it neither fails nor waits on a busy worker.
    `install_worker_tracking` calls it, and `fedpersonal.quiet` does when TFF is first imported after
    `fedpersonal`.
    """
    global _exit_registered
    with _exit_lock:
        if _exit_registered:
            return
        _exit_registered = True
    atexit.register(_shutdown_at_exit)


def running_workers() -> list[int]:
    """Returns the pids of tracked workers that are still running."""
    with _lock:
        return [p.pid for p in _workers if _is_running(p.pid)]


def _process_state(pid: int) -> str | None:
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            return f.read().decode(errors='replace').rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _is_running(pid: int) -> bool:
    state = _process_state(pid)
    return state is not None and state not in ('Z', 'X')


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_exited(pid: int, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while _is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _replace_default_context(*, at_exit: bool = False) -> None:
    """Releases the current default context, and with it TFF's own handle on its
    worker, while the interpreter is still intact.

    Mid-run the replacement is a fresh C++ context (it starts a worker only if
    another computation runs); at exit it is TFF's runtime-error context.
    """
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.context_stack import runtime_error_context  # pylint: disable=g-import-not-at-top

    if at_exit:
        context_stack_impl.context_stack.set_default_context(runtime_error_context.create_runtime_error_context())
    else:
        tff.backends.native.set_sync_local_cpp_execution_context()
    gc.collect()


def _shutdown_at_exit() -> None:
    # Same order as `shutdown`: stop the workers first, so TFF's cleanup never waits on a live one.
    shutdown(_at_exit=True)


def shutdown(timeout_seconds: float = 5.0, *, _at_exit: bool = False) -> int:
    """Stops every `worker_binary` process started by this process.

    Every tracked worker still running is stopped (SIGINT, then SIGKILL after
    `timeout_seconds`), then the current default execution context is replaced
    by a fresh one (which starts a new worker only if another computation runs). Safe to call repeatedly; runs at
    exit (`release_at_exit`), where it also stops untracked workers and installs TFF's runtime-error context.

    Args:
      timeout_seconds: How long to wait for a worker to exit after SIGINT before
        it is killed.

    Returns:
      The number of workers that had to be stopped here (workers released by
      TFF's own cleanup when the old context was dropped are not counted).
    """
    # Workers are stopped *before* the context is replaced: dropping TFF's context makes TFF signal its worker and
    # wait for it without a timeout, which hung when a busy worker ignored SIGINT. A dead worker returns at once.
    replace = _at_exit or (_installed and bool(running_workers()))
    with _lock:
        workers, _workers[:] = list(_workers), []
    pids = [process.pid for process in workers]
    if _at_exit:  # Untracked workers too (started before tracking): their ServiceManager would leave them running.
        pids += [pid for pid in worker_pids_of_this_process() if pid not in pids]
    stopped = 0
    for pid in pids:
        if not _is_running(pid):
            continue
        stopped += 1
        # Wait for the exit but leave the zombie for TFF's own handle to reap: a context still
        # holding this worker then finds it dead (os.kill on a zombie succeeds) and starts a new one.
        _signal(pid, signal.SIGINT)
        if not _wait_exited(pid, timeout_seconds):
            _signal(pid, signal.SIGKILL)
            _wait_exited(pid, timeout_seconds)
    if replace:
        _replace_default_context(at_exit=_at_exit)
    return stopped


class LocalRuntime:
    """A local C++ TFF execution context whose workers stop when it exits.

    Example:

    ```python
    with fedpersonal.runtime.LocalRuntime():
        state = process.initialize()
        ...
    ```

    Args:
      default_num_clients: Cardinality used when it cannot be inferred.
      max_concurrent_computation_calls: Limit on concurrent calls of one
        computation in the C++ runtime (non-positive: no limit).
      secure_sum_in_the_clear: Run TFF's secure summation intrinsics (e.g. of
        `tff.aggregators.SecureSumFactory`) as plain sums. TFF's local runtime
        has no secure aggregation; this simulates its result (TFF's test
        context), it does not protect anything.
    """

    def __init__(
        self,
        default_num_clients: int = 0,
        max_concurrent_computation_calls: int = -1,
        *,
        secure_sum_in_the_clear: bool = False,
    ):
        self._default_num_clients = default_num_clients
        self._max_concurrent = max_concurrent_computation_calls
        self._secure_sum_in_the_clear = secure_sum_in_the_clear
        self._previous: Any | None = None

    def __enter__(self) -> LocalRuntime:
        import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
        from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

        install_worker_tracking()
        self._previous = context_stack_impl.context_stack.current
        backend = tff.backends.test.set_sync_test_cpp_execution_context
        if not self._secure_sum_in_the_clear:
            backend = tff.backends.native.set_sync_local_cpp_execution_context
        backend(default_num_clients=self._default_num_clients, max_concurrent_computation_calls=self._max_concurrent)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

        shutdown()
        if self._previous is not None:
            context_stack_impl.context_stack.set_default_context(self._previous)


def worker_pids_of_this_process() -> list[int]:
    """Pids of any `worker_binary` whose parent is this process (tracked or not)."""
    pids = []
    for entry in os.listdir('/proc') if os.path.isdir('/proc') else []:
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat', 'rb') as f:
                stat = f.read().decode(errors='replace')
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                cmdline = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(')', 1)[1].split()[1])
        state = stat.rsplit(')', 1)[1].split()[0]
        if ppid == os.getpid() and b'worker_binary' in cmdline and state != 'Z':
            pids.append(int(entry))
    return pids
