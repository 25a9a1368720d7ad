"""The engine's compiled rounds on worker processes: scaling out on the same engine code as one machine.

Each worker is a Ray actor (one process; pinned to one core when asked) that builds the *same* process as the
driver from a recipe, a picklable zero-argument callable returning `WorkerSetup` (the process and the dataset it
reads clients from), so its groups run the engine's compiled (XLA) group program exactly as a local run does. The
round is one Ray compiled graph (built once per ``with`` block: each round then costs tens of microseconds of Ray
per hop instead of a task submission each, docs/RESULTS.md "Engine workers"). A round (`EngineWorkers.run_round`,
what `process.run_round` does inside the ``with`` block):

1. the driver splits the round's client ids into one contiguous share per worker, aligned to the engine's group
   size, and sends the round's global weights with every worker's share of ids and, for a stateful process, of
   private states (one message, read by every worker);
2. each worker loads its clients by id from its own dataset (the recipe's ``dataset_fn``, built on the worker;
   each client's data is materialized once and kept there), packs them into groups as a local round does, runs
   them (`GroupRoundRunner.share`) and returns a partial aggregate and, separately, its clients' new private
   states (to the driver directly);
3. the partial aggregates are merged by a tree on the workers (`GroupRoundRunner.merge`, pairs level by level,
   ceil(log2 W) levels; the partials travel worker to worker, not through the driver);
4. the driver applies the server step to the merged partial (`GroupRoundRunner.finish`). The private states
   reach the driver only as the clients' outputs, as on the local engine (they are never part of a partial).

A waiting worker shows as a busy core (Ray's compiled-graph channels poll, yielding the core to any other work
there: a loop beside an idle worker on its core ran at full speed). A round equals the local engine's to float
reassociation of the shares' sums (tested to 1e-6). A worker that dies
stops the run with `fedpersonal.errors.WorkerError` naming it; a binary rerun resumes from its last checkpoint.

Ray is the distributed engine (pip ``ray``; docs/RESULTS.md, "Engine workers", says why it and not TFF's worker
service or TensorFlow's remote functions). Without an address, ``workers`` local worker processes are started and
stopped with the block; on several machines, start Ray on each (``ray start --head`` on one, ``ray start
--address=HEAD:6379`` on the others) and pass ``address='HEAD:6379'``: the workers are placed over the cluster.

Example:

```python
def recipe():  # Runs on every worker (and may run on the driver): builds the same process and dataset.
    return engine_workers.WorkerSetup(build_process(), client_data.create_tf_dataset_for_client)

with engine_workers.EngineWorkers(recipe, workers=2):
    state = process.initialize()
    output = process.run_round(state, datasets, client_ids=ids)  # Run by the two workers.
```
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from fedpersonal import errors

_ROUND_TIMEOUT_S = 7 * 24 * 3600

_active: contextvars.ContextVar[EngineWorkers | None] = contextvars.ContextVar(
    'fedpersonal_engine_workers', default=None
)


@dataclasses.dataclass
class WorkerSetup:
    """What a worker builds from the recipe: the process (on the engine backend) and its clients' datasets.

    Attributes:
      process: A `PersonalizedProcess` built as on the driver (same builder, same arguments).
      dataset_fn: Client id -> that client's dataset, read where the worker runs.
    """

    process: Any
    dataset_fn: Callable[[str], Any]


def active() -> EngineWorkers | None:
    """The `EngineWorkers` whose ``with`` block is running (None outside any)."""
    return _active.get()


def shares(client_ids: Sequence[str], workers: int, group_size: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` slices of a round's clients, one per worker that gets any, aligned to whole groups.

    >>> shares([str(i) for i in range(100)], 2, 25)
    [(0, 50), (50, 100)]
    >>> shares([str(i) for i in range(30)], 4, 25)
    [(0, 25), (25, 30)]
    """
    groups = -(-len(client_ids) // group_size)
    per_worker = -(-groups // workers) * group_size
    return [(s, min(s + per_worker, len(client_ids))) for s in range(0, len(client_ids), per_worker)]


def _set_affinity(core: int) -> None:
    """Pins every thread of this process (and the threads they start) to `core`."""
    for tid in os.listdir('/proc/self/task'):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), {core})


