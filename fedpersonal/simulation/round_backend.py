"""The simulation engine as a process's `fedpersonal.core.process.RoundBackend`: what `process.run_round` runs.

An engine process's rounds take two pieces: a *packer*, which turns a round's client datasets into the engine's
client inputs (`packing.ClientPacker`: fixed-shape groups of logical clients; `silo_engine.SiloPacker`: each
client's padded batches), and a *round runner*, which runs the round on them in the driver's runtime, compiled by
XLA (`driver.GroupRoundRunner`, `silo_engine.SiloRoundRunner`). `EngineBackend` holds both, so the process
itself knows neither.

Under TFF's multi-worker runtime (`fedpersonal.runtime.DistributedRuntime`) the round is the process's TFF
`next` instead (the workers run the client work), on the packed groups when `next` takes them: a stateful
process's private states are then stacked per group by the packer (which owns the groups' layout), and back.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from fedpersonal.core import process as process_lib
from fedpersonal.runtime import distributed
from fedpersonal.runtime import engine_workers


class EngineBackend:
    """A process's rounds on the fast simulation engine (see the module docstring).

    Args:
      packer: Turns a round's client datasets into the round runner's inputs: ``pack(client_data, client_ids)``;
        with `stacks_private_states`, also ``stack_private_states(groups, private_states)`` and
        ``unstack_private_states(groups, stacked, num_clients)``.
      round_runner: ``(state, packed, private_states or None, *, num_clients) -> ProcessOutput``, the round in
        the driver's runtime.
      next_takes_packed: Whether the process's TFF `next` takes the packed inputs (a client slot is a group);
        else it takes the clients' datasets as they are.
      stacks_private_states: Whether `next` takes a stateful process's private states stacked per group.
    """

    name = 'engine'

    def __init__(
        self,
        packer: Any,
        round_runner: Callable[..., process_lib.ProcessOutput],
        *,
        next_takes_packed: bool = True,
        stacks_private_states: bool = False,
    ):
        self.packer, self.round_runner = packer, round_runner
        self._next_takes_packed, self._stacks_private_states = next_takes_packed, stacks_private_states

    @property
    def checks_inputs(self) -> bool:
        """Whether the packer runs a process's `input_check` on each client's batches as it materializes them (so
        `PersonalizedProcess.run_round` does not read the clients' data a second time)."""
        return bool(getattr(self.packer, 'checks_batches', False))

    def pack(
        self, client_data: Sequence[Any], client_ids: Sequence[str] | None = None, *, check: Any = None
    ) -> list[Any]:
        """The round runner's inputs for a round's client datasets (each client's materialized once given its id);
        with the default `next_takes_packed`, also what the process's TFF `next` takes as client data. `check`: a
        `fedpersonal.core.input_checks.LabelCheck` run on each client's batches when they are materialized."""
        if check is not None and self.checks_inputs:
            return self.packer.pack(client_data, client_ids, check=check)
        return self.packer.pack(client_data, client_ids)

    def prefetch(self, client_data: Sequence[Any], client_ids: Sequence[str], *, check: Any = None) -> None:
        """Starts materializing clients (e.g. the next round's) into the packer's cache on its background thread
        (`packing.ClientPacker.prefetch`; `check` as in `pack`). A no-op for a packer without one, on engine
        workers (each packs its own share) and under TFF's distributed runtime (its workers read the data)."""
        prefetch = getattr(self.packer, 'prefetch', None)
        if prefetch is None or engine_workers.active() is not None or distributed.active():
            return
        if check is not None and self.checks_inputs:
            prefetch(client_data, client_ids, check=check)
        else:
            prefetch(client_data, client_ids)

    def run_round(
        self,
        process: process_lib.PersonalizedProcess,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None,
        *,
        client_ids: Sequence[str] | None,
    ) -> process_lib.ProcessOutput:
        """The round by the round runner, on the engine workers of an `EngineWorkers` block (each loads its
        clients by id: `client_ids` needed), or under TFF's distributed runtime by `run_next`."""
        workers = engine_workers.active()
        if workers is not None:
            if client_ids is None:
                raise ValueError('Engine workers load their clients by id: run_round needs client_ids.')
            return workers.run_round(process, state, client_ids, private_states)
        if distributed.active():
            return self.run_next(process, state, client_data, private_states, client_ids=client_ids)
        private = list(private_states or []) if process.stateful else None
        packed = self.pack(client_data, client_ids, check=process.input_check)
        return self.round_runner(state, packed, private, num_clients=len(client_data))

    def run_next(
        self,
        process: process_lib.PersonalizedProcess,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None = None,
        *,
        client_ids: Sequence[str] | None = None,
    ) -> process_lib.ProcessOutput:
        """The round as the process's TFF `next` in the current TFF runtime (what the workers of a distributed
        runtime run), its inputs packed as `next` takes them; equal to the round runner's round."""
        if not self._next_takes_packed:
            return process.run_next(state, list(client_data), private_states)
        groups = self.pack(client_data, client_ids, check=process.input_check)
        if not (process.stateful and self._stacks_private_states):
            return process.run_next(state, groups, private_states)
        private = list(private_states or [])
        output = process.run_next(state, groups, self.packer.stack_private_states(groups, private))
        unstacked = self.packer.unstack_private_states(groups, output.private_states, len(private))
        return process_lib.ProcessOutput(output.state, output.metrics, unstacked)
