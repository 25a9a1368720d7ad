"""The silo engine: a round's clients each as one compiled program in the driver, from the round's
`fedpersonal.core.RoundFunctions` (the functions the process's TFF computations wrap; nothing here restates them).

For cross-silo rounds (HPFL): a few clients with many records each, each holding tables padded to the largest
silo, whose steps differ by up to 60x. Lockstep would multiply that work (every step updates the full padded
tables), and a compiled loop over silos (`tf.map_fn`) measured 10x slower than a loop of calls (docs/RESULTS.md).
So a round is three phases:

1. **clients** (one XLA-compiled program, called once per client): the client's data as
   `client_work.PaddedBatches` (all clients padded to the round's largest, so one program serves them all, and a
   client runs only its own steps in a `tf.while_loop`), its `client_update` (training, metrics and uploads).
   Each client's tables are first cut to the rows it uses (`shrink`, to 2^k or 3 * 2^(k-1) rows: few compiled
   shapes, at most a third unused), which is exact and saves the padded rows' dense optimizer work; clients are
   submitted longest first to one thread per core;
2. **server** (one program): the `server_step` on the clients' stacked uploads and metrics -- never a table row;
3. **post-aggregation** (one compiled program per client), when the round has one.

The phases are methods (`distribute`, `clients`, `server`, `update`, `output`) that `__call__` composes; engine
workers (`fedpersonal.runtime.engine_workers`) run `clients` and `update` where the silos' data are and the rest
in the driver, so a round on workers is the same code as here (`audit_clients` audits what a silo sends).

`unsupported` says what the engine cannot run as TFF would (an aggregator other than TFF's default, client work
XLA cannot compile); `fedpersonal.backends` then builds the process on the per-client backend. `process.next`
stays the TFF computation (the privacy audit's subject); tests check that `run_round` equals it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib
from fedpersonal.core.round_functions import RoundFunctions
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import packing
from fedpersonal.simulation import round_backend

_MIN_ROWS = 16  # Smallest table cut (fewer compiled shapes).


def unsupported(functions: RoundFunctions) -> str | None:
    """Why the engine cannot run `functions` as the per-client backend does, or None if it can."""
    if functions.not_compilable is not None:
        return f'the engine compiles each client with XLA, and {functions.not_compilable}'
    for name, factory in functions.aggregators.items():
        plain_sum = type(factory) is tff.aggregators.SumFactory  # pylint: disable=unidiomatic-typecheck
        if factory is None or plain_sum:
            continue
        try:
            group_lib.check_aggregator(factory)
        except errors.ConfigError:
            return (
                f"the engine aggregates the uploads as TFF's default factories do, not with {name}="
                f"{type(factory).__name__} (which may act on each client's own upload)"
            )
    return None


def build(functions: RoundFunctions) -> round_backend.EngineBackend:
    """The backend of a process running `functions` on the engine (check `unsupported` first): its packer and
    round runner; the process's TFF `next` takes the clients' data as they are."""
    return round_backend.EngineBackend(
        SiloPacker(repeats=functions.dataset_repeats), SiloRoundRunner(functions), next_takes_packed=False
    )


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def rows(count: Any, capacity: int) -> int:
    """The rows a client's tables are cut to: the smallest 2^k or 3 * 2^(k-1) >= `count` (at most 1/3 unused)."""
    count = max(_MIN_ROWS, int(count))
    power = _pow2(count)
    cut = power * 3 // 4 if power * 3 // 4 >= count else power
    return min(capacity, cut)


class SiloPacker:
    """Packs clients' data (a NamedTuple) with each dataset field as `PaddedBatches` of one shape for all clients
    in a round, the other fields as numpy arrays (materialized once per client id).

    Args:
      repeats: How often each dataset field is iterated (its batches repeated, in the order TFF iterates them).
    """

    def __init__(self, *, repeats: Mapping[str, int]):
        self._repeats = dict(repeats)
        self._cache: dict[Any, Any] = {}

    def _client(self, get_data: Callable[[], Any], key: Any) -> Any:
        """A client's materialized data; `get_data` is only called for a client not cached under `key`."""
        if key is not None and key in self._cache:
            return self._cache[key]
        data = get_data()
        fields: dict[str, Any] = {}
        for name, value in data._asdict().items():
            if isinstance(value, tf.data.Dataset):
                repeated = value.repeat(self._repeats[name]) if name in self._repeats else value
                fields[name] = (packing.batches_as_tff_sees(repeated), value.element_spec)
            else:
                fields[name] = np.asarray(value)
        client = (type(data), fields)
        if key is not None:
            self._cache[key] = client
        return client

    def pack(self, client_data: Sequence[Any], client_ids: Sequence[Any] | None = None) -> list[Any]:
        """Each client's data with `PaddedBatches`, padded to the round's largest client (a power of 2 steps)."""
        keys = list(client_ids) if client_ids is not None else [None] * len(client_data)
        clients = [self._client(functools.partial(client_data.__getitem__, i), k) for i, k in enumerate(keys)]
        splits = [n for n, v in clients[0][1].items() if isinstance(v, tuple)] if clients else []
        sizes = [len(tf.nest.flatten(b)[0]) for _, c in clients for n in splits for b in c[n][0]]
        batch = max(sizes or [1])
        steps = {n: _pow2(max([len(c[n][0]) for _, c in clients] or [1])) for n in splits}
        return [
            container(**{n: _padded(v[0], v[1], steps[n], batch) if n in steps else v for n, v in fields.items()})
            for container, fields in clients
        ]


