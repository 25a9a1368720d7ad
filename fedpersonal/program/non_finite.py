"""Non-finite training losses: how the training loop finds them and the error that stops a diverging run.

`fedpersonal.program.run_learning_process` checks every round's training metrics with `non_finite_losses`; on a
hit it reruns each participant alone to name the clients, then stops with `NonFiniteLossError`
(``non_finite_clients='stop'``, the default) or goes on counting them (``'zero'``: the client work zeroes a
non-finite update and keeps the client's previous private state, as TFF's zeroing aggregators do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors

NON_FINITE_MODES = ('stop', 'zero')


class NonFiniteLossError(errors.InputError):
    """A round's training loss is NaN or infinite (``non_finite_clients='stop'``).

    Attributes:
      round_num: The round whose loss was not finite (not checkpointed).
      client_ids: The participants whose loss is not finite when each trains alone in that round.
    """

    def __init__(self, message: str, *, round_num: int, client_ids: Sequence[str]):
        super().__init__(message)
        self.round_num = round_num
        self.client_ids = list(client_ids)


def non_finite_losses(train_metrics: Any, prefix: str = 'train') -> dict[str, float]:
    """The non-finite values of the loss metrics (keys containing 'loss') among nested metrics, by flat key.

    Args:
      train_metrics: A (nested) mapping of metric names to numbers or arrays.
      prefix: The flat key of `train_metrics`.

    Returns:
      ``{flat key: the first non-finite value}`` for every loss metric that has one.

    Example:

    >>> non_finite_losses({'loss': float('nan'), 'accuracy': float('nan'), 'head': {'loss': 0.5}})
    {'train/loss': nan}
    """
    found: dict[str, float] = {}
    if isinstance(train_metrics, dict) or hasattr(train_metrics, 'items'):
        for key, value in train_metrics.items():
            found.update(non_finite_losses(value, f'{prefix}/{key}'))
    elif 'loss' in prefix.rsplit('/', 1)[-1]:
        values = np.asarray(train_metrics, dtype=np.float64).reshape(-1)
        bad = values[~np.isfinite(values)]
        if bad.size:
            found[prefix] = float(bad[0])
    return found
