"""The engine's compiled rounds on worker processes: scaling out on the same engine code as one machine.

Each worker is a Ray actor (one process; pinned to one core when asked) that builds the *same* process as the
driver from a recipe, a picklable zero-argument callable returning `WorkerSetup` (the process and the dataset it
reads clients from), so its groups run the engine's compiled (XLA) group program exactly as a local run does. The
round is one Ray compiled graph (built once per ``with`` block: each round then costs tens of microseconds of Ray
per hop instead of a task submission each, docs/ENGINE.md "Engine workers"). A round (`EngineWorkers.run_round`,
what `process.run_round` does inside the ``with`` block):

1. the driver splits the round's client ids into one contiguous share per worker, aligned to the engine's group
   size (equal shares, or with ``balance`` by the workers' measured speeds: `fedpersonal.runtime.balance`), and
   sends the round's global weights with every worker's share of ids and, for a stateful process, of private
   states (one message, read by every worker);
2. each worker loads its clients by id from its own dataset (the recipe's ``dataset_fn``, built on the worker;
   each client's data is materialized once and kept there), packs them into groups as a local round does, runs
   them (`GroupRoundRunner.share`) and returns a partial aggregate and, separately, its clients' new private
   states (to the driver directly);
3. the partial aggregates are merged by a tree on the workers (`GroupRoundRunner.merge`, pairs level by level,
   ceil(log2 W) levels; the partials travel worker to worker, not through the driver);
4. the driver applies the server step to the merged partial (`GroupRoundRunner.finish`). The private states
   reach the driver only as the clients' outputs, as on the local engine (they are never part of a partial).

A cross-silo round (HPFL's silo engine, whose server step reads every client's upload and whose clients then
run a second phase on its result) runs as Ray tasks instead: each worker runs its silos' first phase and keeps
their trained states, the driver runs the server step on the uploads in client order, each worker then runs its
silos' second phase and returns their private states (`fedpersonal.runtime.worker_actor`). A silo round takes
seconds, so two task rounds (about a millisecond) do not matter there. Silos differ in size by up to 60x: after
the first round (contiguous shares) they are shared out by their measured seconds (longest first, each to the
least loaded worker), a plan kept while the round's silos stay the same; which worker trains a silo changes none
of its numbers.

A waiting worker shows as a busy core (Ray's compiled-graph channels poll, yielding the core to any other work
there: a loop beside an idle worker on its core ran at full speed). Workers use the driver's TensorFlow threads
and oneDNN setting (`driver_threads`), so a round equals the local engine's but for the reassociation of the
shares' sums: within README's "Reproducibility" bound, which the tests assert. A worker that dies
stops the run with `fedpersonal.errors.WorkerError` naming it; a binary rerun resumes from its last checkpoint.

Ray is the distributed engine (pip ``ray``; docs/ENGINE.md, "Engine workers", says why it and not TFF's worker
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

import collections
import contextlib
import contextvars
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from fedpersonal import errors
from fedpersonal.runtime import balance as balance_lib
from fedpersonal.runtime import worker_actor
from fedpersonal.runtime.worker_actor import check_runs_on_workers  # Part of this module's API.

_ROUND_TIMEOUT_S = 7 * 24 * 3600
_SILO_PLANS = 4  # Silo plans kept (the round's, a lone silo's rerun's, ...).

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


def shares(client_ids: Sequence[Any], workers: int, group_size: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` slices of a round's clients, one per worker that gets any, aligned to whole groups.

    >>> shares([str(i) for i in range(100)], 2, 25)
    [(0, 50), (50, 100)]
    >>> shares([str(i) for i in range(30)], 4, 25)
    [(0, 25), (25, 30)]
    """
    groups = -(-len(client_ids) // group_size)
    per_worker = -(-groups // workers) * group_size
    return [(s, min(s + per_worker, len(client_ids))) for s in range(0, len(client_ids), per_worker)]


def _quiet_cancellations(record: logging.LogRecord) -> bool:
    """Drops Ray's traceback of each worker task cancelled when a worker died (the run's own error names it)."""
    return not record.getMessage().startswith('Error cancelling worker task')


def _init_ray(ray: Any, address: str | None, kwargs: dict[str, Any], attempts: int = 3) -> None:
    """`ray.init`; a local start retried when it fails to start: two local Ray starts at the same moment (two runs
    started together on one machine) can pick the same free port for the GCS ("Failed to start GCS") or time out
    waiting for each other's processes ("The current node timed out during startup")."""
    for attempt in range(attempts):
        try:
            ray.init(address=address, **kwargs)
            return
        except Exception as error:  # pylint: disable=broad-except
            startup = any(m in str(error) for m in ('GCS', 'timed out during startup', 'failed to startup'))
            if address is not None or attempt + 1 == attempts or not startup:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(1.0 + attempt)


def driver_threads() -> int:
    """TensorFlow's intra-op threads in this process, as TensorFlow resolves them: ``tf.config.threading``'s setting,
    else ``TF_NUM_INTRAOP_THREADS``, else one per CPU this process may run on."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    configured = tf.config.threading.get_intra_op_parallelism_threads()
    if configured > 0:
        return configured
    with contextlib.suppress(ValueError):
        if int(os.environ.get('TF_NUM_INTRAOP_THREADS', '0')) > 0:
            return int(os.environ['TF_NUM_INTRAOP_THREADS'])
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


class EngineWorkers:
    """Engine rounds on Ray worker processes, as a context manager (see the module docstring).

    Args:
      recipe: A picklable zero-argument callable returning `WorkerSetup`; every worker calls it once.
      workers: How many workers (each one Ray actor with one CPU).
      address: A running Ray cluster's address (``HEAD:6379``); None starts a local one for the block.
      cores: With local workers, the core each worker is pinned to (``cores[i % len(cores)]``); None: unpinned.
      threads: TensorFlow's intra-op threads in each worker. None (the default): the driver's own
        (`driver_threads`), so a worker's group program splits its reductions as a local round's does whatever the
        user's environment; 1 is faster where the workers fill the cores, at the price of equality with a local
        run on more threads (a matrix product's sums split by thread: ~1e-5 apart after a few rounds).
      balance: A group round's shares follow the workers' measured speeds (`fedpersonal.runtime.balance`: a
        faster worker gets more whole groups); False: equal shares, bit for bit the same numbers for the same seed
        (a balanced round equals them to float reassociation).

    Attributes:
      balance: Whether group rounds' shares follow the workers' speeds (``balance``; may be changed between rounds).
      balancer: The workers' measured seconds per group (`balance.GroupBalancer`; measured in every group round).
      last_timings: The last round's seconds: ``round_s``, ``submit_s`` (the driver's sending), ``wait_s`` (until
        the merged partial arrived), ``finish_s`` (the server step), ``shares_s`` (each worker's own); when the
        workers run on the driver's host, also their timeline on its clock: ``start_delays_s`` (each share's start
        after the sending), ``merges_s`` (each merge, from the later of its two partials to the merged one) and
        ``transport_s`` (from the merged partial to the driver); ``groups``: each worker's groups. A silo round has
        its own (`_silo_round`).

    Raises:
      ConfigError: (on entering) fewer than one worker, Ray missing, a recipe that fails on a worker or builds a
        process without an engine program; the message names ``--engine_workers`` and the worker.
    """

    def __init__(
        self,
        recipe: Callable[[], WorkerSetup],
        workers: int = 2,
        *,
        address: str | None = None,
        cores: Sequence[int] | None = None,
        threads: int | None = None,
        balance: bool = False,
    ):
        if workers < 1:
            raise errors.ConfigError(f'--engine_workers: at least one engine worker is needed, got {workers}.')
        self._recipe, self.num_workers, self._address = recipe, int(workers), address
        self._cores, self._threads = (list(cores) if cores else None), threads
        self._actors: list[Any] = []
        self.names: list[str] = []
        self._started_ray = False
        self._token: contextvars.Token | None = None
        self._program, self._group_size, self._stateful = '', 0, False
        self._graph: Any = None
        self.balance = balance
        self.balancer = balance_lib.GroupBalancer(self.num_workers)
        self._counts: list[int] | None = None  # The last group round's groups per worker.
        self._silo_seconds: dict[str, float] = {}  # Each silo's last seconds on a worker (`_silo_shares`).
        # The silo plans of the last few silo sets (a lone silo's rerun does not replace the round's plan).
        self._silo_plans: collections.OrderedDict[tuple[str, ...], list[list[int]]] = collections.OrderedDict()
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
                    # Ray runs its workers at niceness 15 by default: compute workers would yield to every other
                    # process on their cores (a local round's driver runs at 0).
                    kwargs.update(num_cpus=self.num_workers, _system_config={'worker_niceness': 0})
                _init_ray(ray, self._address, kwargs)
                self._started_ray = True
            threads = self._threads if self._threads is not None else driver_threads()
            env = {'TF_NUM_INTRAOP_THREADS': str(threads)}
            if self._threads is not None:
                env['TF_NUM_INTEROP_THREADS'] = str(self._threads)
            # oneDNN's kernels as the driver's (an emulated instruction set, or oneDNN off, reaches the workers).
            env.update({k: os.environ[k] for k in ('ONEDNN_MAX_CPU_ISA', 'TF_ENABLE_ONEDNN_OPTS') if k in os.environ})
            env.setdefault('TF_CPP_MIN_LOG_LEVEL', os.environ.get('TF_CPP_MIN_LOG_LEVEL', '3'))
            if self._address is None:  # Local workers import this package from where the driver does.
                package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                inherited = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
                env['PYTHONPATH'] = os.pathsep.join(dict.fromkeys([package_root, *inherited]))
            actor = ray.remote(num_cpus=1, max_restarts=0)(worker_actor.Worker)
            for i in range(self.num_workers):
                core = self._cores[i % len(self._cores)] if self._cores else None
                options = actor.options(runtime_env={'env_vars': env}, name=None)
                self._actors.append(options.remote(self._recipe, core, i))
            self.names = self._started([a.describe.remote() for a in self._actors])
            self._program, self._group_size, self._stateful = self._started([self._actors[0].layout.remote()])[0]
            logging.getLogger('ray.dag.compiled_dag_node').addFilter(_quiet_cancellations)
            if self._program == 'groups':  # A silo round's phases are Ray tasks (`_silo_round`).
                self._graph = worker_actor.round_graph(self._actors, self._stateful)
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
        if process.stateful and private_states is None:
            raise ValueError("A stateful process needs the clients' private states.")
        if process.stateful != self._stateful:
            raise errors.ConfigError(
                f"--engine_workers: the workers' recipe builds a {'stateful' if self._stateful else 'stateless'} "
                f"process but this round's is {'stateful' if process.stateful else 'stateless'}: give the workers "
                'the recipe of the process being run.'
            )
        if not self._actors:
            raise errors.ConfigError('--engine_workers: the engine workers were stopped (a worker died); rerun.')
        started = time.perf_counter()
        if self._program == 'silos':
            parts = self._silo_shares(list(client_ids))
        else:
            parts = [list(range(a, b)) for a, b in self._group_slices(len(client_ids))]
        assignments = [
            ([client_ids[i] for i in part], None if private_states is None else [private_states[i] for i in part])
            for part in parts
        ]
        timings: dict[str, Any] = dict(workers=sum(1 for part in parts if part))
        if self._program == 'silos':
            output = self._silo_round(process, state, parts, assignments, timings)
        else:
            output = self._group_round(process, state, assignments, timings)
        self.last_timings = dict(round_s=time.perf_counter() - started, **timings)
        return output

    def _group_slices(self, num_clients: int) -> list[tuple[int, int]]:
        """Each worker's ``[start, stop)`` of a group round's clients: equal whole-group shares (`shares`), or with
        ``balance`` the split the workers' measured speeds predict to be fastest (`balance.GroupBalancer`)."""
        even = shares(range(num_clients), self.num_workers, self._group_size)
        even += [(num_clients, num_clients)] * (self.num_workers - len(even))
        counts = [-(-(b - a) // self._group_size) for a, b in even]
        if self.balance:
            counts = self.balancer.counts(sum(counts), counts, self._counts)
        self._counts = counts
        return balance_lib.slices(num_clients, self._group_size, counts)

    def _gather(self, submit: Callable[[], Any]) -> Any:
        """The values of what `submit` starts on the workers; a failure raised as `_failed` says (a worker's death
        also ends this block's workers: a compiled graph is torn down with it)."""
        import ray  # pylint: disable=g-import-not-at-top

        try:
            # No practical limit: a round takes what it takes and a death ends it. (Not -1, "none": Ray 2.40 turns
            # it into an immediate timeout when a channel grows for a message larger than its buffer.)
            return ray.get(submit(), timeout=_ROUND_TIMEOUT_S)
        except Exception as error:  # pylint: disable=broad-except
            failure = self._failed(error)
            if isinstance(failure, errors.WorkerError):
                self._close()
            raise failure from None

    def _group_round(self, process: Any, state: Any, assignments: list, timings: dict[str, Any]) -> Any:
        """A group round: the compiled graph (`worker_actor.round_graph`), then the server step here."""
        started, submitted = time.perf_counter(), []

        def submit() -> Any:
            references = self._graph.execute(state.global_model_weights, *assignments)
            submitted.append(time.perf_counter())
            return references

        values = self._gather(submit)
        got = time.perf_counter()
        # Copied out of the graph's channels (read in place; the next round writes there).
        private = [s for share in values[1:] for s in worker_actor.copied(share)] if process.stateful else None
        merged = worker_actor.copied(values[0])
        timings['shares_s'] = merged.pop('seconds')
        timings['groups'] = list(self._counts or [])
        if self._counts is not None:
            self.balancer.record(self._counts, timings['shares_s'])
        clock = merged.pop('clock')
        del values
        num_clients = sum(len(ids) for ids, _ in assignments)
        output = process.backend.round_runner.finish(state, merged, private, num_clients=num_clients)
        timings.update(submit_s=submitted[0] - started, wait_s=got - submitted[0], finish_s=time.perf_counter() - got)
        if clock['host'] == socket.gethostname():  # The workers' timeline on this host's clock.
            timings.update(
                start_delays_s=[s - submitted[0] for s in clock['started']],
                merges_s=clock['merges'],
                transport_s=got - clock['ready'],
            )
        return output

    def _silo_shares(self, client_ids: list[str]) -> list[list[int]]:
        """The round's silos (indices) per worker: contiguous shares while a silo's seconds are unknown (the first
        round), then the longest silos first, each to the least loaded worker (silos' sizes differ by up to 60x),
        kept while the round's silos stay the same (a silo moved to another worker compiles its shapes there)."""
        key = tuple(client_ids)
        if key in self._silo_plans:  # Kept while the round's silos are the same: a worker's silos, compiled.
            self._silo_plans.move_to_end(key)
            return self._silo_plans[key]
        if any(c not in self._silo_seconds for c in client_ids):
            slices = shares(client_ids, self.num_workers, 1)
            return [list(range(a, b)) for a, b in slices] + [[]] * (self.num_workers - len(slices))
        loads = [0.0] * self.num_workers
        parts: list[list[int]] = [[] for _ in range(self.num_workers)]
        for i in sorted(range(len(client_ids)), key=lambda i: -self._silo_seconds[client_ids[i]]):
            w = min(range(self.num_workers), key=loads.__getitem__)
            parts[w].append(i)
            loads[w] += self._silo_seconds[client_ids[i]]
        self._silo_plans[key] = [sorted(part) for part in parts]
        while len(self._silo_plans) > _SILO_PLANS:
            self._silo_plans.popitem(last=False)
        return self._silo_plans[key]

    def _silo_round(
        self, process: Any, state: Any, parts: list[list[int]], assignments: list, timings: dict[str, Any]
    ) -> Any:
        """A silo round (`fedpersonal.runtime.worker_actor`): the clients' first phase on the workers, the server
        step here on every upload in client order (as a local round's), the second phase on the workers. Which
        worker trains a silo changes nothing in its numbers."""
        import ray  # pylint: disable=g-import-not-at-top

        runner = process.backend.round_runner
        started = time.perf_counter()
        received, distributor_state = runner.distribute(state)
        sent = ray.put(worker_actor.as_numpy(received))  # Serialized once for every worker.
        firsts = self._gather(lambda: [a.silo_clients.remote(sent, s) for a, s in zip(self._actors, assignments)])
        clients_done = time.perf_counter()
        order = [i for part in parts for i in part]  # The workers' outputs' clients, back in client order below.
        in_order = lambda values: [v for _, v in sorted(zip(order, values), key=lambda pair: pair[0])]
        uploads, metrics = in_order([u for f in firsts for u in f[0]]), in_order([m for f in firsts for m in f[1]])
        ids = [c for ids, _ in assignments for c in ids]
        self._silo_seconds.update(zip(ids, [s for f in firsts for s in f[3]]))
        server = runner.server(state, uploads, metrics)
        value = None if server[-1] is None else ray.put(worker_actor.as_numpy(server[-1]))
        server_done = time.perf_counter()
        updated = self._gather(lambda: [a.silo_update.remote(value) for a in self._actors])
        private = in_order([s for share in updated for s in worker_actor.copied(share)])  # Ray's: read-only.
        output = runner.output(state, distributor_state, server, private)
        timings.update(
            silos=parts,
            shares_s=[f[2] for f in firsts],
            clients_s=clients_done - started,
            server_s=server_done - clients_done,
            update_s=time.perf_counter() - server_done,
        )
        return output


@dataclasses.dataclass(frozen=True)
class Request:
    """A binary's ``--engine_workers``, ``--ray_address`` and ``--engine_workers_balance``: how many engine workers,
    on which Ray cluster, whether their shares follow their speeds (`EngineWorkers`' ``balance``)."""

    workers: int
    address: str | None = None
    balance: bool = False


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
    with EngineWorkers(recipe, wanted.workers, address=wanted.address, balance=wanted.balance) as workers:
        yield workers
