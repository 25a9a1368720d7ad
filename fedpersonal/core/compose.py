"""Composing a `PersonalizedProcess` from TFF's parts and one client-work computation.

A round is TFF's: a distributor broadcasts the server's model weights (`build_broadcast_process`), every
sampled client runs the algorithm's client work, a `tff.aggregators` factory aggregates only the
`ClientResult` updates, and TFF's apply-optimizer finalizer applies the aggregate with a server optimizer.
The algorithm supplies just its client work:

* stateless: ``client_update: (<weights, dataset> -> <ClientResult, client metrics>)`` — composed with
  `tff.learning.templates.compose_learning_process` (the TFF `LearningProcess` is kept as
  `process.learning_process`);
* stateful: ``client_update: (<weights, dataset, private state> -> <ClientResult, client metrics, new private
  state>)`` — the private states enter and leave CLIENTS-placed and never reach a SERVER-placed intrinsic.

An optional post-aggregation stage (`PostAggregation`, stateful client work only) adds a second broadcast after
the server step -- of a value computed from the new global weights -- and a client update of each new private
state from it and that client's metrics (what HPFL's round does after its aggregation). An optional server step
(`ServerStep`, stateful only) replaces TFF's aggregator and finalizer by the algorithm's own aggregation of the
clients' uploads, with a server state of its own (HPFL's accuracy-weighted public aggregation and centre
clustering). The distributor is any `tff.learning.templates.DistributionProcess`: the client work receives its
result (HPFL's sends the weights with the round number, or nothing to clients that train their own model).
Without these parts the round is the one above, unchanged.

`aggregate_metrics` turns the CLIENTS-placed client metrics into SERVER-placed ones: `keras_metrics` (TFF's
`sum_then_finalize` over Keras metric variables) or `ratio_metrics` (sums of ``[numerator, denominator]``).

Example (a stateful method whose private state is one local head; see tests/core/fedper_test.py for a full one):

    process = compose_personalized_process(
        initial_global_weights=initial_body, initial_private_state=initial_head,
        client_update=client_update, server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        aggregate_metrics=ratio_metrics(client_update.type_signature.result[1]))
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import TypeAlias

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import apply_optimizer_finalizer

from fedpersonal.core import process as process_lib

AggregationFactory: TypeAlias = (
    tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory
)


class PostAggregation(NamedTuple):
    """A client step after aggregation: the server broadcasts a value of its new state, clients update privately.

    Attributes:
      server_value: TF computation from the new global weights (with a `ServerStep`: the new global weights and
        the server step's new state) to what is broadcast.
      client_update: TF computation ``(broadcast value, private state, client metrics) -> private state``: the
        client metrics are the client work's per-client output that `aggregate_metrics` also reads.
    """

    server_value: tff.Computation
    client_update: tff.Computation

    def apply(self, server_values: Any, private_states: Any, client_metrics: Any) -> Any:
        """Traced inside a federated computation: the clients' updated private states (CLIENTS-placed).

        `server_values` is the SERVER-placed argument of `server_value` (a tuple of SERVER values is zipped).
        """
        broadcast = tff.federated_broadcast(tff.federated_map(self.server_value, server_values))
        return tff.federated_map(self.client_update, (broadcast, private_states, client_metrics))


class ServerStep(NamedTuple):
    """The server's step from the clients' uploads, in place of TFF's aggregator and finalizer (stateful only).

    Attributes:
      initialize: No-arg federated computation of its SERVER-placed state (the process state's ``aggregator``;
        its ``finalizer`` is then ``()``).
      next: Python function traced inside ``next``: ``(state, global weights, uploads, client metrics) -> (new
        global weights, new state, measurements)``, state and weights SERVER-placed, uploads (the client work's
        first result) and client metrics CLIENTS-placed; `measurements`, an `OrderedDict` of SERVER-placed values,
        take the place of the round's ``aggregator`` and ``finalizer`` metrics.
    """

    initialize: tff.Computation
    next: Callable[..., tuple[Any, Any, Any]]


def weighted_aggregator(
    model_aggregator: AggregationFactory | None, client_weighting: Any
) -> tff.aggregators.WeightedAggregationFactory:
    """`model_aggregator` as a weighted factory (default `MeanFactory`).

    Raises:
      ValueError: an unweighted aggregator with a client weighting other than UNIFORM.
    """
    if model_aggregator is None:
        return tff.aggregators.MeanFactory()
    if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
        if client_weighting is not tff.learning.ClientWeighting.UNIFORM:
            raise ValueError(
                'An unweighted aggregator needs client_weighting=tff.learning.ClientWeighting.UNIFORM, '
                f'got {client_weighting}.'
            )
        return tff.aggregators.as_weighted_aggregator(model_aggregator)
    return model_aggregator


def apply_update(
    server_optimizer: tff.learning.optimizers.Optimizer, optimizer_state: Any, trainable: Sequence[Any], update: Any
) -> tuple[Any, list[Any], Any]:
    """TFF's apply-optimizer finalizer step as TF (for engines): ``(optimizer state, weights, measurements)`` after
    applying the aggregated `update`; a non-finite update keeps the previous weights and state."""
    new_state, new_weights = server_optimizer.next(optimizer_state, list(trainable), list(update))
    reject, measurements = apply_optimizer_finalizer.reject_non_finite_update(new_state, list(update))
    keep = lambda new, old: tf.nest.map_structure(lambda a, b: tf.where(reject, b, a), new, old)
    return keep(new_state, optimizer_state), keep(list(new_weights), list(trainable)), measurements


def keras_metrics(
    finalizers: collections.OrderedDict, metrics_aggregator: Callable[..., tff.Computation]
) -> Callable[[Any], Any]:
    """Server metrics from clients' unfinalized Keras metrics (`finalizers` filled while tracing the client work)."""

    def aggregate(unfinalized):
        return metrics_aggregator(finalizers, unfinalized.type_signature.member)(unfinalized)

    return aggregate


def ratio_metrics(sums_type: tff.Type | None = None) -> Callable[[Any], Any]:
    """Server metrics from per-client ``[numerator, denominator]`` pairs (an `OrderedDict` of 2-vectors).

    Each metric is sum(numerators) / sum(denominators), except `num_examples`, which is the sum of its
    numerators (see `client_work.ratio_sums`). `sums_type` (one client's sums) defaults to the type of the
    CLIENTS-placed value the returned function is called on.
    """

    def finalize(sums):
        return collections.OrderedDict(
            (k, v[0] if k == 'num_examples' else v[0] / tf.maximum(v[1], 1.0)) for k, v in sums.items()
        )

    def aggregate(client_sums):
        member_type = sums_type if sums_type is not None else client_sums.type_signature.member
        return tff.federated_map(tff.tensorflow.computation(member_type)(finalize), tff.federated_sum(client_sums))

    return aggregate


def _keyed(metrics: Any, key: str | None) -> Any:
    """The ``client_work`` metrics: the aggregated client metrics under `key` (TFF's ``'train'``), or themselves."""
    return metrics if key is None else tff.federated_zip(collections.OrderedDict([(key, metrics)]))


def _client_work_process(
    client_update: tff.Computation, aggregate_metrics: Callable[[Any], Any], metrics_key: str | None
) -> tff.learning.templates.ClientWorkProcess:
    weights_type, dataset_type = client_update.type_signature.parameter

    @tff.federated_computation
    def initialize():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        tff.FederatedType((), tff.SERVER),
        tff.FederatedType(weights_type, tff.CLIENTS),
        tff.FederatedType(dataset_type, tff.CLIENTS),
    )
    def next_fn(state, weights, client_datasets):
        del state
        client_result, client_metrics = tff.federated_map(client_update, (weights, client_datasets))
        measurements = _keyed(aggregate_metrics(client_metrics), metrics_key)
        return tff.templates.MeasuredProcessOutput(
            state=tff.federated_value((), tff.SERVER), result=client_result, measurements=measurements
        )

    return tff.learning.templates.ClientWorkProcess(initialize, next_fn)


