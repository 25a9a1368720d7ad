"""The client state store interface, spec validation, encoding and default initializers.

In partially local federated learning (FURL, FedRecon with kept local state), each
client owns private values (e.g. a user embedding) that never leave it. A
simulation keeps them between rounds in a `ClientStateStore` keyed by client id.

A client's state is a `State`: a list of numpy arrays in a fixed order (e.g. the
model's local trainable variables), described by the store's `spec`, a list of
`(shape, dtype)` pairs. Every value written is validated against the spec.

Versioning (shared by every implementation):

* `register` writes initial values ("round 0"); they are durable and committed at
  once, and `rollback` never removes them.
* `put(ids, states, round_num)` writes the values a round produced. Writes are
  *pending* until `commit(r)` (called right after the server state of round `r`
  was checkpointed) makes them the clients' committed values. A client keeps one
  pending write, its latest: a later round's write supersedes it, so a store holds
  at most two values per client however many rounds pass between checkpoints
  (keeping every round's would hold, e.g., 50 rounds of 943 clients' 336 KB item
  tables between two checkpoints: 16 GB).
* `rollback(r)` (on resume from the server checkpoint of round `r`) discards every
  pending write with round > r, so each client is back to its value of round r;
  clients written for the first time after round `r` are unregistered. Only the
  rounds the training loop resumes from are possible targets: the committed round
  (a checkpoint is committed before the next round runs) or a round no earlier
  than every pending write (a checkpoint written but not committed; nothing to
  discard). Committed values older than the last committed round are not kept
  either.
* `get` returns a client's latest value, pending or committed; a client that was
  never stored gets `default_fn(client_id)` and stays unregistered.

This module and the stores use numpy and the standard library only.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors

State = list[np.ndarray]
Spec = list[tuple[tuple[int, ...], np.dtype]]
DefaultFn = Callable[[str], State]


class CorruptStateError(errors.DataError):
    """A stored value cannot be decoded (wrong length, missing bytes)."""


def normalize_spec(spec: Iterable[tuple[Sequence[int], Any]]) -> Spec:
    """Returns `spec` as a list of `(tuple of ints, np.dtype)` pairs.

    Args:
      spec: `(shape, dtype)` pairs; shapes are sequences of non-negative ints,
        dtypes anything `np.dtype` accepts, or a `tf.DType` (no object or
        structured dtypes).

    Returns:
      The normalized spec.

    Raises:
      ValueError: If a shape or dtype is not supported.
    """
    result: Spec = []
    for index, entry in enumerate(spec):
        try:
            shape, dtype = entry
        except (TypeError, ValueError) as e:
            raise ValueError(f'spec entry {index} must be a (shape, dtype) pair, got {entry!r}') from e
        try:
            dims = tuple(int(d) for d in shape)
        except TypeError as e:
            raise ValueError(f'spec entry {index}: shape must be a sequence of ints, got {shape!r}') from e
        if any(d < 0 for d in dims) or any(int(d) != d for d in shape):
            raise ValueError(f'spec entry {index}: shape must have non-negative int dims, got {shape!r}')
        try:
            dt = np.dtype(getattr(dtype, 'as_numpy_dtype', dtype))  # Also takes a tf.DType (duck-typed).
        except TypeError as e:
            raise ValueError(f'spec entry {index}: {dtype!r} is not a dtype') from e
        if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
            raise ValueError(f'spec entry {index}: dtype {dt} is not a plain numeric dtype')
        result.append((dims, dt))
    return result


def spec_of(state: Sequence[Any]) -> Spec:
    """The spec describing one example state (e.g. the values of a model's local variables).

    Args:
      state: Arrays (or anything `np.asarray` accepts).

    Returns:
      The `(shape, dtype)` of each array, in order.
    """
    arrays = [np.asarray(a) for a in state]
    return normalize_spec((a.shape, a.dtype) for a in arrays)


def spec_to_json(spec: Spec) -> str:
    """A canonical JSON text for a normalized spec (byte order included)."""
    return json.dumps([{'shape': list(shape), 'dtype': dtype.str} for shape, dtype in spec])


def format_spec(spec: Spec) -> str:
    """A short human-readable spec, e.g. `[(32,) float32, () int64]`."""
    return '[' + ', '.join(f'{shape} {dtype}' for shape, dtype in spec) + ']'


class StateCodec:
    """Validates states against a spec and converts them to and from one bytes blob.

    The blob of a state is the concatenation of its arrays' raw C-order bytes, in
    spec order, in the spec's dtypes (native byte order unless the spec says
    otherwise).
    """

    def __init__(self, spec: Spec):
        self.spec = spec
        self._sizes = [int(np.prod(shape, dtype=np.int64)) for shape, _ in spec]
        self._nbytes = [size * dtype.itemsize for size, (_, dtype) in zip(self._sizes, spec)]
        self.nbytes = sum(self._nbytes)

    def validate(self, client_id: str, state: Any) -> State:
        """Returns `state` as a list of arrays after checking it against the spec.

        Args:
          client_id: Named in error messages.
          state: A sequence of array-likes, one per spec entry.

        Returns:
          The arrays (`np.asarray` of each entry; not copied).

        Raises:
          ValueError: Naming the client id, and the array index with the expected
            and actual shape/dtype, if the state does not match the spec.
        """
        if not isinstance(state, (list, tuple)) and (isinstance(state, np.ndarray) or not isinstance(state, Sequence)):
            raise ValueError(
                f'client {client_id!r}: state must be a list of {len(self.spec)} arrays '
                f'(spec {format_spec(self.spec)}), got {type(state).__name__}'
            )
        if len(state) != len(self.spec):
            raise ValueError(
                f'client {client_id!r}: state has {len(state)} arrays, expected {len(self.spec)} '
                f'(spec {format_spec(self.spec)})'
            )
        arrays = []
        for index, (value, (shape, dtype)) in enumerate(zip(state, self.spec)):
            array = value if type(value) is np.ndarray else np.asarray(value)  # pylint: disable=unidiomatic-typecheck
            if array.shape != shape or array.dtype != dtype:
                raise ValueError(
                    f'client {client_id!r}: array {index} expected shape {shape} dtype {dtype}, '
                    f'got shape {array.shape} dtype {array.dtype}'
                )
            arrays.append(array)
        return arrays

    def encode(self, client_id: str, state: Any) -> bytes:
        """Validates `state` and returns its blob (raises ValueError like `validate`)."""
        arrays = self.validate(client_id, state)
        if len(arrays) == 1:
            return arrays[0].tobytes()
        return b''.join(a.tobytes() for a in arrays)

    def decode(self, client_id: str, blob: bytes | None) -> State:
        """Returns fresh, writable arrays from a blob.

        Raises:
          CorruptStateError: Naming the client id, if the blob's length does not
            match the spec.
        """
        if blob is None or len(blob) != self.nbytes:
            got = 'no value' if blob is None else f'{len(blob)} bytes'
            raise CorruptStateError(
                f'client {client_id!r}: stored state is corrupt: expected {self.nbytes} bytes '
                f'for spec {format_spec(self.spec)}, got {got}'
            )
        state = []
        offset = 0
        for size, nbytes, (shape, dtype) in zip(self._sizes, self._nbytes, self.spec):
            state.append(np.frombuffer(blob, dtype=dtype, count=size, offset=offset).reshape(shape).copy())
            offset += nbytes
        return state


class ClientStateStore(abc.ABC):
    """Per-client private state kept between rounds, keyed by client id.

    See the module docstring for the versioning semantics shared by all stores.
    Stores are context managers (`close()` on exit).

    Attributes:
      spec: Shape and dtype of each array of a state.
      default_fn: Value of a client that was never stored.
    """

    def __init__(self, spec: Iterable[tuple[Sequence[int], Any]], default_fn: DefaultFn):
        self.spec: Spec = normalize_spec(spec)
        self.default_fn = default_fn
        self._codec = StateCodec(self.spec)

    @abc.abstractmethod
    def get(self, client_ids: Sequence[str]) -> list[State]:
        """Latest values of clients.

        Args:
          client_ids: Client ids (duplicates allowed).

        Returns:
          One fresh state per id, in order: the latest value stored (pending or
          committed), or `default_fn(client_id)` for a client never stored (which
          does not register it).
        """

    @abc.abstractmethod
    def contains(self, client_id: str) -> bool:
        """Whether the client has a stored value (registered or put)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of registered clients (those with a stored value)."""

    @abc.abstractmethod
    def put(self, client_ids: Sequence[str], states: Sequence[State], round_num: int) -> None:
        """Writes the values produced in round `round_num`, atomically.

        A client not yet registered becomes registered. Writing the same client
        twice in one round replaces the first write.

        Args:
          client_ids: Distinct client ids.
          states: One state per id, matching the spec.
          round_num: The round that produced the values; must be greater than
            `committed_round()`.

        Raises:
          ValueError: On a spec mismatch (naming the client and array index),
            duplicate ids, mismatched lengths or a round <= `committed_round()`;
            nothing is written then.
        """

    @abc.abstractmethod
    def register(self, client_ids: Sequence[str], states: Sequence[State] | None = None) -> None:
        """Registers clients with initial values (round 0), atomically.

        Initial values are committed at once (never rolled back). Meant for bulk
        initialization of up to millions of clients: `client_ids` and `states` may
        be any iterables with a length and are consumed in order.

        Args:
          client_ids: Distinct ids of clients that are not registered yet.
          states: One state per id, or None to use `default_fn(client_id)`.

        Raises:
          ValueError: If a client is already registered or listed twice, or on a
            spec mismatch; nothing is registered then.
        """

    @abc.abstractmethod
    def commit(self, round_num: int) -> None:
        """Durability point, called right after the server state of `round_num` was checkpointed.

        Every pending write becomes its client's committed value; the values it
        supersedes are deleted.

        Raises:
          ValueError: If `round_num < committed_round()`, or a write of a round
            after `round_num` is pending (its client's earlier write is not kept).
        """

    @abc.abstractmethod
    def rollback(self, round_num: int) -> None:
        """Discards every write with round > `round_num` (on resume from that server checkpoint).

        Each client gets back its value of round `round_num`; clients first
        written after `round_num` are unregistered.

        Raises:
          ValueError: If `round_num < committed_round()`, or if it is after the
            committed round but before a pending write (only a client's latest
            pending write is kept, so its value of `round_num` is gone).
        """

    @abc.abstractmethod
    def committed_round(self) -> int:
        """The last committed round (0 if none)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the store's resources; it cannot be used afterwards."""

    def __enter__(self) -> ClientStateStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _default(self, client_id: str) -> State:
        """`default_fn(client_id)`, validated and copied."""
        return [np.array(a, copy=True) for a in self._codec.validate(client_id, self.default_fn(client_id))]


def check_round(round_num: int, committed: int, what: str) -> int:
    """Validates a round number against the committed round; returns it as an int."""
    if isinstance(round_num, bool) or int(round_num) != round_num:
        raise ValueError(f'{what}: round_num must be an int, got {round_num!r}')
    round_num = int(round_num)
    if round_num < 0:
        raise ValueError(f'{what}: round_num must be >= 0, got {round_num}')
    if what == 'put' and round_num <= committed:
        raise ValueError(
            f'put: round {round_num} is not after the committed round {committed}; committed values '
            'cannot be rewritten (rollback first when resuming from an older checkpoint)'
        )
    if what in ('commit', 'rollback') and round_num < committed:
        raise ValueError(
            f'{what}({round_num}): round {committed} is already committed and older versions are '
            f'not kept, so the store cannot go back before round {committed}'
        )
    return round_num


class PendingWrites:
    """Each client's latest write since the last commit: the bookkeeping both stores share (module doc).

    `stored(ids)` (given to `put` and `drop_after`) returns the ids among `ids` that have a committed value, so
    `new_clients` counts the written clients a commit will register.
    """

    def __init__(self) -> None:
        self._writes: dict[str, tuple[int, bytes]] = {}  # client id -> (round, blob).
        self.new_clients = 0

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._writes

    def blob(self, client_id: str) -> bytes | None:
        write = self._writes.get(client_id)
        return None if write is None else write[1]

    def put(
        self,
        client_ids: Sequence[str],
        blobs: Sequence[bytes],
        round_num: int,
        stored: Callable[[list[str]], set[str]],
    ) -> None:
        unwritten = [cid for cid in client_ids if cid not in self._writes]
        self.new_clients += len(unwritten) - len(stored(unwritten))
        self._writes.update((cid, (round_num, blob)) for cid, blob in zip(client_ids, blobs))

    def drop_after(self, round_num: int, stored: Callable[[list[str]], set[str]]) -> None:
        """Discards the writes of rounds after `round_num`."""
        dropped = [cid for cid, (r, _) in self._writes.items() if r > round_num]
        self.new_clients -= len(dropped) - len(stored(dropped))
        for cid in dropped:
            del self._writes[cid]

    def writes(self) -> list[tuple[str, int, bytes]]:
        """Every write as ``(client id, round, blob)``."""
        return [(cid, r, blob) for cid, (r, blob) in self._writes.items()]

    def clear(self) -> None:
        """Forgets every write (once committed)."""
        self._writes, self.new_clients = {}, 0

    def check(self, round_num: int, committed: int, what: str) -> None:
        """Raises ValueError if `commit` or `rollback` (`what`) of `round_num` needs a superseded write.

        Args:
          round_num: The round of the commit or rollback (already `check_round`ed).
          committed: The committed round.
          what: ``'commit'`` or ``'rollback'``.
        """
        latest = max((r for r, _ in self._writes.values()), default=None)
        if latest is None or latest <= round_num or (what == 'rollback' and round_num == committed):
            return
        targets = (
            f'roll back to the committed round {committed} or to a round >= {latest}'
            if what == 'rollback'
            else f'commit a round >= {latest}'
        )
        raise ValueError(
            f'{what}({round_num}): a write of round {latest} is pending and the store keeps only the latest '
            f'write of each client since round {committed}, so the values of round {round_num} are not kept; {targets}'
        )


def check_distinct(client_ids: Sequence[str], what: str) -> None:
    """Raises ValueError naming a client id that is listed twice."""
    if len(set(client_ids)) != len(client_ids):
        seen = set()
        for cid in client_ids:
            if cid in seen:
                raise ValueError(f'{what}: client {cid!r} is listed more than once')
            seen.add(cid)


def check_client_id(client_id: Any) -> str:
    if not isinstance(client_id, str):
        raise ValueError(f'client ids must be str, got {type(client_id).__name__} {client_id!r}')
    return client_id


# ----------------------------------------------------------------------------------------------- defaults


def zeros_default(spec: Iterable[tuple[Sequence[int], Any]]) -> DefaultFn:
    """A `default_fn` giving every client all-zero arrays.

    Args:
      spec: The store's spec.

    Returns:
      `client_id -> [np.zeros(shape, dtype) for each spec entry]`.
    """
    spec = normalize_spec(spec)

    def default_fn(client_id: str) -> State:
        del client_id
        return [np.zeros(shape, dtype) for shape, dtype in spec]

    return default_fn


_SEEDED_UNIFORM_DOMAIN = b'fedpersonal.client_state.seeded_uniform/v1'


def seeded_uniform_default(spec: Iterable[tuple[Sequence[int], Any]], scale: float, seed: int) -> DefaultFn:
    """A `default_fn` giving each client its own uniform random values in [-scale, scale].

    The values are a deterministic function of `(seed, client_id, spec)` only,
    identical across processes, platforms and Python hash seeds: the bits come
    from SHAKE-128 of the seed and the UTF-8 client id (not Python's `hash()`),
    read as little-endian uint64 words, one per element in spec order, each mapped
    to a float64 in [0, 1) with 53 random bits, then to `scale * (2u - 1)` and cast
    to the entry's dtype (rounding may reach +scale in float32/float16).

    Args:
      spec: The store's spec; every dtype must be a floating-point dtype.
      scale: Half-width of the interval (>= 0).
      seed: Any int (e.g. the experiment seed).

    Returns:
      The default function.

    Raises:
      ValueError: If a dtype is not floating point or `scale` is negative.
    """
    spec = normalize_spec(spec)
    for index, (_, dtype) in enumerate(spec):
        if not np.issubdtype(dtype, np.floating):
            raise ValueError(f'seeded_uniform_default: spec entry {index} has dtype {dtype}, not a float dtype')
    if not scale >= 0:
        raise ValueError(f'seeded_uniform_default: scale must be >= 0, got {scale}')
    sizes = [int(np.prod(shape, dtype=np.int64)) for shape, _ in spec]
    total = sum(sizes)
    prefix = _SEEDED_UNIFORM_DOMAIN + b'\0' + str(int(seed)).encode('ascii') + b'\0'
    scale = float(scale)
    step = 2.0 * scale / 2.0**53  # Exact: a power of two times `scale`.
    shift = np.uint64(11)
    word = np.dtype('<u8')

    def default_fn(client_id: str) -> State:
        digest = hashlib.shake_128(prefix + client_id.encode('utf-8')).digest(8 * total)
        values = (np.frombuffer(digest, dtype=word) >> shift) * step - scale  # float64: 53-bit uniform.
        if len(spec) == 1:  # Fast path (bulk registration of e.g. one user embedding).
            return [values.astype(spec[0][1]).reshape(spec[0][0])]
        state = []
        offset = 0
        for size, (shape, dtype) in zip(sizes, spec):
            state.append(values[offset : offset + size].astype(dtype).reshape(shape))
            offset += size
        return state

    return default_fn
