"""A clean stop on SIGINT or SIGTERM: the training loop finishes its round, checkpoints it, then stops.

While `deferred()` is active (`fedpersonal.program.run_learning_process` holds it for its whole run, in the main
thread only), the first SIGINT (Ctrl-C) or SIGTERM does not interrupt the round in flight: it is recorded
(`pending`), the loop checkpoints the round it is finishing and calls `stop`, which raises `KeyboardInterrupt`
(SIGINT) or `SystemExit(128 + 15)` (SIGTERM, exit status 143). Unwinding closes the client state store and the
runtime (`fedpersonal.runtime.LocalRuntime` stops its workers). A second signal acts at once, as by default.
A restart with the same command resumes from that checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from absl import logging

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []
_active = [False]


def _record(signum: int, frame: Any) -> None:
    del frame
    _received.append(signum)
    for s in _SIGNALS:  # A second signal stops at once.
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    logging.warning(
        'Received %s: stopping after the current round, once it is checkpointed (send it again to stop at once).',
        signal.Signals(signum).name,
    )


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Defers SIGINT and SIGTERM to the end of the current round for the ``with`` block (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or _active[0]:  # Nested: the outer one acts.
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    _received.clear()
    _active[0] = True
    for s in _SIGNALS:
        signal.signal(s, _record)
    try:
        yield
    finally:
        _active[0] = False
        for s, handler in previous.items():
            signal.signal(s, handler)


def pending() -> bool:
    """Whether a stop signal arrived (the loop checkpoints the round it is finishing and calls `stop`)."""
    return bool(_received)


def stop(name: str, round_num: int, unit: str = 'round') -> None:
    """Raises what the first received signal would have: `KeyboardInterrupt` (SIGINT) or `SystemExit(143)`."""
    signum = _received[0]
    logging.info('[%s] stopped by %s after %s %d (checkpointed).', name, signal.Signals(signum).name, unit, round_num)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)
