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
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import tensorflow_federated as tff

from fedpersonal import errors


class LazyDatasets(Sequence):
    """Clients' datasets (or any per-client inputs), each built when indexed: what `run_round` may take.

    The engine reads only the datasets of clients it has not materialized before (`ClientPacker.pack` with client
    ids), and building a client's tf.data pipeline costs ~10 ms, more than a whole engine round's client work on
    MovieLens. (Also importable as `fedpersonal.simulation.packing.LazyDatasets`.)
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


class PersonalizedProcess(tff.templates.IterativeProcess):
    """A personalized federated learning process: the package's one process protocol.

    Attributes:
      private_state_type: The TFF type of one client's private state, or None for a stateless process.
      global_weights_type: The TFF type of the server's model weights (`get_model_weights`).
      learning_process: For a stateless process built from TFF's templates, the
        `tff.learning.templates.LearningProcess` it wraps (usable with TFF's own tooling); otherwise None.
      parts: Named building blocks of the process (client work, aggregations, ...) for tests, audits and
        analyses; their meaning is documented by each builder.
      packer: None for the per-client path; for a simulation engine's process, the object that turns a round's
        client datasets into `next`'s client inputs (e.g. `fedpersonal.simulation.packing.ClientPacker`):
        ``pack(client_data, client_ids)``; ``packs_next_input = False`` when its output is for the round runner
        only; and, when `next` takes the private states stacked per packed group,
        ``stack_private_states(groups, private_states)`` and ``unstack_private_states(groups, stacked,
        num_clients)``. The process only calls these, so `fedpersonal.core` needs nothing from the engine.
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
        packer: Any = None,
        round_runner: Callable[..., ProcessOutput] | None = None,
    ):
        """Args: `initialize_fn` and `next_fn` as TFF's `IterativeProcess` takes them, the rest as the attributes.

        With a `round_runner`, `next_fn` may also be a no-arg function building the `next` computation: it is
        built (and checked) on first use of `next`, which `run_round` does not need; so an engine process traces
        TFF's copy of its client work only when something uses `next` (the privacy audit, another runtime).
        """
        if (private_state_type is None) != (initial_private_state_fn is None):
            raise TypeError('private_state_type and initial_private_state_fn go together.')
        self.private_state_type = private_state_type
        if isinstance(next_fn, tff.Computation):
            self._build_next: Callable[[], tff.Computation] | None = None
            self._set_next(initialize_fn, next_fn)
        else:
            if round_runner is None:
                raise TypeError('next_fn must be a tff.Computation unless a round_runner runs the rounds (run_round).')
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
        self.packer = packer
        self._round_runner = round_runner
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
        """``'engine'`` when a TFF client slot carries a packed group of logical clients, else ``'per_client'``."""
        return 'per_client' if self.packer is None else 'engine'

    @property
    def engine_strategy(self) -> str | None:
        """How the engine's round runner runs a group's client work (e.g. ``'client_loop'``; its ``strategy``), or
        None without one, or while it is still measuring (``engine_strategy='measure'``)."""
        return getattr(self._round_runner, 'strategy', None)

    def pack(self, client_data: Sequence[Any], *, client_ids: Sequence[str] | None = None) -> list[Any]:
        """The `next` input for a round's client datasets.

        The per-client path takes the datasets as they are; the fast simulation engine takes them packed into
        fixed-shape groups of logical clients (`fedpersonal.simulation.packing`), materialized once per client
        id when `client_ids` are given.
        """
        if self.packer is None:
            return list(client_data)
        return self.packer.pack(client_data, client_ids)

    def run_round(
        self,
        state: Any,
        client_data: Sequence[Any],
        private_states: Sequence[Any] | None = None,
        *,
        client_ids: Sequence[str] | None = None,
    ) -> ProcessOutput:
        """One round on the clients' datasets, the fastest way this process has; what training loops call.

        Packs the datasets (`pack`) and runs the round: with the fast simulation engine, the groups' client
        work compiled by XLA in this process and TFF's aggregation and server step
        (`fedpersonal.simulation.driver`); otherwise `next` in TFF's runtime. Both give the same result.

        Args:
          state: The server state.
          client_data: The sampled clients' datasets (any sequence, e.g. a `LazyDatasets` building each when read).
          private_states: A stateful process's private states of those clients.
          client_ids: The clients' ids (the engine then materializes each client's data once).
        """
        from fedpersonal.runtime import distributed  # pylint: disable=g-import-not-at-top

        data = self.pack(client_data, client_ids=client_ids)
        if self._round_runner is not None and not distributed.active():
            private = list(private_states or []) if self.stateful else None
            return self._round_runner(state, data, private, num_clients=len(client_data))
        if not getattr(self.packer, 'packs_next_input', True):  # Packed for the round runner only.
            data = list(client_data)
        try:
            if self._private_states_per_group:  # The engine's `next` takes private states stacked per group.
                return self._next_of_groups(state, data, list(private_states or []))
            if self.stateful:
                return self.next(state, data, list(private_states or []))
            return self.next(state, data)
        except Exception as error:  # pylint: disable=broad-except
            if 'Cannot embed a federated value' in str(error) and self.uses_secure_aggregation:
                raise errors.ConfigError(
                    'This process aggregates with secure summation (e.g. tff.aggregators.SecureSumFactory), which '
                    "TFF's local runtime cannot run. To simulate it (as plain sums), run inside "
                    'fedpersonal.runtime.LocalRuntime(secure_sum_in_the_clear=True).'
                ) from None
            raise

    def _next_of_groups(self, state: Any, groups: Sequence[Any], private_states: Sequence[Any]) -> ProcessOutput:
        """`next` of a stateful engine process: the clients' private states stacked per group (by the packer,
        which owns the groups' layout), and back."""
        output = self.next(state, groups, self.packer.stack_private_states(groups, private_states))
        unstacked = self.packer.unstack_private_states(groups, output.private_states, len(private_states))
        return ProcessOutput(output.state, output.metrics, unstacked)

    @property
    def _private_states_per_group(self) -> bool:
        if not self.stateful or self.packer is None:
            return False
        return not self.next.type_signature.parameter[2].member.is_equivalent_to(self.private_state_type)

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
    packer: Any = None,
    round_runner: Callable[..., ProcessOutput] | None = None,
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
        packer=packer,
        round_runner=round_runner,
    )
