"""The one protocol of a personalized federated process.

Every algorithm of the package (FedRecon, FURL, Ditto, FedDVA, HPFL and its baselines, FedPer, ...) is a
`PersonalizedProcess`, a `tff.templates.IterativeProcess` whose computations are

    initialize: ( -> state@SERVER)
    next:       (<state@SERVER, {data}@CLIENTS[, {private}@CLIENTS]> ->
                 ProcessOutput<state@SERVER, metrics@SERVER, private_states={private}@CLIENTS or <>>)

A *stateless* process (FedRecon: local variables are reconstructed every round and never persisted) takes no
private states and returns ``private_states=()``. A *stateful* one (FURL, Ditto, FedDVA, HPFL) takes each sampled
client's private state as a CLIENTS-placed input and returns the trained one as a CLIENTS-placed output; between
rounds the states live in a `fedpersonal.client_state` store (see `fedpersonal.program.run_learning_process`).
Nothing derived only from private states reaches a SERVER-placed value (`fedpersonal.privacy.audit`).

`get_model_weights(state)` returns the server's model weights (the global variables) from a state.

`run_round` (what training loops call) is run by the process's `RoundBackend`: by default `PerClientBackend`,
which calls `next` in TFF's runtime; a simulation backend (e.g. `fedpersonal.simulation.round_backend`'s grouped
engine) may run the same round another way, with the same result. The process knows only this protocol.

Around the backend, `run_round` refuses what would give silent numbers: before the round, each client's data is
checked once against the process's `input_check` (`fedpersonal.core.input_checks`: labels outside the model's
outputs); after it, a NaN or infinite loss raises `NonFiniteLossError` (``non_finite='ignore'`` keeps the round).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.core import input_checks
from fedpersonal.core import non_finite as non_finite_lib
from fedpersonal.core.array_data import ArrayDatasets as ArrayDatasets


def as_numpy(structure: Any) -> Any:
    """`structure` with every tensor (and array-like leaf) as a numpy array: what a backend returns to the caller and
    what travels between processes."""
    return tf.nest.map_structure(np.asarray, structure)


class LazyDatasets(Sequence):
    """Clients' datasets (or any per-client inputs), each built when indexed: what `run_round` may take.

    A backend may read only the datasets of clients it has not materialized before (given their ids), and building
    a client's tf.data pipeline costs ~10 ms, more than a whole engine round's client work on MovieLens. (Also
    importable as `fedpersonal.simulation.packing.LazyDatasets`.)
    """

    def __init__(self, client_ids: Sequence[str], make: Callable[[str], Any]):
        self._client_ids, self._make = list(client_ids), make

    def __len__(self) -> int:
        return len(self._client_ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._make(c) for c in self._client_ids[index]]
        return self._make(self._client_ids[index])


class ProcessOutput(NamedTuple):
    """The result of one round of every `PersonalizedProcess`.

    Attributes:
      state: The new server state (SERVER-placed).
      metrics: The round's metrics (SERVER-placed): `client_work`, `aggregator`, ... as in TFF.
      private_states: The sampled clients' new private states (CLIENTS-placed, in the order of the clients
        given to `next`), or ``()`` for a stateless process.
    """

    state: Any
    metrics: Any
    private_states: Any


class RoundBackend(Protocol):
    """What runs a `PersonalizedProcess`'s rounds (`PersonalizedProcess.run_round`); the process holds one.

    `PerClientBackend` (the default) runs `next` in TFF's runtime. A simulation backend may run the round another
    way (e.g. groups of clients compiled by XLA in the driver, `fedpersonal.simulation.round_backend`) with the
    same result, and may use `process.run_next` for TFF's `next` (e.g. under a distributed runtime).
    """

    @property
    def name(self) -> str:
        """The backend's name: ``'per_client'``, ``'engine'``, ... (`PersonalizedProcess.simulation`)."""
        ...

    def run_round(
        self,
        process: PersonalizedProcess,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None,
        *,
        client_ids: Sequence[str] | None,
    ) -> ProcessOutput:
        """One round of `process`, as `PersonalizedProcess.run_round` documents it.

        A backend whose ``checks_inputs`` attribute is True runs ``process.input_check`` on each client's batches
        itself, where it materializes them (the engine's packer); otherwise the process checks each client's
        dataset before calling this.
        """
        ...


