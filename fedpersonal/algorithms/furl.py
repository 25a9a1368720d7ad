"""FURL: Federated User Representation Learning (Bui et al., 2019).

Model parameters are split into *federated* parameters (the model's global
variables) and *private* parameters (its local variables, e.g. a user
embedding). Each round, every sampled client

1. receives the federated parameters;
2. starts its private parameters from the value its last participation left
   on the device (or a default on first participation) -- they are a
   `tff.CLIENTS`-placed *input* of the round;
3. trains federated and private parameters jointly on its data (optionally
   with a norm penalty on its own private parameters, which keeps the
   independent-local-training constraint, Eq. 1);
4. sends back only the federated update and a weight; its trained private
   parameters are a `tff.CLIENTS`-placed *output* of the round (global update
   rule a_p = identity, Eq. 7).

Federated parameters are aggregated with any `tff.aggregators` factory
(a_f = FedAvg by default, Eq. 4) and applied by a server optimizer. Private
parameters never reach a SERVER-placed intrinsic or the server state.

The process is a `tff.templates.IterativeProcess` (a `LearningProcess` cannot
return CLIENTS-placed values):

    initialize: ( -> state@SERVER)
    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> ->
           <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import tensor_utils
from tensorflow_federated.python.learning.optimizers import keras_optimizer

from fedpersonal.algorithms import fed_recon
from fedpersonal.models import partially_local_model

ModelWeights = tff.learning.models.ModelWeights
ReconstructionModel = tff.learning.models.ReconstructionModel
AggregationFactory = Union[tff.aggregators.WeightedAggregationFactory, tff.aggregators.UnweightedAggregationFactory]


class FurlOutput(NamedTuple):
    """Result of one FURL round: server state, server metrics, and each client's new private state."""

    state: Any
    metrics: Any
    private_states: Any


class FurlProcess(tff.templates.IterativeProcess):
    """The FURL iterative process, with helpers to read and set the federated weights."""

    def __init__(self, initialize_fn, next_fn, *, private_state_type, global_weights_type, initial_private_state_fn):
        super().__init__(initialize_fn, next_fn)
        self.private_state_type = private_state_type
        self.global_weights_type = global_weights_type
        self._initial_private_state_fn = initial_private_state_fn

    def get_model_weights(self, state) -> ModelWeights:
        """The federated (global) model weights in `state`."""
        return state.global_model_weights

    def initial_private_state(self) -> ModelWeights:
        """A freshly initialized private state (the model's local variables at their initializers)."""
        return self._initial_private_state_fn()


def local_weights(model: ReconstructionModel) -> ModelWeights:
    """The model's private (local) variables as `ModelWeights`."""
    return ModelWeights(
        trainable=list(model.local_trainable_variables), non_trainable=list(model.local_non_trainable_variables)
    )


def global_weights(model: ReconstructionModel) -> ModelWeights:
    """The model's federated (global) variables as `ModelWeights`."""
    return ModelWeights(
        trainable=list(model.global_trainable_variables), non_trainable=list(model.global_non_trainable_variables)
    )


