"""One builder for HPFL, its ablations and its federated baselines: `build_process(config, RoundSpec(...))`.

Every process of the family is a `fedpersonal.core.PersonalizedProcess` on the GUM whose private state is each
silo's `ClientState` (its personalized GUM, CLIENTS-placed input and output of ``next``), composed by
`fedpersonal.core.compose_personalized_process` from the parts in `parts` and `server_step`: a round is the
package's one round -- distributor, client work, server step -- followed, where the method has one, by a client
step after aggregation (the composer's `PostAggregation`). What each phase does is data, a `RoundSpec`:

1. **Start** (``start``): ``'own'`` -- the client trains its own (personalized) model, nothing is sent before
   local training (HPFL, Distributed); ``'global'`` -- the distributor broadcasts the server's public components
   (with the round number, which seeds Fednoise) and the client replaces its own by them (the FedAvg family).
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
4. **Server step** (`server_step`, the composer's `ServerStep`): update aggregations apply the aggregate with TFF's apply-optimizer finalizer
   (`tff.learning.templates.build_apply_optimizer_finalizer`; default SGD with ``server_learning_rate``);
   HPFL's public aggregation divides the weighted sums (an attribute nobody passes keeps its c_k^g).
5. **Client step after aggregation** (`parts.post_aggregation`, only when something was aggregated): the server broadcasts
   `GlobalComponents` (c^g and Theta^g); update aggregations make the client take the new global public
   components; HPFL's fine-grained update blends them, ``c_ki <- c_ki Acc_ki + c_k^g (1 - Acc_ki)``
   (`aggregation.personalize_public`), and the clustered private aggregation blends every real user (item) row
   towards the global centres, ``Emb_ji <- Emb_ji Acc_i + Emb^g (1 - Acc_i)``
   (`aggregation.personalize_embeddings`, weighting ``center_weighting``).

The methods are values of `spec.RoundSpec` (`fedpersonal.algorithms.hpfl.baselines.round_spec` names them). The
round is stated once, as TF functions (`fedpersonal.core.RoundFunctions`): the TFF computations wrap them, and
the silo engine (`fedpersonal.simulation.silo_engine`, the backend `fedpersonal.backends` chooses) runs them.
Metrics: ``client_work`` (train and validation loss, validation accuracy, examples), then the server step's
``attributes_aggregated``, ``aggregator``, ``finalizer`` and ``clustering``, where the method has them.

    initialize: ( -> LearningAlgorithmState@SERVER)   (distributor: rounds run; aggregator: a `ServerState`)
    next: (<LearningAlgorithmState@SERVER, {ClientData}@CLIENTS, {ClientState}@CLIENTS> ->
           ProcessOutput<state@SERVER, metrics@SERVER, private_states={ClientState}@CLIENTS>)
"""

from __future__ import annotations

from typing import Any

