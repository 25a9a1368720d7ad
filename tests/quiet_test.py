"""Quiet by default (issue 62): TensorFlow's start-up lines are left out, every other line is kept, TFF's
default context is released at exit, and ``FEDPERSONAL_VERBOSE_TF=1`` shows everything."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from absl import logging as absl_logging

from fedpersonal import quiet

# Everything TensorFlow 2.14 wrote at its import on this CPU machine with TF_CPP_MIN_LOG_LEVEL=0 (issue 62).
STARTUP = """\
2026-12-06 07:25:37.811971: I tensorflow/core/util/port.cc:111] oneDNN custom operations are on. You may see \
slightly different numerical results due to floating-point round-off errors from different computation orders. \
To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
2026-12-06 07:25:37.814554: I tensorflow/tsl/cuda/cudart_stub.cc:28] Could not find cuda drivers on your machine, \
GPU will not be used.
2026-12-06 07:25:37.864315: E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:9342] Unable to register \
cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
2026-12-06 07:25:37.864402: E tensorflow/compiler/xla/stream_executor/cuda/cuda_fft.cc:609] Unable to register \
cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered
2026-12-06 07:25:37.864433: E tensorflow/compiler/xla/stream_executor/cuda/cuda_blas.cc:1518] Unable to register \
cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered
2026-12-06 07:25:37.875537: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary is \
optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI AMX_TILE AMX_INT8 AMX_BF16 FMA, \
in other operations, rebuild TensorFlow with the appropriate compiler flags.
2026-12-06 07:25:39.219521: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not find \
TensorRT
I1206 07:25:37.811971  4242 port.cc:113] oneDNN custom operations are on. You may see slightly different results.
"""
# Real errors, some from the very files (or with the very words) of the start-up lines: all are kept.
REAL = """\
2026-12-06 07:25:38.000001: E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:439] Could not create cudnn \
handle: CUDNN_STATUS_INTERNAL_ERROR
2026-12-06 07:25:38.000002: F tensorflow/core/platform/cpu_feature_guard.cc:37] The TensorFlow library was compiled \
to use AVX instructions, but these aren't available on your machine.
2026-12-06 07:25:38.000003: F tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:9342] Unable to register \
cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
2026-12-06 07:25:38.000004: E tensorflow/core/framework/op_kernel.cc:1839] OP_REQUIRES failed at save_restore.cc
Traceback (most recent call last):
ImportError: Could not find cuda drivers on your machine, GPU will not be used.
"""


def test_the_filter_drops_exactly_the_startup_lines():
    assert all(quiet.is_startup_line(line) for line in STARTUP.splitlines())
    assert not any(quiet.is_startup_line(line) for line in REAL.splitlines())
    mixed = ''.join(a + b for a, b in zip(STARTUP.splitlines(True), REAL.splitlines(True)))
    assert quiet.filter_startup_lines(mixed) == REAL
    assert quiet.filter_startup_lines(STARTUP + 'no newline at the end') == 'no newline at the end'


def test_lines_written_to_descriptor_2_inside_the_filter_pass_on_unless_startup_lines(capfd):
    with quiet._filtered_stderr():  # pylint: disable=protected-access
        os.write(2, STARTUP.encode())
        os.write(2, REAL.encode())
        os.write(2, b'a last line, unfinished')
    os.write(2, b'after\n')  # After the filter has passed on everything: in order.
    assert capfd.readouterr().err == REAL + 'a last line, unfinished' + 'after\n'


def test_the_hook_filters_the_first_import_of_its_module_only_then_removes_itself(tmp_path, capfd, monkeypatch):
    (tmp_path / 'noisy_module.py').write_text(
        f'import os\nos.write(2, {(STARTUP + REAL).encode()!r})\nimported = getattr(__loader__, "name", None)\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'noisy_module', raising=False)
    hook = quiet._FirstImportHook({'noisy_module': quiet._filtered_stderr})  # pylint: disable=protected-access
    monkeypatch.setattr(sys, 'meta_path', [hook, *sys.meta_path])
    import noisy_module  # type: ignore[import-not-found]  # pylint: disable=g-import-not-at-top,import-outside-toplevel

    assert capfd.readouterr().err == REAL
    assert hook not in sys.meta_path
    # The module's own loader, during its execution (it delegates) and after it.
    assert noisy_module.imported == 'noisy_module' and type(noisy_module.__loader__).__name__ == 'SourceFileLoader'
    assert noisy_module.__spec__.loader is noisy_module.__loader__


def test_a_crash_inside_the_filtered_import_still_shows_the_lines_written_before_it(tmp_path):
    # A temporary file read back after the import would lose them: the filter is a process of its own.
    (tmp_path / 'crashing_module.py').write_text(f'import os\nos.write(2, {(STARTUP + REAL).encode()!r})\nos.abort()\n')
    code = (
        'import sys; from fedpersonal import quiet; '
        "sys.meta_path.insert(0, quiet._FirstImportHook({'crashing_module': quiet._filtered_stderr})); "
        'import crashing_module'
    )
    run = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGABRT
    assert run.stderr == REAL


def test_verbose_environment():
    assert quiet.verbose({'FEDPERSONAL_VERBOSE_TF': '1'}) and quiet.verbose({'FEDPERSONAL_VERBOSE_TF': 'yes'})
    assert not quiet.verbose({}) and not quiet.verbose({'FEDPERSONAL_VERBOSE_TF': '0'})


def test_only_the_checkpoint_save_lines_are_dropped_and_only_within_the_block(caplog, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_VARIABLE, raising=False)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger='absl')

    def log(level, filename, message):
        logger = logging.getLogger('absl')
        logger.handle(logger.makeRecord('absl', level, f'/x/{filename}', 1, message, (), None))

    with quiet.checkpoint_save_lines_dropped():
        log(logging.INFO, 'file_program_state_manager.py', 'Program state saved: %s')
        log(logging.WARNING, 'file_program_state_manager.py', 'Program state saved: %s')  # A warning: kept.
        log(logging.INFO, 'training_loop.py', 'Program state saved: %s')  # Another file: kept.
        absl_logging.info('[run] round 1/2')
    log(logging.INFO, 'file_program_state_manager.py', 'Program state saved: %s')  # After the block: kept.
    assert [(r.levelno, r.filename) for r in caplog.records if r.name == 'absl'] == [
        (logging.WARNING, 'file_program_state_manager.py'),
        (logging.INFO, 'training_loop.py'),
        (logging.INFO, 'quiet_test.py'),
        (logging.INFO, 'file_program_state_manager.py'),
    ]


# Lines that must never reach the terminal from an import through fedpersonal (issue 62).
_NOISE = (
    'cuDNN',
    'cuFFT',
    'cuBLAS',
    'cuda drivers',
    'oneDNN',
    'cpu_feature_guard',
    'To enable the following',
    'TensorRT',
)


def _child(code: str, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k not in (quiet.VERBOSE_VARIABLE, 'PYTHONWARNINGS')}
    environ['TF_CPP_MIN_LOG_LEVEL'] = '0'  # Every level: the import's 10 lines, the 3 cuDNN/cuFFT/cuBLAS ones at 2.
    return subprocess.Popen(
        [sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**environ, **env}
    )


def test_importing_tff_through_fedpersonal_prints_nothing_unless_asked():
    quiet_run = _child('import fedpersonal.algorithms; import tensorflow_federated')
    # The control: with everything shown the import prints the lines (so they are checked here). TFF imported by
    # `install_worker_tracking` (as tests/conftest.py does), which holds its lock while the hook registers the exit
    # run: that deadlocked once.
    verbose_run = _child(
        'from fedpersonal import runtime; runtime.install_worker_tracking()', FEDPERSONAL_VERBOSE_TF='1'
    )
    out, err = quiet_run.communicate(timeout=300)
    assert quiet_run.returncode == 0, err
    assert not out and not err, err  # No start-up line, no "Exception ignored in: ... ServiceManager.__del__".
    _, verbose_err = verbose_run.communicate(timeout=300)
    assert verbose_run.returncode == 0, verbose_err
    assert all(word in verbose_err for word in ('cuDNN', 'cuda drivers', 'TensorRT')), verbose_err


_COMPUTATION = """
import fedpersonal.algorithms
import numpy as np
import tensorflow_federated as tff
from fedpersonal.runtime import execution_context

assert tff.tensorflow.computation(lambda x: x * 2, np.int32)(3) == 6  # TFF's default context: not LocalRuntime.
print(*execution_context.worker_pids_of_this_process())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def test_a_computation_in_tffs_default_context_ends_quietly_and_stops_its_worker():
    run = _child(_COMPUTATION, TF_CPP_MIN_LOG_LEVEL='2')
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert not [line for line in err.splitlines() if any(word in line for word in _NOISE)], err
    assert 'Exception ignored' not in err, err
    (worker,) = map(int, out.split())  # Started by the computation; it used to outlive the program.
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
