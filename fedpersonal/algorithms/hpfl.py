"""HPFL: hierarchical personalized federated learning for user modeling (Wu et al., WWW 2021), on TFF.

Cross-silo: a few clients (schools, regions), each with many users and items, all participating every round. Each
client holds a General User Model (`fedpersonal.models.gum`) whose *public* components (per-attribute knowledge
vectors c_k, `gum.attribute_vectors`) may be shared and whose *private* components (user and item tables) must not
be. One round of `build_hpfl(...).next`:

1. **Client upload phase** (`process.client_train`, TF): the client trains its own (personalized) GUM for
   ``client_epochs`` local epochs on its train split with a `tff.learning.optimizers` optimizer inside a
   `Dataset.reduce` loop, then measures on its **validation** split (not test: the authors' code measures on
   test, a leak) the accuracy Acc_ki of the records of each attribute k, its overall accuracy Acc_i, and counts
   I_ki, the number of training records involving attribute k that the round processed (records x epochs). Then
   (`process.client_centres`, TF) it runs k-means on its user embeddings theta and on its item difficulties b
   (rows of its real users/items only), with ``min(n // local_cluster_divisor + 1, max_local_clusters)`` clusters
   (about n/5 + 1, as in the authors' code; padded to the static ``max_local_clusters`` with a mask).
2. **Server, public components** (only with ``aggregate_public``): per attribute k,
   ``c_k^g = sum_i d(Acc_ki, p) I_ki Acc_ki c_ki / sum_i d(Acc_ki, p) I_ki Acc_ki`` with ``d(x, p) = 1 if x > p``.
   Each client uploads ``a_ki c_ki`` and ``a_ki`` (``a_ki = d(Acc_ki, p) I_ki Acc_ki``; a client without validation
   records of attribute k, in particular one lacking the attribute, has Acc_ki = 0 and contributes nothing), they
   are summed with a `tff.aggregators` sum (default `SumFactory`, replaceable e.g. by a noised or secure sum) and
   the server divides; an attribute that no client passes keeps its previous global c_k. ``p`` is the
   configurable ``accuracy_threshold`` (the authors' code draws it at random).
3. **Server, private components** (only with ``aggregate_private``): clients upload only their padded cluster
   centres (never user/item rows) through one `federated_aggregate` that concatenates them (at most
   ``max_clients`` uploads: more are dropped and counted in the metrics), and the server clusters all user centres
   (and, separately, all item centres) into ``min(total // global_cluster_divisor + 1, max_global_clusters)``
   global centres Theta^g (about total/10). TFF's `tff.learning.algorithms.build_fed_kmeans` does not fit this
   step: it is mini-batch (Sculley) k-means that moves randomly initialized centroids one step per round with
   cumulative counts, while HPFL needs, every round, a clustering of that round's uploaded centres. The server
   therefore runs the same deterministic TF k-means as the clients (`kmeans`: maximin initialization from the
   point nearest the mean, then Lloyd iterations; an empty cluster keeps its centre).
4. **Client update phase** (`process.client_update`, TF), fine-grained personalized update:
   ``c_ki <- c_ki Acc_ki + c_k^g (1 - Acc_ki)`` (public, `personalize_public`) and, for every real user (item)
   row, ``Emb^g = sum_n w_n Theta_n / sum_m w_m`` and ``Emb_ji <- Emb_ji Acc_i + Emb^g (1 - Acc_i)``
   (`personalize_embeddings`), with ``w_n = ||Emb_ji - Theta_n||`` as published (farther centres weigh more;
   ``center_weighting='distance'``, the default) or ``w_n = 1 / ||Emb_ji - Theta_n||``
   (``center_weighting='inverse_distance'``).

The personalized model is the client's state for the next round: there is no broadcast before local training.
Ablations: HPFL-K = ``aggregate_public=True, aggregate_private=False`` (no clustering, no centre upload);
HPFL-R = ``aggregate_public=False, aggregate_private=True`` (public components stay local); both False is the
Distributed (local-only) baseline.

**Private state.** Each client's `ClientState` (its GUM weights -- public copy and private tables -- and its real
numbers of users and items) is a `tff.CLIENTS`-placed input and output of `next`, as in FURL
(`fedpersonal.algorithms.furl`); nothing in the SERVER state is per-client. Silos of different sizes share one
static type: user/item tables are padded to the largest silo (`gum.GumConfig.for_data`), the item attribute table
to ``max_items`` rows; the real sizes in the state mask padded rows out of clustering and of the embedding update
(padded rows are never indexed by the data). Client data is a `ClientData` (train and validation datasets, the
attribute table, a seed) built by `client_data` / `federated_data`.

**Privacy audit** (`fedpersonal.privacy.audit`): `next` decomposes into the client computations above and
`process.round_from_uploads(state, trained_states, reports, centres)`, whose explicit ``centres`` argument is the
only way the trained tables reach the server; see tests/algorithms/hpfl_test.py.

    initialize: ( -> HpflState@SERVER)
    next: (<HpflState@SERVER, {ClientData}@CLIENTS, {ClientState}@CLIENTS> ->
           <state=HpflState@SERVER, metrics@SERVER, private_states={ClientState}@CLIENTS>)
"""

from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.models import gum

__all__ = [
    'HpflDataError', 'ClientData', 'ClientState', 'ClientReport', 'Centres', 'GlobalComponents', 'HpflState',
    'HpflOutput', 'HpflProcess', 'SiloPredictions', 'CENTER_WEIGHTINGS', 'ROW_UPDATES', 'build_hpfl', 'client_data',
    'federated_data', 'split_dataset', 'initial_client_state', 'initial_client_states', 'local_training',
    'validation_statistics', 'public_aggregation_weights', 'personalize_public', 'global_embedding',
    'personalize_embeddings', 'maximin_init', 'lloyd_step', 'kmeans', 'predict_silos', 'batch_type',
    'client_data_type', 'client_state_type', 'client_round', 'metric_sums', 'finalize_metrics', 'SPLITS',
]

CENTER_WEIGHTINGS = ('distance', 'inverse_distance')
SPLITS = {'train': 0, 'validation': 1, 'test': 2}
_EPS = 1e-6


class HpflDataError(ValueError):
    """Client data that cannot feed a GUM (the message names the data set, the client and the field)."""


# ----------------------------------------------------------------------------------------------- structures
class ClientData(NamedTuple):
    """What one silo holds besides its model: its data.

    Attributes:
      train: `tf.data.Dataset` of batches ``OrderedDict(user=int64[B], item=int64[B], label=float32[B])``, labels
        on the [0, 1] scale (`gum.to_unit`).
      validation: Same, the validation split.
      item_attributes: float32 ``[max_items, K]`` multi-hot attribute rows (zero rows past the silo's items).
      seed: int64 scalar, distinct per silo (used by the noised baselines).
    """

    train: Any
    validation: Any
    item_attributes: Any
    seed: Any


