"""TFF's multi-worker runtime: a round's client slots spread over remote `worker_binary` services.

TFF 0.87 ships every piece of a distributed simulation; this module assembles them and adds the checks a user needs:

* each worker is TFF's C++ executor service (``tensorflow_federated/data/worker_binary --port=P``, what
  `scripts/start_workers.sh` starts), reached over gRPC by TFF's `RemoteExecutor` through a
  `RemoteExecutorGrpcStub`, inside one `AsyncExecutionContext` per worker (as TFF's own local runtime talks to
  its one local worker);
* a computation is compiled to TFF's mergeable form (`compile_to_mergeable_comp_form`: the part up to its
  aggregation, the aggregation's merge, the part after it). Its CLIENTS-placed arguments are split into one
  contiguous share of client slots per worker (TFF's `MergeableCompExecutionContextValue`); every worker runs the
  part up to the aggregation on its share, the partial aggregates are merged, and the part after the aggregation
  runs per share again for CLIENTS-placed results (e.g. the new private states, which therefore never leave
  their client's share: the privacy audit's property holds per worker);
* with the fast simulation engine a TFF client slot is a packed group of logical clients, so the groups are
  what is spread over the workers (`PersonalizedProcess.run_round` calls ``next`` under this runtime: the
  workers run the groups' client work in TFF's runtime, without the driver's XLA).

Two things differ from TFF's `MergeableCompExecutionContext`, which this class extends:

1. **Order.** TFF merges the partial aggregates and concatenates the per-share CLIENTS-placed results in the order
   the workers *finish*. The results are then reordered whenever a later share finishes first: clients received
   other clients' private states (measured: a FURL round's states came back as [c, a, b]), and float sums
   depended on timing. Here every step keeps the shares' order: results equal a local run's (to float
   reassociation over the shares) and one run equals the next.
2. **Failures.** TFF's contexts retry an unavailable worker forever (a run hangs on a dead worker). Here a gRPC
   failure of a worker raises `fedpersonal.errors.WorkerError` naming the worker; a binary stops with that
   message and resumes from its last checkpoint when rerun. Entering the runtime checks that every worker is
   reachable (``connect_timeout_seconds``) and runs a probe computation on each, so a wrong address or a
   service that is not TFF 0.87's executor fails at once with the address in the message.

A computation whose aggregation depends on another aggregation (HPFL's accuracy-weighted public aggregation
followed by clustering) has no mergeable form: it is refused with a `ConfigError` naming ``--workers``.

Example (two workers on this machine, e.g. ``scripts/start_workers.sh 2 8000``):

```python
with fedpersonal.runtime.DistributedRuntime(['localhost:8000', 'localhost:8001']):
    state = process.initialize()
    output = process.run_round(state, datasets, client_ids=ids)
```
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from fedpersonal import errors
from fedpersonal.runtime import execution_context

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000  # As TFF's local runtime.
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
# gRPC codes of a worker that is gone, restarted or not a TFF worker (TFF retries the first two forever).
_WORKER_FAILURES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNKNOWN,
    None,
)
_STUB_METHODS = (
    'get_executor',
    'create_value',
    'create_struct',
    'create_call',
    'create_selection',
    'compute',
    'dispose',
    'dispose_executor',
)


def parse_workers(value: str | Sequence[str] | None) -> list[str]:
    """``'host:port,host:port'`` (or a list) -> the addresses; empty -> ``[]`` (the local runtime).

    Raises:
      ConfigError: An address is not ``host:port`` with a port number, naming ``--workers``.
    """
    if value is None:
        return []
    items = value.split(',') if isinstance(value, str) else list(value)
    addresses = [item.strip() for item in items if item.strip()]
    for address in addresses:
        host, _, port = address.rpartition(':')
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise errors.ConfigError(f'--workers: {address!r} is not host:port (e.g. localhost:8000).')
    if len(set(addresses)) != len(addresses):
        raise errors.ConfigError(f'--workers: an address is given twice: {",".join(addresses)}.')
    return addresses


def _grpc_detail(error: BaseException) -> str:
    if isinstance(error, grpc.Call):
        try:
            return f'{error.code().name}: {error.details()}'
        except Exception:  # pylint: disable=broad-except
            pass
    return str(error) or type(error).__name__


def _worker_stub(address: str, channel: grpc.Channel) -> Any:
    """TFF's gRPC stub for `address` whose failures raise `WorkerError` instead of TFF's retryable errors."""
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top

    class WorkerStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
        def __init__(self):
            super().__init__(channel)
            self.address = address

    def wrap(name: str):
        method = getattr(remote_executor_grpc_stub.RemoteExecutorGrpcStub, name)

        def call(self, request):
            try:
                return method(self, request)
            except ValueError:  # 'Cannot invoke RPC on closed channel!': a dispose after the runtime closed.
                if name.startswith('dispose'):
                    return None
                raise
            except grpc.RpcError as error:  # TFF's RetryableGRPCError is one too.
                detail = _grpc_detail(error)
                code = error.code() if isinstance(error, grpc.Call) else None
                if name.startswith('dispose'):  # Freeing a value on a worker that is gone: nothing left to free.
                    return None
                if code not in _WORKER_FAILURES:  # The computation failed on the worker (e.g. INTERNAL): a bug.
                    raise RuntimeError(f'A computation failed on TFF worker {address}: {detail}') from None
                raise errors.WorkerError(
                    address,
                    f'TFF worker {address} failed during a computation ({detail}). Check that it is running '
                    '(scripts/start_workers.sh) and reachable; rerun the same command to resume from the last '
                    'checkpoint.',
                    detail,
                ) from None

        return call

    for name in _STUB_METHODS:
        setattr(WorkerStub, name, wrap(name))
    return WorkerStub()


def _shared_compiler() -> Any:
    """TFF's native compiler (`desugar_and_transform_to_native`) behind one cache for every worker's context.

    Each `AsyncExecutionContext` caches its own compilations, so a computation was compiled once per worker. Most of
    a distributed run's first round is this compilation, its static Grappler pass over the mergeable form's parts:
    a FURL binary's first round took 178 s on two workers with a compilation per worker, 86-92 s with one (a
    local first round: 9 s). Grappler cannot be skipped: without its function inlining the engine's vectorized
    graphs fail on the worker, and without its other passes the rounds ran 2-3x slower.
    """
    from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline  # pylint: disable=g-import-not-at-top

    return compiler_pipeline.CompilerPipeline(compiler.desugar_and_transform_to_native).compile


def _worker_context(stub: Any, compiler_fn: Any) -> Any:
    """An `AsyncExecutionContext` running computations on one remote worker (as TFF's local runtime does)."""
    from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.executors import remote_executor  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

    def stack_fn(cardinalities):
        cardinalities.setdefault(placements.CLIENTS, 0)  # As TFF's local factory (default_num_clients=0).
        # Each worker value freed as soon as Python drops it, as on the local runtime (`execution_context`).
        executor = remote_executor.RemoteExecutor(stub, dispose_batch_size=execution_context.DISPOSE_BATCH_SIZE)
        executor.set_cardinalities(cardinalities)
        return executor

    return async_execution_context.AsyncExecutionContext(
        executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn),
        compiler_fn=compiler_fn,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


def _ordered_context_class():
    from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.computation import computation_base  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as mc  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import computation_types  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import type_analysis  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import type_conversions  # pylint: disable=g-import-not-at-top

    def compile_or_refuse(comp):
        try:
            return mergeable_comp_compiler.compile_to_mergeable_comp_form(comp)
        except ValueError as error:
            raise errors.ConfigError(
                f'--workers: this computation ({comp.type_signature}) cannot be split over workers: its round has '
                "an aggregation that depends on another one (e.g. HPFL), which TFF's mergeable form does not "
                f'allow ({error}). Run it without --workers.'
            ) from None

    async def invoke_ordered(comp, arg_list, contexts):
        partials = await asyncio.gather(*(ctx.invoke(comp.up_to_merge, a) for a, ctx in zip(arg_list, contexts)))
        merged = partials[0]
        for partial in partials[1:]:  # In the shares' order (TFF: in the order the workers finish).
            merged = await contexts[0].invoke(comp.merge, structure.Struct.unnamed(merged, partial))

        def after(a, ctx):
            return ctx.invoke(comp.after_merge, merged if a is None else structure.Struct.unnamed(a, merged))

        result_type = comp.after_merge.type_signature.result
        replicated = lambda t: not isinstance(t, computation_types.FederatedType) or t.all_equal
        if type_analysis.contains_only(result_type, replicated):
            return await after(arg_list[0], contexts[0])
        results = await asyncio.gather(*(after(a, ctx) for a, ctx in zip(arg_list, contexts)))
        return mc._repackage_partitioned_values(list(results), result_type_spec=result_type)  # pylint: disable=protected-access

    class OrderedMergeableContext(mc.MergeableCompExecutionContext):
        """TFF's mergeable-form context with every step in the shares' order (see the module docstring)."""

        def __init__(self, async_contexts: Sequence[Any], addresses: Sequence[str]):
            super().__init__(async_contexts=async_contexts, compiler_fn=compile_or_refuse)
            self.addresses = list(addresses)

        def invoke(self, comp, arg=None):
            if isinstance(comp, computation_base.Computation):
                comp = self._compiler_pipeline.compile(comp)
            contexts = self._async_execution_contexts
            if arg is not None:
                shares = mc.MergeableCompExecutionContextValue(
                    arg, comp.up_to_merge.type_signature.parameter, self._num_subrounds
                ).value()
            else:
                shares = [None] * len(contexts)
            result = self._async_runner.run_coro_and_return_result(
                invoke_ordered(comp, shares, contexts[: len(shares)])
            )
            return type_conversions.type_to_py_container(result, comp.after_merge.type_signature.result)

    return OrderedMergeableContext


def _probe(context: Any, address: str, timeout_seconds: float) -> None:
    """Runs a federated sum on one worker; raises `ConfigError` naming it if that fails or does not return."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.common_libs import async_utils  # pylint: disable=g-import-not-at-top

    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def federated_sum(values):
        return tff.federated_sum(values)

    outcome: dict[str, Any] = {}

    def run():
        try:
            outcome['value'] = async_utils.AsyncThreadRunner().run_coro_and_return_result(
                context.invoke(federated_sum, [1, 2, 39])
            )
        except BaseException as error:  # pylint: disable=broad-except
            outcome['error'] = error

    thread = threading.Thread(target=run, daemon=True, name=f'probe {address}')
    thread.start()
    thread.join(timeout_seconds)
    hint = 'Is it a TFF 0.87 worker_binary (scripts/start_workers.sh), the version this driver runs?'
    if thread.is_alive():
        raise errors.ConfigError(
            f'--workers: worker {address} did not run a probe computation in {timeout_seconds:g} s. {hint}'
        )
    if 'error' in outcome:
        detail = getattr(outcome['error'], 'detail', '') or _grpc_detail(outcome['error'])
        raise errors.ConfigError(f'--workers: worker {address} failed a probe computation ({detail}). {hint}')
    if int(np.asarray(outcome['value'])) != 42:
        raise errors.ConfigError(f'--workers: worker {address} computed a wrong probe result. {hint}')


def for_workers(workers: str | Sequence[str] | None) -> Any:
    """The runtime a binary runs in: `DistributedRuntime` on `workers` (``--workers``), or `LocalRuntime` if empty."""
    from fedpersonal.runtime import execution_context  # pylint: disable=g-import-not-at-top

    addresses = parse_workers(workers)
    return DistributedRuntime(addresses) if addresses else execution_context.LocalRuntime()


def active() -> bool:
    """Whether TFF's current context is a `DistributedRuntime`'s (computations run on its workers)."""
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

    return getattr(context_stack_impl.context_stack.current, 'addresses', None) is not None


class DistributedRuntime:
    """TFF's multi-worker runtime on running `worker_binary` services, as a context manager.

    Inside the block every TFF computation runs split over the workers (see the module docstring). The workers
    are not started or stopped here (they run elsewhere: `scripts/start_workers.sh`); leaving the block closes
    the connections and restores the previous context. Nothing this runtime starts outlives it.

    Args:
      workers: The workers' ``host:port`` addresses (or one comma-separated string).
      connect_timeout_seconds: How long each worker may take to accept the connection.
      probe_timeout_seconds: How long each worker may take to run the probe computation.

    Raises:
      ConfigError: (on entering) no address, a malformed one, an unreachable worker, or one that does not run
        the probe computation; the message names the worker and ``--workers``.
    """

    def __init__(
        self,
        workers: str | Sequence[str],
        *,
        connect_timeout_seconds: float = 10.0,
        probe_timeout_seconds: float = 60.0,
    ):
        self.addresses = parse_workers(workers)
        if not self.addresses:
            raise errors.ConfigError('--workers: no worker address given.')
        self._connect_timeout = connect_timeout_seconds
        self._probe_timeout = probe_timeout_seconds
        self._channels: list[grpc.Channel] = []
        self._previous: Any = None

    def __enter__(self) -> DistributedRuntime:
        from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

        try:
            contexts, compiler_fn = [], _shared_compiler()
            for address in self.addresses:
                channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
                self._channels.append(channel)
                try:
                    grpc.channel_ready_future(channel).result(timeout=self._connect_timeout)
                except grpc.FutureTimeoutError:
                    raise errors.ConfigError(
                        f'--workers: cannot connect to worker {address} within {self._connect_timeout:g} s. Is a '
                        'worker running there (scripts/start_workers.sh) and the port reachable from this machine?'
                    ) from None
                context = _worker_context(_worker_stub(address, channel), compiler_fn)
                _probe(context, address, self._probe_timeout)
                contexts.append(context)
        except BaseException:
            self._close()
            raise
        self._previous = context_stack_impl.context_stack.current
        context_stack_impl.context_stack.set_default_context(_ordered_context_class()(contexts, self.addresses))
        return self

    def _close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels = []

    def __exit__(self, *exc_info: Any) -> None:
        from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

        if self._previous is not None:
            context_stack_impl.context_stack.set_default_context(self._previous)
            self._previous = None
        self._close()
