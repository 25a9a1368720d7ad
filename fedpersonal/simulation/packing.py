"""Clients' data as fixed-shape tensors: the input of one compiled group of logical clients.

A client's work reads one or more *phases* of batches (FedRecon: the support set, then the query set; FURL:
its training batches). `ClientPacker` turns each client's `tf.data.Dataset` into those phases exactly as the
per-client path iterates them (the phase function is the same: e.g. the algorithm's dataset split function
with its epochs and step caps), materializes every batch once, and stacks a group of clients into

    {phase: {'batch': <element structure of [clients, steps, batch, ...] arrays>,
             'mask':  [clients, steps, batch] float32 (1 for a real example),
             'steps': [clients] int32 (the client's number of batches)}}

Shorter clients, smaller batches and empty slots are zero-padded and masked. Shapes only grow: steps are
padded to a power of two and the batch and group sizes are fixed, so a run traces and compiles its group
computation once (a rare larger client recompiles once).

Client datasets are materialized once per client id (`pack(..., client_ids=...)`), which assumes they yield
the same batches every round, as the package's tasks do; without ids every round is materialized afresh. The
materialized clients are kept in a cache bounded in bytes (least recently used clients evicted, materialized again
when sampled again), and `ClientPacker.prefetch` materializes the next round's clients on a background thread while
the current round computes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal import progress
from fedpersonal.core.process import LazyDatasets as LazyDatasets
from fedpersonal.simulation import materialize
from fedpersonal.simulation import options as simulation_options

PhaseFn = Callable[[tf.data.Dataset], Sequence[tf.data.Dataset]]
# Clients read per compiled pass (`materialize`): a prefetch's first clients can be packed while later ones are read.
_PASS_CLIENTS = 64
BatchPhaseFn = Callable[[list[Any]], Sequence[list[Any]]]


class _Read(NamedTuple):
    """A client's batches already read as numpy (`ArrayDatasets.numpy_batches`), in place of its dataset."""

    batches: list[Any]


class _Phase:
    """One phase of one client: its batches stacked as ``[steps, batch, ...]`` leaves plus the example mask."""

    def __init__(self, batches: list[Any], element_spec: Any):
        specs = tf.nest.flatten(element_spec)
        flat = [tf.nest.flatten(b) for b in batches]
        self.steps = len(batches)
        self.batch_size = max((len(f[0]) for f in flat), default=0)
        self.leaves = []
        for k, spec in enumerate(specs):
            rows = [f[k] for f in flat]
            inner = np.max([r.shape[1:] for r in rows], axis=0).astype(int) if rows else _known(spec.shape[1:])
            leaf = np.zeros([self.steps, self.batch_size, *inner], spec.dtype.as_numpy_dtype)
            for s, row in enumerate(rows):
                leaf[(s, slice(0, len(row))) + tuple(slice(0, d) for d in row.shape[1:])] = row
            self.leaves.append(leaf)
        self.mask = np.zeros([self.steps, self.batch_size], np.float32)
        for s, f in enumerate(flat):
            self.mask[s, : len(f[0])] = 1.0

    @property
    def nbytes(self) -> int:
        """The bytes this phase holds (its leaves and mask): what it costs `ClientPacker`'s cache."""
        return int(sum(leaf.nbytes for leaf in self.leaves) + self.mask.nbytes)


_ALIGN = 64  # Bytes: TensorFlow's buffer alignment (EIGEN_MAX_ALIGN_BYTES); it adopts such arrays without a copy.
_SHARABLE = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64))


