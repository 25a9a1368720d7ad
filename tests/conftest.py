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
