"""Test session setup: quiet TF, and no TFF worker may outlive the session."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top

from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

# Tests run TFF computations in TFF's default context too: track its workers from the start.
runtime.install_worker_tracking()


@pytest.fixture(scope='session', autouse=True)
def _no_orphaned_tff_workers():
    yield
    runtime.shutdown()
    leftover = runtime.worker_pids_of_this_process()
    assert not leftover, f'TFF worker_binary processes left running after the test session: {leftover}'


# The slowest tests (binaries killed and restarted, notebooks, end-to-end runs; `--durations`) start first, so that
# pytest-xdist's workers do not end the session waiting on one of them while the other has nothing left to do.
_SLOW_FIRST = (
    'tests/program/crash_safety_test.py::test_killed_anywhere',
    'tests/experiments/hpfl_user_modeling_test.py::test_binary_killed',
    'tests/runtime/engine_workers_test.py::test_pfl_benchmark',
    'tests/runtime/engine_workers_test.py::test_binary',
    'tests/runtime/engine_workers_test.py::test_hpfl',
    'tests/experiments/furl_personalization_test.py::test_four_configurations',
    'tests/experiments/pfl_benchmark_test.py::test_the_other_rows',
    'tests/program/output_dir_failures_test.py::test_a_directory_made_read_only',
    'tests/experiments/movielens_mf_test.py::test_resumes_from_checkpoint',
    'tests/notebooks_test.py',
    'tests/reproducibility_test.py',
    'tests/experiments/feddva_test.py',
    'tests/simulation/feddva_engine_test.py',
    'tests/algorithms/feddva_test.py',
)


def pytest_configure(config):
    config.addinivalue_line(
        'markers',
        'numeric: a numeric equivalence (engine vs per-client, workers vs local, against TFF or a plain loop) whose '
        'bound is derived (tests/tolerances.py); scripts/test.sh runs these again under another instruction set.',
    )


def pytest_report_header(config):
    del config
    settings = {k: os.environ[k] for k in ('ONEDNN_MAX_CPU_ISA', 'TF_ENABLE_ONEDNN_OPTS') if k in os.environ}
    return f'oneDNN setting: {settings or "native"}'


def pytest_collection_modifyitems(config, items):
    del config

    def rank(item):
        return next((i for i, prefix in enumerate(_SLOW_FIRST) if item.nodeid.startswith(prefix)), len(_SLOW_FIRST))

    items.sort(key=rank)  # Stable: the order within each rank is kept.
