"""The parts `process.build_process` assembles an HPFL-family process from: one factory per phase of the round.

Each factory turns the `RoundSpec` (the method as data) and the build arguments into the TF and TFF computations
of one phase (see `fedpersonal.algorithms.hpfl.process` for the round): `initial_values`, `client_work` (the
client's training, uploads and report), `server_steps` (broadcast, aggregations, server step), `post_aggregation`
(the client step after aggregation, the composer's `PostAggregation` stage), `after_client_work` and
`round_computations` (``initialize`` and ``next`` from those), `engine_parts` (the engine's packer and round
runner from the same TF functions).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl import engine
from fedpersonal.algorithms.hpfl import server
from fedpersonal.algorithms.hpfl import training
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import GlobalCentres
from fedpersonal.algorithms.hpfl.types import GlobalComponents
from fedpersonal.algorithms.hpfl.types import HpflState
from fedpersonal.algorithms.hpfl.types import ModelWeights
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import gum

ROUND_TYPE = tff.TensorType(np.int32)


class Initial(NamedTuple):
    """No-arg TF computations of the server's first global public components and global centres."""

    weights: tff.Computation
    centres: tff.Computation


def initial_values(config: gum.GumConfig, *, public_seed: int, max_global_clusters: int) -> Initial:
    """The initial global public components (seeded by `public_seed`) and empty global centres."""

    @tff.tensorflow.computation
    def initial_weights():
        return ModelWeights(trainable=list(gum.initial_public(config, public_seed)), non_trainable=[])

    @tff.tensorflow.computation
    def initial_centres():
        zeros = lambda *shape: tf.zeros(shape)
        dim = config.num_attributes
        return GlobalCentres(
            zeros(max_global_clusters, dim),
            zeros(max_global_clusters),
            zeros(max_global_clusters, dim),
            zeros(max_global_clusters),
        )

    return Initial(initial_weights, initial_centres)


class Types(NamedTuple):
    """TFF types of a silo's `ClientData` and `ClientState`, of the public components and of the server's
    global weights (`ModelWeights`) and centres (`GlobalCentres`)."""

    data: Any
    state: Any
    public: Any
    weights: Any
    centres: Any


def types_of(config: gum.GumConfig, initial: Initial) -> Types:
    """The `Types` of a process on `config` whose server starts from `initial`."""
    state_type = data_lib.client_state_type(config)
    return Types(
        data=data_lib.client_data_type(config),
        state=state_type,
        public=state_type.model.public,
        weights=initial.weights.type_signature.result,
        centres=initial.centres.type_signature.result,
    )


class ClientWork(NamedTuple):
    """The client work of a round.

    Attributes:
      train: The Python function the engine compiles, the one `client_train` wraps.
      upload_noise: Fednoise's ``(silo seed, round) -> noise`` (None without upload noise).
      client_train: The TF computation (see `HpflProcess.client_train`).
      client_centres: TF computation ``ClientState -> Centres`` (start ``'own'``), else None.
      report_type: TFF type of a `ClientReport`.
      uploads_type: TFF type of a client's uploads: `Centres` (start ``'own'``) or a `ClientResult`.
    """

    train: Callable[..., Any]
    upload_noise: Callable[..., Any] | None
    client_train: tff.Computation
    client_centres: tff.Computation | None
    report_type: Any
    uploads_type: Any