class ClientState(NamedTuple):
    """A client's private state: its personalized GUM and the real sizes of its padded tables."""

    model: gum.GumWeights
    num_users: Any  # int32 scalar
    num_items: Any  # int32 scalar


class ClientReport(NamedTuple):
    """What a client learns in its upload phase (only parts of it are uploaded, see the module docstring)."""

    public: gum.PublicWeights  # Trained public components c_ki.
    attribute_accuracy: Any  # [K] Acc_ki on the validation split (0 without validation records of attribute k).
    attribute_iterations: Any  # [K] I_ki.
    accuracy: Any  # Acc_i.
    train_loss_sum: Any
    num_train_examples: Any
    validation_loss_sum: Any
    validation_correct: Any
    num_validation_examples: Any


class Centres(NamedTuple):
    """A client's k-means centres of its user embeddings and item difficulties, padded with masks."""

    user_centres: Any  # [max_local_clusters, K]
    user_mask: Any  # [max_local_clusters] float32 1/0
    item_centres: Any
    item_mask: Any


class GlobalComponents(NamedTuple):
    """What the server broadcasts for the client update phase: c^g and the global centres Theta^g."""

    public: gum.PublicWeights
    user_centres: Any  # [max_global_clusters, K]
    user_mask: Any
    item_centres: Any
    item_mask: Any


class HpflState(NamedTuple):
    """Server state of HPFL."""

    global_components: GlobalComponents
    aggregator: Any  # State of the public-component sum aggregator.
    round_num: Any  # int32


class HpflOutput(NamedTuple):
    """Result of one round: server state, server metrics, and every client's new private state."""

    state: Any
    metrics: Any
    private_states: Any


class SiloPredictions(NamedTuple):
    """Predictions of one silo on one split, in record order, on the original label scale."""

    client_id: str
    user: np.ndarray
    item: np.ndarray
    label: np.ndarray
    prediction: np.ndarray


# --------------------------------------------------------------------------------------------------- data
def batch_type() -> collections.OrderedDict:
    """TFF type of one batch of a client dataset."""
    return collections.OrderedDict(user=tff.TensorType(np.int64, [None]), item=tff.TensorType(np.int64, [None]),
                                   label=tff.TensorType(np.float32, [None]))


def client_data_type(config: gum.GumConfig) -> tff.Type:
    """TFF type of a `ClientData`."""
    sequence = tff.SequenceType(batch_type())
    return tff.to_type(ClientData(train=sequence, validation=sequence,
                                  item_attributes=tff.TensorType(np.float32, [config.max_items, config.num_attributes]),
                                  seed=tff.TensorType(np.int64)))


def _check_silo(silo: Any, config: gum.GumConfig, name: str) -> None:
    where = f'{name}: client {silo.client_id!r}'

    def fail(field: str, problem: str):
        raise HpflDataError(f'{where}: {field} {problem}')

    if silo.num_users > config.max_users:
        fail('num_users', f'= {silo.num_users} exceeds the model\'s max_users = {config.max_users}')
    if silo.num_items > config.max_items:
        fail('num_items', f'= {silo.num_items} exceeds the model\'s max_items = {config.max_items}')
    arrays = {f: np.asarray(getattr(silo, f)) for f in ('user', 'item', 'label', 'split')}
    n = arrays['user'].shape[0] if arrays['user'].ndim == 1 else -1
    for field, array in arrays.items():
        if array.ndim != 1 or array.shape[0] != n:
            fail(field, f'must be 1-D with one entry per record like user ({n}), got shape {array.shape}')
    for field, count in (('user', silo.num_users), ('item', silo.num_items)):
        array = arrays[field]
        if n and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() >= count):
            fail(field, f'indices must be integers in [0, {count}), got range '
                        f'[{array.min()}, {array.max()}] (dtype {array.dtype})')
    if n and not np.isin(arrays['split'], (0, 1, 2)).all():
        bad = arrays['split'][~np.isin(arrays['split'], (0, 1, 2))][0]
        fail('split', f'values must be 0 (train), 1 (validation) or 2 (test), got {bad}')
    label = arrays['label'].astype(np.float64)
    lo, hi = config.rating_range
    if n and (not np.isfinite(label).all() or label.min() < lo or label.max() > hi):
        fail('label', f'must be finite and within the rating range [{lo}, {hi}], got [{label.min()}, {label.max()}]')
    if config.task == 'binary' and n and not np.isin(label, (0.0, 1.0)).all():
        fail('label', 'must be 0 or 1 for the binary task')
    attributes = np.asarray(silo.item_attributes)
    if attributes.shape != (silo.num_items, config.num_attributes):
        fail('item_attributes', f'must have shape [num_items, K] = [{silo.num_items}, {config.num_attributes}], '
                                f'got {attributes.shape}')
    if not np.isfinite(attributes).all() or (attributes < 0).any():
        fail('item_attributes', 'must be finite and non-negative (multi-hot)')


def split_dataset(silo: Any, config: gum.GumConfig, split: str, *, batch_size: int = 64,
                  shuffle_seed: Optional[int] = None) -> tf.data.Dataset:
    """The records of one split of a silo as a dataset of `batch_type` batches (labels mapped to [0, 1]).

    Args:
      silo: A `fedpersonal.data.user_modeling.ClientSilo`.
      config: The model config (for the rating range).
      split: 'train', 'validation' or 'test'.
      batch_size: Batch size.
      shuffle_seed: If given, the records are shuffled (reshuffled at every epoch of a round, the same way every
        round); otherwise they stay in record order.
    """
    if split not in SPLITS:
        raise ValueError(f'split must be one of {tuple(SPLITS)}, got {split!r}.')
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
    keep = np.asarray(silo.split) == SPLITS[split]
    records = collections.OrderedDict(
        user=np.asarray(silo.user, np.int64)[keep], item=np.asarray(silo.item, np.int64)[keep],
        label=gum.to_unit(np.asarray(silo.label, np.float32)[keep], config.rating_range).astype(np.float32))
    dataset = tf.data.Dataset.from_tensor_slices(records)
    if shuffle_seed is not None and keep.any():
        dataset = dataset.shuffle(int(keep.sum()), seed=shuffle_seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size)


