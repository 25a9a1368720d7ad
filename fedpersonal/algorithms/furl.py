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

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing

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
    simulation: str = 'engine',
    group_size: int | None = None,
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
      simulation: ``'engine'`` (default): a round's clients in groups, each one XLA-compiled program, their
        private states stacked per group (`process.run_round`); ``'per_client'``: one TFF client
        computation per client. Same results to float precision.
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB).

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
        probe_spec = probe.input_spec

    @tff.tensorflow.computation
    def initial_global_weights():
        return client_work.global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_private_state():
        return client_work.local_weights(model_fn())

    dataset_type = tff.SequenceType(element_type)
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()
    simulation_options.check_simulation(simulation)
    if simulation == 'engine':
        return _build_engine_process(
            model_fn,
            probe_spec=probe_spec,
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            client_optimizer=client_optimizer,
            server_optimizer=server_optimizer,
            client_epochs=client_epochs,
            private_norm_regularization=private_norm_regularization,
            client_weighting=client_weighting,
            model_aggregator=model_aggregator,
            metrics_aggregator=metrics_aggregator,
            group_size=group_size,
            initial_global_weights=initial_global_weights,
            initial_private_state=initial_private_state,
        )

    @tff.tensorflow.computation(
        initial_global_weights.type_signature.result, dataset_type, initial_private_state.type_signature.result
    )
    @tf.function
    def client_update(server_weights, dataset, private_state):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            metrics = client_work.build_metrics(metrics_fn, loss_fn, metric_finalizers)
            loss = client_work.construct(loss_fn)
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


def _build_engine_process(
    model_fn,
    *,
    probe_spec,
    loss_fn,
    metrics_fn,
    client_optimizer,
    server_optimizer,
    client_epochs,
    private_norm_regularization,
    client_weighting,
    model_aggregator,
    metrics_aggregator,
    group_size,
    initial_global_weights,
    initial_private_state,
) -> process_lib.PersonalizedProcess:
    """FURL on the fast simulation engine: the same client work for a group of clients in lockstep."""
    group_lib.check_aggregator(model_aggregator, fixed_clip_dp=True)
    dp_clip = group_lib.per_client_clip(model_aggregator)  # A fixed DP clip: applied to each logical client.
    group_lib.client_weights(client_weighting, tf.zeros([1]))  # Refuses a callable weighting early.
    lockstep.check_optimizer(client_optimizer, 'client_optimizer')
    simulation_options.check_engine_parts(metrics_aggregator=metrics_aggregator)
    model = functional.FunctionalModel(model_fn)
    initial = model.initial_weights
    num_global, num_local = len(initial.global_trainable), len(initial.local_trainable)
    global_slots = [(functional.GLOBAL_TRAINABLE, i) for i in range(num_global)]
    local_slots = [(functional.LOCAL_TRAINABLE, i) for i in range(num_local)]
    group_size = group_size or simulation_options.default_group_size(
        list(initial.global_trainable) + list(initial.local_trainable)
    )
    packer = packing.ClientPacker(
        None, ('train',), probe_spec, group_size, batch_phase_fn=lambda batches: (batches * client_epochs,)
    )
    weights_type = initial_global_weights.type_signature.result
    private_type = initial_private_state.type_signature.result
    group_private_type = packing.stacked_type(private_type)
    penalty = None
    if private_norm_regularization > 0:
        penalty = lambda values, _: (
            private_norm_regularization * tf.add_n([tf.reduce_sum(tf.square(v)) for v in values[num_global:]])
        )

    def build_group_work(finalizers: collections.OrderedDict, *, now: bool):
        metrics_and_loss = group_lib.metrics_and_loss(metrics_fn, loss_fn, finalizers, now=now)

        @tf.function
        def group_work(server_weights, group, private_states):
            metrics, loss = metrics_and_loss()
            for metric in metrics:
                metric.reset_state()

            @tf.function(jit_compile=model.xla)
            def train(received, non_trainable, group, private_trainable, private_non_trainable):
                weights = functional.Parts(received, non_trainable, private_trainable, private_non_trainable)
                phase = group['train']
                weight = group_lib.client_weights(client_weighting, tf.reduce_sum(phase['mask'], axis=[1, 2]))
                weights, steps = lockstep.lockstep_steps(
                    model,
                    weights,
                    global_slots + local_slots,
                    phase,
                    client_optimizer,
                    loss,
                    metrics=metrics,
                    penalty=penalty,
                    delta_weights=weight,
                )
                trained_globals = list(weights.global_trainable)
                if dp_clip is None:
                    result, finite = group_lib.update_after_steps(received, trained_globals, weight, steps)
                else:
                    result = group_lib.clipped_sum_update(received, trained_globals, weight, dp_clip)
                    finite = group_lib.client_finite(received, trained_globals)
                keep = lambda new, old: tf.where(
                    tf.reshape(finite, [-1] + [1] * (new.shape.rank - 1)), new, tf.cast(old, new.dtype)
                )
                new_private = tff.learning.models.ModelWeights(
                    trainable=[keep(n, o) for n, o in zip(weights.local_trainable, private_trainable)],
                    non_trainable=list(private_non_trainable),
                )
                return result, new_private

            result, new_private = train(
                list(server_weights.trainable),
                list(server_weights.non_trainable),
                group,
                list(private_states.trainable),
                list(private_states.non_trainable),
            )
            with tf.control_dependencies(tf.nest.flatten(result)):
                return result, client_work.read_metrics(metrics), new_private

        return group_work

    metric_finalizers: collections.OrderedDict = collections.OrderedDict()
    client_update = lambda: tff.tensorflow.computation(weights_type, packer.group_type(), group_private_type)(
        build_group_work(metric_finalizers, now=False)
    )
    # A slot is a group: under a fixed DP clip its record is the sum of up to group_size clipped updates.
    aggregator = compose.weighted_aggregator(group_lib.slot_aggregator(model_aggregator, group_size), client_weighting)
    runner = driver.GroupRoundRunner(
        build_group_work(collections.OrderedDict(), now=True),
        server_optimizer,
        driver.KerasMetricsFinalizer(lambda: client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())),
        aggregation=None if dp_clip is None else aggregator.create(weights_type.trainable, tff.TensorType(np.float32)),
    )
    return compose.compose_personalized_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=aggregator,
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.keras_metrics(metric_finalizers, metrics_aggregator),
        packer=packer,
        round_runner=runner,
        group_private_state_type=group_private_type,
    )
