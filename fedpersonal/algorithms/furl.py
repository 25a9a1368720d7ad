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

The process is a stateful `fedpersonal.core.PersonalizedProcess` composed by
`fedpersonal.core.compose_personalized_process` (a `LearningProcess` cannot
return CLIENTS-placed values):

    initialize: ( -> state@SERVER)
    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> ->
           <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import partially_local_model

ReconstructionModel: TypeAlias = tff.learning.models.ReconstructionModel


def build_furl(
    model_fn: Callable[[], ReconstructionModel],
    *,
    loss_fn: Callable[[], tf.keras.losses.Loss],
    metrics_fn: Callable[[], list[tf.keras.metrics.Metric]] | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_epochs: int = 1,
    private_norm_regularization: float = 0.0,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_aggregator: compose.AggregationFactory | None = None,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
) -> process_lib.PersonalizedProcess:
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
      A stateful `fedpersonal.core.PersonalizedProcess`: `next(state, client_datasets, private_states)` ->
      `ProcessOutput(state, metrics, private_states)`; `initial_private_state()` is a client's private state
      before its first participation (the model's local variables at their initializers).

    Example:

    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> from fedpersonal.models import matrix_factorization as mf
    >>> process = algorithms.build_furl(mf.personal_model_fn(num_items=20, num_latent_factors=4),
    ...                                 loss_fn=tf.keras.losses.MeanSquaredError)
    >>> process.stateful
    True
    """
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    with tf.Graph().as_default():
        probe = model_fn()
        partially_local_model.require_parts(probe, algorithm='FURL', needs_global=True, needs_local=True)
        element_type = tff.types.tensorflow_to_type(probe.input_spec)

    @tff.tensorflow.computation
    def initial_global_weights():
        return client_work.global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_private_state():
        return client_work.local_weights(model_fn())

    dataset_type = tff.SequenceType(element_type)
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()

    @tff.tensorflow.computation(
        initial_global_weights.type_signature.result, dataset_type, initial_private_state.type_signature.result
    )
    @tf.function
    def client_update(server_weights, dataset, private_state):
        with tf.init_scope():
            model = model_fn()
            metrics = client_work.build_metrics(metrics_fn, loss_fn, metric_finalizers)
            loss = loss_fn()
            trainable = list(model.global_trainable_variables) + list(model.local_trainable_variables)
            optimizer = client_work.prepare_optimizer(client_optimizer, trainable)
        client_work.assign_weights(client_work.global_weights(model), server_weights)
        client_work.assign_weights(client_work.local_weights(model), private_state)

        penalty = None
        if private_norm_regularization > 0:
            private = list(model.local_trainable_variables)
            penalty = lambda: private_norm_regularization * tf.add_n([tf.reduce_sum(tf.square(v)) for v in private])
        num_examples = client_work.optimizer_steps(
            trainable,
            dataset.repeat(client_epochs),
            optimizer,
            client_work.model_batch_loss(model, loss, metrics),
            penalty=penalty,
        ).num_examples
        delta, has_non_finite = client_work.weights_delta(server_weights.trainable, model.global_trainable_variables)
        unfinalized = client_work.read_metrics(metrics)
        weight = client_work.client_weight(client_weighting, num_examples, unfinalized, has_non_finite)
        new_private = client_work.keep_previous_if_non_finite(
            has_non_finite, private_state, client_work.local_weights(model)
        )
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), unfinalized, new_private

    return compose.compose_personalized_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.keras_metrics(metric_finalizers, metrics_aggregator),
    )