def client_data(silo: Any, config: gum.GumConfig, *, batch_size: int = 64, seed: int = 0, shuffle: bool = True,
                data_name: str = 'data') -> ClientData:
    """A silo's `ClientData` (checked: bad input raises `HpflDataError` naming the client and the field).

    Args:
      silo: A `fedpersonal.data.user_modeling.ClientSilo`.
      config: The model config.
      batch_size: Batch size of both datasets.
      seed: The silo's seed (train shuffling and `ClientData.seed`).
      shuffle: Shuffle the train split (validation stays in record order).
      data_name: The data set's name, for error messages.
    """
    _check_silo(silo, config, data_name)
    attributes = np.zeros([config.max_items, config.num_attributes], np.float32)
    attributes[:silo.num_items] = np.asarray(silo.item_attributes, np.float32)
    return ClientData(
        train=split_dataset(silo, config, 'train', batch_size=batch_size, shuffle_seed=seed if shuffle else None),
        validation=split_dataset(silo, config, 'validation', batch_size=batch_size),
        item_attributes=attributes, seed=np.int64(seed))


def federated_data(data: Any, config: gum.GumConfig, *, batch_size: int = 64, seed: int = 0,
                   shuffle: bool = True) -> list[ClientData]:
    """`client_data` of every silo of a `UserModelingData`, in silo order (silo i gets seed ``seed * 1000 + i``)."""
    return [client_data(silo, config, batch_size=batch_size, seed=seed * 1000 + i, shuffle=shuffle,
                        data_name=data.name) for i, silo in enumerate(data.silos)]


def initial_client_state(config: gum.GumConfig, num_users: int, num_items: int, *, public_seed: int = 0,
                         private_seed: int = 0) -> ClientState:
    """A client's first `ClientState`: `gum.initial_weights` (the public part is the same for every client with the
    same `public_seed`, and equals HPFL's initial global c^g) and the silo's real sizes."""
    if not 0 <= num_users <= config.max_users or not 0 <= num_items <= config.max_items:
        raise HpflDataError(f'silo sizes ({num_users} users, {num_items} items) exceed the model\'s tables '
                            f'({config.max_users}, {config.max_items}).')
    return ClientState(model=gum.initial_weights(config, public_seed, private_seed), num_users=np.int32(num_users),
                       num_items=np.int32(num_items))


def initial_client_states(data: Any, config: gum.GumConfig, *, public_seed: int = 0,
                          seed: int = 0) -> list[ClientState]:
    """`initial_client_state` of every silo (private tables seeded ``seed * 1000 + i``)."""
    return [initial_client_state(config, s.num_users, s.num_items, public_seed=public_seed,
                                 private_seed=seed * 1000 + i) for i, s in enumerate(data.silos)]


def _struct_type(fn) -> tff.Type:
    return tff.tensorflow.computation(fn).type_signature.result


def client_state_type(config: gum.GumConfig) -> tff.Type:
    """TFF type of a `ClientState`."""
    return _struct_type(lambda: initial_client_state(config, 0, 0))


# ----------------------------------------------------------------------------------------- local training
def _trainable(weights: gum.GumWeights, fields: Sequence[str]) -> tuple:
    return tuple(weights.public) + tuple(getattr(weights.private, f) for f in fields)


def _rebuild(weights: gum.GumWeights, values: Sequence[tf.Tensor], fields: Sequence[str]) -> gum.GumWeights:
    public = gum.PublicWeights(*values[:3])
    return gum.GumWeights(public=public, private=weights.private._replace(**dict(zip(fields, values[3:]))))


ROW_UPDATES = ('lazy', 'dense')


def _per_weight_state_keys(optimizer_state, specs: Sequence[tf.TensorSpec]) -> tuple[str, ...]:
    """Keys of a `tff.learning.optimizers` state whose values hold one tensor per weight (Adam's moments, ...)."""
    keys = []
    for key, value in optimizer_state.items():
        if isinstance(value, (tuple, list)) and len(value) == len(specs) and all(
                tf.TensorShape(getattr(v, 'shape', ())) == spec.shape for v, spec in zip(value, specs)):
            keys.append(key)
    return tuple(keys)


def local_training(weights: gum.GumWeights, dataset: tf.data.Dataset, item_attributes: tf.Tensor,
                   optimizer: tff.learning.optimizers.Optimizer, config: gum.GumConfig, *, epochs: int = 1,
                   proximal_center: Optional[gum.PublicWeights] = None, proximal_strength: float = 0.0,
                   row_updates: str = 'dense'):
    """Trains all GUM weights (public and private) on `dataset` with one optimizer step per batch.

    The optimizer state starts fresh. With `proximal_center`, ``proximal_strength / 2 * ||public - center||^2`` is
    added to every batch loss (FedProx). Call inside a TF graph (a TFF computation or `tf.function`).

    ``row_updates='dense'`` (default) applies the optimizer to the full tables (the gradients of untouched rows
    are zeros: plain Adam, as published). ``'lazy'`` steps only the table rows a batch touches: the step gathers
    the batch's unique user and item rows of the private tables and of the optimizer's per-weight state (e.g.
    Adam's moments), runs ``optimizer.next`` on those rows and the public components, and scatters the results
    back, so the optimizer's work per step is O(batch) instead of O(table). For SGD (any optimizer whose update of
    a zero-gradient row is zero) this is exactly the dense step; for Adam it is lazy Adam (untouched rows keep
    their values and moments instead of drifting on stale momentum; the bias-correction step count is shared).
    Measured (`benchmarks/hpfl_row_updates.py`, docs/RESULTS.md): at ASSIST's table sizes (10,745 padded item
    rows) a whole 40-silo round costs the same either way (15.7 s dense, 16.6 s lazy: the per-step cost is fixed
    per-op overhead) and dense Adam reached a lower validation loss after three rounds (0.194 vs 0.201); with
    100,000-row tables a local epoch is 2.1x faster lazy (Adam). Hence dense is the default.

    Returns:
      ``(weights, num_examples, loss_sum, attribute_iterations)``: the trained weights, the number of records
      processed (over all epochs), the sum over batches of batch MSE x batch size (before each step), and I_k
      ``[K]``, the number of processed records whose item has attribute k.
    """
    if row_updates not in ROW_UPDATES:
        raise ValueError(f'row_updates must be one of {ROW_UPDATES}, got {row_updates!r}.')
    fields = gum.trainable_private_fields(config)
    values = _trainable(weights, fields)
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in values)
    num_public = len(gum.PublicWeights._fields)
    initial_state = optimizer.initialize(specs)
    per_weight = _per_weight_state_keys(initial_state, specs)

    def loss_of(current, user, item, attributes, label):
        loss = gum.mse_loss(current, user, item, attributes, label)
        total = loss
        if proximal_center is not None and proximal_strength > 0:
            total += 0.5 * proximal_strength * tf.add_n(
                [tf.reduce_sum(tf.square(a - b)) for a, b in zip(current.public, proximal_center)])
        return loss, total

    def dense_step(values, optimizer_state, batch, attributes):
        with tf.GradientTape() as tape:
            tape.watch(values)
            loss, total = loss_of(_rebuild(weights, values, fields), batch['user'], batch['item'], attributes,
                                  batch['label'])
        gradients = tuple(tf.convert_to_tensor(g) for g in tape.gradient(total, values))
        optimizer_state, values = optimizer.next(optimizer_state, values, gradients)
        return tuple(values), optimizer_state, loss

    def lazy_step(values, optimizer_state, batch, attributes):
        users, user_index = tf.unique(batch['user'])
        items, item_index = tf.unique(batch['item'])
        rows_of = lambda field: users if field == 'theta' else items  # Every other private table is per item.
        rows = (None,) * num_public + tuple(rows_of(field) for field in fields)

        def gather(tensors):
            return tuple(t if r is None else tf.gather(t, r) for t, r in zip(tensors, rows))

        def scatter(tensors, updates):
            return tuple(u if r is None else tf.tensor_scatter_nd_update(t, r[:, None], u)
                         for t, u, r in zip(tensors, updates, rows))

        local_values = gather(values)
        local_state = collections.OrderedDict(
            (key, gather(value) if key in per_weight else value) for key, value in optimizer_state.items())
        # The non-trained private fields (discrimination without use_discrimination) are read at the same rows.
        local_weights = weights._replace(private=weights.private._replace(**{
            f: tf.gather(getattr(weights.private, f), rows_of(f))
            for f in gum.PrivateWeights._fields if f not in fields}))
        with tf.GradientTape() as tape:
            tape.watch(local_values)
            loss, total = loss_of(_rebuild(local_weights, local_values, fields), user_index, item_index,
                                  attributes, batch['label'])
        gradients = tuple(tf.convert_to_tensor(g) for g in tape.gradient(total, local_values))
        local_state, local_values = optimizer.next(local_state, local_values, gradients)
        new_state = collections.OrderedDict(
            (key, scatter(optimizer_state[key], local_state[key]) if key in per_weight else local_state[key])
            for key in optimizer_state)
        return scatter(values, tuple(local_values)), new_state, loss

    update = lazy_step if row_updates == 'lazy' else dense_step

    def step(carry, batch):
        values, optimizer_state, n, loss_sum, iterations = carry
        attributes = tf.gather(item_attributes, batch['item'])
        values, optimizer_state, loss = update(values, optimizer_state, batch, attributes)
        size = tf.shape(batch['label'])[0]
        return (values, optimizer_state, n + size, loss_sum + loss * tf.cast(size, tf.float32),
                iterations + tf.reduce_sum(tf.cast(attributes > 0, tf.float32), axis=0))

    initial = (values, initial_state, tf.constant(0, tf.int32), tf.constant(0.0),
               tf.zeros([config.num_attributes]))
    values, _, n, loss_sum, iterations = dataset.repeat(epochs).reduce(initial, step)
    return _rebuild(weights, values, fields), n, loss_sum, iterations


