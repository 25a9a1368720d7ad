"""Progress of long phases with an ETA, in the run's log (absl logging), for training rounds and evaluations.

`logged(iterable, total, description)` is `tqdm` writing its status line through absl logging (so it lands in the
same log as the round lines, in a terminal, a log file or a notebook), only for phases that last longer than a
few seconds and at most every `interval` seconds. `eta_text` is the training loop's estimate: training and
evaluation time per round measured separately, so that the ETA is not off by the evaluations still to come.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import tqdm  # type: ignore[import-untyped]
from absl import logging

T = TypeVar('T')


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