def client_work(
    config: gum.GumConfig,
    spec: RoundSpec,
    types: Types,
    *,
    optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int,
    row_updates: str,
    public_seed: int,
    local_cluster_divisor: int,
    max_local_clusters: int,
    kmeans_iterations: int,
) -> ClientWork:
    """Training from the client's own model (start ``'own'``) or from the broadcast one, with its uploads."""

    def train_own(data, state):
        return training.client_round(data, state, optimizer, config, epochs=client_epochs, row_updates=row_updates)

    public_shapes = [v.shape for v in gum.initial_public(config, public_seed)]

    def upload_noise(seed, round_num):
        """Fednoise's noise of one silo's upload: seeded by the silo and the round (outside XLA, whose
        stateless random numbers differ from TF's)."""
        seed = tf.cast(seed, tf.int64)
        return [
            spec.upload_noise_stddev
            * tf.random.stateless_normal(shape, seed=tf.stack([seed, tf.cast(round_num, tf.int64) * 8 + i]))
            for i, shape in enumerate(public_shapes)
        ]

    def train_from_global(data, state, global_weights, round_num, noise=None):
        global_public = global_weights.trainable
        if spec.local_update == 'gradient':
            trained, report, update = training.gradient_round(global_public, data, state, optimizer, config)
        else:
            start = gum.PublicWeights(*global_public)
            proximal = spec.proximal_strength > 0
            trained, report = training.client_round(
                data,
                state,
                optimizer,
                config,
                epochs=client_epochs,
                start_public=start,
                proximal_center=start if proximal else None,
                proximal_strength=spec.proximal_strength,
                row_updates=row_updates,
            )
            update = [g - w for g, w in zip(global_public, trained.model.public)]
        if spec.upload_noise_stddev > 0:
            noise = upload_noise(data.seed, round_num) if noise is None else noise
            update = [u + n for u, n in zip(update, noise)]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(u)) for u in update])
        update = [tf.where(finite, u, tf.zeros_like(u)) for u in update]
        weight = report.num_train_examples if spec.public_aggregation == 'mean' else tf.constant(1.0)
        return (
            trained,
            report,
            tff.learning.templates.ClientResult(update=update, update_weight=tf.where(finite, weight, 0.0)),
        )

    own = spec.start == 'own'
    if own:
        client_train = tff.tensorflow.computation(types.data, types.state)(train_own)
    else:
        client_train = tff.tensorflow.computation(types.data, types.state, types.weights, ROUND_TYPE)(
            lambda data, state, global_weights, round_num: train_from_global(data, state, global_weights, round_num)
        )
    client_centres = (
        server.client_centres_computation(
            types.state,
            config,
            local_cluster_divisor=local_cluster_divisor,
            max_local_clusters=max_local_clusters,
            kmeans_iterations=kmeans_iterations,
        )
        if own
        else None
    )
    train: Callable[..., Any] = train_from_global
    if own:
        train = train_own
    return ClientWork(
        train=train,
        upload_noise=upload_noise if spec.upload_noise_stddev > 0 else None,
        client_train=client_train,
        client_centres=client_centres,
        report_type=client_train.type_signature.result[1],
        uploads_type=client_centres.type_signature.result if own else client_train.type_signature.result[2],
    )


class ServerSteps(NamedTuple):
    """The server's side of a round; each is None when the `RoundSpec` has no such step."""

    distributor: Any  # TFF's broadcast process (start 'global').
    aggregator: Any  # The update aggregation's process ('mean', 'attention').
    finalizer: Any  # TFF's apply-optimizer finalizer (update aggregations).
    server_optimizer: Any  # The finalizer's optimizer.
    public_aggregation: server.PublicAggregation | None
    clustering: server.CentreClustering | None


def server_steps(
    config: gum.GumConfig,
    spec: RoundSpec,
    types: Types,
    work: ClientWork,
    *,
    server_optimizer: tff.learning.optimizers.Optimizer | None,
    model_aggregator: tff.aggregators.WeightedAggregationFactory | None,
    public_sum_factory: tff.aggregators.UnweightedAggregationFactory | None,
    max_clients: int,
    max_local_clusters: int,
    max_global_clusters: int,
    global_cluster_divisor: int,
    kmeans_iterations: int,
) -> ServerSteps:
    """The broadcast, aggregations and server step the `RoundSpec` names (TFF's parts or HPFL's `server`)."""
    distributor = aggregator = finalizer = finalizer_optimizer = None
    public_aggregation = clustering = None
    if spec.updates_public:
        distributor = tff.learning.templates.build_broadcast_process(types.weights)
        factory = (
            aggregation.AttentionMeanFactory()
            if spec.public_aggregation == 'attention'
            else model_aggregator or tff.aggregators.MeanFactory()
        )
        aggregator = factory.create(work.uploads_type.update, work.uploads_type.update_weight)
        finalizer_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
            learning_rate=spec.server_learning_rate
        )
        finalizer = tff.learning.templates.build_apply_optimizer_finalizer(finalizer_optimizer, types.weights)
    if spec.public_aggregation == 'accuracy_weighted':
        public_aggregation = server.PublicAggregation(
            types.public,
            work.report_type.attribute_accuracy,
            work.report_type.attribute_iterations,
            accuracy_threshold=spec.accuracy_threshold,
            sum_factory=public_sum_factory,
        )
    if spec.private_aggregation == 'clustered':
        assert work.client_centres is not None  # RoundSpec: clustering needs start='own'.
        clustering = server.CentreClustering(
            work.client_centres.type_signature.result,
            types.centres,
            dim=config.num_attributes,
            max_clients=max_clients,
            max_local_clusters=max_local_clusters,
            max_global_clusters=max_global_clusters,
            global_cluster_divisor=global_cluster_divisor,
            kmeans_iterations=kmeans_iterations,
        )
    return ServerSteps(distributor, aggregator, finalizer, finalizer_optimizer, public_aggregation, clustering)