class _Worker:
    """The actor: builds the recipe's process and runs its shares (see the module docstring)."""

    def __init__(self, recipe: Callable[[], WorkerSetup], core: int | None, index: int):
        import socket  # pylint: disable=g-import-not-at-top

        self.name = f'engine worker {index} (pid {os.getpid()} on {socket.gethostname()})'
        # A failing recipe is kept and raised by `describe`: the driver then gets the error itself (a creation
        # task's error reaches it only as the actor's death).
        self._error: BaseException | None = None
        try:
            if core is not None:
                _set_affinity(core)
            setup = recipe()
            self._dataset_fn = setup.dataset_fn
            self._stateful = setup.process.stateful
            self._backend = setup.process.backend
            self._runner: Any = getattr(self._backend, 'round_runner', None)
            check_runs_on_workers(setup.process)
        except Exception as error:  # pylint: disable=broad-except
            self._error = error

    def describe(self) -> str:
        if self._error is not None:
            raise self._error
        return self.name

    def layout(self) -> tuple[int, bool]:
        """The engine's group size and whether the process is stateful (the round graph's shape)."""
        return int(self._backend.packer.group_size), bool(self._stateful)

    def run_share(self, weights: Any, share: tuple[Sequence[str], Sequence[Any] | None]) -> tuple:
        """This worker's share (its client ids and their private states) of a round: its partial aggregate (None
        for no clients) with ``'seconds'``, this worker's seconds, and its clients' new private states."""
        started = time.perf_counter()
        from fedpersonal.core import process as process_lib  # pylint: disable=g-import-not-at-top

        client_ids, private_states = share
        if not client_ids:
            return None, [] if private_states is not None else None
        try:
            # The graph's inputs are read in place from its channel, which the next round overwrites: copied.
            weights = _copied(weights)
            # Lazy: a client's pipeline is built only the first time it is packed here (then its data is kept).
            datasets = process_lib.LazyDatasets(client_ids, self._dataset_fn)
            groups = self._backend.pack(datasets, client_ids=list(client_ids))
            partial = self._runner.share(weights, groups, _copied(private_states))
        except errors.ConfigError as error:  # E.g. a client's data malformed: named with the worker.
            raise errors.ConfigError(f'{self.name}: {error}') from None
        except Exception as error:  # pylint: disable=broad-except
            raise RuntimeError(
                f'{self.name} failed while running its share of the round: {type(error).__name__}: {error}'
            ) from error
        private = partial.pop('private')
        partial['seconds'] = [time.perf_counter() - started]
        return partial, private

    def run_stateless_share(self, weights: Any, share: tuple[Sequence[str], None]) -> dict | None:
        """`run_share` of a stateless process: the partial only (the driver then reads one output per round)."""
        return self.run_share(weights, share)[0]

    def merge(self, a: dict | None, b: dict | None) -> dict | None:
        if a is None or b is None:
            return b if a is None else a
        merged = self._runner.merge(a, b)
        merged['seconds'] = a['seconds'] + b['seconds']  # Each worker's seconds, carried to the driver.
        return merged


def check_runs_on_workers(process: Any, name: str = 'this process') -> None:
    """Raises `ConfigError` (naming `name` and ``--engine_workers``) unless `process` has an engine group program
    that engine workers can run (`GroupRoundRunner.share`)."""
    if not hasattr(getattr(process.backend, 'round_runner', None), 'share'):
        raise errors.ConfigError(
            f'--engine_workers: {name} runs on the {process.simulation} backend, which has no engine group program '
            'that engine workers can run (the plan and model-loss engines have one): run it without --engine_workers.'
        )


