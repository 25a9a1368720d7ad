"""Deterministic fault injection for the crash-safety tests: kill (or fail) the process at a named point.

Inert unless the environment variable ``FEDPERSONAL_FAULT`` is set (one dictionary lookup per point). Its value is
``<point>:<n>`` or ``<point>:<n>:<action>``: at the `n`-th time this process reaches `point` (counted from 1),
``kill`` (the default) sends it ``SIGKILL`` (no handler, no cleanup: as a power cut or the OOM killer would),
``enospc`` raises ``OSError(ENOSPC)`` (a full disk), ``sigterm`` sends it ``SIGTERM`` (as a scheduler stopping a
job) and ``sigint`` sends ``SIGINT`` to its process group (as Ctrl-C in a terminal); after either signal the
process goes on, and its handlers decide (`fedpersonal.program.stop_signals`). The points (`POINTS`), in the order
a round reaches them:

* ``round``: a round's clients have run and their new private states are written to the store (pending), nothing
  of the round is released or checkpointed yet (`fedpersonal.program.training_loop`);
* ``evaluation``: a round's evaluation has run, its metrics are not released yet;
* ``metrics``: a round's row is in ``metrics.csv``, not yet in TensorBoard (`fedpersonal.program.outputs`);
* ``checkpoint_write``: a checkpoint's files are written in the staging directory, not yet marked complete;
* ``checkpoint_staged``: the checkpoint is complete (``ready_R``), the client state store has not committed round R;
* ``client_state_commit``: inside the SQLite store's commit transaction, before it is committed;
* ``checkpoint_committed``: the store committed round R, the checkpoint is not yet published;
* ``json`` / ``results``: a JSON file (``results`` for ``results.json``, ``json`` for any other) is written to its
  temporary file, not yet renamed over the old one.

Example (tests/program/crash_safety_test.py): ``FEDPERSONAL_FAULT=checkpoint_staged:2 python
experiments/furl_personalization.py ...`` dies right after staging its second checkpoint.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = 'FEDPERSONAL_FAULT'
POINTS = (
    'round',
    'evaluation',
    'metrics',
    'checkpoint_write',
    'checkpoint_staged',
    'client_state_commit',
    'checkpoint_committed',
    'json',
    'results',
)
ACTIONS = ('', 'kill', 'enospc', 'sigterm', 'sigint')
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """Marks the fault point `name`: kills or fails the process if ``FEDPERSONAL_FAULT`` names this hit.

    Raises:
      OSError: ``ENOSPC``, when the action is ``enospc``.
      ValueError: ``FEDPERSONAL_FAULT`` is malformed or names an unknown point.
    """
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, rest = spec.partition(':')
    count, _, action = rest.partition(':')
    if target not in POINTS or not count.isdigit() or action not in ACTIONS:
        raise ValueError(f'{ENV}={spec!r}: expected <point>:<n>[:{"|".join(ACTIONS[1:])}] with a point of {POINTS}.')
    if name != target:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != int(count):
        return
    if action == 'enospc':
        raise OSError(errno.ENOSPC, f'{os.strerror(errno.ENOSPC)} (injected by {ENV}={spec})')
    if action == 'sigterm':
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == 'sigint':
        os.killpg(os.getpgrp(), signal.SIGINT)
    else:
        os.kill(os.getpid(), signal.SIGKILL)
