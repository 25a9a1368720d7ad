"""Server checkpoints written atomically together with the client state store's commit (`Checkpoints`).

A checkpoint of round R is staged in ``checkpoints/.staging`` (``program_state_R``, renamed ``ready_R`` once
complete), then the store commits round R, then ``ready_R`` is renamed into ``checkpoints/program_state_R`` (what
`tff.program.FileProgramStateManager.load_latest` reads). A run killed at any point restarts from a consistent
pair: `Checkpoints.recover` deletes a partial or uncommitted staged checkpoint (with the ``*_temp*`` directories a
killed `tf.saved_model.save` leaves) and publishes a complete one whose round the store committed. Each step is a
fault point of `fedpersonal.faults` (tests/program/crash_safety_test.py kills runs there).

Every checkpoint carries ``manifest.json`` (each file's size and SHA-256), written last into the staged directory,
so a published checkpoint has one. `Checkpoints.load_latest` verifies it before loading: a damaged or partial
checkpoint (a disk full at the wrong moment, a partial copy of the run directory, bit rot) is named in one log line,
moved aside to ``checkpoints/damaged_program_state_R``, and the newest intact one is used. A stateful run whose
client state store has committed a round after that intact checkpoint cannot fall back (the store keeps no older
versions, and server and client states must come from the same round): it stops with `DamagedCheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from absl import logging
from google.protobuf import message

from fedpersonal import errors
from fedpersonal import faults
from fedpersonal import quiet
from fedpersonal.program import output_dir
from fedpersonal.program import outputs as outputs_lib

PREFIX = 'program_state_'  # The version prefix of tff.program.FileProgramStateManager (ExperimentOutputs' default).
READY = 'ready_'
KEEP_CHECKPOINTS = 2
MANIFEST = 'manifest.json'
DAMAGED = 'damaged_'
_CHUNK = 1 << 20
# What loading a damaged checkpoint written before manifests raises ("Read less bytes than requested", "SavedModel
# Fingerprint Error", ...). Checked only for such checkpoints: an intact one that fails to load is not damage.
_READ_ERRORS = (tf.errors.OpError, IndexError, OSError, RuntimeError, message.DecodeError)


class DamagedCheckpointError(errors.InputError):
    """The newest checkpoint is damaged and the run cannot fall back to an older one without mixing rounds."""


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, 'rb') as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _files(directory: str) -> list[str]:
    """The files below `directory` other than the manifest, as sorted relative paths."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


def write_manifest(directory: str) -> None:
    """Writes ``manifest.json`` into the checkpoint `directory`: every other file's size and SHA-256."""
    entries = {
        name: {'size': os.path.getsize(os.path.join(directory, name)), 'sha256': _digest(os.path.join(directory, name))}
        for name in _files(directory)
    }
    path = os.path.join(directory, MANIFEST)
    with open(path + '.tmp', 'w') as f:
        json.dump({'files': entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + '.tmp', path)


def damage(directory: str) -> str | None:
    """What is wrong with the checkpoint `directory` against its manifest, or None if it is intact.

    A checkpoint written before manifests existed (none in it) is taken as intact here; `Checkpoints.load_latest`
    still treats its failure to load as damage.

    Example:

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> with open(os.path.join(directory, 'a'), 'w') as f:
    ...     _ = f.write('weights')
    >>> write_manifest(directory)
    >>> damage(directory) is None
    True
    >>> with open(os.path.join(directory, 'a'), 'w') as f:
    ...     _ = f.write('weightz')
    >>> damage(directory)
    'a: its checksum differs from the manifest'
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, 'rb') as f:
            expected = json.loads(f.read().decode())['files']
        if not isinstance(expected, dict):
            raise TypeError
    except (ValueError, TypeError, KeyError):
        return f'{MANIFEST} is not readable'
    for name in sorted(set(_files(directory)) - set(expected)):
        return f'{name}: not in the manifest'
    for name, entry in sorted(expected.items()):
        file = os.path.join(directory, str(name))
        if not isinstance(entry, dict) or not os.path.isfile(file):
            return f'{name}: missing'
        size = os.path.getsize(file)
        if size != entry.get('size'):
            return f'{name}: {size} bytes, the manifest says {entry.get("size")}'
        if _digest(file) != entry.get('sha256'):
            return f'{name}: its checksum differs from the manifest'
    return None


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

    def load_latest(self, structure: Any, store: Any) -> tuple[Any, int]:
        """The newest intact checkpoint as ``(state, round)``, or ``(None, 0)`` if there is none.

        Each checkpoint newer than the one used is damaged (`damage`, or a checkpoint without a manifest that fails
        to load): it is named in a log line and moved to ``checkpoints/damaged_program_state_R``.

        Args:
          structure: The structure of the state to load (as `tff.program.FileProgramStateManager.load`).
          store: The run's client state store, or None (stateless).

        Raises:
          DamagedCheckpointError: A newer checkpoint is damaged and `store` has committed a round after the
            intact one (nothing is moved then: restoring the damaged checkpoint resumes the run).
        """
        versions = outputs_lib.run_coroutine(self.manager.get_versions()) or []
        damaged: list[tuple[int, str]] = []
        loaded, version = None, 0
        for candidate in reversed(versions):
            path = os.path.join(self.root, f'{PREFIX}{candidate}')
            problem = damage(path)
            if problem is None:
                try:
                    loaded = outputs_lib.run_coroutine(self.manager.load(candidate, structure))
                except _READ_ERRORS as error:
                    if os.path.exists(os.path.join(path, MANIFEST)):
                        raise  # Intact files that do not load: not damage (e.g. another structure), a bug to see.
                    problem = f'it does not load ({type(error).__name__}: {error})'
                else:
                    version = candidate
                    break
            damaged.append((candidate, problem))
        if not damaged:
            return loaded, version
        committed = store.committed_round() if store is not None else 0
        if committed > version:
            newest, problem = damaged[0]
            fallback = f'the intact checkpoint of round {version}' if loaded is not None else 'no intact checkpoint'
            raise DamagedCheckpointError(
                f'The newest checkpoint, {os.path.join(self.root, f"{PREFIX}{newest}")}, is damaged ({problem}). '
                f'The client state store holds the private states of round {committed} and keeps no older ones, so '
                f'the run cannot fall back to {fallback} without pairing server and client states of different '
                f'rounds. Restore that checkpoint from a copy to resume, or start over (--fresh_start, or another '
                f'--output_dir).'
            )
        with output_dir.writing(os.path.dirname(self.root)):
            for candidate, problem in damaged:
                target = os.path.join(self.root, f'{DAMAGED}{PREFIX}{candidate}')
                suffix = 0
                while os.path.exists(target if not suffix else f'{target}.{suffix}'):
                    suffix += 1
                target = target if not suffix else f'{target}.{suffix}'
                os.replace(os.path.join(self.root, f'{PREFIX}{candidate}'), target)
                logging.warning(
                    'The checkpoint of round %d is damaged (%s): moved to %s; %s.',
                    candidate,
                    problem,
                    target,
                    f'resuming from round {version}' if loaded is not None else 'starting over (no intact checkpoint)',
                )
        return loaded, version

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
            with quiet.checkpoint_save_lines_dropped():  # Three INFO lines a save, each naming a temporary path.
                outputs_lib.run_coroutine(tff.program.FileProgramStateManager(self.staging).save(checkpoint, round_num))
            write_manifest(staged)
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
