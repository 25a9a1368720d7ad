"""Validation-based choices the training loop makes: which clients' states to keep, and when to stop.

* `ModelSelection` (every-client runs of a stateful process with a client state store): the private states of the
  evaluation round with the lowest validation metric are kept in the store.
* `EarlyStopping` (any run with an evaluation): the server state of the best evaluation round is kept (with
  ``keep_client_states``, also every client's private state of that round, in the store), and training stops after
  ``patience`` evaluations without improvement.

Both are checkpointed with the server state, so a resumed run selects and stops exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors

_BEST_PREFIX = 'best/'  # Store ids of the selected private states: 'best/<client id>'.


@dataclasses.dataclass
class ModelSelection:
    """Validation-based model selection done by the loop (every-client runs with a client state store).

    After each evaluation whose `metric` (a key of the evaluation metrics) is finite and lower than every earlier
    one, the loop stores the new private states of every client under `state_ids` (the same store, same round,
    so they are committed with the checkpoint and rolled back on resume) and records the round and value here
    and in the checkpoint. Read the selected states with `best_states`.

    Attributes:
      metric: The evaluation metric to minimize (e.g. ``'rmse'``).
      best_value: The lowest value so far (inf before any finite one).
      best_round: Its round (0: none yet; the selected states are then the initial ones).
    """

    metric: str
    best_value: float = math.inf
    best_round: int = 0
    prefix: str = _BEST_PREFIX

    def state_ids(self, client_ids: Sequence[str]) -> list[str]:
        """The store ids of the selected states of `client_ids`."""
        return [f'{self.prefix}{c}' for c in client_ids]

    def best_states(self, store: Any, client_ids: Sequence[str]) -> list[list[np.ndarray]]:
        """The selected flat private states of `client_ids` (their initial states, `store.default_fn`, if no
        evaluation selected a round)."""
        if self.best_round == 0:
            return [store.default_fn(c) for c in client_ids]
        return store.get(self.state_ids(client_ids))

    def _checkpoint(self) -> dict[str, Any]:
        return {'best_value': np.float64(self.best_value), 'best_round': np.int64(self.best_round)}

    def _restore(self, saved: Mapping[str, Any]) -> None:
        self.best_value, self.best_round = float(saved['best_value']), int(saved['best_round'])


@dataclasses.dataclass
class EarlyStopping:
    """Early stopping on a validation metric; keeps the server state of the best evaluation round.

    After each evaluation the loop calls `update`: a finite value better than every earlier one (by more than
    `min_delta`) records its round, value and server state; any other value counts as a stale evaluation. Training
    stops after `patience` stale evaluations in a row (0: never; the best state is still kept). Test a run with
    `best_state`, the model selected on validation.

    A stateful run's personalized model is the server state *and* each client's private state. With
    `keep_client_states`, the loop also copies every client's private state in its client state store under
    `state_ids` when a round becomes the best (committed with the checkpoint and rolled back on resume, like the
    store itself); test with `best_client_states`.

    >>> stopping = EarlyStopping('rmse', patience=2)
    >>> [stopping.update(v, r, f'state {r}') for r, v in [(10, 1.2), (20, 1.0), (30, 1.1), (40, float('nan'))]]
    [True, True, False, False]
    >>> stopping.stopped, stopping.best_round, stopping.best_value, stopping.best_state
    (True, 20, 1.0, 'state 20')

    Attributes:
      metric: The evaluation metric (a key of the evaluation's metrics, e.g. ``'rmse'``).
      patience: Stale evaluations in a row before training stops (0: never stop early).
      mode: ``'min'`` (lower is better) or ``'max'``.
      min_delta: The least change that counts as an improvement.
      keep_client_states: Whether the loop keeps every client's private state of the best round (runs with a
        client state store).
      best_value: The best value so far (nan before any finite one).
      best_round: Its round (0: none yet).
      stale: Evaluations since the last improvement.
      best_state: The server state after `best_round` (None before any).
    """

    metric: str
    patience: int = 0
    mode: str = 'min'
    min_delta: float = 0.0
    keep_client_states: bool = False
    best_value: float = math.nan
    best_round: int = 0
    stale: int = 0
    best_state: Any = None

    def __post_init__(self):
        if self.mode not in ('min', 'max'):
            raise errors.ConfigError(f"early stopping mode must be 'min' or 'max', got {self.mode!r}.")
        if self.patience < 0:
            raise errors.ConfigError(f'early stopping patience must be >= 0, got {self.patience}.')
        if self.min_delta < 0:
            raise errors.ConfigError(f'early stopping min_delta must be >= 0, got {self.min_delta}.')

    @property
    def stopped(self) -> bool:
        """Whether `patience` evaluations in a row brought no improvement."""
        return self.patience > 0 and self.stale >= self.patience

    def improves(self, value: float) -> bool:
        """Whether `value` would be a new best."""
        if not math.isfinite(value):
            return False
        if math.isnan(self.best_value):
            return True
        if self.mode == 'min':
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def update(self, value: float, round_num: int, state: Any) -> bool:
        """Records the evaluation of `round_num` (its server state `state`); returns whether it is the new best."""
        if self.improves(value):
            self.best_value, self.best_round, self.best_state, self.stale = float(value), int(round_num), state, 0
            return True
        self.stale += 1
        return False

    def state_ids(self, client_ids: Sequence[str]) -> list[str]:
        """The store ids under which `keep_client_states` keeps the best round's states of `client_ids`."""
        return [f'{_BEST_PREFIX}{c}' for c in client_ids]

    def best_client_states(self, store: Any, client_ids: Sequence[str]) -> list[list[np.ndarray]]:
        """The flat private states `client_ids` had after `best_round` (their current ones before any best)."""
        if not self.keep_client_states:
            raise ValueError('best_client_states needs EarlyStopping(keep_client_states=True).')
        return store.get(self.state_ids(client_ids) if self.best_round > 0 else list(client_ids))

    def value_of(self, evaluation: Mapping[str, Any]) -> float:
        """The metric's value in an evaluation's metrics; `ConfigError` naming the metric if absent."""
        if self.metric not in evaluation:
            raise errors.ConfigError(
                f'early stopping metric {self.metric!r} is not among the evaluation metrics {sorted(evaluation)}.'
            )
        return float(evaluation[self.metric])

    def _checkpoint(self, state: Any) -> dict[str, Any]:
        return {
            'best_value': np.float64(self.best_value),
            'best_round': np.int64(self.best_round),
            'stale': np.int64(self.stale),
            'best_state': self.best_state if self.best_state is not None else state,
        }

    def _restore(self, saved: Mapping[str, Any]) -> None:
        self.best_value, self.best_round = float(saved['best_value']), int(saved['best_round'])
        self.stale = int(saved['stale'])
        self.best_state = saved['best_state'] if self.best_round > 0 else None
