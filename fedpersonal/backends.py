"""Which backend runs an algorithm's client plan, chosen in one place: the context.

An algorithm states its client work once (`fedpersonal.core.client_plan.ClientPlan`); `build_process` binds it to
the backend of the current context:

* ``'engine'`` (default): the grouped engine (`fedpersonal.simulation.plan_engine`): `process.run_round` runs a
  round's clients in groups, each group one compiled program; `process.next` maps the same group program over
  TFF's CLIENTS.
* ``'per_client'``: one TF computation per client, mapped over the clients by TFF (`process.next`; `run_round`
  runs it too).

A plan whose phases name losses its model defines (`fedpersonal.core.model_loss_plan`, e.g. FedDVA's) runs on
`fedpersonal.simulation.model_loss_engine` or `fedpersonal.core.model_loss_plan`'s per-client backend.

A round stated as `fedpersonal.core.RoundFunctions` (HPFL) gets its engine backend from `silo_engine_backend`: the
silo engine (`fedpersonal.simulation.silo_engine`), each client one compiled program.

Where the engine cannot run a configuration (an aggregator that needs each client's own update, a client optimizer
that is not a functional TFF optimizer, a custom distributor), the process is built on the per-client backend, with
one log line saying why: something TFF supports never gives an error for it.

The context also says how the engine runs a plan's groups (``strategy``, `fedpersonal.simulation.options`
``ENGINE_STRATEGIES``): ``'auto'`` (default) picks the vectorized lockstep, the compiled loop over clients or the
low-rank steps of a dense model by a fixed rule from the workload's shape
(`fedpersonal.simulation.client_loop.auto_strategy`), so a rerun computes the same numbers bit for bit;
``'lockstep'``, ``'client_loop'``, ``'low_rank'`` (`fedpersonal.simulation.low_rank`) and ``'spread'`` (the loop, a
group's clients split over the cores, one program each) pin one; ``'measure'`` times them on the first rounds and keeps the fastest (the strategies agree to float rounding only,
so which one wins, and the last bits of the results, may differ between runs). The choice is logged once.

It also bounds the bytes of materialized clients each engine packer keeps between rounds (``packed_cache_mb``,
`fedpersonal.simulation.packing.ClientPacker`'s ``cache_bytes``; None: 1/8 of the machine's memory,
`fedpersonal.simulation.options.default_cache_bytes`); results never depend on it.

Example:

>>> from fedpersonal import backends
>>> backends.current(), backends.current_strategy()
('engine', 'auto')
>>> with backends.use('per_client'):
...     backends.current()
'per_client'
>>> with backends.use('engine', strategy='client_loop'):
...     with backends.use('engine'):  # An inner context without a strategy keeps the outer one.
...         backends.current_strategy()
'client_loop'
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import errors
from fedpersonal import models
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import input_checks
from fedpersonal.core import model_loss_plan
from fedpersonal.core import per_client_plan
from fedpersonal.core import process as process_lib
from fedpersonal.core import round_functions
from fedpersonal.simulation import model_loss_engine
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import plan_engine
from fedpersonal.simulation import silo_engine

ENGINE, PER_CLIENT = 'engine', 'per_client'
BACKENDS = (ENGINE, PER_CLIENT)
_backend: contextvars.ContextVar[str] = contextvars.ContextVar('fedpersonal_backend', default=ENGINE)
_strategy: contextvars.ContextVar[str] = contextvars.ContextVar(
    'fedpersonal_engine_strategy', default=simulation_options.AUTO
)
_packed_cache_mb: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    'fedpersonal_packed_cache_mb', default=None
)
_SUM_THEN_FINALIZE = tff.learning.metrics.sum_then_finalize


def current() -> str:
    """The backend of the current context (``'engine'`` unless `use` says otherwise)."""
    return _backend.get()


def current_strategy() -> str:
    """The engine strategy of the current context (``'auto'`` unless `use` says otherwise)."""
    return _strategy.get()


def current_packed_cache_mb() -> float | None:
    """The bound of an engine packer's client cache in MiB in the current context (None: the machine's default)."""
    return _packed_cache_mb.get()


def current_cache_bytes() -> int | None:
    """`current_packed_cache_mb` in bytes, as `fedpersonal.simulation.packing.ClientPacker` takes it."""
    return simulation_options.cache_bytes(_packed_cache_mb.get())


@contextlib.contextmanager
def use(backend: str, *, strategy: str | None = None, packed_cache_mb: float | None = None) -> Iterator[None]:
    """Builds processes on `backend` (``'engine'`` or ``'per_client'``) inside the ``with`` block.

    Args:
      backend: ``'engine'`` or ``'per_client'``.
      strategy: How the engine runs a plan's groups (see the module docstring); None keeps the context's.
      packed_cache_mb: The most MiB of materialized clients an engine packer keeps between rounds (see the module
        docstring); None keeps the context's.

    Raises:
      ValueError: An unknown backend or strategy, or a negative `packed_cache_mb`.
    """
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}.')
    if strategy is not None and strategy not in simulation_options.ENGINE_STRATEGIES:
        raise ValueError(f'strategy must be one of {simulation_options.ENGINE_STRATEGIES}, got {strategy!r}.')
    if packed_cache_mb is not None and packed_cache_mb < 0:
        raise ValueError(f'packed_cache_mb must be >= 0, got {packed_cache_mb}.')
    token = _backend.set(backend)
    strategy_token = _strategy.set(strategy) if strategy is not None else None
    cache_token = _packed_cache_mb.set(packed_cache_mb) if packed_cache_mb is not None else None
    try:
        yield
    finally:
        if cache_token is not None:
            _packed_cache_mb.reset(cache_token)
        if strategy_token is not None:
            _strategy.reset(strategy_token)
        _backend.reset(token)


def build_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], Any],
    *,
    loss_fn: client_work.LossFn | None = None,
    metrics_fn: client_work.MetricsFn | None = None,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Any = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    group_size: int | None = None,
    measure_communication: bool = False,
    name: str = 'plan',
    element_spec: Any = None,
) -> process_lib.PersonalizedProcess:
    """The process that runs `plan` on the context's backend (see the module docstring): stateful, unless the
    plan's local weights start afresh every round (`ClientPlan.local_start`).

    Args:
      plan: The client work.
      model_fn: No-arg function returning a new partially local model (`fedpersonal.models.from_keras_model`
        with global and local layers; for a plan with model-defined losses a
        `fedpersonal.core.model_loss_plan.PhasedModel`); its local weights are each client's private state.
      loss_fn: No-arg function returning the Keras loss (None for a plan with model-defined losses, which reports
        the ratio metrics of `fedpersonal.core.model_loss_plan`, without `metrics_fn` or `metrics_aggregator`).
      metrics_fn: Optional no-arg function returning Keras metrics (``loss`` and ``num_examples`` are added).
      server_optimizer: A TFF optimizer, applied to the aggregated update of the global weights.
      model_aggregator: A `tff.aggregators` factory for the global update (default: the weighted mean); on the
        engine a `fedpersonal.privacy.dp` fixed-clip factory clips each client.
      client_weighting: `tff.learning.ClientWeighting` (``NUM_EXAMPLES``: the examples of the global phase's
        steps) or a callable of the client's unfinalized metrics (per-client backend).
      metrics_aggregator: As in TFF.
      model_distributor: As in TFF (default its broadcast; another one runs on the per-client backend).
      group_size: Engine only: the most clients per compiled group.
      measure_communication: Engine only: `run_round` also reports each logical client's download and upload
        under the keys of `fedpersonal.metrics.communication`'s measured broadcast and aggregator.
      name: The algorithm's name, for the log line of a fallback.
      element_spec: For a plan with model-defined losses: the client datasets' element spec (default: the
        model's ``input_spec``; a Keras plan's is its model's ``input_spec``).

    Returns:
      A stateful `PersonalizedProcess`; with a sparse categorical cross-entropy its `input_check` refuses labels
      outside the model's outputs (`fedpersonal.core.input_checks.label_check`); with a `ClientPlan.table` its
      `max_clients` is the table's capacity.

    Raises:
      ValueError: Arguments the plan does not take (a Keras loss for model-defined losses, or none for the Keras
        loss), or no element spec for a model without an ``input_spec``.
    """
    process = _build_process(
        plan,
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        client_weighting=client_weighting,
        metrics_aggregator=metrics_aggregator,
        model_distributor=model_distributor,
        group_size=group_size,
        measure_communication=measure_communication,
        name=name,
        element_spec=element_spec,
    )
    if loss_fn is not None:
        process.input_check = input_checks.label_check(model_fn, loss_fn)
    if plan.table is not None:  # Its server keeps at most so many rows a round.
        process.max_clients = plan.table.capacity
    return process


def _build_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], Any],
    *,
    loss_fn: client_work.LossFn | None,
    metrics_fn: client_work.MetricsFn | None,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Any,
    client_weighting: Any,
    metrics_aggregator: Callable[..., tff.Computation],
    model_distributor: tff.learning.templates.DistributionProcess | None,
    group_size: int | None,
    measure_communication: bool,
    name: str,
    element_spec: Any,
) -> process_lib.PersonalizedProcess:
    """`build_process` without the input check."""
    if not isinstance(server_optimizer, tff.learning.optimizers.Optimizer):  # TFF's server step takes no other.
        raise TypeError(f'server_optimizer must be a tff.learning.optimizers.Optimizer, got {server_optimizer!r}.')
    parts = dict(model_aggregator=model_aggregator, client_weighting=client_weighting)
    engine: Callable[[], process_lib.PersonalizedProcess]
    per_client: Callable[[], process_lib.PersonalizedProcess]
    if plan.model_losses:
        if loss_fn is not None or metrics_fn is not None or metrics_aggregator is not _SUM_THEN_FINALIZE:
            raise ValueError(
                f'{name}: a plan with model-defined losses takes no loss_fn, metrics_fn or metrics_aggregator.'
            )
        if element_spec is None:
            with tf.Graph().as_default():
                element_spec = getattr(model_fn(), 'input_spec', None)
            if element_spec is None:
                raise ValueError(f'{name}: give the element_spec of the client datasets (the model has no input_spec).')
        spec = dict(element_spec=element_spec, server_optimizer=server_optimizer)
        engine = functools.partial(
            model_loss_engine.build_engine_process,
            plan,
            model_fn,
            client_weighting=client_weighting,
            group_size=group_size,
            measure_communication=measure_communication,
            cache_bytes=current_cache_bytes(),
            **spec,
        )
        per_client = functools.partial(
            model_loss_plan.build_per_client_process,
            plan,
            model_fn,
            model_distributor=model_distributor,
            **spec,
            **parts,
        )
    else:
        if loss_fn is None:
            raise ValueError(f'{name}: a plan without model-defined losses needs loss_fn.')
        common = dict(loss_fn=loss_fn, metrics_fn=metrics_fn, server_optimizer=server_optimizer)
        engine = functools.partial(
            plan_engine.build_engine_process,
            plan,
            model_fn,
            group_size=group_size,
            measure_communication=measure_communication,
            strategy=current_strategy(),
            cache_bytes=current_cache_bytes(),
            name=name,
            **common,
            **parts,
        )
        per_client = functools.partial(
            per_client_plan.build_per_client_process,
            plan,
            model_fn,
            metrics_aggregator=metrics_aggregator,
            model_distributor=model_distributor,
            **common,
            **parts,
        )
    if current() == ENGINE:
        reason = plan_engine.unsupported(
            plan,
            metrics_aggregator=metrics_aggregator,
            model_distributor=model_distributor,
            **parts,
        )
        if reason is None:
            try:
                return engine()
            except errors.ConfigError as error:  # The model (e.g. a layer the engine cannot run per client).
                reason = str(error)
        logging.info('%s runs on the per-client backend: %s', name, reason.rstrip('.') + '.')
    return per_client()


def silo_engine_backend(functions: round_functions.RoundFunctions, *, name: str) -> process_lib.RoundBackend | None:
    """The backend for `compose_personalized_process` to run `functions` (the round its other parts compute) on
    the context's backend: the silo engine (`fedpersonal.simulation.silo_engine`: each client one compiled
    program), or None (TFF's `next`) on the per-client backend and where the engine cannot run them (logged).
    """
    if current() != ENGINE:
        return None
    reason = silo_engine.unsupported(functions)
    if reason is None:
        return silo_engine.build(functions)
    logging.info('%s runs on the per-client backend: %s', name, reason.rstrip('.') + '.')
    return None


def build_classifier_process(
    plan: client_plan.ClientPlan,
    keras_model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    group_size: int | None = None,
    name: str = 'plan',
) -> process_lib.PersonalizedProcess:
    """`build_process` for a Keras classifier (logits) whose weights are all global (e.g. Ditto's and APFL's, whose
    private state is a personal copy): sparse cross-entropy, reporting ``accuracy``.

    Args:
      plan: The client work.
      keras_model_fn: No-arg function returning a new Keras classifier on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      server_optimizer: Applied to the aggregated update.
      client_weighting: How the update is weighted (default: by the examples the global phase trained).
      group_size: Engine only: the most clients per compiled group.
      name: The algorithm's name, for the log line of a fallback.

    Returns:
      A stateful `PersonalizedProcess`.
    """
    spec = collections.OrderedDict(x=element_spec['x'], y=element_spec['y'])

    def model_fn() -> tff.learning.models.ReconstructionModel:
        keras_model = keras_model_fn()
        return models.from_keras_model(keras_model, input_spec=spec, global_variables=keras_model.variables)

    return build_process(
        plan,
        model_fn,
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
        server_optimizer=server_optimizer,
        client_weighting=client_weighting,
        group_size=group_size,
        name=name,
    )
