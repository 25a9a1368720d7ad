"""Progress of long phases with an ETA, in the run's log (absl logging), for training rounds and evaluations.

`logged(iterable, total, description)` is `tqdm` writing its status line through absl logging (so it lands in the
same log as the round lines, in a terminal, a log file or a notebook), only for phases that last longer than a
few seconds and at most every `interval` seconds. `waiting(description, expected_seconds)` does the same for one
long call that cannot report its own progress (a TFF computation over every client): elapsed time, and the time
left as estimated from the expected duration (e.g. the previous call's). `eta_text` is the training loop's estimate: training and
evaluation time per round measured separately, so that the ETA is not off by the evaluations still to come;
`epoch_text` is the same for centralized training's epochs. `should_log_round` is the rule that keeps the round lines
readable: a run of thousands of short rounds logs a line at most every `ROUND_LINE_SECONDS` (and the rounds that
matter), while every round's metrics still go to ``metrics.csv`` and TensorBoard.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import tqdm  # type: ignore[import-untyped]
from absl import logging

T = TypeVar('T')

ROUND_LINE_SECONDS = 30.0
"""The training loop logs a round line at least this many seconds after the previous one (`should_log_round`)."""


class _LogWriter:
    """A file-like object for tqdm that logs each status line (tqdm writes ``'\\r' + line``)."""

    def write(self, text: str) -> None:
        line = text.strip('\r\n ')
        if line:
            logging.info('%s', line)

    def flush(self) -> None:
        pass


def logged(
    iterable: Iterable[T], total: int | None, description: str, *, delay: float = 5.0, interval: float = 10.0
) -> Iterator[T]:
    """Iterates `iterable`, logging ``description: n/total [elapsed<eta, rate]`` while it lasts.

    Args:
      iterable: What to iterate.
      total: Its length (for the ETA), if known.
      description: What is being done, e.g. ``'[fedrecon] evaluation: clients'``.
      delay: Seconds before the first line (short phases log nothing).
      interval: Least seconds between two lines.

    Yields:
      The items of `iterable`.
    """
    yield from tqdm.tqdm(
        iterable,
        total=total,
        desc=description,
        file=_LogWriter(),
        delay=delay,
        mininterval=interval,
        maxinterval=interval * 10,
        ascii=True,
        dynamic_ncols=False,
        ncols=100,
        leave=False,
    )


@contextlib.contextmanager
def waiting(
    description: str, expected_seconds: float | None = None, *, delay: float = 5.0, interval: float = 10.0
) -> Iterator[None]:
    """Logs ``description: 40s elapsed, ~20s left`` every `interval` seconds while the body runs (after `delay`).

    For one long call with no progress of its own. The time left is ``expected_seconds`` minus the elapsed time
    (``'~?'`` without an estimate, ``'over the expected ...'`` once exceeded). Nothing is logged if the body ends
    within `delay`.

    Example:

    >>> with waiting('evaluation: 3 clients', expected_seconds=1.0, delay=60.0):
    ...     pass
    """
    done = threading.Event()
    started = time.monotonic()

    def report() -> None:
        wait = delay
        while not done.wait(wait):
            elapsed = time.monotonic() - started
            if expected_seconds is None:
                left = 'time left unknown (first call)'
            elif elapsed <= expected_seconds:
                left = f'~{expected_seconds - elapsed:.0f}s left'
            else:
                left = f'over the expected {expected_seconds:.0f}s'
            logging.info('%s: %.0fs elapsed, %s', description, elapsed, left)
            wait = interval

    reporter = threading.Thread(target=report, name='fedpersonal-progress', daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


def eta_text(
    train_seconds: Sequence[float],
    evaluation_seconds: Sequence[float],
    round_num: int,
    total_rounds: int,
    rounds_per_evaluation: int,
) -> str:
    """The time a run has left after `round_num`, as shown in the round lines.

    The mean training round time times the rounds left, plus the mean evaluation time times the evaluations left
    (every `rounds_per_evaluation` rounds and after the last); a lower bound, marked ``'>='``, until an evaluation
    has been timed.

    Example:

    >>> eta_text([2.0], [], 1, 10, 5), eta_text([2.0, 2.0], [30.0], 5, 12, 5)
    ('>=18s', '74s')
    """
    rounds_left = total_rounds - round_num
    evaluations_left = total_rounds // rounds_per_evaluation - round_num // rounds_per_evaluation
    evaluations_left += int(rounds_left > 0 and total_rounds % rounds_per_evaluation != 0)
    seconds = float(np.mean(train_seconds)) * rounds_left if train_seconds else 0.0
    if evaluations_left and not evaluation_seconds:
        return f'>={seconds:.0f}s'
    if evaluation_seconds:
        seconds += float(np.mean(evaluation_seconds)) * evaluations_left
    return f'{seconds:.0f}s'


def epoch_text(epoch: int, total_epochs: int, epoch_seconds: Sequence[float], *, early_stopping: bool = False) -> str:
    """``'epoch 3/10  eta 14s'``: an epoch of centralized training, with the time the remaining epochs take.

    Each epoch's seconds include its validation, so `eta_text` counts no separate evaluations. With
    `early_stopping`, training may end before `total_epochs`: the ETA is an upper bound, marked ``'<='``.

    Example:

    >>> epoch_text(3, 10, [2.0, 2.0, 2.0]), epoch_text(3, 100, [2.0], early_stopping=True)
    ('epoch 3/10  eta 14s', 'epoch 3/100  eta <=194s')
    """
    eta = eta_text(epoch_seconds, [0.0], epoch, total_epochs, 1)
    if early_stopping and epoch < total_epochs:
        eta = f'<={eta}'
    return f'epoch {epoch}/{total_epochs}  eta {eta}'


def should_log_round(
    round_num: int,
    total_rounds: int,
    *,
    first_round: int,
    evaluated: bool,
    seconds_since_last_line: float,
    interval: float | None = None,
) -> bool:
    """Whether the training loop logs the line of `round_num` (its metrics are recorded either way).

    Always the first round this process runs (`first_round`: 1, or the one after a resumed checkpoint), rounds
    with an evaluation (or that end the run early) and the last round; any other round only once `interval`
    seconds (default `ROUND_LINE_SECONDS`) have passed since the previous line, so a run of many short rounds logs
    a line every `interval` seconds rather than one per round.

    Example (rounds of 10 s, so one line every third round between the evaluations of rounds 5 and 10):

    >>> last, logged = -float('inf'), []
    >>> for r in range(1, 13):
    ...     if should_log_round(r, 12, first_round=1, evaluated=r % 5 == 0, seconds_since_last_line=10 * r - last):
    ...         last = 10 * r
    ...         logged.append(r)
    >>> logged
    [1, 4, 5, 8, 10, 12]
    """
    if round_num in (first_round, total_rounds) or evaluated:
        return True
    return seconds_since_last_line >= (ROUND_LINE_SECONDS if interval is None else interval)