def build_furl(
    model_fn: Callable[[], ReconstructionModel],
    *,
    loss_fn: Callable[[], tf.keras.losses.Loss],
    metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_epochs: int = 1,
    private_norm_regularization: float = 0.0,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_aggregator: Optional[AggregationFactory] = None,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
) -> FurlProcess:
    """Builds the FURL iterative process.

    Args:
      model_fn: No-arg function returning a new model whose local variables are
        the private parameters (e.g. `fedpersonal.models.from_keras_model` with
        the user-embedding layer declared local).
      loss_fn: No-arg function returning the training loss.
      metrics_fn: No-arg function returning Keras metrics computed during local
        training (`loss` and `num_examples` are added).
      client_optimizer: Optimizer for the joint local training.
      server_optimizer: Applied to the aggregated federated update.
      client_epochs: Local epochs per round (the paper: 1).
      private_norm_regularization: lambda of a `lambda * ||w_p||^2` penalty on
        the client's own private parameters (allowed by Eq. 1).
      client_weighting: `NUM_EXAMPLES` (FedAvg, Eq. 4), `UNIFORM`, or a callable.
      model_aggregator: Any `tff.aggregators` factory for the federated update.
      metrics_aggregator: As in TFF.

    Returns:
      A `FurlProcess`.
    """
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    with tf.Graph().as_default():
        probe = model_fn()
        partially_local_model.require_parts(probe, algorithm='FURL', needs_global=True, needs_local=True)
        element_type = tff.types.tensorflow_to_type(probe.input_spec)

    @tff.tensorflow.computation
    def initial_global_weights():
        return global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_private_state():
        return local_weights(model_fn())

    weights_type = initial_global_weights.type_signature.result
    private_type = initial_private_state.type_signature.result
    dataset_type = tff.SequenceType(element_type)

    if model_aggregator is None:
        model_aggregator = tff.aggregators.MeanFactory()
    if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
        if client_weighting is not tff.learning.ClientWeighting.UNIFORM:
            raise ValueError('An unweighted aggregator needs client_weighting=tff.learning.ClientWeighting.UNIFORM.')
        model_aggregator = tff.aggregators.as_weighted_aggregator(model_aggregator)
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()

    @tff.tensorflow.computation(weights_type, dataset_type, private_type)
    @tf.function
    def client_update(server_weights, dataset, private_state):
        with tf.init_scope():
            model = model_fn()
            metrics = fed_recon.build_metrics(metrics_fn, loss_fn, metric_finalizers)
            loss = loss_fn()
            trainable = list(model.global_trainable_variables) + list(model.local_trainable_variables)
            optimizer = keras_optimizer.build_or_verify_tff_optimizer(
                client_optimizer, trainable, disjoint_init_and_next=False
            )
        fed_recon.assign(model.global_trainable_variables, server_weights.trainable)
        fed_recon.assign(model.global_non_trainable_variables, server_weights.non_trainable)
        fed_recon.assign(model.local_trainable_variables, private_state.trainable)
        fed_recon.assign(model.local_non_trainable_variables, private_state.non_trainable)

        penalty = None
        if private_norm_regularization > 0:
            private = list(model.local_trainable_variables)
            penalty = lambda: private_norm_regularization * tf.add_n([tf.reduce_sum(tf.square(v)) for v in private])
        num_examples = fed_recon.optimizer_steps(
            model, dataset.repeat(client_epochs), trainable, optimizer, loss, metrics, extra_loss=penalty
        )
        delta = [a - b for a, b in zip(server_weights.trainable, model.global_trainable_variables)]
        delta, has_non_finite = tensor_utils.zero_all_if_any_non_finite(delta)
        unfinalized = ReconstructionModel.read_metric_variables(metrics)
        weight = fed_recon.client_weight(client_weighting, num_examples, unfinalized, has_non_finite)
        new_private = keep_previous_if_non_finite(
            has_non_finite, private_state, model.local_trainable_variables, model.local_non_trainable_variables
        )
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), unfinalized, new_private

    def aggregate_metrics(unfinalized):
        return metrics_aggregator(metric_finalizers, unfinalized.type_signature.member)(unfinalized)

    return compose_stateful_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=model_aggregator,
        server_optimizer=server_optimizer,
        aggregate_metrics=aggregate_metrics,
    )


def keep_previous_if_non_finite(
    has_non_finite: tf.Tensor, previous: ModelWeights, trainable: list[tf.Variable], non_trainable: list[tf.Variable]
) -> ModelWeights:
    """A client's new private state: the trained variables' values, or `previous` if the round went non-finite.

    Must run inside the client's `tf.function`; `has_non_finite` is the flag of
    `tensor_utils.zero_all_if_any_non_finite` on the federated update.
    """
    return tf.cond(
        has_non_finite > 0,
        lambda: ModelWeights(trainable=list(previous.trainable), non_trainable=list(previous.non_trainable)),
        lambda: ModelWeights(
            trainable=[tf.identity(v) for v in trainable], non_trainable=[tf.identity(v) for v in non_trainable]
        ),
    )