def post_aggregation(
    spec: RoundSpec, types: Types, report_type: Any
) -> tuple[Callable[..., Any], compose.PostAggregation]:
    """The client step after aggregation: ``(update_client, the composer's stage running it)``.

    The server broadcasts `GlobalComponents` (c^g and Theta^g); `update_client` (also what the engine compiles)
    takes them into the client's state as the `RoundSpec` says (see `fedpersonal.algorithms.hpfl.process`).
    """

    @tff.tensorflow.computation(types.weights, types.centres)
    def components(weights, centres):
        return GlobalComponents(gum.PublicWeights(*weights.trainable), *centres)

    def update_client(global_components, state, report):
        public, private = state.model.public, state.model.private
        if spec.public_aggregation == 'accuracy_weighted':
            public = aggregation.personalize_public(public, global_components.public, report.attribute_accuracy)
        elif spec.updates_public:
            public = gum.PublicWeights(*global_components.public)
        if spec.private_aggregation == 'clustered':
            users = tf.range(tf.shape(private.theta)[0]) < state.num_users
            items = tf.range(tf.shape(private.difficulty)[0]) < state.num_items
            private = private._replace(
                theta=aggregation.personalize_embeddings(
                    private.theta,
                    users,
                    global_components.user_centres,
                    global_components.user_mask,
                    report.accuracy,
                    spec.center_weighting,
                ),
                difficulty=aggregation.personalize_embeddings(
                    private.difficulty,
                    items,
                    global_components.item_centres,
                    global_components.item_mask,
                    report.accuracy,
                    spec.center_weighting,
                ),
            )
        return state._replace(model=gum.GumWeights(public=public, private=private))

    client_update = tff.tensorflow.computation(components.type_signature.result, types.state, report_type)(
        update_client
    )
    return update_client, compose.PostAggregation(server_value=components, client_update=client_update)


def initialize_computation(initial: Initial, steps: ServerSteps) -> tff.Computation:
    """``initialize``: the `HpflState` (``()`` for the steps the `RoundSpec` has not)."""

    def unit():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(
            HpflState(
                global_model_weights=tff.federated_eval(initial.weights, tff.SERVER),
                centres=tff.federated_eval(initial.centres, tff.SERVER),
                distributor=steps.distributor.initialize() if steps.distributor else unit(),
                aggregator=(
                    steps.aggregator.initialize()
                    if steps.aggregator
                    else steps.public_aggregation.sum_process.initialize()
                    if steps.public_aggregation
                    else unit()
                ),
                finalizer=steps.finalizer.initialize() if steps.finalizer else unit(),
                round_num=tff.federated_value(np.int32(0), tff.SERVER),
            )
        )

    return initialize


