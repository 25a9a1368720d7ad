"""The engine worker itself (`fedpersonal.runtime.engine_workers`): the Ray actor that builds the recipe's process and
runs its rounds' client work, and the compiled graph of a group round.

A worker runs one of two engine programs, the one its process's round runner has (`program`):

* ``'groups'`` (`fedpersonal.simulation.driver.GroupRoundRunner`): the worker packs its share of the round's
  clients into groups and returns their partial aggregate (`run_share`); the partials are merged on the workers
  (`merge`, a tree in `round_graph`) and the driver applies the server step;
* ``'silos'`` (`fedpersonal.simulation.silo_engine.SiloRoundRunner`, HPFL): the server step reads every client's
  upload, and a second client phase reads its result. The worker runs its clients' first phase (`silo_clients`:
  their uploads and metrics go to the driver, which runs the server step as a local round does) and keeps what
  the second needs; `silo_update` then runs the second phase there and returns the clients' new private states.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from fedpersonal import errors


def program(process: Any) -> str | None:
    """The engine program engine workers run for `process` (``'groups'`` or ``'silos'``, see the module
    docstring), or None when its backend has none."""
    return getattr(getattr(process.backend, 'round_runner', None), 'worker_program', None)


def check_runs_on_workers(process: Any, name: str = 'this process') -> None:
    """Raises `ConfigError` (naming `name` and ``--engine_workers``) unless `process` has an engine program that
    engine workers can run (`program`)."""
    if program(process) is None:
        raise errors.ConfigError(
            f'--engine_workers: {name} runs on the {process.simulation} backend, which has no engine program that '
            'engine workers can run (the engine backends have one): run it without --engine_workers.'
        )


def copied(value: Any) -> Any:
    """`value` with every numpy array in it copied (compiled-graph messages are read in place)."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.nest.map_structure(lambda v: np.array(v) if isinstance(v, np.ndarray) else v, value)


def as_numpy(value: Any) -> Any:
    """`value` with every tensor in it as a numpy array (what travels between driver and workers)."""
    from fedpersonal.core import process  # pylint: disable=g-import-not-at-top

    return process.as_numpy(value)


def pin_to_core(core: int) -> None:
    """Pins every thread of this process (and the threads they start) to `core`."""
    for tid in os.listdir('/proc/self/task'):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), {core})


class Worker:
    """The actor: builds the recipe's process and runs its shares (see the module docstring).

    Args:
      recipe: `engine_workers.WorkerSetup`'s zero-argument builder.
      core: The core to pin this process to (None: unpinned).
      index: The worker's number (in its name).
    """

    def __init__(self, recipe: Callable[[], Any], core: int | None, index: int):
        self.name = f'engine worker {index} (pid {os.getpid()} on {socket.gethostname()})'
        # A failing recipe is kept and raised by `describe`: the driver then gets the error itself (a creation
        # task's error reaches it only as the actor's death).
        self._error: BaseException | None = None
        self._kept: Any = None  # A silo round's clients' state between its two client phases.
        try:
            if core is not None:
                pin_to_core(core)
            setup = recipe()
            self._dataset_fn = setup.dataset_fn
            self._stateful = setup.process.stateful
            self._backend = setup.process.backend
            self._input_check = getattr(setup.process, 'input_check', None)  # Run where the share is packed.
            self._runner: Any = getattr(self._backend, 'round_runner', None)
            self._program = program(setup.process)
            check_runs_on_workers(setup.process)
        except Exception as error:  # pylint: disable=broad-except
            self._error = error

    def describe(self) -> str:
        if self._error is not None:
            raise self._error
        return self.name

    def layout(self) -> tuple[str, int, bool]:
        """The engine program (`program`), its clients per group (1 for silos) and whether the process is
        stateful: the round's shape."""
        group_size = int(self._backend.packer.group_size) if self._program == 'groups' else 1
        return str(self._program), group_size, bool(self._stateful)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """A failure in this worker's share raised naming the worker."""
        try:
            yield
        except errors.ConfigError as error:  # E.g. a client's data malformed.
            raise errors.ConfigError(f'{self.name}: {error}') from None
        except Exception as error:  # pylint: disable=broad-except
            raise RuntimeError(
                f'{self.name} failed while running its share of the round: {type(error).__name__}: {error}'
            ) from error

    def _pack(self, client_ids: Sequence[str]) -> list[Any]:
        from fedpersonal.core import process as process_lib  # pylint: disable=g-import-not-at-top

        # Lazy: a client's pipeline is built only the first time it is packed here (then its data is kept).
        datasets = process_lib.LazyDatasets(client_ids, self._dataset_fn)
        return self._backend.pack(datasets, client_ids=list(client_ids), check=self._input_check)

    def run_share(self, weights: Any, share: tuple[Sequence[str], Sequence[Any] | None]) -> tuple:
        """This worker's share (its client ids and their private states) of a group round: its partial aggregate
        (None for no clients) with ``'seconds'``, this worker's seconds, and its clients' new private states."""
        started = time.perf_counter()
        client_ids, private_states = share
        if not client_ids:
            return None, [] if private_states is not None else None
        with self._named():
            # The graph's inputs are read in place from its channel, which the next round overwrites: copied.
            partial = self._runner.share(copied(weights), self._pack(client_ids), copied(private_states))
        private = partial.pop('private')
        ready = time.perf_counter()
        partial['seconds'] = [ready - started]
        partial['clock'] = _clock(started, ready)
        return partial, private

    def run_stateless_share(self, weights: Any, share: tuple[Sequence[str], None]) -> dict | None:
        """`run_share` of a stateless process: the partial only (the driver then reads one output per round)."""
        return self.run_share(weights, share)[0]

    def merge(self, a: dict | None, b: dict | None) -> dict | None:
        if a is None or b is None:
            return b if a is None else a
        merged = self._runner.merge(a, b)
        merged['seconds'] = a['seconds'] + b['seconds']  # Each worker's seconds, carried to the driver.
        merged['clock'] = _merged_clock(a['clock'], b['clock'], time.perf_counter())
        return merged

    def silo_clients(self, received: Any, share: tuple[Sequence[str], Sequence[Any]]) -> tuple[list, list, float, list]:
        """A silo round's first client phase on this worker's share: its clients' uploads and metrics (in the
        share's order), this worker's seconds and each client's; what the second phase needs stays here
        (`silo_update`)."""
        started = time.perf_counter()
        client_ids, private_states = share
        self._kept = None
        if not client_ids:
            return [], [], 0.0, []
        with self._named():
            uploads, metrics, self._kept = self._runner.clients(received, self._pack(client_ids), private_states)
        seconds = time.perf_counter() - started
        return as_numpy(uploads), as_numpy(metrics), seconds, list(self._runner.client_seconds)

    def silo_update(self, value: Any) -> list:
        """A silo round's second client phase (on the server step's `value`): this share's new private states."""
        kept, self._kept = self._kept, None
        if kept is None:
            return []
        with self._named():
            return self._runner.update(value, kept)