def build_ratio_metrics_aggregation(sums_type: tff.Type) -> Callable[[Any], Any]:
    """Server metrics from per-client `[numerator, denominator]` pairs (an `OrderedDict` of 2-vectors).

    The returned function maps the CLIENTS-placed pairs to SERVER-placed metrics:
    each metric is sum(numerators) / sum(denominators), except `num_examples`,
    which is the sum of its numerators.
    """

    @tff.tensorflow.computation(sums_type)
    def finalize(sums):
        return collections.OrderedDict(
            (k, v[0] if k == 'num_examples' else v[0] / tf.maximum(v[1], 1.0)) for k, v in sums.items()
        )

    def aggregate(client_sums):
        return tff.federated_map(finalize, tff.federated_sum(client_sums))

    return aggregate


def compose_stateful_process(
    *,
    initial_global_weights: tff.Computation,
    initial_private_state: tff.Computation,
    client_update: tff.Computation,
    model_aggregator: tff.aggregators.WeightedAggregationFactory,
    server_optimizer: tff.learning.optimizers.Optimizer,
    aggregate_metrics: Callable[[Any], Any],
) -> FurlProcess:
    """Composes a stateful-client learning process (FURL, FedDVA, Ditto) from its parts.

    The round broadcasts the global weights (TFF's broadcast process), runs
    `client_update: (<global weights, dataset, private state> -> <ClientResult,
    client metrics, new private state>)` on every client, aggregates only the
    `ClientResult` with `model_aggregator`, applies it with `server_optimizer`
    (TFF's apply-optimizer finalizer), and turns the
    CLIENTS-placed client metrics into SERVER-placed ones with
    `aggregate_metrics`. The new private states are returned CLIENTS-placed and
    never reach a SERVER-placed intrinsic.

    Args:
      initial_global_weights: No-arg TF computation returning the initial global `ModelWeights`.
      initial_private_state: No-arg TF computation returning a default private state.
      client_update: The client work as a TF computation (see above).
      model_aggregator: A weighted `tff.aggregators` factory for `ClientResult.update`
        (weighted by `ClientResult.update_weight`).
      server_optimizer: Applied to the aggregated update.
      aggregate_metrics: Python function from CLIENTS-placed client metrics to
        SERVER-placed metrics, called while tracing the federated computation.

    Returns:
      A `FurlProcess`.
    """
    dataset_type = client_update.type_signature.parameter[1]
    private_type = initial_private_state.type_signature.result
    weights_type = initial_global_weights.type_signature.result
    aggregator = model_aggregator.create(weights_type.trainable, tff.TensorType(np.float32))
    distributor = tff.learning.templates.build_broadcast_process(weights_type)
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer, weights_type)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(
            tff.learning.templates.LearningAlgorithmState(
                global_model_weights=tff.federated_eval(initial_global_weights, tff.SERVER),
                distributor=distributor.initialize(),
                client_work=tff.federated_value((), tff.SERVER),
                aggregator=aggregator.initialize(),
                finalizer=finalizer.initialize(),
            )
        )

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(dataset_type, tff.CLIENTS),
        tff.FederatedType(private_type, tff.CLIENTS),
    )
    def next_fn(state, client_data, private_states):
        distributed = distributor.next(state.distributor, state.global_model_weights)
        client_result, client_metrics, new_private = tff.federated_map(
            client_update, (distributed.result, client_data, private_states)
        )
        aggregated = aggregator.next(state.aggregator, client_result.update, client_result.update_weight)
        finalized = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
        new_state = tff.federated_zip(
            tff.learning.templates.LearningAlgorithmState(
                global_model_weights=finalized.result,
                distributor=distributed.state,
                client_work=state.client_work,
                aggregator=aggregated.state,
                finalizer=finalized.state,
            )
        )
        metrics = tff.federated_zip(
            collections.OrderedDict(
                distributor=distributed.measurements,
                client_work=tff.federated_zip(collections.OrderedDict(train=aggregate_metrics(client_metrics))),
                aggregator=aggregated.measurements,
                finalizer=finalized.measurements,
            )
        )
        return FurlOutput(state=new_state, metrics=metrics, private_states=new_private)

    return FurlProcess(
        initialize,
        next_fn,
        private_state_type=private_type,
        global_weights_type=weights_type,
        initial_private_state_fn=initial_private_state,
    )
