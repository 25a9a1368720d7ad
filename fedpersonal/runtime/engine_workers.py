"""The engine's compiled rounds on worker processes: scaling out on the same engine code as one machine.

Each worker is a Ray actor (one process; pinned to one core when asked) that builds the *same* process as the
driver from a recipe, a picklable zero-argument callable returning `WorkerSetup` (the process and the dataset it
reads clients from), so its groups run the engine's compiled (XLA) group program exactly as a local run does. A
round (`EngineWorkers.run_round`, what `process.run_round` does inside the ``with`` block):

1. the driver splits the round's client ids into one contiguous share per worker, aligned to the engine's group
   size, and sends each worker its share's ids, the round's global weights (put once in Ray's object store and
   read by every worker) and, for a stateful process, its clients' private states;
2. each worker loads its clients by id from its own dataset (the recipe's ``dataset_fn``, built on the worker;
   each client's data is materialized once and kept there), packs them into groups as a local round does, runs
   them (`GroupRoundRunner.share`) and returns a partial aggregate and, separately, its clients' new private
   states;
3. the partial aggregates are merged by a tree: while more than two are left, pairs are merged on the first one's
   worker (`GroupRoundRunner.merge`; the partials travel worker to worker, not through the driver), and the driver
   merges the last two (ceil(log2 W) levels in all);
4. the driver applies the server step to the merged partial (`GroupRoundRunner.finish`). The private states
   reach the driver only as the clients' outputs, as on the local engine (they are never part of a partial).

A round equals the local engine's to float reassociation of the shares' sums (tested to 1e-6). A worker that dies
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
import os
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from fedpersonal import errors

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

    def __init__(self, recipe: Callable[[], WorkerSetup], core: int | None):
        # A failing recipe is kept and raised by `describe`: the driver then gets the error itself (a creation
        # task's error reaches it only as the actor's death).
        self._error: BaseException | None = None
        try:
            if core is not None:
                _set_affinity(core)
            setup = recipe()
            self._dataset_fn = setup.dataset_fn
            self._backend = setup.process.backend
            self._runner: Any = getattr(self._backend, 'round_runner', None)
            if not hasattr(self._runner, 'share'):
                raise errors.ConfigError(
                    f'--engine_workers: this process ({setup.process.simulation} backend) has no engine group program '
                    'that engine workers can run: build it on the engine backend (plan or model-loss engine).'
                )
        except Exception as error:  # pylint: disable=broad-except
            self._error = error

    def describe(self) -> tuple[int, str]:
        import socket  # pylint: disable=g-import-not-at-top

        if self._error is not None:
            raise self._error
        return os.getpid(), socket.gethostname()

    def group_size(self) -> int:
        return int(self._backend.packer.group_size)

    def run_share(self, weights: Any, client_ids: Sequence[str], private_states: Sequence[Any] | None) -> tuple:
        started = time.perf_counter()
        from fedpersonal.core import process as process_lib  # pylint: disable=g-import-not-at-top

        # Lazy: a client's pipeline is built only the first time it is packed here (then its data is kept).
        datasets = process_lib.LazyDatasets(client_ids, self._dataset_fn)
        groups = self._backend.pack(datasets, client_ids=list(client_ids))
        partial = self._runner.share(weights, groups, private_states)
        return partial, partial.pop('private'), time.perf_counter() - started

    def merge(self, a: dict, b: dict) -> dict:
        return self._runner.merge(a, b)


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
        self._group_size = 0
        self.last_timings: dict[str, Any] = {}
        self.last_partial: dict | None = None

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
                ray.init(address=self._address, **kwargs)
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
                self._actors.append(options.remote(self._recipe, core))
            described = self._get([a.describe.remote() for a in self._actors], 'starting')
            self.names = [f'engine worker {i} (pid {pid} on {host})' for i, (pid, host) in enumerate(described)]
            self._group_size = self._get([self._actors[0].group_size.remote()], 'starting')[0]
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

        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self._actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def _get(self, refs: Sequence[Any], what: str, workers: Sequence[int] | None = None) -> list[Any]:
        """`ray.get` of one reference per worker, a worker's failure raised naming it."""
        import ray  # pylint: disable=g-import-not-at-top

        values = []
        for k, ref in enumerate(refs):
            i = workers[k] if workers is not None else k
            name = self.names[i] if i < len(self.names) else f'engine worker {i}'
            try:
                values.append(ray.get(ref))
            except ray.exceptions.RayTaskError as error:  # The worker's own code raised: its error, named.
                cause = error.cause if hasattr(error, 'cause') else error
                if isinstance(cause, errors.ConfigError):
                    raise errors.ConfigError(f'{name}: {cause}') from None
                if what == 'starting':  # The recipe failed there (e.g. its data is not on that machine).
                    raise errors.ConfigError(
                        f'--engine_workers: {name} could not start: {type(cause).__name__}: {cause}'
                    ) from None
                raise RuntimeError(f'{name} failed while {what}: {type(cause).__name__}: {cause}') from cause
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
                if what == 'starting':  # E.g. the recipe could not be unpickled there (a module it needs).
                    lines = [ln.strip() for ln in str(error).splitlines() if 'Error' in ln and ln.strip()]
                    raise errors.ConfigError(
                        f'--engine_workers: {name} could not start: {lines[-1] if lines else type(error).__name__}'
                    ) from None
                raise errors.WorkerError(
                    name,
                    f'{name} stopped while {what} ({type(error).__name__}). Check the machine it ran on; rerun the '
                    'same command to resume from the last checkpoint.',
                    str(error).splitlines()[0] if str(error) else type(error).__name__,
                ) from None
        return values

    def merge_seconds(self, partial: dict, repeats: int = 5) -> float:
        """The median seconds of one level of the merge tree: `partial` (e.g. a round's merged partial aggregate)
        put in Ray's object store twice, moved to a worker and merged there, the result fetched (a diagnostic for
        cost models, benchmarks/multi_worker.py)."""
        import ray  # pylint: disable=g-import-not-at-top

        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            ray.get(self._actors[0].merge.remote(ray.put(partial), ray.put(partial)))
            seconds.append(time.perf_counter() - started)
        return sorted(seconds)[len(seconds) // 2]

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
        started = time.perf_counter()
        slices = shares(list(client_ids), self.num_workers, self._group_size)
        weights = ray.put(state.global_model_weights)
        outputs = [
            self._actors[w]
            .run_share.options(num_returns=3)
            .remote(weights, list(client_ids[a:b]), None if private_states is None else list(private_states[a:b]))
            for w, (a, b) in enumerate(slices)
        ]
        partials, owners = [p for p, _, _ in outputs], list(range(len(outputs)))
        while len(partials) > 2:  # The tree: pairs merged on the first one's worker, level by level.
            pairs = range(0, len(partials), 2)
            merged_refs = [
                self._actors[owners[j]].merge.remote(partials[j], partials[j + 1])
                if j + 1 < len(partials)
                else partials[j]
                for j in pairs
            ]
            partials, owners = merged_refs, [owners[j] for j in pairs]
        submitted = time.perf_counter()
        refs = [s for _, _, s in outputs] + [q for _, q, _ in outputs] + partials
        try:  # One wait for every result (a get per result costs a round trip each).
            values = ray.get(refs)
        except Exception:  # pylint: disable=broad-except
            self._get([s for _, _, s in outputs], 'running its share of the round')  # Names the worker.
            self._get([q for _, q, _ in outputs], "returning its clients' private states")
            self._get(partials, 'merging the shares', workers=owners)
            raise
        n = len(slices)
        share_seconds, new_private, tops = values[:n], values[n : 2 * n], values[2 * n :]
        runner = process.backend.round_runner
        merged = tops[0] if len(tops) == 1 else runner.merge(tops[0], tops[1])  # The root: here.
        self.last_partial = merged
        shared = got = time.perf_counter()
        private = [s for share in new_private for s in share] if private_states is not None else None
        output = runner.finish(state, merged, private, num_clients=len(client_ids))
        done = time.perf_counter()
        self.last_timings = dict(
            round_s=done - started,
            submit_s=submitted - started,
            shares_s=share_seconds,
            wait_s=shared - submitted,
            finish_s=done - got,
            workers=len(slices),
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


@contextlib.contextmanager
def serve(recipe: Callable[[], WorkerSetup]) -> Iterator[EngineWorkers | None]:
    """The rounds of the recipe's process on engine workers when a binary requested them (`requested`), else
    nothing: a task wraps its training in this, with the recipe that builds what it trains."""
    request = _requested.get()
    if request is None or request.workers <= 0:
        yield None
        return
    with EngineWorkers(recipe, request.workers, address=request.address) as workers:
        yield workers
