"""Quiet by default: TensorFlow's start-up lines, TFF's exit noise and per-checkpoint log lines are left out.

Importing TensorFlow 2.14 writes, from C++ to file descriptor 2, lines that say nothing about a run on a CPU
machine: cuDNN/cuFFT/cuBLAS "Unable to register ... factory" (ERROR level, so ``TF_CPP_MIN_LOG_LEVEL=2`` keeps
them), "Could not find cuda drivers", oneDNN custom operations, the CPU instructions notice and "TF-TRT Warning:
Could not find TensorRT". ``TF_CPP_MIN_LOG_LEVEL=3`` would hide them, and every real error with them. Instead,
`install` (run by ``import fedpersonal``) adds an import hook (`sys.meta_path`) that wraps the first
``import tensorflow`` only: while it runs, file descriptor 2 goes through a small filter process (this file, run
by the same Python) that drops exactly the lines `is_startup_line` recognizes and passes every other line on as
it comes. A separate process, so that a crash during the import (an abort after a C++ ``Check failed``) still
shows its message. The hook does nothing when TensorFlow is already imported and removes itself once used;
``import fedpersonal`` imports neither TensorFlow nor TFF and changes nothing in them.

The same hook notices the first ``import tensorflow_federated`` and calls
`fedpersonal.runtime.execution_context.release_at_exit`: at interpreter exit TFF's default context is released
while the interpreter is intact, which prevents the "Exception ignored in: ... ServiceManager.__del__" traceback
and stops a worker started by a computation outside `fedpersonal.runtime.LocalRuntime` (left running before).

`checkpoint_save_lines_dropped` drops the INFO lines each checkpoint save logs ("Assets written to",
"Writing fingerprint to", "Program state saved"); warnings and the package's own lines are kept.

Set ``FEDPERSONAL_VERBOSE_TF=1`` (`VERBOSE_VARIABLE`) to filter nothing.

Example:

>>> is_startup_line('2026-12-06 07:25:37.875180: I tensorflow/tsl/cuda/cudart_stub.cc:28] Could not find cuda '
...                 'drivers on your machine, GPU will not be used.')
True
>>> is_startup_line('2026-12-06 07:25:38.000000: E tensorflow/core/framework/op_kernel.cc:1839] OP_REQUIRES failed')
False
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import BinaryIO

if TYPE_CHECKING:  # `logging` is imported where used, so that `import fedpersonal` stays light.
    import logging
    import types
    from importlib.machinery import ModuleSpec

VERBOSE_VARIABLE = 'FEDPERSONAL_VERBOSE_TF'

# TensorFlow's start-up lines: (the C++ file that logs it, the start of its message). Matched whatever the log
# prefix: TF 2.14's "2026-12-06 07:25:37.811971: I path/file.cc:111] ", absl's "I1206 07:25:37.811971  1 file.cc:111] ".
_STARTUP_MESSAGES = (
    (r'port\.cc', r'oneDNN custom operations are on\.'),
    (r'cudart_stub\.cc', r'Could not find cuda drivers on your machine, GPU will not be used\.'),
    (
        r'cuda_(?:dnn|fft|blas)\.cc',
        r'Unable to register cu(?:DNN|FFT|BLAS) factory: Attempting to register factory for plugin cu(?:DNN|FFT|BLAS) '
        r'when one has already been registered',
    ),
    (r'cpu_feature_guard\.cc', r'This TensorFlow binary is optimized to use available CPU instructions'),
    (r'py_utils\.cc', r'TF-TRT Warning: Could not find TensorRT'),
)
# Severity I, W or E (never F, fatal), then the rest of the prefix, the file (any directory) and its line number.
_STARTUP_LINE = re.compile(
    r'(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: )?[IWE][\d:. ]*(?:\S*/)?(?:'
    + '|'.join(f'{file}:\\d+\\] {message}' for file, message in _STARTUP_MESSAGES)
    + ')'
)
# The second line of the CPU instructions notice, printed without a prefix.
_CPU_NOTICE_CONTINUATION = re.compile(
    r'To enable the following instructions: [\w ,.-]+, in other operations, rebuild TensorFlow with the '
    r'appropriate compiler flags\.'
)

# The INFO lines each checkpoint save logs: (logger, the file that logs it, the start of its format string).
_CHECKPOINT_SAVE_LINES = (
    ('tensorflow', 'builder_impl.py', 'Assets written to'),
    ('absl', 'fingerprinting_utils.py', 'Writing fingerprint to'),
    ('absl', 'file_program_state_manager.py', 'Program state saved'),
)

_TENSORFLOW = 'tensorflow'
_TFF = 'tensorflow_federated'


def verbose(environ: Any = None) -> bool:
    """Whether the environment (default `os.environ`) asks for everything (``FEDPERSONAL_VERBOSE_TF``, not 0)."""
    value = (os.environ if environ is None else environ).get(VERBOSE_VARIABLE, '')
    return value.strip() not in ('', '0')


def is_startup_line(line: str) -> bool:
    """Whether `line` is one of TensorFlow's known start-up lines (see the module docstring)."""
    line = line.rstrip('\r\n')
    return bool(_STARTUP_LINE.match(line) or _CPU_NOTICE_CONTINUATION.fullmatch(line))


def filter_startup_lines(text: str) -> str:
    """`text` without TensorFlow's known start-up lines; every other line is kept as it is.

    Example:

    >>> filter_startup_lines('To enable the following instructions: AVX2 FMA, in other operations, rebuild '
    ...                      'TensorFlow with the appropriate compiler flags.\\nF op.cc:1] Check failed: x\\n')
    'F op.cc:1] Check failed: x\\n'
    """
    return ''.join(line for line in text.splitlines(keepends=True) if not is_startup_line(line))