def _copied(value: Any) -> Any:
    """`value` with every numpy array in it copied (compiled-graph messages are read in place)."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.nest.map_structure(lambda v: np.array(v) if isinstance(v, np.ndarray) else v, value)


def _quiet_cancellations(record: logging.LogRecord) -> bool:
    """Drops Ray's traceback of each worker task cancelled when a worker died (the run's own error names it)."""
    return not record.getMessage().startswith('Error cancelling worker task')


def _round_graph(actors: Sequence[Any], stateful: bool) -> Any:
    """The round as a Ray compiled graph: input ``(weights, share_0, ..., share_{W-1})``; worker w runs its share;
    the partials (each with its worker's seconds) merged by a tree on the workers; outputs ``[merged partial]``,
    and for a stateful process each worker's private states after it, ``private_0 .. private_{W-1}`` (straight to
    the driver, never through the tree)."""
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


def _init_ray(ray: Any, address: str | None, kwargs: dict[str, Any], attempts: int = 3) -> None:
    """`ray.init`; a local start retried when its GCS fails to start: two local Ray starts at the same moment (two
    runs started together on one machine) can pick the same free port for it."""
    for attempt in range(attempts):
        try:
            ray.init(address=address, **kwargs)
            return
        except RuntimeError as error:
            if address is not None or attempt + 1 == attempts or 'GCS' not in str(error):
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(1.0 + attempt)


class EngineWorkers:
    """Engine rounds on Ray worker processes, as a context manager (see the module docstring).

    Args:
      recipe: A picklable zero-argument callable returning `WorkerSetup`; every worker calls it once.
      workers: How many workers (each one Ray actor with one CPU).
      address: A running Ray cluster's address (``HEAD:6379``); None starts a local one for the block.
      cores: With local workers, the core each worker is pinned to (``cores[i % len(cores)]``); None: unpinned.
      threads: TensorFlow's intra- and inter-op threads in each worker (None: TensorFlow's default).

    Raises:
      ConfigError: (on entering) fewer than one worker, Ray missing, a recipe that fails on a worker or builds a
        process without an engine group program; the message names ``--engine_workers`` and the worker.
    """

    def __init__(
        self,
        recipe: Callable[[], WorkerSetup],
        workers: int = 2,
        *,
        address: str | None = None,
        cores: Sequence[int] | None = None,
        threads: int | None = 1,
    ):
        if workers < 1:
            raise errors.ConfigError(f'--engine_workers: at least one engine worker is needed, got {workers}.')
        self._recipe, self.num_workers, self._address = recipe, int(workers), address
        self._cores, self._threads = (list(cores) if cores else None), threads
        self._actors: list[Any] = []
        self.names: list[str] = []
        self._started_ray = False
        self._token: contextvars.Token | None = None
        self._group_size, self._stateful = 0, False
        self._graph: Any = None
        self.last_timings: dict[str, Any] = {}

    def __enter__(self) -> EngineWorkers:
        try:
            import ray  # pylint: disable=g-import-not-at-top
        except ImportError:
            raise errors.ConfigError(
                '--engine_workers: engine workers need Ray (pip install ray; scripts/env.sh).'
            ) from None
        try:
            if not ray.is_initialized():
                kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
                if self._address is None:
                    kwargs['num_cpus'] = self.num_workers
                _init_ray(ray, self._address, kwargs)
                self._started_ray = True
            env = {}
            if self._threads is not None:
                env = {'TF_NUM_INTRAOP_THREADS': str(self._threads), 'TF_NUM_INTEROP_THREADS': str(self._threads)}
            env.setdefault('TF_CPP_MIN_LOG_LEVEL', os.environ.get('TF_CPP_MIN_LOG_LEVEL', '3'))
            if self._address is None:  # Local workers import this package from where the driver does.
                package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                inherited = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
                env['PYTHONPATH'] = os.pathsep.join(dict.fromkeys([package_root, *inherited]))
            actor = ray.remote(num_cpus=1, max_restarts=0)(_Worker)
            for i in range(self.num_workers):
                core = self._cores[i % len(self._cores)] if self._cores else None
                options = actor.options(runtime_env={'env_vars': env}, name=None)
                self._actors.append(options.remote(self._recipe, core, i))
            self.names = self._started([a.describe.remote() for a in self._actors])
            self._group_size, self._stateful = self._started([self._actors[0].layout.remote()])[0]
            logging.getLogger('ray.dag.compiled_dag_node').addFilter(_quiet_cancellations)
            self._graph = _round_graph(self._actors, self._stateful)
        except BaseException:
            self._close()
            raise
        self._token = _active.set(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._token is not None:
            _active.reset(self._token)
            self._token = None
        self._close()

    def _close(self) -> None:
        import ray  # pylint: disable=g-import-not-at-top

        if self._graph is not None:
            with contextlib.suppress(Exception):
                self._graph.teardown()
            self._graph = None
        logging.getLogger('ray.dag.compiled_dag_node').removeFilter(_quiet_cancellations)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self._actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def _started(self, refs: Sequence[Any]) -> list[Any]:
        """`ray.get` of one start-up reference per worker; a worker that could not start raised naming it."""
        import ray  # pylint: disable=g-import-not-at-top

        values = []
        for i, ref in enumerate(refs):
            name = f'engine worker {i}'
            try:
                values.append(ray.get(ref))
            except ray.exceptions.RayTaskError as error:  # The recipe failed there (e.g. its data is not there).
                cause = error.cause if hasattr(error, 'cause') else error
                if isinstance(cause, errors.ConfigError):
                    raise errors.ConfigError(f'{name}: {cause}') from None
                raise errors.ConfigError(
                    f'--engine_workers: {name} could not start: {type(cause).__name__}: {cause}'
                ) from None
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
                # E.g. the recipe could not be unpickled there (a module it needs).
                lines = [ln.strip() for ln in str(error).splitlines() if 'Error' in ln and ln.strip()]
                raise errors.ConfigError(
                    f'--engine_workers: {name} could not start: {lines[-1] if lines else type(error).__name__}'
                ) from None
        return values

    def _failed(self, error: BaseException) -> BaseException:
        """The error to raise for a round that failed with `error`: a worker's own error, named; or, when the
        compiled graph stopped (a worker died), a `WorkerError` naming the worker that no longer answers."""
        import ray  # pylint: disable=g-import-not-at-top

        if isinstance(error, ray.exceptions.RayTaskError):  # The worker's own code raised (its name in it).
            cause = error.cause if hasattr(error, 'cause') else error
            return cause if isinstance(cause, (errors.ConfigError, RuntimeError)) else error
        for name, actor in zip(self.names, self._actors):
            try:
                ray.get(actor.describe.remote(), timeout=30)
            except Exception as probe:  # pylint: disable=broad-except
                return errors.WorkerError(
                    name,
                    f'{name} stopped during the round ({type(probe).__name__}). Check the machine it ran on; rerun '
                    'the same command to resume from the last checkpoint.',
                    str(error).splitlines()[0] if str(error) else type(error).__name__,
                )
        return error

    def run_round(
        self, process: Any, state: Any, client_ids: Sequence[str], private_states: Sequence[Any] | None = None
    ) -> Any:
        """One round of `process` on the workers (see the module docstring); what `process.run_round` returns.

        Args:
          process: The driver's process (the same recipe's); its round runner applies the server step.
          state: The process state.
          client_ids: The round's clients (each worker loads its share's data by id).
          private_states: A stateful process's private states of these clients, in order.

        Raises:
          WorkerError: A worker stopped during the round (named).
        """
        import ray  # pylint: disable=g-import-not-at-top

        if process.stateful and private_states is None:
            raise ValueError("A stateful process needs the clients' private states.")
        if process.stateful != self._stateful:
            raise errors.ConfigError(
                f"--engine_workers: the workers' recipe builds a {'stateful' if self._stateful else 'stateless'} "
                f"process but this round's is {'stateful' if process.stateful else 'stateless'}: give the workers "
                'the recipe of the process being run.'
            )
        if self._graph is None:
            raise errors.ConfigError('--engine_workers: the engine workers were stopped (a worker died); rerun.')
        started = time.perf_counter()
        slices = shares(list(client_ids), self.num_workers, self._group_size)
        slices += [(len(client_ids), len(client_ids))] * (self.num_workers - len(slices))
        assignments = [
            (list(client_ids[a:b]), None if private_states is None else list(private_states[a:b])) for a, b in slices
        ]
        try:
            references = self._graph.execute(state.global_model_weights, *assignments)
            submitted = time.perf_counter()
            # No practical limit: a round takes what it takes and a death ends it. (Not -1, "none": Ray 2.40 turns
            # it into an immediate timeout when a channel grows for a message larger than its buffer.)
            values = ray.get(references, timeout=_ROUND_TIMEOUT_S)
        except Exception as error:  # pylint: disable=broad-except
            failure = self._failed(error)
            if isinstance(failure, errors.WorkerError):
                self._close()  # The graph is torn down with a dead worker: the block's workers are done.
            raise failure from None
        got = time.perf_counter()
        # Copied out of the graph's channels (read in place; the next round writes there).
        private = [s for share in values[1:] for s in _copied(share)] if process.stateful else None
        merged = _copied(values[0])
        share_seconds = merged.pop('seconds')
        del values
        output = process.backend.round_runner.finish(state, merged, private, num_clients=len(client_ids))
        done = time.perf_counter()
        self.last_timings = dict(
            round_s=done - started,
            submit_s=submitted - started,
            shares_s=share_seconds,
            wait_s=got - submitted,
            finish_s=done - got,
            workers=sum(1 for a, b in slices if b > a),
        )
        return output


@dataclasses.dataclass(frozen=True)
class Request:
    """A binary's ``--engine_workers`` and ``--ray_address``: how many engine workers, on which Ray cluster."""

    workers: int
    address: str | None = None


