"""Server checkpoints written atomically together with the client state store's commit (`Checkpoints`).

A checkpoint of round R is staged in ``checkpoints/.staging`` (``program_state_R``, renamed ``ready_R`` once
complete), then the store commits round R, then ``ready_R`` is renamed into ``checkpoints/program_state_R`` (what
`tff.program.FileProgramStateManager.load_latest` reads). A run killed at any point restarts from a consistent
pair: `Checkpoints.recover` deletes a partial or uncommitted staged checkpoint (with the ``*_temp*`` directories a
killed `tf.saved_model.save` leaves) and publishes a complete one whose round the store committed. Each step is a
fault point of `fedpersonal.faults` (tests/program/crash_safety_test.py kills runs there).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import tensorflow_federated as tff
from absl import logging

from fedpersonal import faults
from fedpersonal.program import output_dir
from fedpersonal.program import outputs as outputs_lib

PREFIX = 'program_state_'  # The version prefix of tff.program.FileProgramStateManager (ExperimentOutputs' default).
READY = 'ready_'
KEEP_CHECKPOINTS = 2


class Checkpoints:
    """The checkpoints of one `ExperimentOutputs` (``<run directory>/checkpoints``)."""

    def __init__(self, outputs: outputs_lib.ExperimentOutputs):
        self.root = outputs.path('checkpoints')
        self.staging = os.path.join(self.root, '.staging')
        self.manager = outputs.state_manager

    def recover(self, store: Any) -> None:
        """Completes or deletes what a killed `save` left: publishes a complete staged checkpoint whose round
        `store` committed, deletes every other staged entry and any temporary directory of a killed write."""
        if os.path.isdir(self.root):  # A write killed inside tf.saved_model.save (directly into the root before
            for entry in os.listdir(self.root):  # checkpoints were staged) leaves program_state_R_tempNNNN.
                if entry.startswith(PREFIX) and '_temp' in entry:
                    shutil.rmtree(os.path.join(self.root, entry), ignore_errors=True)
        if not os.path.isdir(self.staging):
            return
        for entry in sorted(os.listdir(self.staging)):
            path = os.path.join(self.staging, entry)
            if entry.startswith(READY) and entry[len(READY) :].isdigit():
                version = int(entry[len(READY) :])
                target = os.path.join(self.root, f'{PREFIX}{version}')
                committed = store.committed_round() if store is not None else version
                if committed >= version and not os.path.exists(target):
                    os.replace(path, target)
                    logging.info(
                        'Completed the checkpoint of round %d interrupted after its client states were committed.',
                        version,
                    )
                    continue
            shutil.rmtree(path, ignore_errors=True)

    def save(self, checkpoint: Any, round_num: int, store: Any) -> None:
        """Stages `checkpoint` as round `round_num`, commits `store` (if any) to that round, then publishes it and
        deletes all but the latest `KEEP_CHECKPOINTS` published checkpoints.

        Raises:
          OutputDirectoryNotWritableError: The checkpoint cannot be written (read-only or full directory); the
            checkpoints published before are untouched and a restart resumes from the latest of them.
        """
        staged = os.path.join(self.staging, f'{PREFIX}{round_num}')
        ready = os.path.join(self.staging, f'{READY}{round_num}')
        with output_dir.writing(os.path.dirname(self.root)):
            if os.path.exists(staged):  # Left by an earlier failed write of this round (e.g. a full disk).
                shutil.rmtree(staged)
            outputs_lib.run_coroutine(tff.program.FileProgramStateManager(self.staging).save(checkpoint, round_num))
            faults.point('checkpoint_write')
            os.replace(staged, ready)
            faults.point('checkpoint_staged')
            if store is not None:
                store.commit(round_num)
            faults.point('checkpoint_committed')
            os.replace(ready, os.path.join(self.root, f'{PREFIX}{round_num}'))
        versions = outputs_lib.run_coroutine(self.manager.get_versions()) or []
        for version in versions[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(os.path.join(self.root, f'{PREFIX}{version}'), ignore_errors=True)