def after_client_work(
    spec: RoundSpec, types: Types, work: ClientWork, steps: ServerSteps, stage: compose.PostAggregation
) -> Callable[..., process_lib.ProcessOutput]:
    """Everything after the client work -- aggregations, server step, the `stage` when the method has one, the
    metrics -- as a function traced inside ``next`` and ``round_from_uploads``."""
    public_aggregation, clustering = steps.public_aggregation, steps.clustering

    @tff.tensorflow.computation(types.weights)
    def public_of(weights):
        return gum.PublicWeights(*weights.trainable)

    @tff.tensorflow.computation(types.public)
    def weights_of(public):
        return ModelWeights(trainable=list(public), non_trainable=[])

    @tff.tensorflow.computation(ROUND_TYPE)
    def increment(round_num):
        return round_num + 1

    @tff.tensorflow.computation(work.report_type)
    def client_metric_sums(report):
        return training.metric_sums(report)

    @tff.tensorflow.computation(client_metric_sums.type_signature.result)
    def finalize(sums):
        return training.finalize_metrics(sums)

    def after(state, trained, reports, uploads, distributor_state=None):
        global_weights, centres = state.global_model_weights, state.centres
        aggregator_state, finalizer_state = state.aggregator, state.finalizer
        measurements = collections.OrderedDict()
        if public_aggregation is not None:
            new_public, num_aggregated, aggregator_state = public_aggregation.aggregate(
                state.aggregator,
                tff.federated_map(public_of, global_weights),
                reports.public,
                reports.attribute_accuracy,
                reports.attribute_iterations,
            )
            measurements['attributes_aggregated'] = num_aggregated
            global_weights = tff.federated_map(weights_of, new_public)
        if steps.aggregator is not None:
            aggregated = steps.aggregator.next(state.aggregator, uploads.update, uploads.update_weight)
            finalized = steps.finalizer.next(state.finalizer, global_weights, aggregated.result)
            global_weights, aggregator_state, finalizer_state = finalized.result, aggregated.state, finalized.state
            measurements['aggregator'] = aggregated.measurements
            measurements['finalizer'] = finalized.measurements
        if clustering is not None:
            centres, measurements['clustering'] = clustering.cluster(state.centres, uploads)
        new_states = stage.apply((global_weights, centres), trained, reports) if spec.personalizes else trained
        train_metrics = tff.federated_map(finalize, tff.federated_sum(tff.federated_map(client_metric_sums, reports)))
        new_state = tff.federated_zip(
            HpflState(
                global_model_weights=global_weights,
                centres=centres,
                distributor=state.distributor if distributor_state is None else distributor_state,
                aggregator=aggregator_state,
                finalizer=finalizer_state,
                round_num=tff.federated_map(increment, state.round_num),
            )
        )
        metrics = tff.federated_zip(collections.OrderedDict(client_work=train_metrics, **measurements))
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=new_states)

    return after


class Round(NamedTuple):
    """The federated computations of a process (see `HpflProcess`)."""

    initialize: tff.Computation
    next: tff.Computation
    round_from_uploads: tff.Computation


def round_computations(
    spec: RoundSpec,
    types: Types,
    initial: Initial,
    work: ClientWork,
    steps: ServerSteps,
    stage: compose.PostAggregation,
) -> Round:
    """``next``: the client work, then `after_client_work` (with the `stage` when the method has one)."""
    after = after_client_work(spec, types, work, steps, stage)
    initialize = initialize_computation(initial, steps)
    server_state_type = initialize.type_signature.result

    @tff.federated_computation(
        server_state_type,
        tff.FederatedType(types.state, tff.CLIENTS),
        tff.FederatedType(work.report_type, tff.CLIENTS),
        tff.FederatedType(work.uploads_type, tff.CLIENTS),
    )
    def round_from_uploads(state, trained, reports, uploads):
        return after(state, trained, reports, uploads)

    @tff.federated_computation(
        server_state_type, tff.FederatedType(types.data, tff.CLIENTS), tff.FederatedType(types.state, tff.CLIENTS)
    )
    def next_fn(state, client_data, client_states):
        if spec.start == 'own':
            trained, reports = tff.federated_map(work.client_train, (client_data, client_states))
            uploads = tff.federated_map(work.client_centres, trained) if steps.clustering is not None else None
            return after(state, trained, reports, uploads)
        distributed = steps.distributor.next(state.distributor, state.global_model_weights)
        trained, reports, uploads = tff.federated_map(
            work.client_train,
            (client_data, client_states, distributed.result, tff.federated_broadcast(state.round_num)),
        )
        return after(state, trained, reports, uploads, distributed.state)

    return Round(initialize, next_fn, round_from_uploads)


def engine_parts(
    config: gum.GumConfig,
    spec: RoundSpec,
    work: ClientWork,
    steps: ServerSteps,
    update_client: Callable[..., Any],
    *,
    client_epochs: int,
    local_cluster_divisor: int,
    max_local_clusters: int,
    kmeans_iterations: int,
) -> tuple[engine.SiloPacker, engine.HpflRoundRunner]:
    """The engine's packer and round runner, from the same TF functions as the TFF computations."""

    def centres(state):
        return server.client_centres(
            state,
            config,
            local_cluster_divisor=local_cluster_divisor,
            max_local_clusters=max_local_clusters,
            kmeans_iterations=kmeans_iterations,
        )

    packer = engine.SiloPacker(epochs=1 if spec.local_update == 'gradient' else client_epochs)
    runner = engine.HpflRoundRunner(
        spec=spec,
        train=work.train,
        centres=centres if steps.clustering is not None else None,
        update_client=update_client,
        upload_noise=work.upload_noise,
        clustering=steps.clustering,
        server_optimizer=steps.server_optimizer,
        metric_sums=training.metric_sums,
        finalize_metrics=training.finalize_metrics,
    )
    return packer, runner