def validation_statistics(weights: gum.GumWeights, dataset: tf.data.Dataset, item_attributes: tf.Tensor,
                          config: gum.GumConfig):
    """Sums over `dataset`: ``(loss_sum, correct, num_examples, attribute_correct [K], attribute_count [K])``.

    A record counts for attribute k when its item has attribute k; Acc_k = attribute_correct / attribute_count.
    """
    k = config.num_attributes

    def step(carry, batch):
        loss_sum, right, n, attribute_right, attribute_count = carry
        attributes = tf.gather(item_attributes, batch['item'])
        prediction = gum.predict(weights, batch['user'], batch['item'], attributes)
        hits = gum.correct(prediction, batch['label'], config)
        has = tf.cast(attributes > 0, tf.float32)
        return (loss_sum + tf.reduce_sum(tf.square(prediction - batch['label'])), right + tf.reduce_sum(hits),
                n + tf.cast(tf.shape(hits)[0], tf.float32), attribute_right + tf.linalg.matvec(has, hits, True),
                attribute_count + tf.reduce_sum(has, axis=0))

    return dataset.reduce((tf.constant(0.0), tf.constant(0.0), tf.constant(0.0), tf.zeros([k]), tf.zeros([k])), step)


def client_round(data: ClientData, state: ClientState, optimizer: tff.learning.optimizers.Optimizer,
                 config: gum.GumConfig, *, epochs: int, proximal_center: Optional[gum.PublicWeights] = None,
                 proximal_strength: float = 0.0, start_public: Optional[gum.PublicWeights] = None,
                 row_updates: str = 'dense'):
    """Local training then validation statistics: ``(trained ClientState, ClientReport)`` (TF, shared by baselines).

    `start_public`, if given, replaces the client's public components before training (the FedAvg family);
    `row_updates` as in `local_training`.
    """
    weights = state.model
    if start_public is not None:
        weights = weights._replace(public=gum.PublicWeights(*[tf.identity(v) for v in start_public]))
    trained, n, loss_sum, iterations = local_training(
        weights, data.train, data.item_attributes, optimizer, config, epochs=epochs,
        proximal_center=proximal_center, proximal_strength=proximal_strength, row_updates=row_updates)
    val_loss, val_right, val_n, attribute_right, attribute_count = validation_statistics(
        trained, data.validation, data.item_attributes, config)
    report = ClientReport(
        public=trained.public, attribute_accuracy=tf.math.divide_no_nan(attribute_right, attribute_count),
        attribute_iterations=iterations, accuracy=tf.math.divide_no_nan(val_right, val_n),
        train_loss_sum=loss_sum, num_train_examples=tf.cast(n, tf.float32), validation_loss_sum=val_loss,
        validation_correct=val_right, num_validation_examples=val_n)
    return ClientState(model=trained, num_users=state.num_users, num_items=state.num_items), report


_METRIC_SUM_FIELDS = ('train_loss_sum', 'num_train_examples', 'validation_loss_sum', 'validation_correct',
                      'num_validation_examples')


def metric_sums(report: ClientReport) -> collections.OrderedDict:
    """The additive training statistics of a report (what clients upload for the metrics)."""
    return collections.OrderedDict((f, getattr(report, f)) for f in _METRIC_SUM_FIELDS)


def finalize_metrics(sums) -> collections.OrderedDict:
    """Mean train loss, validation loss and accuracy (of the locally trained models) from summed `metric_sums`."""
    return collections.OrderedDict(
        train_loss=tf.math.divide_no_nan(sums['train_loss_sum'], sums['num_train_examples']),
        validation_loss=tf.math.divide_no_nan(sums['validation_loss_sum'], sums['num_validation_examples']),
        validation_accuracy=tf.math.divide_no_nan(sums['validation_correct'], sums['num_validation_examples']),
        num_train_examples=sums['num_train_examples'], num_validation_examples=sums['num_validation_examples'])


