"""Test session setup: quiet TF, and no TFF worker may outlive the session."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top

import fedpersonal  # pylint: disable=g-import-not-at-top,unused-import  (installs worker tracking first)
from fedpersonal import runtime  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session', autouse=True)
def _no_orphaned_tff_workers():
    yield
    runtime.shutdown()
    leftover = runtime.worker_pids_of_this_process()
    assert not leftover, f'TFF worker_binary processes left running after the test session: {leftover}'