class PerClientBackend:
    """The per-client backend: a round is `next` in TFF's runtime, the clients' datasets as they are."""

    name = 'per_client'

    def run_round(
        self,
        process: PersonalizedProcess,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None,
        *,
        client_ids: Sequence[str] | None,
    ) -> ProcessOutput:
        del client_ids  # TFF reads every client's dataset each round.
        return process.run_next(state, list(client_data), private_states)


PER_CLIENT = PerClientBackend()


class PersonalizedProcess(tff.templates.IterativeProcess):
    """A personalized federated learning process: the package's one process protocol.

    Attributes:
      private_state_type: The TFF type of one client's private state, or None for a stateless process.
      global_weights_type: The TFF type of the server's model weights (`get_model_weights`).
      learning_process: For a stateless process built from TFF's templates, the
        `tff.learning.templates.LearningProcess` it wraps (usable with TFF's own tooling); otherwise None.
      parts: Named building blocks of the process (client work, aggregations, ...) for tests, audits and
        analyses; their meaning is documented by each builder.
      backend: The `RoundBackend` running `run_round` (default `PerClientBackend`).
      input_check: What `run_round` checks each client's data against before training it, once per client id
        (every round without ids): a `fedpersonal.core.input_checks.LabelCheck` (integer labels in ``[0, the
        model's outputs)``, set by `fedpersonal.backends.build_process` for a sparse categorical cross-entropy), or
        None (nothing checked).
      max_clients: The most clients `run_round` takes in a round (a server that keeps each upload, e.g. FedAMP's
        table of `fedpersonal.core.server_table`, has room for so many), or None (no limit).
    """

    def __init__(
        self,
        initialize_fn: tff.Computation,
        next_fn: tff.Computation | Callable[[], tff.Computation],
        *,
        get_model_weights: Callable[[Any], Any],
        global_weights_type: tff.Type | None = None,
        private_state_type: tff.Type | None = None,
        initial_private_state_fn: Callable[[], Any] | None = None,
        learning_process: tff.learning.templates.LearningProcess | None = None,
        parts: dict[str, Any] | None = None,
        backend: RoundBackend | None = None,
    ):
        """Args: `initialize_fn` and `next_fn` as TFF's `IterativeProcess` takes them, the rest as the attributes.

        With a `backend` of its own, `next_fn` may also be a no-arg function building the `next` computation: it
        is built (and checked) on first use of `next`, which such a backend's `run_round` may not need; so an
        engine process traces TFF's copy of its client work only when something uses `next` (the privacy audit,
        another runtime).
        """
        if (private_state_type is None) != (initial_private_state_fn is None):
            raise TypeError('private_state_type and initial_private_state_fn go together.')
        self.private_state_type = private_state_type
        if isinstance(next_fn, tff.Computation):
            self._build_next: Callable[[], tff.Computation] | None = None
            self._set_next(initialize_fn, next_fn)
        else:
            if backend is None:
                raise TypeError('next_fn must be a tff.Computation unless a backend runs the rounds (run_round).')
            if initialize_fn.type_signature.parameter is not None:
                raise TypeError(f'initialize_fn takes no argument, got {initialize_fn.type_signature.parameter}.')
            self._initialize_fn = initialize_fn
            self._state_type = initialize_fn.type_signature.result
            self._next_fn = None
            self._build_next = next_fn
        self._get_model_weights = get_model_weights
        self.global_weights_type = global_weights_type
        self._initial_private_state_fn = initial_private_state_fn
        self.learning_process = learning_process
        self.parts = dict(parts or {})
        self.backend: RoundBackend = backend if backend is not None else PER_CLIENT
        self.input_check: input_checks.LabelCheck | None = None
        self.max_clients: int | None = None
        self._checked_clients: set[str] = set()
        self._secure: bool | None = None

    def _set_next(self, initialize_fn: tff.Computation, next_fn: tff.Computation) -> None:
        """Checks `next_fn` against the protocol (and TFF's `IterativeProcess` checks), then sets it."""
        result = next_fn.type_signature.result
        if not (isinstance(result, tff.StructWithPythonType) and result.python_container is ProcessOutput):
            raise TypeError(f'next_fn must return a ProcessOutput, got {result}.')
        num_args = len(next_fn.type_signature.parameter)
        expected = 3 if self.private_state_type is not None else 2
        if num_args != expected:
            raise TypeError(
                f'next_fn of a {"stateful" if expected == 3 else "stateless"} process takes {expected} arguments '
                f'(state, client data{", private states" if expected == 3 else ""}), got {num_args}.'
            )
        super().__init__(initialize_fn, next_fn)

    @property
    def next(self) -> tff.Computation:
        """The round as a TFF computation (placements, audits, other runtimes); built on first use if lazy."""
        if self._next_fn is None:
            assert self._build_next is not None
            self._set_next(self._initialize_fn, self._build_next())
        return self._next_fn

    @property
    def simulation(self) -> str:
        """The backend's name: ``'engine'`` when a simulation engine runs the rounds, else ``'per_client'``."""
        return self.backend.name

    @property
    def engine_strategy(self) -> str | None:
        """How the engine's round runner runs a group's client work (e.g. ``'client_loop'``; its ``strategy``), or
        None without one, or while it is still measuring (``engine_strategy='measure'``)."""
        return getattr(getattr(self.backend, 'round_runner', None), 'strategy', None)

    def run_round(
        self,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None = None,
        *,
        client_ids: Sequence[str] | None = None,
        non_finite: str = 'stop',
    ) -> ProcessOutput:
        """One round on the clients' datasets, the fastest way this process has; what training loops call.

        The process's `backend` runs it: `next` in TFF's runtime (`PerClientBackend`), or, with the fast
        simulation engine, the clients' work compiled by XLA in this process and TFF's aggregation and server
        step (`fedpersonal.simulation.round_backend`). Both give the same result.

        Before the round, each client's data is checked against `input_check` (once per client id; every round
        without ids): e.g. labels outside the model's outputs raise `input_checks.LabelRangeError` naming the
        client, the labels and the width, where TensorFlow would give NaN losses and a plausible accuracy.

        Args:
          state: The server state.
          client_data: The sampled clients' datasets (any sequence, e.g. a `LazyDatasets` building each when read).
          private_states: A stateful process's private states of those clients.
          client_ids: The clients' ids (a backend may then materialize each client's data once).
          non_finite: What a NaN or infinite loss metric of the round does: ``'stop'`` (default) raises
            `NonFiniteLossError` naming the round's metrics, as the binaries stop (``--non_finite_clients``);
            ``'ignore'`` returns the round as it is (its state may keep the previous weights: a non-finite client
            update is zeroed, a non-finite server update rejected). The error's ``metrics`` hold the round's.

        Raises:
          LabelRangeError: A client's labels are not integers in ``[0, the model's outputs)``.
          NonFiniteLossError: A loss metric of the round is not finite and `non_finite` is ``'stop'``.
          ConfigError: An unknown `non_finite`, or more clients than `max_clients`.
        """
        if non_finite not in non_finite_lib.ROUND_MODES:
            raise errors.ConfigError(f'non_finite must be one of {non_finite_lib.ROUND_MODES}, got {non_finite!r}.')
        if self.max_clients is not None and len(client_data) > self.max_clients:
            raise errors.ConfigError(
                f'This process keeps each client upload of a round and has room for {self.max_clients} (e.g. '
                f"FedAMP's clients_per_round); the round has {len(client_data)} clients: sample at most "
                f'{self.max_clients}, or build it for more.'
            )
        if self.input_check is not None and not getattr(self.backend, 'checks_inputs', False):
            self._check_datasets(self.input_check, client_data, client_ids)
        output = self.backend.run_round(self, state, client_data, private_states, client_ids=client_ids)
        if non_finite == 'stop':
            ids = None if client_ids is None else [str(c) for c in client_ids]
            non_finite_lib.check_round(output.metrics, num_clients=len(client_data), client_ids=ids)
        return output

    def prefetch(self, client_data: Sequence[Any], client_ids: Sequence[str]) -> None:
        """A hint that these clients (e.g. the next round's sample) will be run soon: a backend that supports it
        starts reading their data on a background thread while the caller's round computes (the engine's packer,
        `fedpersonal.simulation.round_backend.EngineBackend.prefetch`); others (e.g. `PerClientBackend`) do nothing.
        Results never change, and a client's error (e.g. `input_checks.LabelRangeError`) is raised only by the
        `run_round` that runs it.

        Args:
          client_data: The clients' datasets (any sequence; a `LazyDatasets` builds only those read).
          client_ids: Their ids (a backend caches clients by id: without ids there is nothing to prefetch).
        """
        prefetch = getattr(self.backend, 'prefetch', None)
        if prefetch is not None:
            prefetch(client_data, client_ids, check=self.input_check)

    def _check_datasets(
        self, check: input_checks.LabelCheck, client_data: Sequence[Any], client_ids: Sequence[str] | None
    ) -> None:
        """`check` on the clients' datasets not checked before (by id; all of them without ids)."""
        for i in range(len(client_data)):
            client_id = f'#{i}' if client_ids is None else str(client_ids[i])
            if client_ids is not None and client_id in self._checked_clients:
                continue  # A `LazyDatasets` then builds no pipeline for it.
            dataset = client_data[i]
            if isinstance(dataset, tf.data.Dataset):
                check.check_dataset(client_id, dataset)
            if client_ids is not None:
                self._checked_clients.add(client_id)

    def run_next(self, state: Any, client_data: Sequence[Any], private_states: Sequence[Any] | None = None) -> Any:
        """`next` in the current TFF runtime on these client inputs (and a stateful process's private states),
        with a clear error where TFF's local runtime cannot run the process's secure aggregation."""
        try:
            if self.stateful:
                return self.next(state, client_data, list(private_states or []))
            return self.next(state, client_data)
        except Exception as error:  # pylint: disable=broad-except
            if 'Cannot embed a federated value' in str(error) and self.uses_secure_aggregation:
                raise errors.ConfigError(
                    'This process aggregates with secure summation (e.g. tff.aggregators.SecureSumFactory), which '
                    "TFF's local runtime cannot run. To simulate it (as plain sums), run inside "
                    'fedpersonal.runtime.LocalRuntime(secure_sum_in_the_clear=True).'
                ) from None
            raise

    @property
    def uses_secure_aggregation(self) -> bool:
        """Whether `next` contains a secure aggregation intrinsic (e.g. from `tff.aggregators.SecureSumFactory`)."""
        from tensorflow_federated.python.core.impl.compiler import tree_analysis  # pylint: disable=g-import-not-at-top

        if self._secure is None:
            self._secure = bool(tree_analysis.find_secure_aggregation_in_tree(self.next.to_building_block()))
        return self._secure

    @property
    def stateful(self) -> bool:
        """True when clients persist private state between rounds (`next` takes and returns it)."""
        return self.private_state_type is not None

    def get_model_weights(self, state: Any) -> Any:
        """The server's model weights (global variables) in `state`."""
        return self._get_model_weights(state)

    def initial_private_state(self) -> Any:
        """A freshly initialized private state (a client's state before its first participation).

        Raises:
          TypeError: the process is stateless.
        """
        if self._initial_private_state_fn is None:
            raise TypeError('A stateless process has no private state.')
        return self._initial_private_state_fn()


def from_learning_process(
    learning_process: tff.learning.templates.LearningProcess,
    *,
    parts: dict[str, Any] | None = None,
    backend: RoundBackend | None = None,
) -> PersonalizedProcess:
    """A stateless `PersonalizedProcess` running a TFF `LearningProcess` (e.g. one built by TFF itself).

    The wrapped process keeps its computations; `next` returns `ProcessOutput(state, metrics, ())`.
    """
    next_type = learning_process.next.type_signature

    @tff.federated_computation(next_type.parameter[0], next_type.parameter[1])
    def next_fn(state, client_data):
        output = learning_process.next(state, client_data)
        return ProcessOutput(state=output.state, metrics=output.metrics, private_states=())

    return PersonalizedProcess(
        learning_process.initialize,
        next_fn,
        get_model_weights=learning_process.get_model_weights,
        global_weights_type=learning_process.get_model_weights.type_signature.result,
        learning_process=learning_process,
        parts=parts,
        backend=backend,
    )
