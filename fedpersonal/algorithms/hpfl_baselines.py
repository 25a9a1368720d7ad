"""HPFL's federated baselines on the same GUM, data and client states: Distributed, FedSGD, FedAvg, Fednoise,
FedProx and FedAtt (Wu et al., WWW 2021, Table "Accuracy performances").

In every baseline the **public components** (``skill_W``, ``know_W``, ``relative_M``) are the shared model and the
**private components** (user and item tables, discrimination, slip, guess) stay on their client: they are a
`tff.CLIENTS`-placed input and output of ``next`` (the same `hpfl.ClientState` as HPFL), trained locally, and never
sent, raw or clustered. Per round, every client

1. replaces its public components by the broadcast global ones (Distributed: keeps its own, there is no server);
2. trains public and private components on its train split (`hpfl.local_training`; FedSGD: one full-batch
   gradient instead, see below) and measures its validation statistics;
3. uploads its public update ``global - trained`` (FedSGD: the mean gradient) with its number of training
   examples as weight;

then the server aggregates and applies the update with a `tff.learning.optimizers` server optimizer (TFF's
apply-optimizer finalizer), and each client's state takes the new global public components (the model it would
predict with now) next to its trained private tables. The methods:

* ``distributed``: local training only (`hpfl.build_hpfl` with both aggregations off).
* ``fedsgd``: the client computes the gradient of its mean train loss at (global public, own private) in one pass
  (``client_epochs`` is ignored), takes one client-optimizer step on its private components and uploads the public
  gradient; the server averages (weighted by examples) and applies ``server_optimizer`` (SGD, learning rate 1).
* ``fedavg``: ``client_epochs`` local epochs; weighted mean of the updates (`tff.aggregators.MeanFactory`, or
  ``model_aggregator``); server SGD with learning rate 1 (plain model averaging).
* ``fednoise``: FedAvg whose clients add Gaussian noise N(0, ``noise_stddev``^2) to every coordinate of their upload
  (noise on uploads at the client, seeded by the client's `ClientData.seed` and the round; TFF's DP aggregators add
  calibrated noise to the *sum* at the server instead, which is a different method: pass
  ``model_aggregator=tff.aggregators.DifferentiallyPrivateFactory...`` to ``build_fedavg`` for that).
* ``fedprox``: FedAvg with the proximal term ``proximal_strength / 2 * ||public - global||^2`` in the local loss.
* ``fedatt`` (attentive aggregation, Ji et al. 2019): per public tensor ("layer") l, with ``d_il = ||w_l - w_il||``,
  ``alpha_il = softmax_i(-d_il)`` and ``w_l <- w_l - eps * sum_i alpha_il (w_l - w_il)``. Clients upload
  ``exp(-d_il) (w_l - w_il)`` and ``exp(-d_il)``; the sums (`tff.aggregators.SumFactory`) give the
  softmax-weighted mean, and the server step is SGD with learning rate ``eps`` = ``attention_step``.
  (``exp(-d)`` underflows in float32 for d > ~87, far above one round's update norms here.)

Every process follows `hpfl.HpflProcess`'s interface: ``initialize()``, ``next(state, client_data, client_states)
-> HpflOutput(state, metrics, private_states)``, ``initial_client_state(num_users, num_items)`` and
``get_public_weights(state)``.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import hpfl
from fedpersonal.models import gum

__all__ = ['BASELINES', 'BaselineState', 'BaselineProcess', 'build_baseline', 'build_distributed', 'build_fedsgd',
           'build_fedavg', 'build_fednoise', 'build_fedprox', 'build_fedatt']

BASELINES = ('distributed', 'fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt')
_SHARED = ('fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt')
ModelWeights = tff.learning.models.ModelWeights


class BaselineState(NamedTuple):
    """Server state of a public-sharing baseline."""

    global_model_weights: Any  # ModelWeights(trainable=[skill_W, know_W, relative_M], non_trainable=[])
    aggregator: Any
    finalizer: Any
    round_num: Any


class BaselineProcess(tff.templates.IterativeProcess):
    """A baseline's iterative process (same interface as `hpfl.HpflProcess`)."""

    def __init__(self, initialize_fn, next_fn, *, method: str, config: gum.GumConfig, client_data_type,
                 client_state_type, public_seed: int):
        super().__init__(initialize_fn, next_fn)
        self.method = method
        self.config = config
        self.client_data_type = client_data_type
        self.client_state_type = client_state_type
        self._public_seed = public_seed

    def initial_client_state(self, num_users: int, num_items: int, *, private_seed: int = 0) -> hpfl.ClientState:
        """A client's first state (public part equal to the initial global public components)."""
        return hpfl.initial_client_state(self.config, num_users, num_items, public_seed=self._public_seed,
                                         private_seed=private_seed)

    def get_public_weights(self, state: BaselineState) -> gum.PublicWeights:
        """The global public components in `state`."""
        return gum.PublicWeights(*state.global_model_weights.trainable)