_requested: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    'fedpersonal_engine_workers_request', default=None
)


@contextlib.contextmanager
def requested(request: Request | None) -> Iterator[None]:
    """Inside the block, a task's `serve` runs its rounds on the requested engine workers (None: none)."""
    token = _requested.set(request)
    try:
        yield
    finally:
        _requested.reset(token)


def request() -> Request | None:
    """The engine workers a binary requested (`requested`), None when none were."""
    request = _requested.get()
    return request if request is not None and request.workers > 0 else None


@contextlib.contextmanager
def serve(
    recipe: Callable[[], WorkerSetup], process: Any = None, name: str = 'this process'
) -> Iterator[EngineWorkers | None]:
    """The rounds of the recipe's process on engine workers when a binary requested them (`requested`), else
    nothing: a task wraps its training in this, with the recipe that builds what it trains.

    Args:
      recipe: What every worker builds (`EngineWorkers`).
      process: The driver's own build of the recipe's process: checked before any worker starts
        (`check_runs_on_workers`, naming `name`).
      name: What the error names (e.g. the method).
    """
    wanted = request()
    if wanted is None:
        yield None
        return
    if process is not None:
        check_runs_on_workers(process, name)
    with EngineWorkers(recipe, wanted.workers, address=wanted.address) as workers:
        yield workers
