"""Local work of a GUM client: training epochs (dense or lazy row updates), FedSGD's gradient pass, validation
statistics and the additive training metrics every process of the family reports."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl.types import ROW_UPDATES
from fedpersonal.algorithms.hpfl.types import ClientData
from fedpersonal.algorithms.hpfl.types import ClientReport
from fedpersonal.algorithms.hpfl.types import ClientState
from fedpersonal.core import client_work
from fedpersonal.models import gum


def _trainable(weights: gum.GumWeights, fields: Sequence[str]) -> tuple:
    return tuple(weights.public) + tuple(getattr(weights.private, f) for f in fields)


def _rebuild(weights: gum.GumWeights, values: Sequence[tf.Tensor], fields: Sequence[str]) -> gum.GumWeights:
    public = gum.PublicWeights(*values[:3])
    return gum.GumWeights(public=public, private=weights.private._replace(**dict(zip(fields, values[3:]))))


def _per_weight_state_keys(optimizer_state, specs: Sequence[tf.TensorSpec]) -> tuple[str, ...]:
    """Keys of a `tff.learning.optimizers` state whose values hold one tensor per weight (Adam's moments, ...)."""
    keys = []
    for key, value in optimizer_state.items():
        if (
            isinstance(value, (tuple, list))
            and len(value) == len(specs)
            and all(tf.TensorShape(getattr(v, 'shape', ())) == spec.shape for v, spec in zip(value, specs))
        ):
            keys.append(key)
    return tuple(keys)


def local_training(
    weights: gum.GumWeights,
    dataset: tf.data.Dataset,
    item_attributes: tf.Tensor,
    optimizer: tff.learning.optimizers.Optimizer,
    config: gum.GumConfig,
    *,
    epochs: int = 1,
    proximal_center: gum.PublicWeights | None = None,
    proximal_strength: float = 0.0,
    row_updates: str = 'dense',
):
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
    Measured (`benchmarks/hpfl_row_updates.py`, docs/ENGINE.md): at ASSIST's table sizes (10,745 padded item
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

    def loss_of(current, user, item, attributes, label, mask):
        loss = gum.mse_loss(current, user, item, attributes, label, mask)
        total = loss
        if proximal_center is not None and proximal_strength > 0:
            total += (
                0.5
                * proximal_strength
                * tf.add_n([tf.reduce_sum(tf.square(a - b)) for a, b in zip(current.public, proximal_center)])
            )
        return loss, total

    def dense_step(values, optimizer_state, batch, attributes, mask):
        with tf.GradientTape() as tape:
            tape.watch(values)
            loss, total = loss_of(
                _rebuild(weights, values, fields), batch['user'], batch['item'], attributes, batch['label'], mask
            )
        gradients = tuple(tf.convert_to_tensor(g) for g in tape.gradient(total, values))
        optimizer_state, values = optimizer.next(optimizer_state, values, gradients)
        return tuple(values), optimizer_state, loss

    def lazy_step(values, optimizer_state, batch, attributes, mask):
        users, user_index = tf.unique(batch['user'])
        items, item_index = tf.unique(batch['item'])
        rows_of = lambda field: users if field == 'theta' else items  # Every other private table is per item.
        rows = (None,) * num_public + tuple(rows_of(field) for field in fields)

        def gather(tensors):
            return tuple(t if r is None else tf.gather(t, r) for t, r in zip(tensors, rows))

        def scatter(tensors, updates):
            return tuple(
                u if r is None else tf.tensor_scatter_nd_update(t, r[:, None], u)
                for t, u, r in zip(tensors, updates, rows)
            )

        local_values = gather(values)
        local_state = collections.OrderedDict(
            (key, gather(value) if key in per_weight else value) for key, value in optimizer_state.items()
        )
        # The non-trained private fields (discrimination without use_discrimination) are read at the same rows.
        local_weights = weights._replace(
            private=weights.private._replace(
                **{
                    f: tf.gather(getattr(weights.private, f), rows_of(f))
                    for f in gum.PrivateWeights._fields
                    if f not in fields
                }
            )
        )
        with tf.GradientTape() as tape:
            tape.watch(local_values)
            loss, total = loss_of(
                _rebuild(local_weights, local_values, fields), user_index, item_index, attributes, batch['label'], mask
            )
        gradients = tuple(tf.convert_to_tensor(g) for g in tape.gradient(total, local_values))
        local_state, local_values = optimizer.next(local_state, local_values, gradients)
        new_state = collections.OrderedDict(
            (key, scatter(optimizer_state[key], local_state[key]) if key in per_weight else local_state[key])
            for key in optimizer_state
        )
        return scatter(values, tuple(local_values)), new_state, loss

    update = lazy_step if row_updates == 'lazy' else dense_step

    def step(values, optimizer_state, batch):
        attributes = tf.gather(item_attributes, batch['item'])
        mask = client_work.batch_mask(batch, batch['label'])
        values, optimizer_state, loss = update(values, optimizer_state, batch, attributes, mask)
        iterations = tf.linalg.matvec(tf.cast(attributes > 0, tf.float32), mask, transpose_a=True)
        return values, optimizer_state, client_work.BatchLoss(loss, tf.reduce_sum(mask), iterations)

    values, _, result = client_work.functional_steps(
        values, initial_state, dataset, step, epochs=epochs, zero_stats=tf.zeros([config.num_attributes])
    )
    n, loss_sum, iterations = result.num_examples, result.loss_sum, result.stats
    return _rebuild(weights, values, fields), n, loss_sum, iterations


def validation_statistics(
    weights: gum.GumWeights, dataset: tf.data.Dataset, item_attributes: tf.Tensor, config: gum.GumConfig
):
    """Sums over `dataset`: ``(loss_sum, correct, num_examples, attribute_correct [K], attribute_count [K])``.

    A record counts for attribute k when its item has attribute k; Acc_k = attribute_correct / attribute_count.
    """
    k = config.num_attributes

    def step(carry, batch):
        loss_sum, right, n, attribute_right, attribute_count = carry
        attributes = tf.gather(item_attributes, batch['item'])
        mask = client_work.batch_mask(batch, batch['label'])
        prediction = gum.predict(weights, batch['user'], batch['item'], attributes)
        hits = gum.correct(prediction, batch['label'], config) * mask
        has = tf.cast(attributes > 0, tf.float32)
        return (
            loss_sum + tf.reduce_sum(mask * tf.square(prediction - batch['label'])),
            right + tf.reduce_sum(hits),
            n + tf.reduce_sum(mask),
            attribute_right + tf.linalg.matvec(has, hits, True),
            attribute_count + tf.linalg.matvec(has, mask, True),
        )

    initial = (tf.constant(0.0), tf.constant(0.0), tf.constant(0.0), tf.zeros([k]), tf.zeros([k]))
    return client_work.reduce_batches(dataset, initial, step)


def client_round(
    data: ClientData,
    state: ClientState,
    optimizer: tff.learning.optimizers.Optimizer,
    config: gum.GumConfig,
    *,
    epochs: int,
    proximal_center: gum.PublicWeights | None = None,
    proximal_strength: float = 0.0,
    start_public: gum.PublicWeights | None = None,
    row_updates: str = 'dense',
):
    """Local training then validation statistics: ``(trained ClientState, ClientReport)`` (TF, shared by baselines).

    `start_public`, if given, replaces the client's public components before training (the FedAvg family);
    `row_updates` as in `local_training`.
    """
    weights = state.model
    if start_public is not None:
        weights = weights._replace(public=gum.PublicWeights(*[tf.identity(v) for v in start_public]))
    trained, n, loss_sum, iterations = local_training(
        weights,
        data.train,
        data.item_attributes,
        optimizer,
        config,
        epochs=epochs,
        proximal_center=proximal_center,
        proximal_strength=proximal_strength,
        row_updates=row_updates,
    )
    val_loss, val_right, val_n, attribute_right, attribute_count = validation_statistics(
        trained, data.validation, data.item_attributes, config
    )
    report = ClientReport(
        public=trained.public,
        attribute_accuracy=tf.math.divide_no_nan(attribute_right, attribute_count),
        attribute_iterations=iterations,
        accuracy=tf.math.divide_no_nan(val_right, val_n),
        train_loss_sum=loss_sum,
        num_train_examples=tf.cast(n, tf.float32),
        validation_loss_sum=val_loss,
        validation_correct=val_right,
        num_validation_examples=val_n,
    )
    return ClientState(model=trained, num_users=state.num_users, num_items=state.num_items), report


_METRIC_SUM_FIELDS = (
    'train_loss_sum',
    'num_train_examples',
    'validation_loss_sum',
    'validation_correct',
    'num_validation_examples',
)


def metric_sums(report: ClientReport) -> collections.OrderedDict:
    """The additive training statistics of a report (what clients upload for the metrics)."""
    return collections.OrderedDict((f, getattr(report, f)) for f in _METRIC_SUM_FIELDS)


def finalize_metrics(sums) -> collections.OrderedDict:
    """Mean train loss, validation loss and accuracy (of the locally trained models) from summed `metric_sums`."""
    return collections.OrderedDict(
        train_loss=tf.math.divide_no_nan(sums['train_loss_sum'], sums['num_train_examples']),
        validation_loss=tf.math.divide_no_nan(sums['validation_loss_sum'], sums['num_validation_examples']),
        validation_accuracy=tf.math.divide_no_nan(sums['validation_correct'], sums['num_validation_examples']),
        num_train_examples=sums['num_train_examples'],
        num_validation_examples=sums['num_validation_examples'],
    )


def _add_scaled(total, gradient, scale):
    """``total + scale * gradient``; an `IndexedSlices` gradient (a table's batch rows) is scattered, O(batch)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.tensor_scatter_nd_add(total, gradient.indices[:, None], scale * gradient.values)
    return total + scale * tf.convert_to_tensor(gradient)


def gradient_round(global_public, data: ClientData, state: ClientState, optimizer, config: gum.GumConfig):
    """FedSGD's client work: one pass of gradients at (global public, own private), one optimizer step on the private
    components, and the mean gradient of the public ones.

    Returns:
      ``(trained ClientState, ClientReport, public mean gradient)``; I_k counts each training record once.
    """
    fields = gum.trainable_private_fields(config)
    weights = state.model._replace(public=gum.PublicWeights(*global_public))
    public = tuple(weights.public)
    private = tuple(getattr(weights.private, f) for f in fields)

    def step(carry, batch):
        public_sum, private_sum, n, loss_sum, iterations = carry
        attributes = tf.gather(data.item_attributes, batch['item'])
        mask = client_work.batch_mask(batch, batch['label'])
        with tf.GradientTape() as tape:
            tape.watch((public, private))
            current = gum.GumWeights(gum.PublicWeights(*public), weights.private._replace(**dict(zip(fields, private))))
            loss = gum.mse_loss(current, batch['user'], batch['item'], attributes, batch['label'], mask)
        public_grads, private_grads = tape.gradient(loss, (public, private))
        size = tf.reduce_sum(mask)
        return (
            tuple(s + size * tf.convert_to_tensor(g) for s, g in zip(public_sum, public_grads)),
            tuple(_add_scaled(s, g, size) for s, g in zip(private_sum, private_grads)),
            n + size,
            loss_sum + size * loss,
            iterations + tf.linalg.matvec(tf.cast(attributes > 0, tf.float32), mask, transpose_a=True),
        )

    zeros = lambda values: tuple(tf.zeros_like(v) for v in values)
    initial = (zeros(public), zeros(private), tf.constant(0.0), tf.constant(0.0), tf.zeros([config.num_attributes]))
    public_sum, private_sum, n, loss_sum, iterations = client_work.reduce_batches(data.train, initial, step)
    public_grad = [tf.math.divide_no_nan(s, n) for s in public_sum]
    private_grad = tuple(tf.math.divide_no_nan(s, n) for s in private_sum)
    optimizer_state = optimizer.initialize(tuple(tf.TensorSpec(v.shape, v.dtype) for v in private))
    _, private = optimizer.next(optimizer_state, private, private_grad)
    trained = weights._replace(private=weights.private._replace(**dict(zip(fields, private))))
    val_loss, val_right, val_n, attribute_right, attribute_count = validation_statistics(
        trained, data.validation, data.item_attributes, config
    )
    report = ClientReport(
        public=trained.public,
        attribute_accuracy=tf.math.divide_no_nan(attribute_right, attribute_count),
        attribute_iterations=iterations,
        accuracy=tf.math.divide_no_nan(val_right, val_n),
        train_loss_sum=loss_sum,
        num_train_examples=n,
        validation_loss_sum=val_loss,
        validation_correct=val_right,
        num_validation_examples=val_n,
    )
    return state._replace(model=trained), report, public_grad
