"""The server step of an HPFL-family round (`RoundSpec`): aggregations and server update from the clients' uploads.

One factory, `server_step`, gives the step twice, from the same building blocks (`server`, `aggregation`, TFF's
aggregators and apply-optimizer finalizer):

* ``step``, the composer's `ServerStep` (TFF federated computations; `process.next`): HPFL's accuracy-weighted
  public aggregation (`server.PublicAggregation`, a `tff.aggregators` sum), the update aggregations (a weighted
  `tff.aggregators` factory, FedAtt's `aggregation.AttentionMeanFactory`, then TFF's finalizer) and the clustered
  private aggregation (`server.CentreClustering`);
* ``stacked``, the same on the clients' uploads stacked along a first axis (one TF function, what the silo engine
  runs): the sums TFF's default `SumFactory` / `MeanFactory` compute, `server.divide_public`,
  `aggregation.divide_attention`, TFF's finalizer step (`compose.apply_update`) and
  `server.CentreClustering.cluster_collection` on the centres collected in client order.

Its state is a `ServerState` (the process state's ``aggregator``); its measurements are the round's
``attributes_aggregated``, ``aggregator``, ``finalizer`` and ``clustering`` metrics, where the method has them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import server
from fedpersonal.algorithms.hpfl.parts import ClientWork
from fedpersonal.algorithms.hpfl.parts import Initial
from fedpersonal.algorithms.hpfl.parts import Types
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import ModelWeights
from fedpersonal.algorithms.hpfl.types import ServerState
from fedpersonal.core import compose
from fedpersonal.models import gum


class ServerParts(NamedTuple):
    """The server step (see the module docstring) and the building blocks tests and analyses use.

    Attributes:
      step: The composer's `ServerStep`.
      stacked: ``(ServerState, global weights, stacked uploads, stacked reports) -> (global weights, ServerState,
        measurements)``, as TF.
      public_aggregation: The `server.PublicAggregation` (accuracy-weighted aggregation), else None.
      clustering: The `server.CentreClustering` (clustered private aggregation), else None.
      aggregators: The `tff.aggregators` factories the user chose, by argument name (None: the default).
    """

    step: compose.ServerStep
    stacked: Callable[..., Any]
    public_aggregation: server.PublicAggregation | None
    clustering: server.CentreClustering | None
    aggregators: dict[str, Any]


def server_step(
    config: gum.GumConfig,
    spec: RoundSpec,
    types: Types,
    initial: Initial,
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
) -> ServerParts:
    """The broadcast-free server step the `RoundSpec` names (TFF's parts and HPFL's `server`)."""
    aggregator = finalizer = optimizer = public_aggregation = clustering = None
    if spec.updates_public:
        factory = (
            aggregation.AttentionMeanFactory()
            if spec.public_aggregation == 'attention'
            else model_aggregator or tff.aggregators.MeanFactory()
        )
        uploads = work.uploads_type
        aggregator = factory.create(uploads.update, uploads.update_weight)
        optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(learning_rate=spec.server_learning_rate)
        finalizer = tff.learning.templates.build_apply_optimizer_finalizer(optimizer, types.weights)
    if spec.public_aggregation == 'accuracy_weighted':
        public_aggregation = server.PublicAggregation(
            types.public,
            work.report_type.attribute_accuracy,
            work.report_type.attribute_iterations,
            accuracy_threshold=spec.accuracy_threshold,
            sum_factory=public_sum_factory,
        )
    if spec.private_aggregation == 'clustered':
        assert work.centres is not None  # RoundSpec: clustering needs start='own'.
        clustering = server.CentreClustering(
            work.centres.type_signature.result,
            types.centres,
            dim=config.num_attributes,
            max_clients=max_clients,
            max_local_clusters=max_local_clusters,
            max_global_clusters=max_global_clusters,
            global_cluster_divisor=global_cluster_divisor,
            kmeans_iterations=kmeans_iterations,
        )

    def unit():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(
            ServerState(
                centres=tff.federated_eval(initial.centres, tff.SERVER),
                aggregation=(
                    aggregator.initialize()
                    if aggregator
                    else public_aggregation.sum_process.initialize()
                    if public_aggregation
                    else unit()
                ),
                finalizer=finalizer.initialize() if finalizer else unit(),
            )
        )

    @tff.tensorflow.computation(types.weights)
    def public_of(weights):
        return gum.PublicWeights(*weights.trainable)

    @tff.tensorflow.computation(types.public)
    def weights_of(public):
        return ModelWeights(trainable=list(public), non_trainable=[])

    def next_fn(state, weights, uploads, reports):
        aggregation_state, finalizer_state, centres = state.aggregation, state.finalizer, state.centres
        measurements = collections.OrderedDict()
        if public_aggregation is not None:
            new_public, num_aggregated, aggregation_state = public_aggregation.aggregate(
                state.aggregation,
                tff.federated_map(public_of, weights),
                reports.public,
                reports.attribute_accuracy,
                reports.attribute_iterations,
            )
            measurements['attributes_aggregated'] = num_aggregated
            weights = tff.federated_map(weights_of, new_public)
        if aggregator is not None:
            assert finalizer is not None  # Both or neither (update aggregations).
            aggregated = aggregator.next(state.aggregation, uploads.update, uploads.update_weight)
            finalized = finalizer.next(state.finalizer, weights, aggregated.result)
            weights, aggregation_state, finalizer_state = finalized.result, aggregated.state, finalized.state
            measurements['aggregator'] = aggregated.measurements
            measurements['finalizer'] = finalized.measurements
        if clustering is not None:
            centres, measurements['clustering'] = clustering.cluster(state.centres, uploads)
        return weights, tff.federated_zip(ServerState(centres, aggregation_state, finalizer_state)), measurements

    def stacked(state, weights, uploads, reports):
        measurements = collections.OrderedDict()
        trainable, centres, optimizer_state = list(weights.trainable), state.centres, state.finalizer
        if public_aggregation is not None:
            upload = tf.vectorized_map(
                lambda r: server.weighted_public_upload(r[0], r[1], r[2], spec.accuracy_threshold),
                (reports.public, reports.attribute_accuracy, reports.attribute_iterations),
            )
            new_public, measurements['attributes_aggregated'] = server.divide_public(
                trainable, tf.nest.map_structure(lambda t: tf.reduce_sum(t, 0), upload)
            )
            trainable = list(new_public)
        if spec.updates_public:
            if spec.public_aggregation == 'attention':
                scored = tf.vectorized_map(lambda u: aggregation.attention_upload(u[0], u[1]), tuple(uploads))
                mean = aggregation.divide_attention(tf.nest.map_structure(lambda t: tf.reduce_sum(t, 0), scored))
                measurements['aggregator'] = ()
            else:
                weight = uploads.update_weight
                total = tf.reduce_sum(weight)
                mean = [tf.math.divide(tf.tensordot(weight, u, 1), total) for u in uploads.update]
                measurements['aggregator'] = collections.OrderedDict(mean_value=(), mean_weight=())
            optimizer_state, trainable, measurements['finalizer'] = compose.apply_update(
                optimizer, optimizer_state, trainable, mean
            )
        if clustering is not None:
            centres, measurements['clustering'] = clustering.cluster_collection(
                centres, _collection(uploads, clustering)
            )
        new_state = state._replace(centres=centres, finalizer=optimizer_state)
        return ModelWeights(trainable=trainable, non_trainable=[]), new_state, measurements

    aggregators = dict(model_aggregator=model_aggregator, public_sum_factory=public_sum_factory)
    return ServerParts(compose.ServerStep(initialize, next_fn), stacked, public_aggregation, clustering, aggregators)


def _collection(uploads: Any, clustering: server.CentreClustering) -> tuple:
    """The centre collection TFF's `federated_aggregate` builds: client i's centres in slots i (first
    `max_clients`)."""
    count = tf.shape(uploads.user_mask)[0]
    capacity = clustering.max_clients

    def slots(values):
        kept = values[:capacity]
        padding = [[0, capacity - tf.shape(kept)[0]]] + [[0, 0]] * (values.shape.rank - 1)
        padded = tf.pad(kept, padding)
        return tf.reshape(padded, tf.concat([[capacity * clustering.max_local_clusters], tf.shape(padded)[2:]], 0))

    return (
        slots(uploads.user_centres),
        slots(uploads.user_mask),
        slots(uploads.item_centres),
        slots(uploads.item_mask),
        tf.minimum(count, capacity),
        tf.maximum(count - capacity, 0),
    )
