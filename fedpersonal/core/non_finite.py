"""Non-finite training losses: how a round's metrics show them and the error that stops a diverging run.

`PersonalizedProcess.run_round` raises `NonFiniteLossError` when a round's loss metric is NaN or infinite
(``non_finite='stop'``, the default; ``'ignore'`` returns the round as it is). The training loop of the binaries
(`fedpersonal.program.run_learning_process`, ``non_finite_clients``) runs its rounds with ``'ignore'`` and reruns
each participant alone to name the clients (`fedpersonal.program.non_finite`, which re-exports this module's names).

Example:

>>> non_finite_losses({'loss': float('nan'), 'accuracy': float('nan'), 'head': {'loss': 0.5}})
{'train/loss': nan}
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors

ROUND_MODES = ('stop', 'ignore')  # `PersonalizedProcess.run_round`'s ``non_finite``.


class NonFiniteLossError(errors.InputError):
    """A round's training loss is NaN or infinite.

    Attributes:
      round_num: The round whose loss was not finite (the training loop's; None from `run_round`, which does not
        number rounds).
      client_ids: The clients whose loss is not finite: found by the training loop by rerunning each participant
        alone; from `run_round`, the round's clients (it does not rerun them), when given their ids.
      losses: The non-finite loss metrics by flat key (e.g. ``{'client_work/train/loss': nan}``).
      metrics: The round's metrics (`run_round`), or None.
    """

    def __init__(
        self,
        message: str,
        *,
        round_num: int | None = None,
        client_ids: Sequence[str] = (),
        losses: Mapping[str, float] | None = None,
        metrics: Any = None,
    ):
        super().__init__(message)
        self.round_num = round_num
        self.client_ids = list(client_ids)
        self.losses = dict(losses or {})
        self.metrics = metrics


def non_finite_losses(train_metrics: Any, prefix: str = 'train') -> dict[str, float]:
    """The non-finite values of the loss metrics (keys containing 'loss') among nested metrics, by flat key.

    Args:
      train_metrics: A (nested) mapping of metric names to numbers or arrays.
      prefix: The flat key of `train_metrics` ('' for none).

    Returns:
      ``{flat key: the first non-finite value}`` for every loss metric that has one.
    """
    found: dict[str, float] = {}
    if isinstance(train_metrics, dict) or hasattr(train_metrics, 'items'):
        for key, value in train_metrics.items():
            found.update(non_finite_losses(value, f'{prefix}/{key}' if prefix else str(key)))
    elif 'loss' in prefix.rsplit('/', 1)[-1]:
        values = np.asarray(train_metrics, dtype=np.float64).reshape(-1)
        bad = values[~np.isfinite(values)]
        if bad.size:
            found[prefix] = float(bad[0])
    return found


def _shown(metrics: Any, prefix: str = '') -> list[str]:
    """The round's scalar metrics as ``key=value`` strings (flat keys)."""
    if isinstance(metrics, dict) or hasattr(metrics, 'items'):
        return [s for k, v in metrics.items() for s in _shown(v, f'{prefix}/{k}' if prefix else str(k))]
    values = np.asarray(metrics)
    if values.size != 1 or values.dtype.kind not in 'iuf':
        return []
    return [f'{prefix}={values.item():.6g}']


def check_round(metrics: Any, *, num_clients: int, client_ids: Sequence[str] | None) -> None:
    """Raises `NonFiniteLossError` when a loss metric of a round's `metrics` is not finite (`run_round`'s check).

    Args:
      metrics: The round's metrics (`ProcessOutput.metrics`).
      num_clients: The round's number of clients.
      client_ids: Their ids, if known.
    """
    losses = non_finite_losses(metrics, '')
    if not losses:
        return
    shown = _shown(metrics)
    listed = ', '.join(shown[:30]) + (f', ... ({len(shown) - 30} more)' if len(shown) > 30 else '')
    clients = f'clients {list(client_ids)[:20]}{" ..." if len(client_ids) > 20 else ""}' if client_ids else 'clients'
    raise NonFiniteLossError(
        f'Non-finite training loss ({", ".join(f"{k}={v}" for k, v in losses.items())}) in this round of '
        f"{num_clients} {clients}; the round's metrics: {listed}. The model diverged (e.g. too large a learning "
        "rate) or a client's data holds NaN or infinite values; the metrics computed beside such a loss (e.g. "
        'accuracy) mean nothing. fedpersonal.program.run_learning_process names the clients (each rerun alone). '
        "To go on with the round as it is, pass run_round(..., non_finite='ignore').",
        client_ids=list(client_ids or []),
        losses=losses,
        metrics=metrics,
    )