def compose_personalized_process(
    *,
    initial_global_weights: tff.Computation,
    client_update: tff.Computation | Callable[[], tff.Computation],
    aggregate_metrics: Callable[[Any], Any],
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: AggregationFactory | None = None,
    initial_private_state: tff.Computation | None = None,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    parts: dict[str, Any] | None = None,
    backend: process_lib.RoundBackend | None = None,
    post_aggregation: PostAggregation | None = None,
    server_step: ServerStep | None = None,
    client_metrics_key: str | None = 'train',
) -> process_lib.PersonalizedProcess:
    """Composes a `PersonalizedProcess` from an algorithm's client work and TFF's parts.

    Args:
      initial_global_weights: No-arg TF computation returning the initial server `ModelWeights`.
      client_update: The client work as a TF computation: ``(weights, dataset) -> (ClientResult, metrics)``,
        or, with `initial_private_state`, ``(weights, dataset, private) -> (ClientResult, metrics, private)``.
        With a `backend` it may be a no-arg function building that computation: it is then built (traced) with
        `process.next`, on its first use, which such a backend's `run_round` may never need. Its private-state
        argument may be of another type than `initial_private_state`'s (one client's): `next` takes what it takes
        per client slot (e.g. a group's stacked states).
      aggregate_metrics: Python function from CLIENTS-placed client metrics to SERVER-placed metrics, called
        while tracing (`keras_metrics` or `ratio_metrics`).
      server_optimizer: Applied to the aggregated update (TFF's apply-optimizer finalizer); unused with a
        `server_step`.
      model_aggregator: A `tff.aggregators` factory for `ClientResult.update` (weighted by
        `ClientResult.update_weight`; an unweighted one is wrapped by the caller with `weighted_aggregator`);
        default `tff.aggregators.MeanFactory()`.
      initial_private_state: No-arg TF computation returning a default private state; makes the process
        stateful.
      model_distributor: Default `tff.learning.templates.build_broadcast_process`; the client work takes its result.
      parts: Extra named building blocks recorded in `process.parts`.
      backend: The `process_lib.RoundBackend` running `process.run_round` (default: `next` in TFF's runtime).
      post_aggregation: A client step after the server step (stateful client work only): `next` broadcasts
        ``post_aggregation.server_value(new global weights)`` and maps ``post_aggregation.client_update`` over
        the clients' new private states and client metrics. A `backend` may run its own rounds (not this).
      server_step: The server's step in place of `model_aggregator`, `server_optimizer` and TFF's finalizer
        (stateful client work only; see `ServerStep`): it takes the client work's first result as uploads.
      client_metrics_key: The key of the aggregated client metrics in the ``client_work`` metrics (TFF's client
        work: ``'train'``); None: they are the ``client_work`` metrics themselves.

    Returns:
      A `PersonalizedProcess` (metrics: `distributor`, `client_work` (`train`), `aggregator`, `finalizer`, or in
      place of the last two a `server_step`'s measurements). `parts['after_client_work']` is the stateful round
      after the client work, a Python function ``(state, uploads, client metrics, new private states) ->
      ProcessOutput`` to trace in a federated computation (the server keeps its distributor state): what a privacy
      audit of the uploads reads.
    """
    weights_type = initial_global_weights.type_signature.result
    distributor = model_distributor or tff.learning.templates.build_broadcast_process(weights_type)
    parts = dict(parts or {})
    stateful = initial_private_state is not None
    for name, part in (('post_aggregation', post_aggregation), ('server_step', server_step)):
        if part is not None:
            if not stateful:
                raise ValueError(f'{name} is a part of stateful client work: it needs initial_private_state.')
            parts[name] = part
    if server_step is None:
        if server_optimizer is None:
            raise ValueError('server_optimizer is needed without a server_step.')
        aggregator = (model_aggregator or tff.aggregators.MeanFactory()).create(
            weights_type.trainable, tff.TensorType(np.float32)
        )
        finalizer = tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer, weights_type)
    if isinstance(client_update, tff.Computation):
        parts['client_update'] = client_update
        dataset_type = client_update.type_signature.parameter[1]
        if not stateful and isinstance(dataset_type, tff.SequenceType):
            client_work = _client_work_process(client_update, aggregate_metrics, client_metrics_key)
            learning_process = tff.learning.templates.compose_learning_process(
                initial_global_weights, distributor, client_work, aggregator, finalizer
            )
            return process_lib.from_learning_process(learning_process, parts=parts, backend=backend)
    # Stateful client work, or client data that is not a sequence (the engine's packed groups, which TFF's
    # ClientWorkProcess does not accept): the same composition written out.
    private_type = initial_private_state.type_signature.result if initial_private_state is not None else None

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(
            tff.learning.templates.LearningAlgorithmState(
                global_model_weights=tff.federated_eval(initial_global_weights, tff.SERVER),
                distributor=distributor.initialize(),
                client_work=tff.federated_value((), tff.SERVER),
                aggregator=server_step.initialize() if server_step else aggregator.initialize(),
                finalizer=tff.federated_value((), tff.SERVER) if server_step else finalizer.initialize(),
            )
        )

    def after_client_work(state, distributed, client_result, client_metrics, new_private):
        """The round after the client work (traced); `distributed` is None outside `next` (state kept)."""
        if server_step is not None:
            weights, server_state, server_metrics = server_step.next(
                state.aggregator, state.global_model_weights, client_result, client_metrics
            )
            finalizer_state, post_value = state.finalizer, tff.federated_zip((weights, server_state))
        else:
            aggregated = aggregator.next(state.aggregator, client_result.update, client_result.update_weight)
            finalized = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
            weights, server_state, finalizer_state = finalized.result, aggregated.state, finalized.state
            server_metrics = collections.OrderedDict(
                aggregator=aggregated.measurements, finalizer=finalized.measurements
            )
            post_value = weights
        if post_aggregation is not None:
            new_private = post_aggregation.apply(post_value, new_private, client_metrics)
        new_state = tff.federated_zip(
            tff.learning.templates.LearningAlgorithmState(
                global_model_weights=weights,
                distributor=state.distributor if distributed is None else distributed.state,
                client_work=state.client_work,
                aggregator=server_state,
                finalizer=finalizer_state,
            )
        )
        metrics = tff.federated_zip(
            collections.OrderedDict(
                distributor=tff.federated_value((), tff.SERVER) if distributed is None else distributed.measurements,
                client_work=_keyed(aggregate_metrics(client_metrics), client_metrics_key),
                **server_metrics,
            )
        )
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=new_private)

    if stateful:
        parts['after_client_work'] = lambda state, *results: after_client_work(state, None, *results)

    def build_next(update: tff.Computation) -> tff.Computation:
        """The round as a federated computation mapping `update` (the client work) over CLIENTS."""
        dataset_type = update.type_signature.parameter[1]
        slot_private_type = private_type
        if stateful and not update.type_signature.parameter[2].is_equivalent_to(private_type):
            slot_private_type = update.type_signature.parameter[2]  # E.g. a group's stacked private states.

        def round_fn(state, client_data, private_states):
            distributed = distributor.next(state.distributor, state.global_model_weights)
            if stateful:
                client_result, client_metrics, new_private = tff.federated_map(
                    update, (distributed.result, client_data, private_states)
                )
            else:
                client_result, client_metrics = tff.federated_map(update, (distributed.result, client_data))
                new_private = ()
            return after_client_work(state, distributed, client_result, client_metrics, new_private)

        if stateful:

            @tff.federated_computation(
                initialize.type_signature.result,
                tff.FederatedType(dataset_type, tff.CLIENTS),
                tff.FederatedType(slot_private_type, tff.CLIENTS),
            )
            def next_fn(state, client_data, private_states):
                return round_fn(state, client_data, private_states)

        else:

            @tff.federated_computation(initialize.type_signature.result, tff.FederatedType(dataset_type, tff.CLIENTS))
            def next_fn(state, client_data):
                return round_fn(state, client_data, None)

        return next_fn

    def build_lazily() -> tff.Computation:
        update = client_update()
        process.parts['client_update'] = update
        return build_next(update)

    process = process_lib.PersonalizedProcess(
        initialize,
        build_next(client_update) if isinstance(client_update, tff.Computation) else build_lazily,
        get_model_weights=lambda state: state.global_model_weights,
        global_weights_type=weights_type,
        private_state_type=private_type,
        initial_private_state_fn=initial_private_state,
        parts=parts,
        backend=backend,
    )
    return process