def aligned_zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """``np.zeros(shape, dtype)`` whose buffer starts on a 64-byte boundary, so `as_tensors` can share it."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.zeros(size + _ALIGN, np.uint8)
    start = -buffer.ctypes.data % _ALIGN
    return buffer[start : start + size].view(dtype).reshape(shape)


def _as_tensor(value: Any) -> tf.Tensor:
    """`tf.convert_to_tensor`, without copying an aligned numeric numpy array (DLPack: the tensor shares its
    buffer, which must not change afterwards; a packed group's arrays never do)."""
    if (
        isinstance(value, np.ndarray)
        and value.size
        and value.dtype in _SHARABLE
        and value.flags['C_CONTIGUOUS']
        and value.ctypes.data % _ALIGN == 0
    ):
        return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
    return tf.convert_to_tensor(value)


def as_tensors(group: Any) -> Any:
    """A packed group (or any structure of arrays) as tensors; the large arrays of `ClientPacker`'s groups are
    shared with TensorFlow, not copied (measured on FURL's ASSISTments group, 4.5 MB: ~0.6 ms per round; 21 MB:
    5 ms)."""
    return tf.nest.map_structure(_as_tensor, group)


def _known(shape: tf.TensorShape) -> list[int]:
    return [d if d is not None else 0 for d in shape.as_list()]


def stacked_type(member: tff.Type) -> tff.Type:
    """The type of a group's values of `member` stacked per client (a leading axis of unknown size)."""
    specs = tff.types.type_to_tf_tensor_specs(member)
    stacked = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape], t.dtype), specs)
    return tff.types.tensorflow_to_type(stacked)