def _forward(source: BinaryIO, sink: BinaryIO) -> None:
    """Copies `source` to `sink` line by line as lines arrive, without TensorFlow's start-up lines."""
    for line in source:
        if is_startup_line(line.decode('utf-8', 'replace')):
            continue
        with contextlib.suppress(OSError):  # A closed stderr: keep draining, so the importer never blocks.
            sink.write(line)
            sink.flush()


@contextlib.contextmanager
def _filtered_stderr() -> Iterator[None]:
    """File descriptor 2 goes through the filter process (`_forward`) for the duration of the block.

    Nothing is filtered with ``FEDPERSONAL_VERBOSE_TF`` set (read now: a binary sets it from ``--verbosity``
    after ``import fedpersonal``), or if the filter cannot start (no descriptor 2, no Python executable, this
    file not on disk).
    """
    import subprocess  # pylint: disable=g-import-not-at-top  # Only here: keeps `import fedpersonal` light.

    if verbose():
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        if not sys.executable or not os.path.isfile(__file__):
            raise OSError('no filter program')
        # -I -S: the standard library only; this file imports nothing else.
        filter_process = subprocess.Popen(
            [sys.executable, '-I', '-S', __file__], stdin=subprocess.PIPE, stdout=saved, stderr=saved
        )
    except OSError:
        os.close(saved)
        yield
        return
    assert filter_process.stdin is not None
    try:
        _flush_stderr()
        os.dup2(filter_process.stdin.fileno(), 2)
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        filter_process.stdin.close()  # With descriptor 2 restored: end of input, the filter exits.
        with contextlib.suppress(subprocess.TimeoutExpired):
            # A process started during the import that still holds the old descriptor 2 keeps the filter alive.
            filter_process.wait(timeout=5)


def _flush_stderr() -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()


class _WrappingLoader:
    """Runs `loader.exec_module` inside `around`, then puts `loader` back on the module and its spec.

    Not an `importlib.abc.Loader` subclass (importing `importlib.abc` costs 20 ms); the import system needs only
    `create_module` and `exec_module`.
    """

    def __init__(self, loader: Any, around: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        self._loader = loader
        self._around = around

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            with self._around():
                self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader

    def __getattr__(self, name: str) -> Any:  # Everything else (get_resource_reader, is_package, ...) is the loader's.
        return getattr(self._loader, name)


class _FirstImportHook:
    """A `sys.meta_path` finder that wraps the first import of each of `watched` (name -> context manager)."""

    def __init__(self, watched: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]]) -> None:
        self.watched = watched

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        around = self.watched.pop(fullname, None)
        if around is None:
            return None
        if not self.watched:
            _remove(self)
        spec = None
        for finder in list(sys.meta_path):  # What the import system would find without this hook.
            find_spec = getattr(finder, 'find_spec', None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return None  # Imported (or not found) as without the hook.
        spec.loader = _WrappingLoader(spec.loader, around)
        return spec


def _remove(hook: _FirstImportHook) -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(hook)


@contextlib.contextmanager
def _release_tff_context_at_exit() -> Iterator[None]:
    yield
    from fedpersonal.runtime import execution_context  # pylint: disable=g-import-not-at-top  # TFF is imported now.

    execution_context.release_at_exit()


def install() -> None:
    """Adds the import hook (see the module docstring) for whichever of TensorFlow and TFF is not imported yet.

    Idempotent; `fedpersonal`'s ``__init__`` calls it. With ``FEDPERSONAL_VERBOSE_TF`` set when TensorFlow is
    imported, its import is left alone (TFF's context is still released at exit).
    """
    if any(isinstance(finder, _FirstImportHook) for finder in sys.meta_path):
        return
    watched: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {}
    if _TENSORFLOW not in sys.modules:
        watched[_TENSORFLOW] = _filtered_stderr
    if _TFF not in sys.modules:
        watched[_TFF] = _release_tff_context_at_exit
    if watched:
        sys.meta_path.insert(0, _FirstImportHook(watched))


_INFO = 20  # logging.INFO


class _DropLogLines:
    """A logging filter: drops the INFO (and lower) records logged from `file` whose format string starts with
    `prefix`, for each ``(file, prefix)`` of `lines`."""

    def __init__(self, lines: Sequence[tuple[str, str]]) -> None:
        self._lines = tuple(lines)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > _INFO:
            return True
        message = str(record.msg)
        return not any(record.filename == file and message.startswith(prefix) for file, prefix in self._lines)


@contextlib.contextmanager
def checkpoint_save_lines_dropped() -> Iterator[None]:
    """Within the block, the INFO lines a checkpoint save logs (`_CHECKPOINT_SAVE_LINES`) are dropped.

    On the loggers themselves (a `logging.Filter`), so every handler (absl's, TensorFlow's own, a test's) and the
    helper thread of the save are covered; nothing is dropped with ``FEDPERSONAL_VERBOSE_TF`` set.
    """
    import logging  # pylint: disable=g-import-not-at-top,redefined-outer-name

    if verbose():
        yield
        return
    added = []
    for name in sorted({logger for logger, _, _ in _CHECKPOINT_SAVE_LINES}):
        drop = _DropLogLines([(file, prefix) for logger, file, prefix in _CHECKPOINT_SAVE_LINES if logger == name])
        logging.getLogger(name).addFilter(drop)
        added.append((name, drop))
    try:
        yield
    finally:
        for name, drop in added:
            logging.getLogger(name).removeFilter(drop)


if __name__ == '__main__':  # The filter process of `_filtered_stderr`: standard input to standard output.
    import signal  # pylint: disable=g-import-not-at-top

    # A Ctrl-C during the import reaches the whole process group: the importer handles it; this process
    # must keep forwarding what the import still writes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _forward(sys.stdin.buffer, sys.stdout.buffer)
