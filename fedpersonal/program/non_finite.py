"""Non-finite training losses: how the training loop finds them and the error that stops a diverging run.

`fedpersonal.program.run_learning_process` checks every round's training metrics with `non_finite_losses`; on a
hit it reruns each participant alone to name the clients, then stops with `NonFiniteLossError`
(``non_finite_clients='stop'``, the default) or goes on counting them (``'zero'``: the client work zeroes a
non-finite update and keeps the client's previous private state, as TFF's zeroing aggregators do). The loop runs
its rounds with ``process.run_round(..., non_finite='ignore')``: it makes the decision itself.

The error and the scan live in `fedpersonal.core.non_finite` (`PersonalizedProcess.run_round` stops on a
non-finite loss too) and are importable from here as before.

Example:

>>> non_finite_losses({'loss': float('nan'), 'accuracy': float('nan'), 'head': {'loss': 0.5}})
{'train/loss': nan}
>>> NON_FINITE_MODES
('stop', 'zero')
"""

from __future__ import annotations

from fedpersonal.core.non_finite import NonFiniteLossError as NonFiniteLossError
from fedpersonal.core.non_finite import non_finite_losses as non_finite_losses

NON_FINITE_MODES = ('stop', 'zero')