def _bucket(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def batches_as_tff_sees(dataset: tf.data.Dataset) -> list[Any]:
    """The batches of `dataset` in the order a TFF computation receiving it iterates them (numpy).

    A dataset shuffled with ``reshuffle_each_iteration`` yields a new order every time the same Python object is
    iterated, while TFF serializes it for every call, so each call starts from the first order. Iterating the
    dataset inside a TFF computation gives exactly what the per-client path trains on, however often the object
    was iterated before.
    """
    spec = dataset.element_spec
    key = repr(spec)
    if key not in _COLLECTORS:
        leaves = tf.nest.flatten(spec)

        @tff.tensorflow.computation(tff.SequenceType(tff.types.tensorflow_to_type(spec)))
        def collect(batches):
            def step(acc, batch):
                values, sizes = acc
                flat = tf.nest.flatten(batch)
                return tuple(tf.concat([a, b], 0) for a, b in zip(values, flat)), tf.concat(
                    [sizes, tf.shape(flat[0])[:1]], 0
                )

            initial = (tuple(tf.zeros([0, *s.shape[1:]], s.dtype) for s in leaves), tf.zeros([0], tf.int32))
            return batches.reduce(initial, step)

        _COLLECTORS[key] = collect
    values, sizes = _COLLECTORS[key](dataset)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [
        tf.nest.pack_sequence_as(spec, [np.asarray(v)[a:b] for v in values]) for a, b in zip(bounds[:-1], bounds[1:])
    ]


_COLLECTORS: dict[str, Any] = {}


class ClientPacker:
    """Packs clients' datasets into fixed-shape groups for the engine's group computation.

    Args:
      phase_fn: ``dataset -> (phase datasets...)`` as the per-client path iterates them, or
      batch_phase_fn: the same on the client's batches held as numpy structures (much faster: the dataset
        is iterated once, e.g. `dataset_split.split_batches`).
      phase_names: One name per phase.
      element_spec: The batches' element spec (the model's input spec).
      group_size: At most this many logical clients per group. A round's clients are split into the fewest
        groups of at most `group_size`, of equal size (the last one padded with empty clients), so a fixed
        number of clients per round gives fixed shapes.
      cache_bytes: The most bytes of materialized clients kept between rounds (least recently used clients are
        evicted after each insertion; an evicted client is materialized again when it is sampled again). None:
        `simulation_options.default_cache_bytes()`, a share of the machine's memory.
    """

    checks_batches = True  # `pack(..., check=...)` checks each client's batches as it materializes them.

    def __init__(
        self,
        phase_fn: PhaseFn | None,
        phase_names: Sequence[str],
        element_spec: Any,
        group_size: int,
        *,
        batch_phase_fn: BatchPhaseFn | None = None,
        cache_bytes: int | None = None,
    ):
        if (phase_fn is None) == (batch_phase_fn is None):
            raise ValueError('Give exactly one of phase_fn and batch_phase_fn.')
        if group_size < 1:
            raise errors.ConfigError(f'group_size must be >= 1, got {group_size}.')
        if cache_bytes is not None and cache_bytes < 0:
            raise errors.ConfigError(f'cache_bytes must be >= 0, got {cache_bytes}.')
        self._phase_fn = phase_fn
        self._batch_phase_fn = batch_phase_fn
        self.phase_names = tuple(phase_names)
        self.element_spec = element_spec
        self.group_size = int(group_size)
        self.cache_bytes = simulation_options.default_cache_bytes() if cache_bytes is None else int(cache_bytes)
        # Least recently used first. The lock guards the cache, its byte count, `_failed` and `_pending`: the
        # prefetch thread inserts into them while the caller's thread reads them.
        self._cache: collections.OrderedDict[str, list[_Phase]] = collections.OrderedDict()
        self._cached_bytes = 0
        self._failed: dict[str, Exception] = {}  # A prefetched client's error, raised when a round packs it.
        self._pending: set[str] = set()  # Ids the in-flight prefetches will still materialize.
        self._lock = threading.Condition()  # Notified as the prefetch thread finishes each client.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None  # Started by the first `prefetch`.
        self._prefetching: concurrent.futures.Future | None = None
        self._steps = dict.fromkeys(self.phase_names, 1)
        self._batch = dict.fromkeys(self.phase_names, 1)
        self._inner: dict[str, list[np.ndarray]] = {
            name: [np.asarray(_known(s.shape[1:]), int) for s in tf.nest.flatten(element_spec)]
            for name in self.phase_names
        }

    def group_type(self) -> tff.Type:
        """The TFF type of one packed group (unknown sizes as None dimensions)."""

        def leaf(spec: tf.TensorSpec) -> tf.TensorSpec:
            return tf.TensorSpec([None, None, None, *spec.shape[1:]], spec.dtype)

        phase = collections.OrderedDict(
            batch=tf.nest.map_structure(leaf, self.element_spec),
            mask=tf.TensorSpec([None, None, None], tf.float32),
            steps=tf.TensorSpec([None], tf.int32),
        )
        spec = collections.OrderedDict((name, phase) for name in self.phase_names)
        return tff.types.tensorflow_to_type(spec)

    @property
    def cached_bytes(self) -> int:
        """The bytes of the clients the cache holds (never more than `cache_bytes`)."""
        with self._lock:
            return self._cached_bytes

    @property
    def cached_clients(self) -> list[str]:
        """The ids of the cached clients, least recently used first."""
        with self._lock:
            return list(self._cache)

    def _phases(self, name: str, read: list[list[Any]], check: Any) -> list[_Phase]:
        """A client's phases from the batches read from its dataset (`batch_phase_fn`: one list) or from its phase
        datasets (one list each), its batches checked by `check` (named `name`)."""
        if self._batch_phase_fn is not None:
            (batches,) = read
            if check is not None:
                check.check_batches(name, batches)
            phase_batches = self._batch_phase_fn(batches)
        else:
            phase_batches = read
            if check is not None:  # The batches the client trains on (its phases' parts of its data).
                check.check_batches(name, [b for batches in phase_batches for b in batches])
        phases = [_Phase(b, self.element_spec) for b in phase_batches]
        if len(phases) != len(self.phase_names):
            raise ValueError(f'The phase function returned {len(phases)} datasets, expected {self.phase_names}.')
        return phases

    def _getter(self, datasets: Sequence[Any], index: int) -> Callable[[], Any]:
        """How client `index` of `datasets` is read: its numpy batches where the sequence gives them and the packer
        reads a client's batches (`batch_phase_fn`; e.g. `fedpersonal.core.array_data.ArrayDatasets`, no pipeline
        built), else its dataset."""
        numpy_batches = getattr(datasets, 'numpy_batches', None)
        if self._batch_phase_fn is not None and numpy_batches is not None:
            return lambda: _Read(numpy_batches(index))
        return functools.partial(datasets.__getitem__, index)

    def _datasets(self, get_dataset: Callable[[], Any]) -> list[Any]:
        """What is read of a client: its dataset or batches (`batch_phase_fn`), or its phase datasets (`phase_fn`)."""
        dataset = get_dataset()
        if self._batch_phase_fn is not None or isinstance(dataset, _Read):
            return [dataset]
        return list(self._phase_fn(dataset))  # type: ignore[misc]

    def _materialize(self, get_dataset: Callable[[], Any], name: str, check: Any) -> list[_Phase]:
        """A client's phases, its datasets read one by one (each by its own iterator)."""
        read = [d.batches if isinstance(d, _Read) else list(d.as_numpy_iterator()) for d in self._datasets(get_dataset)]
        return self._phases(name, read, check)

    def _materialize_many(
        self, get_datasets: Sequence[Callable[[], tf.data.Dataset]], names: Sequence[str], check: Any
    ) -> list[list[_Phase] | Exception]:
        """Clients' phases, their datasets read together in one pass (`materialize.materialize`: the same batches
        as each dataset's own iterator gives); a client's error (building its dataset, reading it, its check) in
        its place. A pass that fails reads its clients again one by one, from new datasets, so that the error names
        its client and the others read their first iteration as always."""
        results: list[list[_Phase] | Exception | None] = [None] * len(get_datasets)
        built: list[tuple[int, list[tf.data.Dataset]]] = []
        for k, get_dataset in enumerate(get_datasets):
            try:
                built.append((k, self._datasets(get_dataset)))
            except Exception as error:  # pylint: disable=broad-except
                results[k] = error
        flat = [d for _, parts in built for d in parts]
        try:
            passed = iter(materialize.materialize([d for d in flat if not isinstance(d, _Read)]))
            read = [d.batches if isinstance(d, _Read) else next(passed) for d in flat]
        except (tf.errors.OpError, ValueError, TypeError):
            read = None
        start = 0
        for k, parts in built:
            try:
                if read is None:
                    results[k] = self._materialize(get_datasets[k], names[k], check)
                else:
                    results[k] = self._phases(names[k], read[start : start + len(parts)], check)
            except Exception as error:  # pylint: disable=broad-except
                results[k] = error
            start += len(parts)
        return [r for r in results if r is not None]

    def _insert(self, client_id: str, phases: list[_Phase]) -> None:
        """Caches a client's phases, then evicts the least recently used clients beyond `cache_bytes` (the client
        itself too when it alone exceeds it: a round that packs it still holds its arrays). Holds the lock."""
        replaced = self._cache.pop(client_id, None)
        if replaced is not None:
            self._cached_bytes -= sum(p.nbytes for p in replaced)
        self._cache[client_id] = phases
        self._cached_bytes += sum(p.nbytes for p in phases)
        while self._cached_bytes > self.cache_bytes and self._cache:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= sum(p.nbytes for p in evicted)

    def _lookup(self, client_id: str) -> list[_Phase] | None:
        """The client's cached phases (now the most recently used), or None; raises the error its prefetch met."""
        with self._lock:
            error = self._failed.pop(client_id, None)
            if error is not None:
                raise error
            phases = self._cache.get(client_id)
            if phases is not None:
                self._cache.move_to_end(client_id)
            return phases

    def _done(self, client_id: str) -> bool:
        """Whether no prefetch is still to materialize the client (called holding the lock)."""
        return client_id not in self._pending

    def _wait_for_prefetch(self) -> None:
        """Returns once no prefetch is in flight (its errors are kept per client, so waiting raises none)."""
        future, self._prefetching = self._prefetching, None
        if future is not None:
            future.result()

    def prefetch(self, datasets: Sequence[tf.data.Dataset], client_ids: Sequence[str], *, check: Any = None) -> None:
        """Materializes into the cache, on a background thread, the clients not cached yet: e.g. the next round's,
        while the caller's round computes. Returns at once; results never change.

        `datasets[i]` is read on that thread (only for a client not cached), so a lazy sequence builds those
        pipelines there too. `check` (a `fedpersonal.core.input_checks.LabelCheck`) checks each client's batches as
        `pack` would; an error materializing a client is kept and raised by the `pack` that packs that client (a
        client no round packs raises nothing). `pack` waits for the prefetch before materializing any client
        itself, so no client is materialized twice; a client being prefetched is waited for alone, so the clients
        prefetched first can be packed while later ones are read.
        """
        if len(client_ids) != len(datasets):
            raise ValueError(f'{len(client_ids)} client ids for {len(datasets)} datasets.')
        with self._lock:
            wanted: dict[str, int] = {}
            for i, client_id in enumerate(map(str, client_ids)):
                if client_id not in self._cache and client_id not in self._failed and client_id not in self._pending:
                    wanted.setdefault(client_id, i)
            self._pending.update(wanted)
        if not wanted:
            return
        # TFF's context stack is per thread: the prefetch runs any TFF computation of `phase_fn` in the caller's.
        context = tff.framework.get_context_stack().current

        def run() -> None:
            try:
                with tff.framework.get_context_stack().install(context):
                    names = list(wanted)
                    for k in range(0, len(names), _PASS_CLIENTS):
                        part = names[k : k + _PASS_CLIENTS]
                        getters = [self._getter(datasets, wanted[name]) for name in part]
                        results = self._materialize_many(getters, part, check)
                        with self._lock:
                            for client_id, result in zip(part, results):
                                if isinstance(result, Exception):
                                    self._failed[client_id] = result
                                else:
                                    self._insert(client_id, result)
                                self._pending.discard(client_id)
                            self._lock.notify_all()
            finally:  # Whatever stopped it, `pack` never waits for a client it will not materialize.
                with self._lock:
                    self._pending.difference_update(wanted)
                    self._lock.notify_all()

        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='fedpersonal-prefetch')
        # One thread runs the prefetches in order: the last one done, all are.
        self._prefetching = self._executor.submit(run)

    def sizes(self, num_clients: int) -> tuple[int, int]:
        """``(number of groups, clients per group)`` for a round of `num_clients`."""
        groups = max(1, -(-num_clients // self.group_size))
        return groups, max(1, -(-num_clients // groups))

    def pack(
        self,
        datasets: Sequence[tf.data.Dataset],
        client_ids: Sequence[str] | None = None,
        *,
        description: str | None = None,
        check: Any = None,
    ) -> list[Any]:
        """The round's clients as a list of packed groups (in client order, `group_size` per group).

        With `client_ids`, a client's data is materialized once: later rounds read `datasets[i]` only for clients
        not seen before, so `datasets` may be a lazy sequence that builds a pipeline when indexed. With
        `description`, a packing that lasts logs its progress (`fedpersonal.progress.logged`). With `check` (a
        `fedpersonal.core.input_checks.LabelCheck`), each client's batches are checked when materialized (a client
        without an id is named by its position, ``'#<i>'``). A client the cache no longer holds (`cache_bytes`) is
        materialized again; one a `prefetch` materialized (or is materializing: it is waited for) is read from the
        cache, its error, if it met one, raised here; materializing a client here first waits for the in-flight
        prefetches.
        """
        if client_ids is not None and len(client_ids) != len(datasets):
            raise ValueError(f'{len(client_ids)} client ids for {len(datasets)} datasets.')
        ids = None if client_ids is None else [str(c) for c in client_ids]
        found: list[list[_Phase] | None] = [None] * len(datasets)
        missing: dict[str, list[int]] = {}  # Each client read once, however often it appears in the round.
        for i in range(len(datasets)):
            if ids is not None:
                client_id = ids[i]
                with self._lock:  # A prefetch materializing this client: wait for it, not for the whole prefetch.
                    self._lock.wait_for(functools.partial(self._done, client_id))
                found[i] = self._lookup(client_id)
            if found[i] is None:
                missing.setdefault(f'#{i}' if ids is None else ids[i], []).append(i)
        if missing:
            # One thread at a time reads clients' data (a dataset function, a validation or TFF's runtime that
            # `phase_fn` calls need not be thread-safe): the in-flight prefetches first.
            self._wait_for_prefetch()
            names = list(missing)
            passes = [names[k : k + _PASS_CLIENTS] for k in range(0, len(names), _PASS_CLIENTS)]
            if description is not None:
                passes = list(progress.logged(passes, len(passes), f'{description} ({_PASS_CLIENTS} a step)'))
            for part in passes:
                # `datasets[i]` is only read for a client not packed before (a lazy sequence then builds no pipeline).
                getters = [self._getter(datasets, missing[name][0]) for name in part]
                for name, result in zip(part, self._materialize_many(getters, part, check)):
                    if isinstance(result, Exception):
                        raise result
                    if ids is not None:
                        with self._lock:
                            self._insert(name, result)
                    for i in missing[name]:
                        found[i] = result
        clients = [c for c in found if c is not None]
        for p, name in enumerate(self.phase_names):
            steps = max((c[p].steps for c in clients), default=1)
            self._steps[name] = max(self._steps[name], _bucket(steps))
            self._batch[name] = max([self._batch[name]] + [c[p].batch_size for c in clients])
            for c in clients:
                for k, leaf in enumerate(c[p].leaves):
                    self._inner[name][k] = np.maximum(self._inner[name][k], leaf.shape[2:])
        groups, size = self.sizes(len(clients))
        return [self._group(clients[g * size : (g + 1) * size], size) for g in range(groups)]

    def stack_private_states(self, groups: Sequence[Any], private_states: Sequence[Any]) -> list[Any]:
        """The round's private states (one per client) as the engine's `next` takes them: stacked per group."""
        return stack_per_group(groups, private_states)

    def unstack_private_states(self, groups: Sequence[Any], stacked: Sequence[Any], num_clients: int) -> list[Any]:
        """The engine's per-group private states -> one per real client (the first `num_clients` slots)."""
        states = [
            s for group, group_states in zip(groups, stacked) for s in unstack(group_states, group_clients(group))
        ]
        return states[:num_clients]

    def _group(self, clients: list[list[_Phase]], size: int) -> collections.OrderedDict:
        group = collections.OrderedDict()
        for p, name in enumerate(self.phase_names):
            steps, batch = self._steps[name], self._batch[name]
            specs = tf.nest.flatten(self.element_spec)
            leaves = [
                aligned_zeros([size, steps, batch, *self._inner[name][k]], spec.dtype.as_numpy_dtype)
                for k, spec in enumerate(specs)
            ]
            mask = aligned_zeros([size, steps, batch], np.float32)
            num_steps = np.zeros([size], np.int32)
            for g, client in enumerate(clients):
                phase = client[p]
                num_steps[g] = phase.steps
                mask[g, : phase.steps, : phase.batch_size] = phase.mask
                for k, leaf in enumerate(phase.leaves):
                    leaves[k][(g,) + tuple(slice(0, d) for d in leaf.shape)] = leaf
            group[name] = collections.OrderedDict(
                batch=tf.nest.pack_sequence_as(self.element_spec, leaves), mask=mask, steps=num_steps
            )
        return group


def split_group(group: Any, parts: int) -> list[tuple[Any, np.ndarray]]:
    """A packed group as up to `parts` packed groups of its client slots, with each part's slot indices: equal
    numbers of slots (the first parts one more), the slots dealt longest first to the part with the fewest steps so
    far, so that parts run for about as long (and their shapes stay those of a contiguous split)."""
    size = group_clients(group)
    parts = max(1, min(parts, size))
    steps = np.sum([np.asarray(phase['steps'], np.int64) for phase in group.values()], axis=0)
    room = [size // parts + (k < size % parts) for k in range(parts)]
    load, members = [0] * parts, [[] for _ in range(parts)]  # type: list[int], list[list[int]]
    for c in sorted(range(size), key=lambda c: -int(steps[c])):
        k = min((k for k in range(parts) if len(members[k]) < room[k]), key=lambda k: load[k])
        members[k].append(c)
        load[k] += int(steps[c])
    indices = [np.sort(np.asarray(m, np.int64)) for m in members]
    return [(tf.nest.map_structure(lambda a, i=i: np.take(np.asarray(a), i, axis=0), group), i) for i in indices]


def group_clients(group: Any) -> int:
    """The number of client slots of a packed group (real and padding)."""
    return int(next(iter(group.values()))['steps'].shape[0])


def stack_per_group(groups: Sequence[Any], private_states: Sequence[Any]) -> list[Any]:
    """The clients' private states stacked per group (in client order; padding slots repeat the first state)."""
    stacked, start = [], 0
    for group in groups:
        size = group_clients(group)
        members = list(private_states[start : start + size])
        members += [private_states[0]] * (size - len(members))
        stacked.append(tf.nest.map_structure(lambda *values: np.stack([np.asarray(v) for v in values]), *members))
        start += size
    return stacked


def unstack(stacked: Any, size: int) -> list[Any]:
    """A group's stacked private states -> one per client slot (numpy)."""
    arrays = tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, 'numpy') else np.asarray(t), stacked)
    return [tf.nest.map_structure(lambda a: a[k], arrays) for k in range(size)]