# -------------------------------------------------------------------------------- HPFL aggregation and update
def public_aggregation_weights(attribute_accuracy, attribute_iterations, threshold: float):
    """``a_k = d(Acc_k, p) I_k Acc_k`` with ``d(x, p) = 1 if x > p else 0`` (``[K]``)."""
    passed = tf.cast(attribute_accuracy > threshold, tf.float32)
    return passed * attribute_iterations * attribute_accuracy


def personalize_public(local: gum.PublicWeights, global_public: gum.PublicWeights,
                       attribute_accuracy) -> gum.PublicWeights:
    """``c_k <- c_k Acc_k + c_k^g (1 - Acc_k)`` for every attribute k (row k of each public matrix)."""
    acc = attribute_accuracy[:, None]
    return gum.PublicWeights(*[acc * l + (1.0 - acc) * g for l, g in zip(local, global_public)])


def _squared_distances(points, centres):
    """``[n, m]`` squared Euclidean distances (expanded form, clipped at 0)."""
    d2 = (tf.reduce_sum(tf.square(points), 1)[:, None] - 2.0 * tf.matmul(points, centres, transpose_b=True)
          + tf.reduce_sum(tf.square(centres), 1)[None, :])
    return tf.maximum(d2, 0.0)


def global_embedding(embeddings, centres, centre_mask, weighting: str = 'distance'):
    """``Emb^g = sum_n w_n Theta_n / sum_m w_m`` per row over the valid centres (``[n, d]``).

    ``w_n = ||Emb - Theta_n||`` (``'distance'``, as published) or ``1 / ||Emb - Theta_n||``
    (``'inverse_distance'``, distances floored at 1e-6). A row whose weights sum to 0 (it coincides with every
    centre) gets ``Emb^g = Emb``.
    """
    if weighting not in CENTER_WEIGHTINGS:
        raise ValueError(f'center_weighting must be one of {CENTER_WEIGHTINGS}, got {weighting!r}.')
    distance = tf.sqrt(_squared_distances(embeddings, centres))
    mask = tf.cast(centre_mask, tf.float32)[None, :]
    weights = mask * (distance if weighting == 'distance' else 1.0 / tf.maximum(distance, _EPS))
    total = tf.reduce_sum(weights, axis=1, keepdims=True)
    return tf.where(total > 0, tf.math.divide_no_nan(tf.matmul(weights, centres), total), embeddings)


def personalize_embeddings(embeddings, row_mask, centres, centre_mask, accuracy, weighting: str = 'distance'):
    """``Emb_j <- Emb_j Acc + Emb^g (1 - Acc)`` for the rows where `row_mask` is set (others unchanged; all
    unchanged when there is no valid centre)."""
    blended = accuracy * embeddings + (1.0 - accuracy) * global_embedding(embeddings, centres, centre_mask, weighting)
    update = tf.logical_and(tf.cast(row_mask, tf.bool), tf.reduce_any(tf.cast(centre_mask, tf.bool)))
    return tf.where(update[:, None], blended, embeddings)


# ------------------------------------------------------------------------------------------------- k-means
def maximin_init(points, mask, num_clusters, max_clusters: int):
    """Deterministic k-means initialization: the valid point nearest the valid points' mean, then repeatedly the
    valid point farthest from the chosen ones (ties: lowest index).

    Args:
      points: float32 ``[n, d]``.
      mask: ``[n]`` (bool or 1/0) valid points.
      num_clusters: int32 scalar, the wanted number of clusters (capped to `max_clusters` and to the number of
        valid points).
      max_clusters: Static number of centre slots.

    Returns:
      ``(centres [max_clusters, d], centre_mask [max_clusters] float32)``; unused slots are zero and masked.
    """
    points = tf.convert_to_tensor(points, tf.float32)
    valid = tf.cast(mask, tf.bool)
    num_valid = tf.reduce_sum(tf.cast(valid, tf.int32))
    k = tf.minimum(tf.minimum(tf.cast(num_clusters, tf.int32), max_clusters), num_valid)
    fvalid = tf.cast(valid, tf.float32)[:, None]
    mean = tf.reduce_sum(points * fvalid, 0) / tf.maximum(tf.reduce_sum(fvalid), 1.0)
    inf = tf.constant(np.inf, tf.float32)
    to_mean = tf.where(valid, tf.reduce_sum(tf.square(points - mean), 1), inf)
    first = tf.argmin(to_mean, output_type=tf.int32)
    dim = tf.shape(points)[1]
    centres = tf.zeros([max_clusters, dim])
    centres = tf.where(k > 0, tf.tensor_scatter_nd_update(centres, [[0]], points[first][None]), centres)
    nearest = tf.where(valid, tf.reduce_sum(tf.square(points - points[first]), 1), -inf)

    def body(t, centres, nearest):
        chosen = tf.argmax(nearest, output_type=tf.int32)
        take = t < k
        centres = tf.where(take, tf.tensor_scatter_nd_update(centres, [[t]], points[chosen][None]), centres)
        nearest = tf.where(take, tf.minimum(nearest, tf.reduce_sum(tf.square(points - points[chosen]), 1)), nearest)
        return t + 1, centres, nearest

    _, centres, _ = tf.while_loop(lambda t, *_: t < max_clusters, body, (tf.constant(1), centres, nearest))
    return centres, tf.cast(tf.range(max_clusters) < k, tf.float32)


def lloyd_step(points, mask, centres, centre_mask):
    """One Lloyd iteration: assign each valid point to its nearest valid centre, move each valid centre to the mean
    of its points (an empty cluster keeps its centre). Returns ``(centres, assignment [n] int32)``."""
    points = tf.convert_to_tensor(points, tf.float32)
    valid_centre = tf.cast(centre_mask, tf.bool)
    d2 = tf.where(valid_centre[None, :], _squared_distances(points, centres), np.inf)
    assignment = tf.argmin(d2, axis=1, output_type=tf.int32)
    members = tf.one_hot(assignment, tf.shape(centres)[0]) * tf.cast(mask, tf.float32)[:, None]
    counts = tf.reduce_sum(members, 0)
    means = tf.matmul(members, points, transpose_a=True) / tf.maximum(counts, 1.0)[:, None]
    moved = tf.logical_and(counts > 0, valid_centre)
    return tf.where(moved[:, None], means, centres), assignment


def kmeans(points, mask, num_clusters, max_clusters: int, iterations: int = 10):
    """`maximin_init` then `iterations` `lloyd_step`s. Returns ``(centres, centre_mask, assignment)``."""
    centres, centre_mask = maximin_init(points, mask, num_clusters, max_clusters)
    assignment = tf.zeros([tf.shape(points)[0]], tf.int32)
    for _ in range(iterations):
        centres, assignment = lloyd_step(points, mask, centres, centre_mask)
    return centres, centre_mask, assignment


