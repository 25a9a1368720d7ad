"""One builder for HPFL, its ablations and its federated baselines: `build_process(config, RoundSpec(...))`.

Every process of the family is a `fedpersonal.core.PersonalizedProcess` on the GUM whose private state is each
silo's `ClientState` (its personalized GUM, CLIENTS-placed input and output of ``next``). A round is the package's
one round -- broadcast, client work, aggregation, server step -- followed, where the method has one, by a client
step after aggregation. What each phase does is data, a `RoundSpec`:

1. **Start** (``start``): ``'own'`` -- the client trains its own (personalized) model, nothing is broadcast before
   local training (HPFL, Distributed); ``'global'`` -- TFF's broadcast process
   (`tff.learning.templates.build_broadcast_process`) sends the server's public components and the client
   replaces its own by them (the FedAvg family).
2. **Client work** (``local_update``): ``'epochs'`` -- ``client_epochs`` local epochs of the client optimizer on
   public and private components (`training.local_training`), with FedProx's proximal term
   ``proximal_strength / 2 ||public - global||^2`` when ``proximal_strength > 0``; ``'gradient'`` -- FedSGD's
   one pass of gradients (`training.gradient_round`). Then validation statistics (the report).
3. **Upload and aggregation** (``public_aggregation``):
   ``'accuracy_weighted'`` -- HPFL's public aggregation of the trained c_ki (`server.PublicAggregation`, a
   `tff.aggregators` sum, default `SumFactory`); ``'mean'`` -- clients upload the update ``global - trained``
   (plus Gaussian noise N(0, ``upload_noise_stddev``^2) seeded by the silo and the round when
   ``upload_noise_stddev > 0``: Fednoise) with their number of training examples as weight, aggregated by a
   weighted `tff.aggregators` factory (default `MeanFactory`); ``'attention'`` -- the same upload, aggregated by
   FedAtt's `aggregation.AttentionMeanFactory`; ``'none'``. A non-finite update is replaced by zeros with weight 0.
   ``private_aggregation='clustered'``: clients upload k-means centres of their tables and the server clusters
   them (`server.CentreClustering`).
4. **Server step**: update aggregations apply the aggregate with TFF's apply-optimizer finalizer
   (`tff.learning.templates.build_apply_optimizer_finalizer`; default SGD with ``server_learning_rate``);
   HPFL's public aggregation divides the weighted sums (an attribute nobody passes keeps its c_k^g).
5. **Client step after aggregation** (`client_update`, only when something was aggregated): the server broadcasts
   `GlobalComponents` (c^g and Theta^g); update aggregations make the client take the new global public
   components; HPFL's fine-grained update blends them, ``c_ki <- c_ki Acc_ki + c_k^g (1 - Acc_ki)``
   (`aggregation.personalize_public`), and the clustered private aggregation blends every real user (item) row
   towards the global centres, ``Emb_ji <- Emb_ji Acc_i + Emb^g (1 - Acc_i)``
   (`aggregation.personalize_embeddings`, weighting ``center_weighting``).

The methods are values of `spec.RoundSpec` (`fedpersonal.algorithms.hpfl.baselines.round_spec` names them).

    initialize: ( -> HpflState@SERVER)
    next: (<HpflState@SERVER, {ClientData}@CLIENTS, {ClientState}@CLIENTS> ->
           ProcessOutput<state@SERVER, metrics@SERVER, private_states={ClientState}@CLIENTS>)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl import engine
from fedpersonal.algorithms.hpfl import server
from fedpersonal.algorithms.hpfl import training
from fedpersonal.algorithms.hpfl.hpfl_process import HpflProcess
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import ROW_UPDATES
from fedpersonal.algorithms.hpfl.types import GlobalCentres
from fedpersonal.algorithms.hpfl.types import GlobalComponents
from fedpersonal.algorithms.hpfl.types import HpflState
from fedpersonal.algorithms.hpfl.types import ModelWeights
from fedpersonal.core import process as process_lib
from fedpersonal.models import gum
from fedpersonal.simulation import options as simulation_options


def build_process(
    config: gum.GumConfig,
    spec: RoundSpec | None = None,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer | None = None,
    client_epochs: int = 1,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
    public_sum_factory: tff.aggregators.UnweightedAggregationFactory | None = None,
    max_clients: int = 64,
    max_local_clusters: int = 32,
    local_cluster_divisor: int = 5,
    max_global_clusters: int = 64,
    global_cluster_divisor: int = 10,
    kmeans_iterations: int = 10,
    public_seed: int = 0,
    row_updates: str = 'dense',
    name: str = 'hpfl',
    simulation: str = 'engine',
) -> HpflProcess:
    """Builds the process a `RoundSpec` describes (see the module docstring).

    Args:
      config: The GUM config (`gum.GumConfig.for_data`).
      spec: The round (default `RoundSpec()`: Distributed).
      client_optimizer: Local optimizer (default Adam, learning rate 0.01); its state restarts every round.
      client_epochs: Local epochs per round (ignored by the ``'gradient'`` local update).
      server_optimizer: Server optimizer of update aggregations (default SGD, ``spec.server_learning_rate``).
      model_aggregator: Weighted `tff.aggregators` factory of the updates for ``'mean'`` (default `MeanFactory`).
      public_sum_factory: `tff.aggregators` factory summing the accuracy-weighted public uploads (default
        `tff.aggregators.SumFactory()`).
      max_clients: Capacity of the server's centre collection (the number of participating clients must not
        exceed it; extra uploads are dropped and counted in ``metrics['clustering']['dropped_centre_uploads']``).
      max_local_clusters: Static cap of a client's clusters (per table).
      local_cluster_divisor: A client with n users (items) uses ``min(n // divisor + 1, max_local_clusters)``.
      max_global_clusters: Static cap of the global clusters (per table).
      global_cluster_divisor: N = ``min(total // divisor + 1, max_global_clusters)`` for `total` uploaded centres.
      kmeans_iterations: Lloyd iterations of every k-means.
      public_seed: Seed of the initial public components (clients' initial states must use the same one:
        `HpflProcess.initial_client_state`).
      row_updates: ``'dense'`` or ``'lazy'`` local table updates (`training.local_training`).
      name: The method's name.
      simulation: ``'engine'`` (default): `run_round` runs the silos' work as XLA-compiled programs
        (`fedpersonal.algorithms.hpfl.engine`); ``'per_client'``: one TFF client computation per silo. Same
        results to float precision; `next` is the TFF computation either way.

    Returns:
      An `HpflProcess`.
    """
    simulation_options.check_simulation(simulation)
    if simulation == 'engine':
        engine.check_engine_options(
            row_updates=row_updates, public_sum_factory=public_sum_factory, model_aggregator=model_aggregator
        )
    spec = spec or RoundSpec()
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    for arg, value in (
        ('max_clients', max_clients),
        ('max_local_clusters', max_local_clusters),
        ('local_cluster_divisor', local_cluster_divisor),
        ('max_global_clusters', max_global_clusters),
        ('global_cluster_divisor', global_cluster_divisor),
    ):
        if value < 1:
            raise ValueError(f'{arg} must be >= 1, got {value}.')
    if kmeans_iterations < 0:
        raise ValueError(f'kmeans_iterations must be >= 0, got {kmeans_iterations}.')
    if row_updates not in ROW_UPDATES:
        raise ValueError(f'row_updates must be one of {ROW_UPDATES}, got {row_updates!r}.')
    if model_aggregator is not None and spec.public_aggregation != 'mean':
        raise ValueError("model_aggregator applies to public_aggregation='mean' only.")
    optimizer = client_optimizer or tff.learning.optimizers.build_adam(learning_rate=0.01)
    dim = config.num_attributes
    data_type = data_lib.client_data_type(config)
    state_type = data_lib.client_state_type(config)
    public_type = state_type.model.public
    round_type = tff.TensorType(np.int32)

    @tff.tensorflow.computation
    def initial_weights():
        return ModelWeights(trainable=list(gum.initial_public(config, public_seed)), non_trainable=[])

    @tff.tensorflow.computation
    def initial_centres():
        zeros = lambda *shape: tf.zeros(shape)
        return GlobalCentres(
            zeros(max_global_clusters, dim),
            zeros(max_global_clusters),
            zeros(max_global_clusters, dim),
            zeros(max_global_clusters),
        )

    weights_type = initial_weights.type_signature.result
    centres_state_type = initial_centres.type_signature.result

    # ---------------------------------------------------------------------------------------- client work
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

    if spec.start == 'own':
        client_train = tff.tensorflow.computation(data_type, state_type)(train_own)
    else:
        client_train = tff.tensorflow.computation(data_type, state_type, weights_type, round_type)(
            lambda data, state, global_weights, round_num: train_from_global(data, state, global_weights, round_num)
        )

    report_type = client_train.type_signature.result[1]
    client_centres = (
        server.client_centres_computation(
            state_type,
            config,
            local_cluster_divisor=local_cluster_divisor,
            max_local_clusters=max_local_clusters,
            kmeans_iterations=kmeans_iterations,
        )
        if spec.start == 'own'
        else None
    )
    uploads_type = (
        client_centres.type_signature.result if spec.start == 'own' else client_train.type_signature.result[2]
    )

    # ---------------------------------------------------------------------------------- aggregation, server
    distributor: Any = None
    finalizer_optimizer: Any = None
    aggregator: Any = None
    finalizer: Any = None
    public_aggregation: server.PublicAggregation | None = None
    clustering: server.CentreClustering | None = None
    if spec.updates_public:
        distributor = tff.learning.templates.build_broadcast_process(weights_type)
        factory = (
            aggregation.AttentionMeanFactory()
            if spec.public_aggregation == 'attention'
            else model_aggregator or tff.aggregators.MeanFactory()
        )
        aggregator = factory.create(uploads_type.update, uploads_type.update_weight)
        finalizer_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
            learning_rate=spec.server_learning_rate
        )
        finalizer = tff.learning.templates.build_apply_optimizer_finalizer(finalizer_optimizer, weights_type)
    if spec.public_aggregation == 'accuracy_weighted':
        public_aggregation = server.PublicAggregation(
            public_type,
            report_type.attribute_accuracy,
            report_type.attribute_iterations,
            accuracy_threshold=spec.accuracy_threshold,
            sum_factory=public_sum_factory,
        )
    if spec.private_aggregation == 'clustered':
        clustering = server.CentreClustering(
            client_centres.type_signature.result,
            centres_state_type,
            dim=dim,
            max_clients=max_clients,
            max_local_clusters=max_local_clusters,
            max_global_clusters=max_global_clusters,
            global_cluster_divisor=global_cluster_divisor,
            kmeans_iterations=kmeans_iterations,
        )

    @tff.tensorflow.computation(weights_type)
    def public_of(weights):
        return gum.PublicWeights(*weights.trainable)

    @tff.tensorflow.computation(public_type)
    def weights_of(public):
        return ModelWeights(trainable=list(public), non_trainable=[])

    @tff.tensorflow.computation(weights_type, centres_state_type)
    def components(weights, centres):
        return GlobalComponents(gum.PublicWeights(*weights.trainable), *centres)

    # ------------------------------------------------------------------------ client step after aggregation
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

    client_update = tff.tensorflow.computation(components.type_signature.result, state_type, report_type)(update_client)

    @tff.tensorflow.computation(round_type)
    def increment(round_num):
        return round_num + 1

    @tff.tensorflow.computation(report_type)
    def client_metric_sums(report):
        return training.metric_sums(report)

    @tff.tensorflow.computation(client_metric_sums.type_signature.result)
    def finalize(sums):
        return training.finalize_metrics(sums)

    def unit():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(
            HpflState(
                global_model_weights=tff.federated_eval(initial_weights, tff.SERVER),
                centres=tff.federated_eval(initial_centres, tff.SERVER),
                distributor=distributor.initialize() if distributor else unit(),
                aggregator=(
                    aggregator.initialize()
                    if aggregator
                    else public_aggregation.sum_process.initialize()
                    if public_aggregation
                    else unit()
                ),
                finalizer=finalizer.initialize() if finalizer else unit(),
                round_num=tff.federated_value(np.int32(0), tff.SERVER),
            )
        )

    server_state_type = initialize.type_signature.result

    def after_client_work(state, trained, reports, uploads, distributor_state=None):
        """Aggregation, server step and the client step after it (traced inside federated computations)."""
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
        if aggregator is not None:
            aggregated = aggregator.next(state.aggregator, uploads.update, uploads.update_weight)
            finalized = finalizer.next(state.finalizer, global_weights, aggregated.result)
            global_weights, aggregator_state, finalizer_state = finalized.result, aggregated.state, finalized.state
            measurements['aggregator'] = aggregated.measurements
            measurements['finalizer'] = finalized.measurements
        if clustering is not None:
            centres, measurements['clustering'] = clustering.cluster(state.centres, uploads)
        new_states = trained
        if spec.personalizes:
            broadcast = tff.federated_broadcast(tff.federated_map(components, (global_weights, centres)))
            new_states = tff.federated_map(client_update, (broadcast, trained, reports))
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

    @tff.federated_computation(
        server_state_type,
        tff.FederatedType(state_type, tff.CLIENTS),
        tff.FederatedType(report_type, tff.CLIENTS),
        tff.FederatedType(uploads_type, tff.CLIENTS),
    )
    def round_from_uploads(state, trained, reports, uploads):
        return after_client_work(state, trained, reports, uploads)

    @tff.federated_computation(
        server_state_type, tff.FederatedType(data_type, tff.CLIENTS), tff.FederatedType(state_type, tff.CLIENTS)
    )
    def next_fn(state, client_data, client_states):
        if spec.start == 'own':
            trained, reports = tff.federated_map(client_train, (client_data, client_states))
            uploads = tff.federated_map(client_centres, trained) if clustering is not None else None
            return after_client_work(state, trained, reports, uploads)
        distributed = distributor.next(state.distributor, state.global_model_weights)
        trained, reports, uploads = tff.federated_map(
            client_train, (client_data, client_states, distributed.result, tff.federated_broadcast(state.round_num))
        )
        return after_client_work(state, trained, reports, uploads, distributed.state)

    packer: engine.SiloPacker | None = None
    runner: engine.HpflRoundRunner | None = None
    if simulation == 'engine':
        train: Callable[..., Any] = train_from_global
        if spec.start == 'own':
            train = train_own
        packer = engine.SiloPacker(epochs=1 if spec.local_update == 'gradient' else client_epochs)
        runner = engine.HpflRoundRunner(
            spec=spec,
            train=train,
            centres=(
                (
                    lambda state: server.client_centres(
                        state,
                        config,
                        local_cluster_divisor=local_cluster_divisor,
                        max_local_clusters=max_local_clusters,
                        kmeans_iterations=kmeans_iterations,
                    )
                )
                if clustering is not None
                else None
            ),
            update_client=update_client,
            upload_noise=upload_noise if spec.upload_noise_stddev > 0 else None,
            clustering=clustering,
            server_optimizer=finalizer_optimizer,
            metric_sums=training.metric_sums,
            finalize_metrics=training.finalize_metrics,
        )
    parts = dict(
        client_data_type=data_type,
        client_state_type=state_type,
        client_train=client_train,
        round_from_uploads=round_from_uploads,
    )
    if clustering is not None:
        parts['client_centres'] = client_centres
    if spec.personalizes:
        parts['client_update'] = client_update
    if public_aggregation is not None:
        parts['public_aggregation'] = public_aggregation.computation
    return HpflProcess(
        initialize,
        next_fn,
        config=config,
        spec=spec,
        name=name,
        public_seed=public_seed,
        parts=parts,
        packer=packer,
        round_runner=runner,
    )


def build_hpfl(
    config: gum.GumConfig,
    *,
    accuracy_threshold: float = 0.5,
    center_weighting: str = 'distance',
    aggregate_public: bool = True,
    aggregate_private: bool = True,
    **kwargs,
) -> HpflProcess:
    """Builds HPFL (or HPFL-K / HPFL-R / Distributed with the two switches).

    ``aggregate_public``: accuracy-weighted public aggregation and personalization (off: HPFL-R);
    ``aggregate_private``: clustered private aggregation and the fine-grained update of the tables (off: HPFL-K);
    both off: Distributed (local training only). `accuracy_threshold` is p of ``d(Acc_ki, p)``: Acc is the task's
    accuracy (binary: thresholded at 0.5; rating: the rounded rating is right, typically about 0.4 on MovieLens),
    so p must lie below the clients' typical per-attribute accuracy or no attribute is aggregated
    (``metrics['attributes_aggregated']`` shows it). Other keyword arguments as in `build_process`.

    Returns:
      An `HpflProcess` (a stateful `fedpersonal.core.PersonalizedProcess`; a client's private state is its
      `ClientState`, `initial_client_state(num_users, num_items)` builds the first one).

    Example:

    >>> from fedpersonal.algorithms import hpfl
    >>> from fedpersonal.models import gum
    >>> config = gum.GumConfig(num_attributes=3, max_users=5, max_items=4, hidden_dim=2)
    >>> process = hpfl.build_hpfl(config, accuracy_threshold=0.5)
    >>> process.stateful, process.initial_client_state(5, 4).num_users
    (True, 5)
    """
    spec = RoundSpec(
        public_aggregation='accuracy_weighted' if aggregate_public else 'none',
        private_aggregation='clustered' if aggregate_private else 'none',
        accuracy_threshold=accuracy_threshold,
        center_weighting=center_weighting,
    )
    kwargs.setdefault(
        'name',
        {(True, True): 'hpfl', (True, False): 'hpfl_k', (False, True): 'hpfl_r', (False, False): 'distributed'}[
            (aggregate_public, aggregate_private)
        ],
    )
    return build_process(config, spec, **kwargs)
