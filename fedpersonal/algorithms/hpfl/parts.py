"""The client-side parts `process.build_process` composes an HPFL-family process from, each stated once.

Each factory turns the `RoundSpec` (the method as data) and the build arguments into the pure TF functions of one
phase of the round and the TFF computation wrapping them (see `fedpersonal.algorithms.hpfl.process` for the
round): `initial_values`, `distributor` (what clients receive before training: the global public components with
the round number, or nothing), `client_work` (training, uploads and report) and `post_aggregation` (the client
step after aggregation, the composer's `PostAggregation`). The server's part is `server_step`. Every backend runs
these same functions: the per-client backend through the TFF computations, the silo engine
(`fedpersonal.simulation.silo_engine`) through `fedpersonal.core.RoundFunctions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl import server
from fedpersonal.algorithms.hpfl import training
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import GlobalCentres
from fedpersonal.algorithms.hpfl.types import GlobalComponents
from fedpersonal.algorithms.hpfl.types import ModelWeights
from fedpersonal.core import compose
from fedpersonal.models import gum

ROUND_TYPE = tff.TensorType(np.int32)


class Initial(NamedTuple):
    """No-arg TF computations of the server's first global public components and global centres, and of the
    private state of an empty silo (0 users and items: the structure of every client's state)."""

    weights: tff.Computation
    centres: tff.Computation
    private: tff.Computation


def initial_values(config: gum.GumConfig, *, public_seed: int, max_global_clusters: int) -> Initial:
    """The initial global public components (seeded by `public_seed`), empty global centres, an empty silo."""

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

    private = tff.tensorflow.computation(lambda: data_lib.initial_client_state(config, 0, 0, public_seed=public_seed))
    return Initial(initial_weights, initial_centres, private)


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
    state_type = initial.private.type_signature.result
    return Types(
        data=data_lib.client_data_type(config),
        state=state_type,
        public=state_type.model.public,
        weights=initial.weights.type_signature.result,
        centres=initial.centres.type_signature.result,
    )


class Distributor(NamedTuple):
    """What clients receive before training; the state is the number of rounds run (int32).

    Attributes:
      process: The `tff.learning.templates.DistributionProcess`: start ``'global'`` broadcasts ``(global
        weights, round number)``, start ``'own'`` sends nothing (``()`` at the clients, no broadcast).
      distribute: The same as TF: ``(round number, global weights) -> (received, next round number)``.
    """

    process: tff.learning.templates.DistributionProcess
    distribute: Callable[[Any, Any], tuple[Any, Any]]


def distributor(spec: RoundSpec, types: Types) -> Distributor:
    """The family's distributor (see `Distributor`)."""
    broadcast = spec.start == 'global'

    def distribute(round_num, weights):
        return ((weights, round_num) if broadcast else ()), round_num + 1

    @tff.federated_computation
    def initialize():
        return tff.federated_value(np.int32(0), tff.SERVER)

    @tff.tensorflow.computation(ROUND_TYPE)
    def increment(round_num):
        return round_num + 1

    @tff.federated_computation(tff.FederatedType(ROUND_TYPE, tff.SERVER), tff.FederatedType(types.weights, tff.SERVER))
    def next_fn(round_num, weights):
        if broadcast:
            sent = tff.federated_broadcast(tff.federated_zip((weights, round_num)))
        else:
            sent = tff.federated_value((), tff.CLIENTS)
        return tff.templates.MeasuredProcessOutput(
            state=tff.federated_map(increment, round_num), result=sent, measurements=tff.federated_value((), tff.SERVER)
        )

    return Distributor(tff.learning.templates.DistributionProcess(initialize, next_fn), distribute)


class ClientWork(NamedTuple):
    """The client work of a round, stated once.

    Attributes:
      update: ``(received, ClientData, ClientState, noise=None) -> (uploads, ClientReport, trained ClientState)``,
        the TF function every backend runs; the uploads are the `Centres` (clustered private aggregation), the
        `ClientResult` (update aggregations) or ``()``.
      noise: Fednoise's ``(received, ClientData) -> noise`` of the upload (None without upload noise): drawn
        inside `update` when not passed.
      computation: `update` as a TF computation ``(received, ClientData, ClientState) -> (uploads, report,
        state)``, the client work of `next`.
      centres: TF computation ``ClientState -> Centres`` (clustered private aggregation), else None.
      report_type: TFF type of a `ClientReport`.
      uploads_type: TFF type of the uploads.
    """

    update: Callable[..., Any]
    noise: Callable[..., Any] | None
    computation: tff.Computation
    centres: tff.Computation | None
    report_type: Any
    uploads_type: Any


def client_work(
    config: gum.GumConfig,
    spec: RoundSpec,
    types: Types,
    received_type: Any,
    *,
    optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int,
    row_updates: str,
    public_seed: int,
    local_cluster_divisor: int,
    max_local_clusters: int,
    kmeans_iterations: int,
) -> ClientWork:
    """Training from the client's own model (start ``'own'``) or from the received one, with its uploads."""
    public_shapes = [v.shape for v in gum.initial_public(config, public_seed)]
    clustered = spec.private_aggregation == 'clustered'

    def upload_noise(seed, round_num):
        """Fednoise's noise of one silo's upload: seeded by the silo and the round."""
        seed = tf.cast(seed, tf.int64)
        return [
            spec.upload_noise_stddev
            * tf.random.stateless_normal(shape, seed=tf.stack([seed, tf.cast(round_num, tf.int64) * 8 + i]))
            for i, shape in enumerate(public_shapes)
        ]

    def centres(state):
        return server.client_centres(
            state,
            config,
            local_cluster_divisor=local_cluster_divisor,
            max_local_clusters=max_local_clusters,
            kmeans_iterations=kmeans_iterations,
        )

    def train_own(data, state):
        trained, report = training.client_round(
            data, state, optimizer, config, epochs=client_epochs, row_updates=row_updates
        )
        return (centres(trained) if clustered else ()), report, trained

    def train_from_global(data, state, global_weights, round_num, noise):
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
        result = tff.learning.templates.ClientResult(update=update, update_weight=tf.where(finite, weight, 0.0))
        return result, report, trained

    def update(received, data, state, noise=None):
        if spec.start == 'own':
            return train_own(data, state)
        global_weights, round_num = received
        return train_from_global(data, state, global_weights, round_num, noise)

    computation = tff.tensorflow.computation(received_type, types.data, types.state)(
        lambda received, data, state: update(received, data, state)
    )
    return ClientWork(
        update=update,
        noise=(lambda received, data: upload_noise(data.seed, received[1])) if spec.upload_noise_stddev > 0 else None,
        computation=computation,
        centres=tff.tensorflow.computation(types.state)(centres) if clustered else None,
        report_type=computation.type_signature.result[1],
        uploads_type=computation.type_signature.result[0],
    )


def post_aggregation(
    spec: RoundSpec, types: Types, report_type: Any, server_state_type: Any
) -> tuple[tuple[Callable[..., Any], Callable[..., Any]], compose.PostAggregation]:
    """The client step after aggregation: ``((server_value, update_client), the composer's stage wrapping them)``.

    The server broadcasts `GlobalComponents` (c^g and Theta^g, `server_value` of the new global weights and
    server state); `update_client` takes them into the client's state as the `RoundSpec` says (see
    `fedpersonal.algorithms.hpfl.process`).
    """

    def server_value(weights, server_state):
        return GlobalComponents(gum.PublicWeights(*weights.trainable), *server_state.centres)

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

    components = tff.tensorflow.computation(types.weights, server_state_type)(server_value)
    client_update = tff.tensorflow.computation(components.type_signature.result, types.state, report_type)(
        update_client
    )
    stage = compose.PostAggregation(server_value=components, client_update=client_update)
    return (server_value, update_client), stage