def _padded(batches: list[Any], spec: Any, steps: int, batch: int) -> client_work.PaddedBatches:
    """`batches` (dicts of arrays) as `PaddedBatches` of `steps` x `batch` examples, with the example mask."""
    arrays = collections.OrderedDict((f, np.zeros([steps, batch], s.dtype.as_numpy_dtype)) for f, s in spec.items())
    mask = np.zeros([steps, batch], np.float32)
    for t, b in enumerate(batches):
        n = len(tf.nest.flatten(b)[0])
        for f in arrays:
            arrays[f][t, :n] = b[f]
        mask[t, :n] = 1.0
    arrays['mask'] = mask
    return client_work.PaddedBatches(arrays, np.int32(len(batches)))


def _tensors(structure: Any) -> Any:
    return tf.nest.map_structure(tf.convert_to_tensor, structure)  # Numpy scalars as arguments would retrace.


def _steps(data: Any) -> int:
    """The steps of a client's first dataset field (HPFL: its training, the costliest part of its work)."""
    return next((int(v.num_steps) for v in data if isinstance(v, client_work.PaddedBatches)), 0)


class SiloRoundRunner:
    """`process.run_round` of a process on the engine (see the module docstring)."""

    worker_program = 'silos'  # What engine workers run of it (`fedpersonal.runtime.worker_actor`).

    def __init__(self, functions: RoundFunctions):
        self._functions = functions
        self.compile_seconds: float | None = None  # The first round's seconds (tracing and XLA compiles).
        self.phase_seconds: dict[str, float] = {}  # The last round's seconds per phase (client, server, update).
        self._noise = tf.function(functions.client_noise) if functions.client_noise is not None else None
        self._client_phase = tf.function(functions.client_update, jit_compile=True)

        @tf.function(jit_compile=False)
        def server_phase(server_state, weights, uploads, client_metrics):
            weights, server_state, measurements = functions.server_step(server_state, weights, uploads, client_metrics)
            sums = tf.nest.map_structure(
                lambda t: tf.reduce_sum(t, 0), tf.vectorized_map(functions.metric_sums, client_metrics)
            )
            return weights, server_state, functions.finalize_metrics(sums), measurements

        self._server_phase = server_phase
        if functions.post_aggregation is not None:
            self._server_value = functions.post_aggregation[0]
            self._update_phase = tf.function(functions.post_aggregation[1], jit_compile=True)
        # Clients are independent: one compiled call per core at a time (XLA's fused loops use one core each).
        # One thread per core this process may use (an engine worker pinned to one core: one), so that each
        # client's seconds (`client_seconds`) are its own.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0))))
        self.client_seconds: list[float] = []  # The last `clients` call's seconds per client, in client order.

    def __call__(
        self, state: Any, clients: Sequence[Any], private_states: Sequence[Any], *, num_clients: int | None = None
    ) -> process_lib.ProcessOutput:
        del num_clients
        first = self.compile_seconds is None
        started = time.perf_counter()
        received, distributor_state = self.distribute(state)
        uploads, client_metrics, kept = self.clients(received, clients, private_states)
        client_done = time.perf_counter()
        server = self.server(state, uploads, client_metrics)
        server_done = time.perf_counter()
        new_states = self.update(server[-1], kept)
        output = self.output(state, distributor_state, server, new_states)
        done = time.perf_counter()
        self.phase_seconds = dict(
            client=client_done - started, server=server_done - client_done, update=done - server_done
        )
        if first:
            self.compile_seconds = done - started
        return output

    # The round's phases, composed above and run apart by engine workers (`fedpersonal.runtime.engine_workers`:
    # `clients` and `update` on the worker holding the clients, `distribute`, `server` and `output` here).

    def distribute(self, state: Any) -> tuple[Any, Any]:
        """What the server sends this round's clients, and the distributor's new state."""
        weights = _tensors(state.global_model_weights)
        return self._functions.distribute(_tensors(state.distributor), weights)

    def clients(self, received: Any, clients: Sequence[Any], private_states: Sequence[Any]) -> tuple[list, list, Any]:
        """Each client's work (phase 1): its upload and metrics (in client order), and what `update` needs (the
        trained private states, kept on the clients' side)."""
        received = _tensors(received)
        cut = [self._cut(data, private) for data, private in zip(clients, private_states)]

        def client(data, private):
            started = time.perf_counter()
            return self._client_phase(*self._arguments(received, data, private)), time.perf_counter() - started

        # Longest client first (by its first dataset's steps): the round waits for its slowest thread (the largest
        # silo has ~30% of the steps).
        order = sorted(range(len(cut)), key=lambda i: -_steps(cut[i][0]))
        futures = {i: self._pool.submit(client, *cut[i]) for i in order}
        results = [futures[i].result() for i in range(len(cut))]
        outputs, self.client_seconds = [out for out, _ in results], [seconds for _, seconds in results]
        uploads, client_metrics, trained = ([out[i] for out in outputs] for i in range(3))
        return uploads, client_metrics, (trained, client_metrics, list(private_states))

    def _cut(self, data: Any, private: Any) -> tuple[Any, Any]:
        """A client's data and private state with its tables cut to the rows it uses (`rows`), when the round cuts."""
        return self._functions.shrink(data, private, rows) if self._functions.shrink is not None else (data, private)

    def _arguments(self, received: Any, data: Any, private: Any) -> tuple:
        """The client program's arguments: what it received, its data, private state and upload noise."""
        data = _tensors(data)
        noise = self._noise(received, data) if self._noise is not None else None
        return _tensors(received), data, _tensors(private), noise

    def audit_clients(self, state: Any, client: Any, private_state: Any) -> list:
        """The privacy audit (`fedpersonal.privacy.audit.audit_tf_function`) of the client program `clients` runs
        (on an engine worker too), traced on one client: its private-state input labelled private, its upload and
        metrics (what leaves the client's side) checked; its trained state goes only to the clients' store."""
        from fedpersonal.privacy import audit  # pylint: disable=g-import-not-at-top

        args = self._arguments(self.distribute(state)[0], *self._cut(client, private_state))
        concrete = self._client_phase.get_concrete_function(*args)
        first = len(tf.nest.flatten(args[:2]))
        private_inputs = concrete.inputs[first : first + len(tf.nest.flatten(args[2]))]
        uploads, metrics, _ = concrete.structured_outputs
        return audit.audit_tf_function(concrete, private_inputs, (uploads, metrics))

    def server(self, state: Any, uploads: Sequence[Any], client_metrics: Sequence[Any]) -> tuple:
        """The server step (phase 2) on every client's upload and metrics, in client order: ``(new weights, server
        state, train metrics, measurements, the value the clients' update phase reads or None)``."""
        stack = lambda values: tf.nest.map_structure(lambda *t: tf.stack(t), *values)
        new_weights, server_state, train_metrics, measurements = self._server_phase(
            _tensors(state.aggregator), _tensors(state.global_model_weights), stack(uploads), stack(client_metrics)
        )
        value = None
        if self._functions.post_aggregation is not None:
            value = self._server_value(new_weights, server_state)
        return new_weights, server_state, train_metrics, measurements, value

    def update(self, value: Any, kept: Any) -> list:
        """The clients' new private states (phase 3: the post-aggregation update on the server step's `value`,
        when the round has one) from what `clients` kept."""
        trained, client_metrics, private_states = kept
        if self._functions.post_aggregation is not None:
            value = _tensors(value)
            trained = list(self._pool.map(lambda t, m: self._update_phase(value, t, m), trained, client_metrics))
        if self._functions.restore is not None:
            return [self._functions.restore(full, process_lib.as_numpy(t)) for full, t in zip(private_states, trained)]
        return [process_lib.as_numpy(t) for t in trained]

    def output(self, state: Any, distributor_state: Any, server: tuple, new_states: list) -> process_lib.ProcessOutput:
        """The round's output from the server step's results and the clients' new private states."""
        new_weights, server_state, train_metrics, measurements, _ = server
        new_state = state._replace(
            global_model_weights=tff.learning.models.ModelWeights(
                trainable=process_lib.as_numpy(list(new_weights.trainable)),
                non_trainable=process_lib.as_numpy(list(new_weights.non_trainable)),
            ),
            distributor=process_lib.as_numpy(distributor_state),
            aggregator=process_lib.as_numpy(server_state),
        )
        metrics = collections.OrderedDict(
            distributor=(), client_work=process_lib.as_numpy(train_metrics), **process_lib.as_numpy(measurements)
        )
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=new_states)
