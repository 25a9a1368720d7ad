"""HPFL's server-side steps after the clients' upload phase, as TFF building blocks.

* `PublicAggregation`: the accuracy-weighted aggregation of the public components. Each client uploads
  ``a_ki c_ki`` and ``a_ki`` (`aggregation.public_aggregation_weights`); a `tff.aggregators` sum (default
  `SumFactory`, replaceable e.g. by a noised or secure sum) adds them up and the server divides; an attribute that
  no client passes keeps its previous global c_k.
* `CentreClustering`: the clustered aggregation of the private components. Clients upload only their padded
  cluster centres (never table rows) through one `federated_aggregate` that concatenates them (at most
  ``max_clients`` uploads: more are dropped and counted in the measurements), and the server clusters all user
  centres (and, separately, all item centres) into ``min(total // global_cluster_divisor + 1,
  max_global_clusters)`` global centres with the same deterministic k-means as the clients (`clustering.kmeans`).
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import clustering
from fedpersonal.algorithms.hpfl.types import Centres
from fedpersonal.algorithms.hpfl.types import GlobalCentres
from fedpersonal.models import gum


def weighted_public_upload(public, attribute_accuracy, attribute_iterations, accuracy_threshold: float):
    """A client's upload of the accuracy-weighted public aggregation: ``(a_k c_k for each matrix, a_k)``."""
    weight = aggregation.public_aggregation_weights(attribute_accuracy, attribute_iterations, accuracy_threshold)
    return gum.PublicWeights(*[weight[:, None] * c for c in public]), weight


def divide_public(previous, summed):
    """The server's division of the summed uploads: ``(new c^g, number of attributes aggregated)``; an attribute
    nobody passed keeps its `previous` global value."""
    weighted, weight = summed
    has = (weight > 0)[:, None]
    new = gum.PublicWeights(
        *[tf.where(has, tf.math.divide_no_nan(s, weight[:, None]), p) for s, p in zip(weighted, previous)]
    )
    return new, tf.reduce_sum(tf.cast(weight > 0, tf.int32))


class PublicAggregation:
    """HPFL's accuracy-weighted public aggregation.

    Attributes:
      sum_process: The `tff.templates.AggregationProcess` summing the weighted uploads (its state is the server
        state's ``aggregator``).
      computation: Federated computation ``(PublicWeights@S, {PublicWeights}@C, {[K]}@C, {[K]}@C) ->
        PublicWeights@S`` (previous global, client c_i, Acc_i, I_i; from the sum's initial state): the formula
        alone, the same code `aggregate` runs.
    """

    def __init__(
        self,
        public_type: tff.Type,
        accuracy_type: tff.Type,
        iterations_type: tff.Type,
        *,
        accuracy_threshold: float,
        sum_factory: tff.aggregators.UnweightedAggregationFactory | None = None,
    ):

        @tff.tensorflow.computation(public_type, accuracy_type, iterations_type)
        def weighted_upload(public, attribute_accuracy, attribute_iterations):
            return weighted_public_upload(public, attribute_accuracy, attribute_iterations, accuracy_threshold)

        self.sum_process = (sum_factory or tff.aggregators.SumFactory()).create(weighted_upload.type_signature.result)

        @tff.tensorflow.computation(public_type, weighted_upload.type_signature.result)
        def divide(previous, summed):
            return divide_public(previous, summed)

        self._weighted_upload = weighted_upload
        self._divide = divide

        @tff.federated_computation(
            tff.FederatedType(public_type, tff.SERVER),
            tff.FederatedType(public_type, tff.CLIENTS),
            tff.FederatedType(accuracy_type, tff.CLIENTS),
            tff.FederatedType(iterations_type, tff.CLIENTS),
        )
        def computation(previous, public, attribute_accuracy, attribute_iterations):
            new_public, _, _ = self.aggregate(
                self.sum_process.initialize(), previous, public, attribute_accuracy, attribute_iterations
            )
            return new_public

        self.computation = computation

    def aggregate(self, sum_state, previous, public, attribute_accuracy, attribute_iterations):
        """Traced inside a federated computation: ``(new global public@S, attributes aggregated@S, sum state@S)``."""
        uploads = tff.federated_map(self._weighted_upload, (public, attribute_accuracy, attribute_iterations))
        summed = self.sum_process.next(sum_state, uploads)
        new_public, num_aggregated = tff.federated_map(self._divide, (previous, summed.result))
        return new_public, num_aggregated, summed.state