def _add_scaled(total, gradient, scale):
    """``total + scale * gradient``; an `IndexedSlices` gradient (a table's batch rows) is scattered, O(batch)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.tensor_scatter_nd_add(total, gradient.indices[:, None], scale * gradient.values)
    return total + scale * tf.convert_to_tensor(gradient)


def _fedsgd_client(global_public, data: hpfl.ClientData, state: hpfl.ClientState, optimizer, config: gum.GumConfig):
    """One pass of gradients at (global public, own private): one private step, the public mean gradient."""
    fields = gum.trainable_private_fields(config)
    weights = state.model._replace(public=gum.PublicWeights(*global_public))
    public = tuple(weights.public)
    private = tuple(getattr(weights.private, f) for f in fields)

    def step(carry, batch):
        public_sum, private_sum, n, loss_sum, iterations = carry
        attributes = tf.gather(data.item_attributes, batch['item'])
        with tf.GradientTape() as tape:
            tape.watch((public, private))
            current = gum.GumWeights(gum.PublicWeights(*public),
                                     weights.private._replace(**dict(zip(fields, private))))
            loss = gum.mse_loss(current, batch['user'], batch['item'], attributes, batch['label'])
        public_grads, private_grads = tape.gradient(loss, (public, private))
        size = tf.cast(tf.shape(batch['label'])[0], tf.float32)
        return (tuple(s + size * tf.convert_to_tensor(g) for s, g in zip(public_sum, public_grads)),
                tuple(_add_scaled(s, g, size) for s, g in zip(private_sum, private_grads)),
                n + size, loss_sum + size * loss,
                iterations + tf.reduce_sum(tf.cast(attributes > 0, tf.float32), axis=0))

    zeros = lambda values: tuple(tf.zeros_like(v) for v in values)
    public_sum, private_sum, n, loss_sum, iterations = data.train.reduce(
        (zeros(public), zeros(private), tf.constant(0.0), tf.constant(0.0), tf.zeros([config.num_attributes])), step)
    public_grad = [tf.math.divide_no_nan(s, n) for s in public_sum]
    private_grad = tuple(tf.math.divide_no_nan(s, n) for s in private_sum)
    optimizer_state = optimizer.initialize(tuple(tf.TensorSpec(v.shape, v.dtype) for v in private))
    _, private = optimizer.next(optimizer_state, private, private_grad)
    trained = weights._replace(private=weights.private._replace(**dict(zip(fields, private))))
    val_loss, val_right, val_n, attribute_right, attribute_count = hpfl.validation_statistics(
        trained, data.validation, data.item_attributes, config)
    report = hpfl.ClientReport(
        public=trained.public, attribute_accuracy=tf.math.divide_no_nan(attribute_right, attribute_count),
        attribute_iterations=iterations, accuracy=tf.math.divide_no_nan(val_right, val_n), train_loss_sum=loss_sum,
        num_train_examples=n, validation_loss_sum=val_loss, validation_correct=val_right,
        num_validation_examples=val_n)
    return state._replace(model=trained), report, public_grad


def build_baseline(
    method: str,
    config: gum.GumConfig,
    *,
    client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    client_epochs: int = 1,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    proximal_strength: float = 0.01,
    noise_stddev: float = 0.01,
    attention_step: float = 1.0,
    public_seed: int = 0,
    row_updates: str = 'dense',
):
    """Builds one of `BASELINES` (see the module docstring).

    Args:
      method: One of `BASELINES`.
      config: The GUM config.
      client_optimizer: Local optimizer (default Adam, learning rate 0.01).
      client_epochs: Local epochs per round (ignored by FedSGD).
      server_optimizer: Applied to the aggregated update (default SGD with learning rate 1; FedAtt: learning rate
        ``attention_step``).
      model_aggregator: Weighted `tff.aggregators` factory of the updates for FedSGD/FedAvg/Fednoise/FedProx
        (default `tff.aggregators.MeanFactory()`); FedAtt uses its attention sums.
      proximal_strength: FedProx's mu.
      noise_stddev: Fednoise's standard deviation of the noise added to every uploaded coordinate.
      attention_step: FedAtt's eps.
      public_seed: Seed of the initial public components.
      row_updates: Local table updates, ``'lazy'`` or ``'dense'`` (`hpfl.local_training`; FedSGD's single
        full-batch step is the same either way).

    Returns:
      A `BaselineProcess` (`hpfl.HpflProcess` for ``'distributed'``).
    """
    if method not in BASELINES:
        raise ValueError(f'method must be one of {BASELINES}, got {method!r}.')
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    for name, value in (('proximal_strength', proximal_strength), ('noise_stddev', noise_stddev),
                        ('attention_step', attention_step)):
        if value < 0:
            raise ValueError(f'{name} must be >= 0, got {value}.')
    optimizer = client_optimizer or tff.learning.optimizers.build_adam(learning_rate=0.01)
    if method == 'distributed':
        return hpfl.build_hpfl(config, client_optimizer=optimizer, client_epochs=client_epochs,
                               aggregate_public=False, aggregate_private=False, public_seed=public_seed,
                               row_updates=row_updates)
    if server_optimizer is None:
        server_optimizer = tff.learning.optimizers.build_sgdm(
            learning_rate=attention_step if method == 'fedatt' else 1.0)

    data_type = hpfl.client_data_type(config)
    state_type = hpfl.client_state_type(config)
    public_type = state_type.model.public

    @tff.tensorflow.computation
    def initial_weights():
        return ModelWeights(trainable=list(gum.initial_public(config, public_seed)), non_trainable=[])

    weights_type = initial_weights.type_signature.result
    trainable_type = weights_type.trainable
    round_type = tff.TensorType(np.int32)

    @tff.tensorflow.computation(trainable_type, data_type, state_type, round_type)
    def client_work(global_public, data, state, round_num):
        if method == 'fedsgd':
            trained, report, update = _fedsgd_client(global_public, data, state, optimizer, config)
        else:
            start = gum.PublicWeights(*global_public)
            trained, report = hpfl.client_round(
                data, state, optimizer, config, epochs=client_epochs, start_public=start,
                proximal_center=start if method == 'fedprox' else None,
                proximal_strength=proximal_strength if method == 'fedprox' else 0.0, row_updates=row_updates)
            update = [g - w for g, w in zip(global_public, trained.model.public)]
        if method == 'fednoise':
            seed = tf.cast(data.seed, tf.int64)
            update = [u + noise_stddev * tf.random.stateless_normal(
                tf.shape(u), seed=tf.stack([seed, tf.cast(round_num, tf.int64) * 8 + i]))
                      for i, u in enumerate(update)]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(u)) for u in update])
        update = [tf.where(finite, u, tf.zeros_like(u)) for u in update]
        if method == 'fedatt':
            scores = [tf.exp(-tf.norm(u)) * tf.cast(finite, tf.float32) for u in update]
            upload = ([s * u for s, u in zip(scores, update)], scores)
            return trained, report, upload, ()
        weight = tf.where(finite, report.num_train_examples, 0.0)
        return trained, report, update, weight

    trained_type, report_type, upload_type, _ = client_work.type_signature.result
    if method == 'fedatt':
        aggregator = tff.aggregators.SumFactory().create(upload_type)
    else:
        aggregator = (model_aggregator or tff.aggregators.MeanFactory()).create(upload_type, tff.TensorType(np.float32))
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer, weights_type)

    if method == 'fedatt':
        @tff.tensorflow.computation(aggregator.next.type_signature.result.result.member)
        def attention_mean(sums):
            weighted, scores = sums
            return [tf.math.divide_no_nan(w, s) for w, s in zip(weighted, scores)]

    @tff.tensorflow.computation(state_type, trainable_type)
    def take_global(state, global_public):
        return state._replace(model=state.model._replace(public=gum.PublicWeights(*global_public)))

    @tff.tensorflow.computation(report_type)
    def client_metric_sums(report):
        return hpfl.metric_sums(report)

    @tff.tensorflow.computation(client_metric_sums.type_signature.result)
    def finalize(sums):
        return hpfl.finalize_metrics(sums)

    @tff.tensorflow.computation(round_type)
    def increment(round_num):
        return round_num + 1

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(BaselineState(
            global_model_weights=tff.federated_eval(initial_weights, tff.SERVER), aggregator=aggregator.initialize(),
            finalizer=finalizer.initialize(), round_num=tff.federated_value(np.int32(0), tff.SERVER)))

    server_state_type = initialize.type_signature.result

    @tff.federated_computation(server_state_type, tff.FederatedType(data_type, tff.CLIENTS),
                               tff.FederatedType(state_type, tff.CLIENTS))
    def next_fn(state, client_data_values, client_states):
        broadcast = tff.federated_broadcast(state.global_model_weights.trainable)
        round_num = tff.federated_broadcast(state.round_num)
        trained, reports, uploads, weights = tff.federated_map(
            client_work, (broadcast, client_data_values, client_states, round_num))
        if method == 'fedatt':
            aggregated = aggregator.next(state.aggregator, uploads)
            update = tff.federated_map(attention_mean, aggregated.result)
        else:
            aggregated = aggregator.next(state.aggregator, uploads, weights)
            update = aggregated.result
        finalized = finalizer.next(state.finalizer, state.global_model_weights, update)
        new_states = tff.federated_map(take_global, (trained, tff.federated_broadcast(finalized.result.trainable)))
        train_metrics = tff.federated_map(finalize, tff.federated_sum(tff.federated_map(client_metric_sums, reports)))
        new_state = tff.federated_zip(BaselineState(
            global_model_weights=finalized.result, aggregator=aggregated.state, finalizer=finalized.state,
            round_num=tff.federated_map(increment, state.round_num)))
        metrics = tff.federated_zip(collections.OrderedDict(
            client_work=train_metrics, aggregator=aggregated.measurements, finalizer=finalized.measurements))
        return hpfl.HpflOutput(state=new_state, metrics=metrics, private_states=new_states)

    return BaselineProcess(initialize, next_fn, method=method, config=config, client_data_type=data_type,
                           client_state_type=state_type, public_seed=public_seed)


def build_distributed(config: gum.GumConfig, **kwargs) -> hpfl.HpflProcess:
    """Local training only (no communication)."""
    return build_baseline('distributed', config, **kwargs)


def build_fedsgd(config: gum.GumConfig, **kwargs) -> BaselineProcess:
    """FedSGD on the public components; private components stay local."""
    return build_baseline('fedsgd', config, **kwargs)


def build_fedavg(config: gum.GumConfig, **kwargs) -> BaselineProcess:
    """FedAvg on the public components; private components stay local."""
    return build_baseline('fedavg', config, **kwargs)


def build_fednoise(config: gum.GumConfig, **kwargs) -> BaselineProcess:
    """FedAvg with Gaussian noise on every client upload; private components stay local."""
    return build_baseline('fednoise', config, **kwargs)


def build_fedprox(config: gum.GumConfig, **kwargs) -> BaselineProcess:
    """FedProx (proximal local loss) on the public components; private components stay local."""
    return build_baseline('fedprox', config, **kwargs)


def build_fedatt(config: gum.GumConfig, **kwargs) -> BaselineProcess:
    """FedAtt (layer-wise attentive aggregation) on the public components; private components stay local."""
    return build_baseline('fedatt', config, **kwargs)
