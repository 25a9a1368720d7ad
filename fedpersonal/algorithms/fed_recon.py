"""Federated Reconstruction (Singhal et al., NeurIPS 2021, Algorithm 1).

Each round, every sampled client

1. receives the global variables g (and, optionally, a learned default for the
   local variables);
2. splits its data into a support and a query set (`ReconstructionSplit`);
3. *reconstructs* its local variables l from their initializer (or the learned
   default) with k_r optimizer steps on the support set, g frozen;
4. *updates* g with k_u optimizer steps on the query set, l frozen (or trained
   jointly when `jointly_train_locals`);
5. sends back only the update g_initial - g_final and a weight.

Local variables exist only inside the client computation: nothing derived from
them is returned, except (opt-in, `learn_local_init`) the displacement of the
reconstructed locals from the shared default, which then goes through the same
aggregator as the global update (so secure or DP aggregation applies to it too).

The process is assembled from TFF's templates: broadcast distributor,
this client work, any `tff.aggregators` factory, and TFF's apply-optimizer
finalizer, via `tff.learning.templates.compose_learning_process`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import dataset_split as dataset_split_lib
from fedpersonal.algorithms import tff_names
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
ModelWeights: TypeAlias = tff.learning.models.ModelWeights
LossFn: TypeAlias = Callable[[], tf.keras.losses.Loss]
MetricsFn: TypeAlias = Callable[[], list[tf.keras.metrics.Metric]]
ModelFn: TypeAlias = Callable[[], ReconstructionModel]
AggregationFactory: TypeAlias = (
    tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory
)
SplitArg: TypeAlias = dataset_split_lib.ReconstructionSplit | dataset_split_lib.DatasetSplitFn
# A TFF optimizer, or (as TFF accepts) a no-arg function returning a Keras optimizer.
OptimizerArg: TypeAlias = tff.learning.optimizers.Optimizer | Callable[[], tf.keras.optimizers.Optimizer]
_DEFAULT_SERVER = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
_DEFAULT_CLIENT = tff.learning.optimizers.build_sgdm(learning_rate=0.1)


def resolve_split_fn(dataset_split: SplitArg) -> dataset_split_lib.DatasetSplitFn:
    if isinstance(dataset_split, dataset_split_lib.ReconstructionSplit):
        return dataset_split_lib.build_dataset_split_fn(dataset_split)
    if callable(dataset_split):
        return dataset_split
    raise TypeError(f'dataset_split must be a ReconstructionSplit or a split function, got {dataset_split!r}.')


def global_weights_with_local_default(model: ReconstructionModel, learn_local_init: bool) -> ModelWeights:
    """The server-side weights: global variables (+ local trainable defaults)."""
    trainable = list(model.global_trainable_variables)
    if learn_local_init:
        trainable += list(model.local_trainable_variables)
    return ModelWeights(trainable=trainable, non_trainable=list(model.global_non_trainable_variables))


def server_weights_type(model_fn: Callable[[], ReconstructionModel], learn_local_init: bool = False) -> tff.Type:
    """The type of the weights `build_fed_recon` broadcasts (e.g. for a custom `model_distributor`)."""

    @tff.tensorflow.computation
    def initial_weights():
        return global_weights_with_local_default(model_fn(), learn_local_init)

    return initial_weights.type_signature.result


def _build_client_update(
    model_fn: ModelFn,
    *,
    loss_fn: LossFn,
    metrics_fn: MetricsFn | None,
    client_optimizer: tff.learning.optimizers.Optimizer,
    reconstruction_optimizer: tff.learning.optimizers.Optimizer,
    split_fn: dataset_split_lib.DatasetSplitFn,
    jointly_train_locals: bool,
    learn_local_init: bool,
    client_weighting: Any,
    metric_finalizers: collections.OrderedDict,
    weights_type: tff.Type,
    dataset_type: tff.SequenceType,
) -> tff.Computation:
    """The FedRecon client work: reconstruct locals, update globals, return the delta."""

    @tff.tensorflow.computation(weights_type, dataset_type)
    @tf.function
    def client_update(server_weights, dataset):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            metrics = client_work.build_metrics(metrics_fn, loss_fn, metric_finalizers)
            loss = client_work.construct(loss_fn)
            recon_opt = client_work.prepare_optimizer(reconstruction_optimizer, model.local_trainable_variables)
            update_variables = list(model.global_trainable_variables)
            if jointly_train_locals:
                update_variables += list(model.local_trainable_variables)
            client_opt = client_work.prepare_optimizer(client_optimizer, update_variables)

        global_trainable = list(model.global_trainable_variables)
        local_trainable = list(model.local_trainable_variables)
        num_global = len(global_trainable)
        received = server_weights.trainable
        client_work.assign(global_trainable, received[:num_global])
        client_work.assign(model.global_non_trainable_variables, server_weights.non_trainable)
        if learn_local_init:
            client_work.assign(local_trainable, received[num_global:])

        support, query = split_fn(dataset)
        client_work.reconstruct(model, support, recon_opt, loss)
        num_examples = client_work.optimizer_steps(
            update_variables, query, client_opt, client_work.model_batch_loss(model, loss, metrics)
        ).num_examples

        trained = list(global_trainable) + (local_trainable if learn_local_init else [])
        delta, has_non_finite = client_work.weights_delta(received, trained)
        unfinalized_metrics = client_work.read_metrics(metrics)
        weight = client_work.client_weight(client_weighting, num_examples, unfinalized_metrics, has_non_finite)
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), unfinalized_metrics

    return client_update


def _build_group_client_update(
    model: functional.FunctionalModel,
    *,
    loss_fn: LossFn,
    metrics_fn: MetricsFn | None,
    client_optimizer: tff.learning.optimizers.Optimizer,
    reconstruction_optimizer: tff.learning.optimizers.Optimizer,
    jointly_train_locals: bool,
    learn_local_init: bool,
    client_weighting: Any,
    metric_finalizers: collections.OrderedDict,
    weights_type: tff.Type,
    group_type: tff.Type,
    dp_clip: float | None = None,
) -> tuple[Callable[[], tff.Computation], Callable[..., Any]]:
    """The FedRecon client work of a group of logical clients in lockstep (the engine's `_build_client_update`).

    With `dp_clip`, the group reports the sum of its clients' updates each clipped to it
    (`group.clipped_sum_update`), for a fixed-clip DP aggregator.

    Returns a no-arg function building the TFF computation (traced only if `process.next` is used) and the same
    client work as a `tf.function` of its own (run by `simulation.driver`, with metric variables of its own).
    """
    initial = model.initial_weights
    num_global = len(initial.global_trainable)
    local_slots = [(functional.LOCAL_TRAINABLE, i) for i in range(len(initial.local_trainable))]
    global_slots = [(functional.GLOBAL_TRAINABLE, i) for i in range(num_global)]
    update_slots = global_slots + (local_slots if jointly_train_locals else [])
    returned_slots = global_slots + (local_slots if learn_local_init else [])

    def build_group_work(finalizers: collections.OrderedDict, *, now: bool):
        metrics_and_loss = group_lib.metrics_and_loss(metrics_fn, loss_fn, finalizers, now=now)

        @tf.function
        def group_work(server_weights, group):
            metrics, loss = metrics_and_loss()
            for metric in metrics:  # Run in this process's runtime, the variables outlive a call.
                metric.reset_state()

            @tf.function(jit_compile=model.xla)
            def train(received, non_trainable, group):
                local_init = (
                    received[num_global:] if learn_local_init else [tf.constant(v) for v in initial.local_trainable]
                )
                weights = functional.Parts(
                    received[:num_global],
                    non_trainable,
                    local_init,
                    [tf.constant(v) for v in initial.local_non_trainable],
                )
                weights, _ = lockstep.lockstep_steps(
                    model, weights, local_slots, group['support'], reconstruction_optimizer, loss
                )
                query = group['query']
                weight = group_lib.client_weights(client_weighting, tf.reduce_sum(query['mask'], axis=[1, 2]))
                weights, steps = lockstep.lockstep_steps(
                    model, weights, update_slots, query, client_optimizer, loss, metrics=metrics, delta_weights=weight
                )
                clients = tf.shape(query['steps'])[0]
                trained = [lockstep.per_client(weights[g][i], initial[g][i], clients) for g, i in returned_slots]
                if dp_clip is not None:
                    return group_lib.clipped_sum_update(received, trained, weight, dp_clip)
                accumulated = steps.weighted_deltas if returned_slots == update_slots else None
                return group_lib.weighted_update(received, trained, weight, accumulated, steps.finite)

            result = train(list(server_weights.trainable), list(server_weights.non_trainable), group)
            with tf.control_dependencies(tf.nest.flatten(result)):
                return result, client_work.read_metrics(metrics)

        return group_work

    build_computation = lambda: tff.tensorflow.computation(weights_type, group_type)(
        build_group_work(metric_finalizers, now=False)
    )
    return build_computation, build_group_work(collections.OrderedDict(), now=True)


def build_fed_recon(
    model_fn: ModelFn,
    *,
    loss_fn: LossFn,
    metrics_fn: MetricsFn | None = None,
    server_optimizer: OptimizerArg | None = None,
    client_optimizer: OptimizerArg | None = None,
    reconstruction_optimizer: OptimizerArg | None = None,
    dataset_split: SplitArg | None = None,
    jointly_train_locals: bool = False,
    learn_local_init: bool = False,
    client_weighting: Any = None,
    model_aggregator: AggregationFactory | None = None,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    metrics_aggregator: Callable[..., tff.Computation] | None = None,
    simulation: str = 'engine',
    group_size: int | None = None,
    measure_communication: bool = False,
    server_optimizer_fn: OptimizerArg | None = None,
    client_optimizer_fn: OptimizerArg | None = None,
    reconstruction_optimizer_fn: OptimizerArg | None = None,
    dataset_split_fn: SplitArg | None = None,
    model_aggregator_factory: AggregationFactory | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds the Federated Reconstruction learning process.

    Args:
      model_fn: No-arg function returning a new `ReconstructionModel` (e.g. from
        `fedpersonal.models.from_keras_model`) each call.
      loss_fn: No-arg function returning the `tf.keras.losses.Loss` optimized
        in both phases (plus the Keras model's regularization losses).
      metrics_fn: No-arg function returning Keras metrics computed on query
        batches during the update (a `loss` and `num_examples` are added).
      server_optimizer: Applied to the aggregated update (SGD, Adam, Yogi, ...); default SGD, learning rate 1.
        Any optimizer may also be a no-arg function returning a Keras optimizer, as in TFF (per-client path only).
      client_optimizer: For the k_u update steps on the query set; default SGD, learning rate 0.1.
      reconstruction_optimizer: For the k_r reconstruction steps on the support set; default SGD, 0.1.
      dataset_split: A `ReconstructionSplit` (support/query split, epochs, step
        caps; default `ReconstructionSplit()`) or any `tff.learning.models.ReconstructionDatasetSplitFn`
        (e.g. TFF's `ReconstructionModel.build_dataset_split_fn(...)`, used as it is).
      jointly_train_locals: Also train local variables during the update phase.
      learn_local_init: Learn a global default for the local trainable
        variables (the paper's footnote 2): clients start reconstruction from
        it, and it is updated with the aggregated displacement of their
        reconstructed locals. Off by default, since that displacement (in
        aggregate) then reaches the server.
      client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (query
        examples, default; also for None, as in TFF), `UNIFORM`, or a callable of the unfinalized metrics.
      model_aggregator: Any `tff.aggregators` factory (weighted or unweighted),
        e.g. DP or zeroing; default weighted `MeanFactory`.
      model_distributor: Default `tff.learning.templates.build_broadcast_process`.
      metrics_aggregator: As in TFF (default, and None: `sum_then_finalize`).
      simulation: ``'engine'`` (default): a round's clients run in groups, each group as one compiled
        program (`fedpersonal.simulation`); `process.pack(datasets)` makes `next`'s input. ``'per_client'``:
        one TFF client computation per client, `next` takes the datasets. Same results to float precision.
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB of
        per-client weight copies, at most 128).
      measure_communication: Engine only: `run_round`'s metrics also report each logical client's download
        and upload as `fedpersonal.metrics.communication`'s measured broadcast and aggregator do on the
        per-client path (same keys; `simulation.driver`).
      server_optimizer_fn, client_optimizer_fn, reconstruction_optimizer_fn, dataset_split_fn,
        model_aggregator_factory: TFF 0.87's names of `server_optimizer`, `client_optimizer`,
        `reconstruction_optimizer`, `dataset_split` and `model_aggregator` (`fedpersonal.algorithms.tff_names`);
        giving both names of one argument is a `TypeError`. `fedpersonal.algorithms.tff_compat.build_fed_recon`
        returns TFF's `LearningProcess` itself (docs/MIGRATING.md).

    Returns:
      A stateless `fedpersonal.core.PersonalizedProcess` (`next(state, client_datasets)` ->
      `ProcessOutput(state, metrics, private_states=())`); `get_model_weights(state)` returns the server
      weights (globals, then local defaults when `learn_local_init`). The TFF
      `tff.learning.templates.LearningProcess` it is composed of is `process.learning_process`.

    Example:

    >>> import tensorflow as tf, tensorflow_federated as tff
    >>> from fedpersonal import algorithms, models
    >>> from fedpersonal.models import matrix_factorization as mf
    >>> process = algorithms.build_fed_recon(
    ...     mf.personal_model_fn(num_items=20, num_latent_factors=4),
    ...     loss_fn=tf.keras.losses.MeanSquaredError,
    ...     client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    >>> process.stateful
    False

    Raises:
      fedpersonal.models.ModelSpecError: the model has no global trainable
        variables, or `learn_local_init` is set and it has no local ones.
      ValueError: an unweighted aggregator with non-uniform client weighting.
      TypeError: an argument given under both its names.
    """
    name = 'build_fed_recon'
    server_optimizer = tff_names.resolve(
        name, 'server_optimizer', server_optimizer, 'server_optimizer_fn', server_optimizer_fn, _DEFAULT_SERVER
    )
    client_optimizer = tff_names.resolve(
        name, 'client_optimizer', client_optimizer, 'client_optimizer_fn', client_optimizer_fn, _DEFAULT_CLIENT
    )
    reconstruction_optimizer = tff_names.resolve(
        name,
        'reconstruction_optimizer',
        reconstruction_optimizer,
        'reconstruction_optimizer_fn',
        reconstruction_optimizer_fn,
        _DEFAULT_CLIENT,
    )
    split: SplitArg = tff_names.resolve(
        name,
        'dataset_split',
        dataset_split,
        'dataset_split_fn',
        dataset_split_fn,
        dataset_split_lib.ReconstructionSplit(),
    )
    model_aggregator = tff_names.resolve(
        name, 'model_aggregator', model_aggregator, 'model_aggregator_factory', model_aggregator_factory
    )
    if client_weighting is None:
        client_weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
    if metrics_aggregator is None:
        metrics_aggregator = tff.learning.metrics.sum_then_finalize
    with tf.Graph().as_default():
        probe = model_fn()
        # The class, not the ReconstructionModel alias: mypy cannot isinstance() an alias of an untyped module's class.
        if not isinstance(probe, tff.learning.models.ReconstructionModel):
            raise TypeError(f'model_fn must return a tff.learning.models.ReconstructionModel, got {type(probe)}.')
        partially_local_model.require_parts(
            probe, algorithm='FedRecon', needs_global=True, needs_local=learn_local_init
        )
        element_type = tff.types.tensorflow_to_type(probe.input_spec)
        probe_spec = probe.input_spec

    @tff.tensorflow.computation
    def initial_weights():
        return global_weights_with_local_default(model_fn(), learn_local_init)

    weights_type = initial_weights.type_signature.result
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()
    simulation_options.check_simulation(simulation)
    split_fn = resolve_split_fn(split)
    if simulation == 'engine':
        group_lib.check_aggregator(model_aggregator, fixed_clip_dp=True)
        simulation_options.check_engine_parts(
            model_distributor=model_distributor, metrics_aggregator=metrics_aggregator
        )
        group_lib.client_weights(client_weighting, tf.zeros([1]))  # Refuses a callable weighting early.
        for role, optimizer in (
            ('server_optimizer', server_optimizer),
            ('client_optimizer', client_optimizer),
            ('reconstruction_optimizer', reconstruction_optimizer),
        ):
            lockstep.check_optimizer(optimizer, role)
        model = functional.FunctionalModel(model_fn)
        trained = list(model.initial_weights.global_trainable) + list(model.initial_weights.local_trainable)
        fast_split = isinstance(split, dataset_split_lib.ReconstructionSplit)
        group_size = group_size or simulation_options.default_group_size(trained)
        dp_clip = group_lib.per_client_clip(model_aggregator)
        packer = packing.ClientPacker(
            None if fast_split else split_fn,
            ('support', 'query'),
            probe_spec,
            group_size,
            batch_phase_fn=functools.partial(dataset_split_lib.split_batches, split=split) if fast_split else None,
        )
        client_update, group_work = _build_group_client_update(
            model,
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            client_optimizer=client_optimizer,
            reconstruction_optimizer=reconstruction_optimizer,
            jointly_train_locals=jointly_train_locals,
            learn_local_init=learn_local_init,
            client_weighting=client_weighting,
            metric_finalizers=metric_finalizers,
            weights_type=weights_type,
            group_type=packer.group_type(),
            dp_clip=dp_clip,
        )
        # A slot is a group: under a fixed DP clip its record is the sum of up to group_size clipped updates.
        aggregator = compose.weighted_aggregator(
            group_lib.slot_aggregator(model_aggregator, group_size), client_weighting
        )
        return compose.compose_personalized_process(
            initial_global_weights=initial_weights,
            client_update=client_update,
            aggregate_metrics=compose.keras_metrics(metric_finalizers, metrics_aggregator),
            server_optimizer=server_optimizer,
            model_aggregator=aggregator,
            model_distributor=model_distributor,
            packer=packer,
            round_runner=driver.GroupRoundRunner(
                group_work,
                server_optimizer,
                driver.KerasMetricsFinalizer(
                    lambda: client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())
                ),
                measure_communication=measure_communication,
                aggregation=(
                    None if dp_clip is None else aggregator.create(weights_type.trainable, tff.TensorType(np.float32))
                ),
            ),
        )
    client_update = _build_client_update(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        client_optimizer=client_optimizer,
        reconstruction_optimizer=reconstruction_optimizer,
        split_fn=split_fn,
        jointly_train_locals=jointly_train_locals,
        learn_local_init=learn_local_init,
        client_weighting=client_weighting,
        metric_finalizers=metric_finalizers,
        weights_type=weights_type,
        dataset_type=tff.SequenceType(element_type),
    )
    return compose.compose_personalized_process(
        initial_global_weights=initial_weights,
        client_update=client_update,
        aggregate_metrics=compose.keras_metrics(metric_finalizers, metrics_aggregator),
        server_optimizer=server_optimizer,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
        model_distributor=model_distributor,
    )