def _clock(started: float, ready: float) -> dict:
    """A share's timeline on this host's monotonic clock (`time.perf_counter`, comparable between the processes
    of one host only): when it started and when its partial was ready, for the driver's timings."""
    return {'host': socket.gethostname(), 'started': [started], 'ready': ready, 'merges': []}


def _merged_clock(a: dict, b: dict, ready: float) -> dict:
    """Two partials' timelines merged at `ready` (this host's clock): a merge's cost is the time from the later of
    its two partials being ready to the merged one being ready (None when they come from other hosts, whose
    clocks are not this one's)."""
    host = socket.gethostname()
    cost = ready - max(a['ready'], b['ready']) if a['host'] == b['host'] == host else None
    return {
        'host': host,
        'started': a['started'] + b['started'],
        'ready': ready,
        'merges': a['merges'] + b['merges'] + [cost],
    }


def round_graph(actors: Sequence[Any], stateful: bool) -> Any:
    """A group round as a Ray compiled graph: input ``(weights, share_0, ..., share_{W-1})``; worker w runs its
    share; the partials (each with its worker's seconds) merged by a tree on the workers; outputs ``[merged
    partial]``, and for a stateful process each worker's private states after it, ``private_0 .. private_{W-1}``
    (straight to the driver, never through the tree)."""
    from ray.dag import InputNode  # pylint: disable=g-import-not-at-top
    from ray.dag import MultiOutputNode  # pylint: disable=g-import-not-at-top

    with InputNode() as inputs:
        if stateful:
            outputs = [
                actor.run_share.options(num_returns=2).bind(inputs[0], inputs[1 + w]) for w, actor in enumerate(actors)
            ]
            partials, privates = [p for p, _ in outputs], [q for _, q in outputs]
        else:
            partials = [actor.run_stateless_share.bind(inputs[0], inputs[1 + w]) for w, actor in enumerate(actors)]
            privates = []
        owners = list(range(len(actors)))
        while len(partials) > 1:  # Pairs merged on the first one's worker, level by level.
            pairs = range(0, len(partials), 2)
            partials = [
                actors[owners[j]].merge.bind(partials[j], partials[j + 1]) if j + 1 < len(partials) else partials[j]
                for j in pairs
            ]
            owners = [owners[j] for j in pairs]
        graph = MultiOutputNode([partials[0], *privates])
    return graph.experimental_compile()