import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl import parts as parts_lib
from fedpersonal.algorithms.hpfl import training
from fedpersonal.algorithms.hpfl.server_step import server_step
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import ROW_UPDATES
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.core import round_functions
from fedpersonal.models import gum


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
    simulation: str | None = None,
) -> process_lib.PersonalizedProcess:
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
        `initial_client_state`).
      row_updates: ``'dense'`` or ``'lazy'`` local table updates (`training.local_training`).
      name: The method's name (``process.parts['name']``).
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context. On the engine (`fedpersonal.simulation.silo_engine`) `run_round`
        runs each silo's work as one XLA-compiled program; on ``'per_client'`` `run_round` is `next`. Same
        results to float precision; `next` is the TFF computation either way. Where the engine cannot run the
        process as TFF would (``row_updates='lazy'``, a custom ``public_sum_factory`` or ``model_aggregator``),
        it is built on the per-client backend, with one log line saying why.

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess`; ``process.parts`` holds its building blocks (see
      `_named_parts`).
    """
    spec = spec or RoundSpec()
    sizes = dict(max_clients=max_clients, max_local_clusters=max_local_clusters)
    sizes.update(local_cluster_divisor=local_cluster_divisor, max_global_clusters=max_global_clusters)
    sizes.update(global_cluster_divisor=global_cluster_divisor)
    _check_arguments(spec, client_epochs, model_aggregator, row_updates, kmeans_iterations=kmeans_iterations, **sizes)
    initial = parts_lib.initial_values(config, public_seed=public_seed, max_global_clusters=max_global_clusters)
    types = parts_lib.types_of(config, initial)
    distributor = parts_lib.distributor(spec, types)
    work = parts_lib.client_work(
        config,
        spec,
        types,
        distributor.process.next.type_signature.result.result.member,
        optimizer=client_optimizer or tff.learning.optimizers.build_adam(learning_rate=0.01),
        client_epochs=client_epochs,
        row_updates=row_updates,
        public_seed=public_seed,
        local_cluster_divisor=local_cluster_divisor,
        max_local_clusters=max_local_clusters,
        kmeans_iterations=kmeans_iterations,
    )
    server = server_step(
        config,
        spec,
        types,
        initial,
        work,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        public_sum_factory=public_sum_factory,
        max_clients=max_clients,
        max_local_clusters=max_local_clusters,
        max_global_clusters=max_global_clusters,
        global_cluster_divisor=global_cluster_divisor,
        kmeans_iterations=kmeans_iterations,
    )
    post, stage = parts_lib.post_aggregation(
        spec, types, work.report_type, server.step.initialize.type_signature.result.member
    )
    functions = round_functions.RoundFunctions(
        distribute=distributor.distribute,
        client_update=work.update,
        client_noise=work.noise,
        server_step=server.stacked,
        metric_sums=training.metric_sums,
        finalize_metrics=training.finalize_metrics,
        post_aggregation=post if spec.personalizes else None,
        shrink=data_lib.shrink,
        restore=data_lib.restore,
        dataset_repeats={'train': 1 if spec.local_update == 'gradient' else client_epochs},
        aggregators=server.aggregators,
        not_compilable="row_updates='lazy' steps the rows a batch touches (tf.unique, no XLA kernel)"
        if row_updates == 'lazy'
        else None,
    )
    with backends.use(simulation or backends.current()):
        backend = backends.silo_engine_backend(functions, name=name)

    @tff.tensorflow.computation(work.report_type)
    def client_metric_sums(report):
        return training.metric_sums(report)

    @tff.tensorflow.computation(client_metric_sums.type_signature.result)
    def finalize(sums):
        return training.finalize_metrics(sums)

    def aggregate_metrics(reports):
        return tff.federated_map(finalize, tff.federated_sum(tff.federated_map(client_metric_sums, reports)))

    process = compose.compose_personalized_process(
        initial_global_weights=initial.weights,
        initial_private_state=initial.private,
        client_update=work.computation,
        aggregate_metrics=aggregate_metrics,
        model_distributor=distributor.process,
        server_step=server.step,
        post_aggregation=stage if spec.personalizes else None,
        client_metrics_key=None,
        parts=dict(spec=spec, name=name, config=config, functions=functions),
        backend=backend,
    )
    process.parts.update(_named_parts(process, types, work, server))
    return process


def _named_parts(process, types, work, server) -> dict[str, Any]:
    """The building blocks tests, audits and analyses use, besides the composer's (``client_update``, the client
    work ``(received, ClientData, ClientState) -> (uploads, ClientReport, ClientState)``; ``post_aggregation``;
    ``server_step``), the `RoundSpec` (``spec``), ``name``, ``config`` and the round's ``functions``:

    * ``round_from_uploads``: federated computation ``(state@S, {uploads}@C, {ClientReport}@C, {trained
      ClientState}@C) -> ProcessOutput``, everything after the client work (``next`` is the client work, then
      this), where the uploads are the `Centres` (start ``'own'``; ``()`` without clustering) or the
      `ClientResult`s (start ``'global'``): the explicit uploads are the privacy audit's subject.
    * ``client_centres``: TF computation ``ClientState -> Centres`` (clustered private aggregation).
    * ``public_aggregation``: federated computation ``(PublicWeights@S, {PublicWeights}@C, {[K]}@C, {[K]}@C) ->
      PublicWeights@S``, the accuracy-weighted formula (previous global, client c_i, Acc_i, I_i), the same code
      `next` runs (accuracy-weighted aggregation).
    """
    state_type = process.initialize.type_signature.result

    @tff.federated_computation(
        state_type,
        tff.FederatedType(work.uploads_type, tff.CLIENTS),
        tff.FederatedType(work.report_type, tff.CLIENTS),
        tff.FederatedType(types.state, tff.CLIENTS),
    )
    def round_from_uploads(state, uploads, reports, trained):
        return process.parts['after_client_work'](state, uploads, reports, trained)

    parts: dict[str, Any] = dict(round_from_uploads=round_from_uploads)
    if work.centres is not None:
        parts['client_centres'] = work.centres
    if server.public_aggregation is not None:
        parts['public_aggregation'] = server.public_aggregation.computation
    return parts


def _check_arguments(spec: RoundSpec, client_epochs, model_aggregator, row_updates, *, kmeans_iterations, **sizes):
    """Raises ValueError on arguments `build_process` cannot build (`sizes`: the clustering sizes, all >= 1)."""
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    for arg, value in sizes.items():
        if value < 1:
            raise ValueError(f'{arg} must be >= 1, got {value}.')
    if kmeans_iterations < 0:
        raise ValueError(f'kmeans_iterations must be >= 0, got {kmeans_iterations}.')
    if row_updates not in ROW_UPDATES:
        raise ValueError(f'row_updates must be one of {ROW_UPDATES}, got {row_updates!r}.')
    if model_aggregator is not None and spec.public_aggregation != 'mean':
        raise ValueError("model_aggregator applies to public_aggregation='mean' only.")


def build_hpfl(
    config: gum.GumConfig,
    *,
    accuracy_threshold: float = 0.5,
    center_weighting: str = 'distance',
    aggregate_public: bool = True,
    aggregate_private: bool = True,
    **kwargs,
) -> process_lib.PersonalizedProcess:
    """Builds HPFL (or HPFL-K / HPFL-R / Distributed with the two switches).

    ``aggregate_public``: accuracy-weighted public aggregation and personalization (off: HPFL-R);
    ``aggregate_private``: clustered private aggregation and the fine-grained update of the tables (off: HPFL-K);
    both off: Distributed (local training only). `accuracy_threshold` is p of ``d(Acc_ki, p)``: Acc is the task's
    accuracy (binary: thresholded at 0.5; rating: the rounded rating is right, typically about 0.4 on MovieLens),
    so p must lie below the clients' typical per-attribute accuracy or no attribute is aggregated
    (``metrics['attributes_aggregated']`` shows it). Other keyword arguments as in `build_process`.

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess`; a client's private state is its `ClientState`
      (`initial_client_state(config, num_users, num_items)` builds the first one).

    Example:

    >>> from fedpersonal.algorithms import hpfl
    >>> from fedpersonal.models import gum
    >>> config = gum.GumConfig(num_attributes=3, max_users=5, max_items=4, hidden_dim=2)
    >>> process = hpfl.build_hpfl(config, accuracy_threshold=0.5)
    >>> process.stateful, process.parts['spec'].public_aggregation
    (True, 'accuracy_weighted')
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