def _num_clusters(num_points, divisor: int, maximum: int):
    """``min(num_points // divisor + 1, maximum)``, 0 without points."""
    num_points = tf.cast(num_points, tf.int32)
    return tf.where(num_points > 0, tf.minimum(num_points // divisor + 1, maximum), 0)


# ----------------------------------------------------------------------------------------------- the process
class HpflProcess(tff.templates.IterativeProcess):
    """The HPFL iterative process plus its parts (for tests, audits and the experiment).

    Attributes:
      config: The `gum.GumConfig`.
      client_data_type, client_state_type: TFF types of a `ClientData` and a `ClientState`.
      client_train: TF computation ``(ClientData, ClientState) -> (ClientState, ClientReport)`` (upload phase).
      client_centres: TF computation ``ClientState -> Centres`` (None without ``aggregate_private``).
      client_update: TF computation ``(GlobalComponents, ClientState, ClientReport) -> ClientState``.
      round_from_uploads: Federated computation ``(HpflState@S, {ClientState}@C, {ClientReport}@C,
        {Centres}@C) -> HpflOutput``: everything after the client upload phase (``next`` = client_train,
        client_centres, then this).
      public_aggregation: Federated computation ``(PublicWeights@S, {PublicWeights}@C, {[K]}@C, {[K]}@C) ->
        PublicWeights@S``: the public aggregation formula (previous global, client c_i, Acc_i, I_i), the same code
        `next` runs.
    """

    def __init__(self, initialize_fn, next_fn, *, config, client_data_type, client_state_type, client_train,
                 client_centres, client_update, round_from_uploads, public_aggregation, options):
        super().__init__(initialize_fn, next_fn)
        self.config = config
        self.client_data_type = client_data_type
        self.client_state_type = client_state_type
        self.client_train = client_train
        self.client_centres = client_centres
        self.client_update = client_update
        self.round_from_uploads = round_from_uploads
        self.public_aggregation = public_aggregation
        self.options = options

    def initial_client_state(self, num_users: int, num_items: int, *, private_seed: int = 0) -> ClientState:
        """A client's first state (public part equal to the initial global components)."""
        return initial_client_state(self.config, num_users, num_items, public_seed=self.options['public_seed'],
                                    private_seed=private_seed)

    def get_public_weights(self, state: HpflState) -> gum.PublicWeights:
        """The global public components c^g in `state`."""
        return state.global_components.public


def build_hpfl(
    config: gum.GumConfig,
    *,
    client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    client_epochs: int = 1,
    accuracy_threshold: float = 0.5,
    center_weighting: str = 'distance',
    aggregate_public: bool = True,
    aggregate_private: bool = True,
    max_clients: int = 64,
    max_local_clusters: int = 32,
    local_cluster_divisor: int = 5,
    max_global_clusters: int = 64,
    global_cluster_divisor: int = 10,
    kmeans_iterations: int = 10,
    public_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    public_seed: int = 0,
    row_updates: str = 'dense',
) -> HpflProcess:
    """Builds HPFL (or HPFL-K / HPFL-R / Distributed with the two switches); see the module docstring.

    Args:
      config: The GUM config (`gum.GumConfig.for_data`).
      client_optimizer: Local optimizer (default Adam, learning rate 0.01); its state restarts every round.
      client_epochs: Local epochs per round (k).
      accuracy_threshold: p of ``d(Acc_ki, p)``. Acc is the task's accuracy (binary: thresholded at 0.5; rating:
        the rounded rating is right, typically about 0.4 on MovieLens), so p must lie below the clients' typical
        per-attribute accuracy or no attribute is aggregated (``metrics['attributes_aggregated']`` shows it).
      center_weighting: ``'distance'`` (published, default) or ``'inverse_distance'``.
      aggregate_public: Aggregate and personalize the public components (off: HPFL-R).
      aggregate_private: Cluster and personalize the private components (off: HPFL-K).
      max_clients: Capacity of the server's centre collection (the number of participating clients must not
        exceed it; extra uploads are dropped and counted in ``metrics['dropped_centre_uploads']``).
      max_local_clusters: Static cap of a client's clusters (per table).
      local_cluster_divisor: A client with n users (items) uses ``min(n // divisor + 1, max_local_clusters)``.
      max_global_clusters: Static cap of the global clusters (per table).
      global_cluster_divisor: N = ``min(total // divisor + 1, max_global_clusters)`` for `total` uploaded centres.
      kmeans_iterations: Lloyd iterations of every k-means.
      public_sum_factory: `tff.aggregators` factory summing the clients' weighted public uploads (default
        `tff.aggregators.SumFactory()`).
      public_seed: Seed of the initial public components (clients' initial states must use the same one:
        `HpflProcess.initial_client_state`).
      row_updates: ``'dense'`` (default: the optimizer steps the full padded tables) or ``'lazy'`` (each local
        step updates only the table rows its batch touches, lazy Adam); see `local_training`.

    Returns:
      An `HpflProcess`.
    """
    if client_epochs < 1:
        raise ValueError(f'client_epochs must be >= 1, got {client_epochs}.')
    if center_weighting not in CENTER_WEIGHTINGS:
        raise ValueError(f'center_weighting must be one of {CENTER_WEIGHTINGS}, got {center_weighting!r}.')
    for name, value in (('max_clients', max_clients), ('max_local_clusters', max_local_clusters),
                        ('local_cluster_divisor', local_cluster_divisor), ('max_global_clusters', max_global_clusters),
                        ('global_cluster_divisor', global_cluster_divisor)):
        if value < 1:
            raise ValueError(f'{name} must be >= 1, got {value}.')
    if kmeans_iterations < 0:
        raise ValueError(f'kmeans_iterations must be >= 0, got {kmeans_iterations}.')
    if not 0.0 <= accuracy_threshold < 1.0:
        raise ValueError(f'accuracy_threshold must be in [0, 1), got {accuracy_threshold}.')
    if row_updates not in ROW_UPDATES:
        raise ValueError(f'row_updates must be one of {ROW_UPDATES}, got {row_updates!r}.')
    optimizer = client_optimizer or tff.learning.optimizers.build_adam(learning_rate=0.01)
    k, dim = config.num_attributes, config.num_attributes
    data_type = client_data_type(config)
    state_type = client_state_type(config)
    public_type = state_type.model.public

    @tff.tensorflow.computation
    def initial_global():
        public = gum.initial_public(config, public_seed)
        return GlobalComponents(public=public, user_centres=tf.zeros([max_global_clusters, dim]),
                                user_mask=tf.zeros([max_global_clusters]),
                                item_centres=tf.zeros([max_global_clusters, dim]),
                                item_mask=tf.zeros([max_global_clusters]))

    global_type = initial_global.type_signature.result

    # ------------------------------------------------------------------ client upload phase
    @tff.tensorflow.computation(data_type, state_type)
    def client_train(data, state):
        return client_round(data, state, optimizer, config, epochs=client_epochs, row_updates=row_updates)

    report_type = client_train.type_signature.result[1]

    @tff.tensorflow.computation(state_type)
    def client_centres(state):
        private = state.model.private
        users = tf.range(config.max_users) < state.num_users
        items = tf.range(config.max_items) < state.num_items
        user_centres, user_mask, _ = kmeans(
            private.theta, users, _num_clusters(state.num_users, local_cluster_divisor, max_local_clusters),
            max_local_clusters, kmeans_iterations)
        item_centres, item_mask, _ = kmeans(
            private.difficulty, items, _num_clusters(state.num_items, local_cluster_divisor, max_local_clusters),
            max_local_clusters, kmeans_iterations)
        return Centres(user_centres, user_mask, item_centres, item_mask)

    centres_type = client_centres.type_signature.result

    # ------------------------------------------------------------------ server: public components
    @tff.tensorflow.computation(public_type, report_type.attribute_accuracy, report_type.attribute_iterations)
    def weighted_public_upload(public, attribute_accuracy, attribute_iterations):
        weight = public_aggregation_weights(attribute_accuracy, attribute_iterations, accuracy_threshold)
        return gum.PublicWeights(*[weight[:, None] * c for c in public]), weight

    sum_factory = public_sum_factory or tff.aggregators.SumFactory()
    public_sum = sum_factory.create(weighted_public_upload.type_signature.result)

    @tff.tensorflow.computation(public_type, weighted_public_upload.type_signature.result)
    def server_public_update(previous, summed):
        weighted, weight = summed
        has = (weight > 0)[:, None]
        new = gum.PublicWeights(*[tf.where(has, tf.math.divide_no_nan(s, weight[:, None]), p)
                                  for s, p in zip(weighted, previous)])
        return new, tf.reduce_sum(tf.cast(weight > 0, tf.int32))

    def aggregate_public_values(aggregator_state, previous, public, attribute_accuracy, attribute_iterations):
        uploads = tff.federated_map(weighted_public_upload, (public, attribute_accuracy, attribute_iterations))
        summed = public_sum.next(aggregator_state, uploads)
        new_public, num_aggregated = tff.federated_map(server_public_update, (previous, summed.result))
        return new_public, num_aggregated, summed.state

    @tff.federated_computation(tff.FederatedType(public_type, tff.SERVER), tff.FederatedType(public_type, tff.CLIENTS),
                               tff.FederatedType(report_type.attribute_accuracy, tff.CLIENTS),
                               tff.FederatedType(report_type.attribute_iterations, tff.CLIENTS))
    def aggregate_public_computation(previous, public, attribute_accuracy, attribute_iterations):
        new_public, _, _ = aggregate_public_values(public_sum.initialize(), previous, public, attribute_accuracy,
                                                   attribute_iterations)
        return new_public

    # ------------------------------------------------------------------ server: private components
    capacity = max_clients * max_local_clusters

    @tff.tensorflow.computation
    def empty_collection():
        return (tf.zeros([capacity, dim]), tf.zeros([capacity]), tf.zeros([capacity, dim]), tf.zeros([capacity]),
                tf.constant(0), tf.constant(0))

    collection_type = empty_collection.type_signature.result

    def _slots(buffer):
        return tf.reshape(buffer, tf.concat([[max_clients, max_local_clusters], tf.shape(buffer)[1:]], 0))

    @tff.tensorflow.computation(collection_type, centres_type)
    def accumulate(collection, centres):
        *buffers, count, dropped = collection
        fits = count < max_clients
        slot = tf.minimum(count, max_clients - 1)
        values = (centres.user_centres, centres.user_mask, centres.item_centres, centres.item_mask)
        buffers = [tf.where(fits, tf.reshape(tf.tensor_scatter_nd_update(_slots(b), [[slot]], v[None]), tf.shape(b)), b)
                   for b, v in zip(buffers, values)]
        return (*buffers, count + tf.cast(fits, tf.int32), dropped + 1 - tf.cast(fits, tf.int32))

    @tff.tensorflow.computation(collection_type, collection_type)
    def merge(a, b):
        *a_buffers, a_count, a_dropped = a
        *b_buffers, b_count, b_dropped = b
        source = tf.range(max_clients)
        target = a_count + source
        keep = tf.logical_and(source < b_count, target < max_clients)
        indices = tf.boolean_mask(target, keep)[:, None]
        buffers = [tf.reshape(tf.tensor_scatter_nd_update(_slots(x), indices, tf.boolean_mask(_slots(y), keep)),
                              tf.shape(x)) for x, y in zip(a_buffers, b_buffers)]
        total = a_count + b_count
        return (*buffers, tf.minimum(total, max_clients), a_dropped + b_dropped + tf.maximum(total - max_clients, 0))

    @tff.tensorflow.computation(collection_type)
    def report_collection(collection):
        return collection

    @tff.tensorflow.computation(global_type, collection_type)
    def server_cluster(previous, collection):
        user_points, user_valid, item_points, item_valid, count, dropped = collection

        def cluster(points, valid, old_centres, old_mask):
            num = tf.reduce_sum(tf.cast(valid > 0, tf.int32))
            wanted = _num_clusters(num, global_cluster_divisor, max_global_clusters)
            centres, mask, _ = kmeans(points, valid > 0, wanted, max_global_clusters, kmeans_iterations)
            return tf.where(num > 0, centres, old_centres), tf.where(num > 0, mask, old_mask), num

        user_centres, user_mask, num_user = cluster(user_points, user_valid, previous.user_centres, previous.user_mask)
        item_centres, item_mask, num_item = cluster(item_points, item_valid, previous.item_centres, previous.item_mask)
        new = previous._replace(user_centres=user_centres, user_mask=user_mask, item_centres=item_centres,
                                item_mask=item_mask)
        measurements = collections.OrderedDict(
            uploaded_user_centres=num_user, uploaded_item_centres=num_item,
            global_user_clusters=tf.reduce_sum(tf.cast(user_mask, tf.int32)),
            global_item_clusters=tf.reduce_sum(tf.cast(item_mask, tf.int32)), dropped_centre_uploads=dropped)
        return new, measurements

    # ------------------------------------------------------------------ client update phase
    @tff.tensorflow.computation(global_type, state_type, report_type)
    def client_update(global_components, state, report):
        model = state.model
        public, private = model.public, model.private
        if aggregate_public:
            public = personalize_public(public, global_components.public, report.attribute_accuracy)
        if aggregate_private:
            users = tf.range(config.max_users) < state.num_users
            items = tf.range(config.max_items) < state.num_items
            private = private._replace(
                theta=personalize_embeddings(private.theta, users, global_components.user_centres,
                                             global_components.user_mask, report.accuracy, center_weighting),
                difficulty=personalize_embeddings(private.difficulty, items, global_components.item_centres,
                                                  global_components.item_mask, report.accuracy, center_weighting))
        return state._replace(model=gum.GumWeights(public=public, private=private))

    @tff.tensorflow.computation(global_type, public_type)
    def with_public(global_components, public):
        return global_components._replace(public=public)

    @tff.tensorflow.computation(tff.TensorType(np.int32))
    def increment(round_num):
        return round_num + 1

    @tff.tensorflow.computation(_struct_type(lambda: collections.OrderedDict(
        (f, tf.constant(0.0)) for f in _METRIC_SUM_FIELDS)))
    def finalize(sums):
        return finalize_metrics(sums)

    @tff.tensorflow.computation(report_type)
    def client_metric_sums(report):
        return metric_sums(report)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(HpflState(
            global_components=tff.federated_eval(initial_global, tff.SERVER),
            aggregator=public_sum.initialize(),
            round_num=tff.federated_value(np.int32(0), tff.SERVER)))

    server_state_type = initialize.type_signature.result

    def server_and_update(state, trained, reports, centres):
        """Everything after the upload phase (traced inside federated computations)."""
        global_components = state.global_components
        measurements = collections.OrderedDict()
        aggregator_state = state.aggregator
        if aggregate_public:
            new_public, num_aggregated, aggregator_state = aggregate_public_values(
                state.aggregator, global_components.public, reports.public, reports.attribute_accuracy,
                reports.attribute_iterations)
            measurements['attributes_aggregated'] = num_aggregated
            global_components = tff.federated_map(with_public, (global_components, new_public))
        if aggregate_private:
            collection = tff.federated_aggregate(centres, empty_collection(), accumulate, merge, report_collection)
            global_components, cluster_measurements = tff.federated_map(server_cluster, (global_components, collection))
            measurements['clustering'] = cluster_measurements
        if aggregate_public or aggregate_private:
            broadcast = tff.federated_broadcast(global_components)
            new_states = tff.federated_map(client_update, (broadcast, trained, reports))
        else:
            new_states = trained
        train_metrics = tff.federated_map(finalize, tff.federated_sum(tff.federated_map(client_metric_sums, reports)))
        new_state = tff.federated_zip(HpflState(global_components=global_components, aggregator=aggregator_state,
                                                round_num=tff.federated_map(increment, state.round_num)))
        metrics = tff.federated_zip(collections.OrderedDict(client_work=train_metrics, **measurements))
        return HpflOutput(state=new_state, metrics=metrics, private_states=new_states)

    @tff.federated_computation(server_state_type, tff.FederatedType(state_type, tff.CLIENTS),
                               tff.FederatedType(report_type, tff.CLIENTS),
                               tff.FederatedType(centres_type, tff.CLIENTS))
    def round_from_uploads(state, trained, reports, centres):
        return server_and_update(state, trained, reports, centres)

    @tff.federated_computation(server_state_type, tff.FederatedType(data_type, tff.CLIENTS),
                               tff.FederatedType(state_type, tff.CLIENTS))
    def next_fn(state, client_data_values, client_states):
        trained, reports = tff.federated_map(client_train, (client_data_values, client_states))
        centres = tff.federated_map(client_centres, trained) if aggregate_private else None
        return server_and_update(state, trained, reports, centres)

    return HpflProcess(
        initialize, next_fn, config=config, client_data_type=data_type, client_state_type=state_type,
        client_train=client_train, client_centres=client_centres if aggregate_private else None,
        client_update=client_update, round_from_uploads=round_from_uploads,
        public_aggregation=aggregate_public_computation,
        options=dict(aggregate_public=aggregate_public, aggregate_private=aggregate_private,
                     center_weighting=center_weighting, accuracy_threshold=accuracy_threshold,
                     public_seed=public_seed, client_epochs=client_epochs))


# -------------------------------------------------------------------------------------------------- evaluation
@functools.lru_cache(maxsize=8)
def _prediction_computation(config: gum.GumConfig):
    state_type = client_state_type(config)
    eval_type = tff.to_type((tff.SequenceType(batch_type()),
                             tff.TensorType(np.float32, [config.max_items, config.num_attributes])))

    @tff.tensorflow.computation(state_type, eval_type)
    def predict_client(state, data):
        dataset, attributes = data

        def step(predictions, batch):
            prediction = gum.predict(state.model, batch['user'], batch['item'], tf.gather(attributes, batch['item']))
            return tf.concat([predictions, prediction], 0)

        return dataset.reduce(tf.zeros([0]), step)

    @tff.federated_computation(tff.FederatedType(state_type, tff.CLIENTS), tff.FederatedType(eval_type, tff.CLIENTS))
    def predict_all(states, data):
        return tff.federated_map(predict_client, (states, data))

    return predict_all


def predict_silos(config: gum.GumConfig, client_states: Sequence[ClientState], data: Any, *, split: str = 'test',
                  batch_size: int = 256) -> list[SiloPredictions]:
    """Every silo's predictions on one split with its own client state (each silo computes on its own data).

    Args:
      config: The model config.
      client_states: One `ClientState` per silo of `data`, in silo order.
      data: The `UserModelingData`.
      split: 'train', 'validation' or 'test'.
      batch_size: Evaluation batch size.

    Returns:
      One `SiloPredictions` per silo, on the original label scale (ratings mapped back with `gum.from_unit`).
    """
    if len(client_states) != len(data.silos):
        raise ValueError(f'{data.name}: {len(client_states)} client states for {len(data.silos)} silos.')
    inputs = []
    for silo in data.silos:
        _check_silo(silo, config, data.name)
        attributes = np.zeros([config.max_items, config.num_attributes], np.float32)
        attributes[:silo.num_items] = np.asarray(silo.item_attributes, np.float32)
        inputs.append((split_dataset(silo, config, split, batch_size=batch_size), attributes))
    outputs = _prediction_computation(config)(list(client_states), inputs)
    results = []
    for silo, prediction in zip(data.silos, outputs):
        keep = np.asarray(silo.split) == SPLITS[split]
        results.append(SiloPredictions(
            client_id=silo.client_id, user=np.asarray(silo.user)[keep], item=np.asarray(silo.item)[keep],
            label=np.asarray(silo.label, np.float32)[keep],
            prediction=np.asarray(gum.from_unit(np.asarray(prediction, np.float32), config.rating_range), np.float32)))
    return results