class CentreClustering:
    """HPFL's clustered aggregation of the private components (see the module docstring)."""

    def __init__(
        self,
        centres_type: tff.Type,
        global_centres_type: tff.Type,
        *,
        dim: int,
        max_clients: int,
        max_local_clusters: int,
        max_global_clusters: int,
        global_cluster_divisor: int,
        kmeans_iterations: int,
    ):
        capacity = max_clients * max_local_clusters
        self.max_clients = max_clients
        self.max_local_clusters = max_local_clusters
        self._global_cluster_divisor = global_cluster_divisor
        self._max_global_clusters = max_global_clusters
        self._kmeans_iterations = kmeans_iterations

        @tff.tensorflow.computation
        def empty_collection():
            return (
                tf.zeros([capacity, dim]),
                tf.zeros([capacity]),
                tf.zeros([capacity, dim]),
                tf.zeros([capacity]),
                tf.constant(0),
                tf.constant(0),
            )

        collection_type = empty_collection.type_signature.result

        def slots(buffer):
            return tf.reshape(buffer, tf.concat([[max_clients, max_local_clusters], tf.shape(buffer)[1:]], 0))

        @tff.tensorflow.computation(collection_type, centres_type)
        def accumulate(collection, centres):
            *buffers, count, dropped = collection
            fits = count < max_clients
            slot = tf.minimum(count, max_clients - 1)
            values = (centres.user_centres, centres.user_mask, centres.item_centres, centres.item_mask)
            buffers = [
                tf.where(fits, tf.reshape(tf.tensor_scatter_nd_update(slots(b), [[slot]], v[None]), tf.shape(b)), b)
                for b, v in zip(buffers, values)
            ]
            return (*buffers, count + tf.cast(fits, tf.int32), dropped + 1 - tf.cast(fits, tf.int32))

        @tff.tensorflow.computation(collection_type, collection_type)
        def merge(a, b):
            *a_buffers, a_count, a_dropped = a
            *b_buffers, b_count, b_dropped = b
            source = tf.range(max_clients)
            target = a_count + source
            keep = tf.logical_and(source < b_count, target < max_clients)
            indices = tf.boolean_mask(target, keep)[:, None]
            buffers = [
                tf.reshape(tf.tensor_scatter_nd_update(slots(x), indices, tf.boolean_mask(slots(y), keep)), tf.shape(x))
                for x, y in zip(a_buffers, b_buffers)
            ]
            total = a_count + b_count
            return (
                *buffers,
                tf.minimum(total, max_clients),
                a_dropped + b_dropped + tf.maximum(total - max_clients, 0),
            )

        @tff.tensorflow.computation(collection_type)
        def report(collection):
            return collection

        @tff.tensorflow.computation(global_centres_type, collection_type)
        def server_cluster(previous, collection):
            return self.cluster_collection(previous, collection)

        self._parts = (empty_collection, accumulate, merge, report, server_cluster)

    def cluster_collection(self, previous: Any, collection: Any):
        """The server's k-means of the collected centres (TF): ``(new GlobalCentres, measurements)``.

        ``collection`` is ``(user_points, user_valid, item_points, item_valid, count, dropped)``: the uploaded
        centres in upload order, each client's `max_local_clusters` slots after the previous client's.
        """
        user_points, user_valid, item_points, item_valid, count, dropped = collection
        del count

        def cluster(points, valid, old_centres, old_mask):
            num = tf.reduce_sum(tf.cast(valid > 0, tf.int32))
            wanted = clustering.cluster_count(num, self._global_cluster_divisor, self._max_global_clusters)
            centres, mask, _ = clustering.kmeans(
                points, valid > 0, wanted, self._max_global_clusters, self._kmeans_iterations
            )
            return tf.where(num > 0, centres, old_centres), tf.where(num > 0, mask, old_mask), num

        user_centres, user_mask, num_user = cluster(user_points, user_valid, previous.user_centres, previous.user_mask)
        item_centres, item_mask, num_item = cluster(item_points, item_valid, previous.item_centres, previous.item_mask)
        measurements = collections.OrderedDict(
            uploaded_user_centres=num_user,
            uploaded_item_centres=num_item,
            global_user_clusters=tf.reduce_sum(tf.cast(user_mask, tf.int32)),
            global_item_clusters=tf.reduce_sum(tf.cast(item_mask, tf.int32)),
            dropped_centre_uploads=dropped,
        )
        return GlobalCentres(user_centres, user_mask, item_centres, item_mask), measurements

    def cluster(self, previous: Any, centres: Any):
        """Traced inside a federated computation: ``(new GlobalCentres@S, measurements@S)`` from the clients'
        `Centres`@C."""
        empty_collection, accumulate, merge, report, server_cluster = self._parts
        collection = tff.federated_aggregate(centres, empty_collection(), accumulate, merge, report)
        return tff.federated_map(server_cluster, (previous, collection))


def client_centres(
    state: Any, config: gum.GumConfig, *, local_cluster_divisor: int, max_local_clusters: int, kmeans_iterations: int
) -> Centres:
    """A client's `Centres` (TF): k-means of the real user rows of theta and item rows of b, with
    ``min(n // local_cluster_divisor + 1, max_local_clusters)`` clusters each (padded to `max_local_clusters`)."""
    private = state.model.private
    users = tf.range(tf.shape(private.theta)[0]) < state.num_users
    items = tf.range(tf.shape(private.difficulty)[0]) < state.num_items
    user_centres, user_mask, _ = clustering.kmeans(
        private.theta,
        users,
        clustering.cluster_count(state.num_users, local_cluster_divisor, max_local_clusters),
        max_local_clusters,
        kmeans_iterations,
    )
    item_centres, item_mask, _ = clustering.kmeans(
        private.difficulty,
        items,
        clustering.cluster_count(state.num_items, local_cluster_divisor, max_local_clusters),
        max_local_clusters,
        kmeans_iterations,
    )
    return Centres(user_centres, user_mask, item_centres, item_mask)


def client_centres_computation(
    state_type: tff.Type,
    config: gum.GumConfig,
    *,
    local_cluster_divisor: int,
    max_local_clusters: int,
    kmeans_iterations: int,
) -> tff.Computation:
    """`client_centres` as a TF computation ``ClientState -> Centres``."""
    return tff.tensorflow.computation(state_type)(
        lambda state: client_centres(
            state,
            config,
            local_cluster_divisor=local_cluster_divisor,
            max_local_clusters=max_local_clusters,
            kmeans_iterations=kmeans_iterations,
        )
    )
