"""The client-work library's local loop for a group of logical clients in lockstep, as one compiled program.

`lockstep_steps` is `fedpersonal.core.client_work.optimizer_steps` for a whole group: the same optimizer step
per batch, the same batch loss (the model's loss on the batch plus its regularization losses, plus an optional
penalty), the same example counts; but every client's weights are stacked on a leading axis and one step of
all clients is one vectorized call (`tf.vectorized_map` over the model as a pure function of its weights,
`fedpersonal.simulation.functional`). The steps are a `tf.while_loop` (an unrolled loop costs tens of seconds
of XLA compilation), and the loop runs as many steps as the group's longest client. Compiled with XLA (static
shapes), every client steps every time and a shorter client's extra steps have an all-zero example mask, hence
a zero loss and no update; without XLA a step gathers only the clients that still have a batch and scatters
their new weights back (measured on the NWP round, clients of 1 to 4 steps: median 0.35 -> 0.29 s per round).

What made it fast (measured on the MovieLens MF round, see docs/RESULTS.md):

* a weight is either *shared* by the group (its rank is the model's; e.g. the received globals while only
  the local variables train) or *per client* (one more leading axis); only trained weights are per client;
* gradients of embedding lookups (`tf.IndexedSlices`) leave the vectorized function as values and row
  indices and are applied with one batched scatter for the whole group (plain SGD); a dense per-client table
  update is 4-6x slower, and a scatter inside `vectorized_map` falls back to a loop;
* the whole loop is compiled with XLA (`jit_compile=True`) where that pays (`FunctionalModel.xla`: not for
  recurrent or convolutional models, which XLA's CPU backend ran 2.5-5x slower).

Padded examples (a batch smaller than the group's batch size, an empty slot) carry mask 0 and zero-filled
features and labels: the loss is reduced over the batch's real examples only (`masked_loss`), and metrics
are updated with the mask as sample weight (a metric that ignores sample weights must skip zero labels, as
the next-word accuracies skip the pad token).

Models that are not one Keras model's forward pass and loss (e.g. FedDVA's phases of a dual VAE) give their
own per-client batch loss (`client_loss`, on the model rebuilt from the client's weights with
`FunctionalModel.rebuild`), per-step inputs (`step_inputs`, e.g. precomputed noise) and statistics read after
each step (`after_step`). Weights a model updates itself while training (batch norm moving statistics,
`FunctionalModel.stateful_slots`) are carried per client from step to step, and change only on a client's real
steps, as the per-client path assigns them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.optimizers import sgdm

from fedpersonal import errors
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import functional

Slot = functional.Slot  # (group, index) of a weight in `functional.Parts`.
# (trained, centre, one client's batch, its example mask) -> scalar
Penalty = Callable[[list[tf.Tensor], list[tf.Tensor], Any, tf.Tensor], tf.Tensor]
# (one client's weights, batch, example mask, step input) -> (batch loss, {slot: updated stateful weight})
ClientLoss = Callable[[functional.Parts, Any, tf.Tensor, Any], tuple[tf.Tensor, dict[Slot, tf.Tensor]]]
# (one client's weights after the step, batch, example mask, step input) -> scalar statistics to sum
AfterStep = Callable[[functional.Parts, Any, tf.Tensor, Any], Any]


class GroupSteps(NamedTuple):
    """Per-client sums over the batches a group's clients processed.

    Attributes:
      num_examples: ``[clients]`` float32.
      loss_sum: ``[clients]`` float32: sum of batch loss x batch size (no penalty).
      weighted_deltas: With `delta_weights` and plain SGD: per trained slot that started shared, the weighted
        sum over clients of ``start - trained`` accumulated step by step (sparse rows scattered once per
        step), which spares a pass over every client's copy of a large table; None for the other slots.
      finite: ``[clients]`` bool: every gradient the client applied was finite.
      stats: Per-client sums of the `after_step` statistics (``[clients]`` each), or ().
    """

    num_examples: tf.Tensor
    loss_sum: tf.Tensor
    weighted_deltas: Sequence[tf.Tensor | None] = ()
    finite: tf.Tensor | None = None
    stats: Any = ()


def plain_sgd_learning_rate(optimizer: tff.learning.optimizers.Optimizer) -> tf.Tensor | None:
    """The learning rate if `optimizer` is TFF's SGD without momentum (the sparse fast path), else None."""
    if isinstance(optimizer, sgdm._SGD):  # pylint: disable=protected-access
        state = optimizer.initialize(())
        if 'momentum' not in state:
            return state['learning_rate']
    return None


def check_optimizer(optimizer: Any, role: str) -> None:
    """Raises `ConfigError` unless `optimizer` is a functional TFF optimizer the engine can step per client."""
    if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
        raise errors.ConfigError(
            f'The fast simulation engine needs a tff.learning.optimizers.Optimizer as {role}, got '
            f"{type(optimizer).__name__} (a Keras optimizer is stateful); use simulation='per_client' for it."
        )


def is_per_client(value: Any, base: Any) -> bool:
    """Whether `value` is stacked per client (one more leading axis than the model's weight `base`)."""
    return value.shape.rank == len(base.shape) + 1


def per_client(value: tf.Tensor, base: Any, clients: tf.Tensor) -> tf.Tensor:
    """`value` stacked per client (broadcast if shared)."""
    if is_per_client(value, base):
        return value
    return tf.broadcast_to(value[tf.newaxis], tf.concat([[clients], tf.shape(value)], 0))


def at(value: tf.Tensor, index: tf.Tensor, axis: int = 0) -> tf.Tensor:
    """`value`'s slice at a loop counter `index` along `axis` (a client's values, every client's batch at a step).

    A gather, not ``value[index]`` or ``value[:, index]``: TF 2.14 lowers a strided slice at a loop-dependent
    index into XLA either as a plain dynamic slice or as a dynamic-size one (pad and set-dimension-size), one or the
    other from one trace of the same function to the next in a process, and the compiled reductions downstream then
    differ in the last bit (a run's reported loss changed with the same seed on an AVX2 machine). A gather has one
    lowering (tests/simulation/step_slice_test.py).
    """
    return tf.gather(value, index, axis=axis)


def replace_slots(parts: functional.Parts, slots: Sequence[Slot], values: Sequence[Any]) -> functional.Parts:
    """`parts` with the weights at `slots` replaced by `values`."""
    groups = [list(g) for g in parts]
    for (g, i), v in zip(slots, values):
        groups[g][i] = v
    return functional.Parts(*groups)


def masked_loss(loss: tf.keras.losses.Loss, labels, predictions, mask) -> tf.Tensor:
    """A batch's loss over its real examples only (mask 1), as the loss computes it on those examples alone.

    A Keras loss with the standard `__call__` is reduced from its per-example values (`Loss.call`) over the
    real examples (``SUM_OVER_BATCH_SIZE``/``AUTO``: their mean; ``SUM``: their sum). A loss with its own
    `__call__` is called with ``sample_weight=mask``; it must give padded examples no weight (e.g. the
    next-word loss, whose padded examples are all pad tokens, which it skips).
    """
    if type(loss).__call__ is not tf.keras.losses.Loss.__call__:
        return loss(labels, predictions, sample_weight=mask)
    values = loss.call(labels, predictions)  # [batch, ...] per-example (per-element) losses.
    weights = tf.broadcast_to(
        tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([values.shape.rank - 1], tf.int32)], 0)), tf.shape(values)
    )
    total = tf.reduce_sum(values * weights)
    if loss.reduction == tf.keras.losses.Reduction.SUM:
        return total
    return tf.math.divide_no_nan(total, tf.reduce_sum(weights))


def batch_mean_loss(loss: tf.keras.losses.Loss, labels, predictions, mask) -> tf.Tensor:
    """Each client's batch loss ``[clients]``: the loss's mean over the client's real examples."""
    if type(loss).__call__ is not tf.keras.losses.Loss.__call__:
        return tf.vectorized_map(lambda args: masked_loss(loss, *args), (labels, predictions, mask))
    values = loss.call(labels, predictions)  # [clients, batch, ...] per-example (per-element) losses.
    weights = tf.broadcast_to(
        tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([values.shape.rank - 2], tf.int32)], 0)), tf.shape(values)
    )
    axes = list(range(1, values.shape.rank))
    return tf.math.divide_no_nan(tf.reduce_sum(values * weights, axes), tf.reduce_sum(weights, axes))


def update_metrics(
    metrics: Sequence[tf.keras.metrics.Metric], labels, predictions, mask, loss: tf.keras.losses.Loss, batch_loss
) -> None:
    """Updates Keras metrics with a group's batch, as the per-client path updates them with each client's batch.

    Example metrics see the clients' examples flattened (padded examples weigh 0); a metric of a batch's mean
    loss (`MeanMetricWrapper` of a Keras `Loss`, e.g. the `loss` metric) gets one value per client batch.
    """

    def flat(t):
        inner = t.shape[2:]
        shape = [-1] + inner.as_list() if inner.is_fully_defined() else tf.concat([[-1], tf.shape(t)[2:]], 0)
        return tf.reshape(t, shape)

    flat_labels, flat_predictions = tf.nest.map_structure(flat, labels), tf.nest.map_structure(flat, predictions)
    weights = tf.reshape(mask, [-1])
    has_batch = tf.cast(tf.reduce_sum(mask, axis=1) > 0, tf.float32)
    for metric in metrics:
        fn = getattr(metric, '_fn', None)
        if isinstance(metric, tff.learning.metrics.NumExamplesCounter):  # A Sum of batch sizes.
            super(tff.learning.metrics.NumExamplesCounter, metric).update_state(tf.reduce_sum(weights))
        elif isinstance(metric, tff.learning.metrics.NumBatchesCounter):  # A Sum of batches.
            super(tff.learning.metrics.NumBatchesCounter, metric).update_state(tf.reduce_sum(has_batch))
        elif isinstance(metric, tf.keras.metrics.MeanMetricWrapper) and isinstance(fn, tf.keras.losses.Loss):
            same = type(fn) is type(loss) and fn.get_config() == loss.get_config()  # The training loss.
            values = batch_loss if same else batch_mean_loss(fn, labels, predictions, mask)
            super(tf.keras.metrics.MeanMetricWrapper, metric).update_state(values, sample_weight=has_batch)
        else:
            metric.update_state(flat_labels, flat_predictions, sample_weight=weights)


@tf.autograph.experimental.do_not_convert
def lockstep_steps(
    model: functional.FunctionalModel,
    weights: functional.Parts,
    train: Sequence[Slot],
    phase: Any,
    optimizer: tff.learning.optimizers.Optimizer,
    loss: tf.keras.losses.Loss | None = None,
    *,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
    penalty: Penalty | None = None,
    centre: Sequence[Any] = (),
    delta_weights: tf.Tensor | None = None,
    client_loss: ClientLoss | None = None,
    step_inputs: Any = None,
    after_step: AfterStep | None = None,
    zero_stats: Any = (),
    vectorize: bool | None = None,
) -> tuple[functional.Parts, GroupSteps]:
    """One optimizer step per batch of `phase` for every client of a group, on the weights at `train` slots.

    Call inside a `tf.function` (the engine's group computation).

    Args:
      model: The model as a pure function of its weights.
      weights: The group's weights; each entry shared (the model's shape) or per client (``[clients, ...]``).
      train: The slots of the weights that train (they come back per client); the others stay frozen.
      phase: A packed phase (`fedpersonal.simulation.packing`): ``{'batch', 'mask', 'steps'}``.
      optimizer: A TFF optimizer; its state starts fresh for every client (as in the per-client path).
      loss: The Keras loss (a batch's loss is its mean over the batch's real examples), or None with
        `client_loss`.
      metrics: Keras metrics updated with every batch's labels and pre-step predictions (group sums).
      penalty: Optional ``(trained, centre, batch, mask) -> scalar`` added to each client's batch loss (e.g.
        Ditto's proximal term), with `centre` per-client or shared tensors (the client's).
      delta_weights: Optional per-client weights ``[clients]`` known before training (e.g. example counts);
        see `GroupSteps.weighted_deltas`.
      client_loss: Instead of `loss`: ``(weights, batch, mask, step input) -> (batch loss, updates)`` for one
        client (its batch padded, `mask` its real examples): the loss over the real examples, and the new
        values of the model's stateful weights (`FunctionalModel.rebuild(..., example_mask=mask).updates`).
      step_inputs: Optional structure of ``[clients, steps, ...]`` tensors; a client's step gets its slice.
      after_step: Optional ``(weights after the step, batch, mask, step input) -> structure of scalars`` summed
        over each client's real steps (`GroupSteps.stats`), e.g. the correct predictions after the step.
      zero_stats: With `after_step`: its structure of float32 scalars, at their initial values (e.g.
        ``OrderedDict(correct=0.0)``), as in `fedpersonal.core.client_work.optimizer_steps`.
      vectorize: False runs each step's clients in a compiled loop without trying `tf.vectorized_map` first
        (for models it cannot batch, e.g. convolutions with per-client filters); default `model.vectorizes`.

    Returns:
      ``(weights, GroupSteps)``: the trained slots (and the model's stateful slots) per client, the others as
      given.
    """
    if (loss is None) == (client_loss is None):
        raise ValueError('Give exactly one of loss and client_loss.')
    vectorized: bool = getattr(model, 'vectorizes', True) if vectorize is None else vectorize
    pfor_loops: bool = getattr(model, 'pfor_loops', False)
    if metrics and client_loss is not None:
        raise ValueError('metrics need the Keras loss path (predictions); sum statistics with after_step instead.')
    base = model.initial_weights
    clients = tf.shape(phase['mask'])[0]
    starts_shared = [not is_per_client(weights[g][i], base[g][i]) for g, i in train]
    trained = [per_client(weights[g][i], base[g][i], clients) for g, i in train]
    if not trained:
        zeros = tf.zeros([clients])
        return weights, GroupSteps(zeros, zeros, [], tf.ones([clients], tf.bool))
    stateful = [s for s in model.stateful_slots if s not in train]
    carried = [per_client(weights[g][i], base[g][i], clients) for g, i in stateful]
    slots = [(g, i) for g in range(4) for i in range(len(base[g])) if (g, i) not in train and (g, i) not in stateful]
    frozen_per_client = [s for s in slots if is_per_client(weights[s[0]][s[1]], base[s[0]][s[1]])]
    centre_per_client = [k for k, c in enumerate(centre) if is_per_client(c, base[train[k][0]][train[k][1]])]
    learning_rate = plain_sgd_learning_rate(optimizer)
    compact = not model.xla
    sparse: list[
        bool
    ] = []  # Per trained weight: is its gradient applied as sparse rows (set while tracing client_step).

    def client_parts(values, frozen, carried_values):
        parts = replace_slots(replace_slots(weights, frozen_per_client, frozen), stateful, carried_values)
        return replace_slots(parts, train, values)

    def client_step(args):
        values, frozen, carried_values, centre_values, batch, mask, extra = args
        parts = client_parts(values, frozen, carried_values)
        full_centre = list(centre)
        for k, c in zip(centre_per_client, centre_values):
            full_centre[k] = c
        batch_loss, n, predictions, gradients, updates = client_gradients(
            model, parts, values, batch, mask, extra, loss, client_loss, penalty, full_centre, bool(stateful)
        )
        # Sparse rows leave as (values, indices) only when their count is static: a count that depends on the data
        # (an embedding looked up on a batch whose padding the model trims, e.g. FURL's `TrimPadding`) differs
        # between clients, which a loop over clients cannot stack; such a gradient is applied dense.
        sparse[:] = [
            isinstance(g, tf.IndexedSlices) and learning_rate is not None and g.values.shape[0] is not None
            for g in gradients
        ]
        flat = []
        for g, is_sparse in zip(gradients, sparse):
            flat.append((g.values, tf.cast(g.indices, tf.int32)) if is_sparse else tf.convert_to_tensor(g))
        new_carried = [tf.stop_gradient(updates.get(s, c)) for s, c in zip(stateful, carried_values)]
        return batch_loss, n, predictions, flat, new_carried

    def optimizer_step(args):
        new_state, new_values = optimizer.next(args[0], tuple(args[1]), tuple(args[2]))
        return new_state, list(new_values)

    def client_stats(args):
        values, frozen, carried_values, batch, mask, extra = args
        assert after_step is not None
        return after_step(client_parts(values, frozen, carried_values), batch, mask, extra)

    if learning_rate is None:
        state_specs = tuple(tf.TensorSpec(t.shape[1:], t.dtype) for t in trained)
        initial_state = optimizer.initialize(state_specs)
        optimizer_state = tf.nest.map_structure(
            lambda s: tf.broadcast_to(tf.convert_to_tensor(s)[tf.newaxis], tf.concat([[clients], tf.shape(s)], 0)),
            initial_state,
        )
    else:
        optimizer_state = ()
    accumulate = [shared and delta_weights is not None and learning_rate is not None for shared in starts_shared]
    deltas = [tf.zeros(base[g][i].shape, base[g][i].dtype) for (g, i), a in zip(train, accumulate) if a]

    def body(t, values, optimizer_state, num_examples, loss_sum, deltas, finite, carried, stats):
        # Without XLA (dynamic shapes are free) a step runs only the clients that still have a batch; with XLA
        # every client of the group steps and a finished client's all-zero mask makes its step a no-op.
        index = tf.cast(tf.where(t < phase['steps'])[:, 0], tf.int32) if compact else None

        def take(value: tf.Tensor) -> tf.Tensor:  # The stepping clients' slices.
            return value if index is None else tf.gather(value, index)

        def put(full: tf.Tensor, part: tf.Tensor) -> tf.Tensor:  # The stepping clients' new slices, in place.
            return part if index is None else tf.tensor_scatter_nd_update(full, index[:, tf.newaxis], part)

        def expand(part: tf.Tensor, fill: int) -> tf.Tensor:  # Per stepping client -> per client (fill the rest).
            # Shaped like `steps`, so a group of statically known size keeps its static shape through the loop.
            return put(tf.cast(tf.zeros_like(phase['steps']) + fill, part.dtype), part)

        batch = tf.nest.map_structure(lambda a: take(at(a, t, axis=1)), phase['batch'])
        mask = take(at(phase['mask'], t, axis=1))
        extra = tf.nest.map_structure(lambda a: take(at(a, t, axis=1)), step_inputs) if step_inputs is not None else ()
        frozen = [take(weights[g][i]) for g, i in frozen_per_client]
        centre_values = [take(centre[k]) for k in centre_per_client]
        stepped = [take(v) for v in values]
        carried_now = [take(c) for c in carried]
        batch_loss, n, predictions, gradients, new_carried = for_each_client(
            client_step,
            (stepped, frozen, carried_now, centre_values, batch, mask, extra),
            vectorize=vectorized,
            signature=step_signature,
            pfor_loops=pfor_loops,
        )
        active = n > 0
        keep = lambda new, old: tf.where(tf.reshape(active, [-1] + [1] * (new.shape.rank - 1)), new, old)
        carried_now = [keep(a, b) for a, b in zip(new_carried, carried_now)]
        carried = [put(full, c) for full, c in zip(carried, carried_now)]
        if learning_rate is not None:
            stepped = [_sgd(v, g, is_sparse, learning_rate) for v, g, is_sparse in zip(stepped, gradients, sparse)]
            step_weights = take(delta_weights) if delta_weights is not None else None
            accumulated = [g for g, a in zip(gradients, accumulate) if a]
            kinds = [is_sparse for is_sparse, a in zip(sparse, accumulate) if a]
            deltas = [_accumulate(d, g, k, learning_rate, step_weights) for d, g, k in zip(deltas, accumulated, kinds)]
            for g, is_sparse in zip(gradients, sparse):
                finite = tf.logical_and(finite, expand(_all_finite(g[0] if is_sparse else g), 1))
        else:
            state_now = tf.nest.map_structure(take, optimizer_state)
            new_state, new_values = for_each_client(
                optimizer_step,
                (state_now, stepped, gradients),
                vectorize=vectorized,
                signature=one_client((optimizer_state, values)),
            )
            stepped = [keep(a, b) for a, b in zip(new_values, stepped)]
            optimizer_state = tf.nest.map_structure(
                lambda full, new, old: put(full, keep(new, old)), optimizer_state, new_state, state_now
            )
        values = [put(full, v) for full, v in zip(values, stepped)]
        if metrics:
            labels = partially_local_model.split_batch(batch)[1]
            update_metrics(metrics, labels, predictions, mask, loss, batch_loss)
        if after_step is not None:
            step_stats = for_each_client(
                client_stats,
                (stepped, frozen, carried_now, batch, mask, extra),
                vectorize=vectorized,
                signature=stats_signature,
                pfor_loops=pfor_loops,
            )
            stats = tf.nest.map_structure(lambda a, b: a + expand(tf.where(active, b, 0.0), 0), stats, step_stats)
        # A finished client's discarded step (a padded example) may have a non-finite loss (FedRoD's balanced loss of
        # a class the client lacks): where, not a product, so that it adds 0, not NaN.
        n_sum, l_sum = num_examples + expand(n, 0), loss_sum + expand(tf.where(n > 0, batch_loss * n, 0.0), 0)
        return t + 1, values, optimizer_state, n_sum, l_sum, deltas, finite, carried, stats

    one_client = lambda structure: tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), structure)
    step_signature = None  # Known without a trace for dense gradients (not the plain SGD path's sparse rows).
    if client_loss is not None and learning_rate is None:
        scalar = tf.TensorSpec([], tf.float32)
        step_signature = (scalar, scalar, scalar, one_client(trained), one_client(carried))
    zeros = tf.zeros([clients])
    stats_signature = None
    if after_step is not None:
        zero_stats = tf.nest.map_structure(lambda z: zeros + z, zero_stats)
        stats_signature = tf.nest.map_structure(lambda _: tf.TensorSpec([], tf.float32), zero_stats)
    finite = tf.ones([clients], tf.bool)
    initial = (tf.constant(0), trained, optimizer_state, zeros, zeros, deltas, finite, carried, zero_stats)
    _, trained, _, num_examples, loss_sum, deltas, finite, carried, stats = tf.while_loop(
        lambda t, *_: t < tf.reduce_max(phase['steps']), body, initial
    )
    remaining = iter(deltas)
    weighted_deltas = [next(remaining) if a else None for a in accumulate]
    weights = replace_slots(replace_slots(weights, train, trained), stateful, carried)
    return weights, GroupSteps(num_examples, loss_sum, weighted_deltas, finite, stats)


def client_gradients(
    model: functional.FunctionalModel,
    parts: functional.Parts,
    values: list[tf.Tensor],
    batch: Any,
    mask: tf.Tensor,
    extra: Any,
    loss: tf.keras.losses.Loss | None,
    client_loss: ClientLoss | None,
    penalty: Penalty | None,
    centre: list[Any],
    mask_batch_norm: bool,
) -> tuple[tf.Tensor, tf.Tensor, Any, list[Any], dict[Slot, tf.Tensor]]:
    """One client's step before the optimizer: ``(batch loss, examples, predictions, gradients, updates)``.

    The gradients are those of the batch loss (plus the model's regularization and the `penalty` at `centre`)
    with respect to `values`, the trained weights inside `parts`; zero for a batch without examples. `updates`
    are the new values of the model's stateful weights (batch norm statistics, over the real examples when
    `mask_batch_norm`). Shared by `lockstep_steps` and `fedpersonal.simulation.client_loop`.
    """
    with tf.GradientTape() as tape:
        tape.watch(values)
        n = tf.reduce_sum(mask)
        if client_loss is not None:
            batch_loss, updates = client_loss(parts, batch, mask, extra)
            predictions, total = tf.zeros([]), batch_loss
        else:
            x, y = partially_local_model.split_batch(batch)
            predictions, regularization, updates = model.apply(
                parts, x, training=True, example_mask=mask if mask_batch_norm else None
            )
            batch_loss = masked_loss(loss, y, predictions, mask)
            total = batch_loss + regularization
        if penalty is not None:
            total += penalty(values, centre, batch, mask)
        total *= tf.cast(n > 0, total.dtype)
    gradients = tape.gradient(total, values, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return batch_loss, n, predictions, gradients, updates


def for_each_client(
    fn: Callable[[Any], Any], elems: Any, *, vectorize: bool = True, signature: Any = None, pfor_loops: bool = False
) -> Any:
    """``fn`` of every client's slice of `elems`, stacked: vectorized (`tf.vectorized_map`) where TF can, else a
    compiled loop over the clients (`tf.map_fn`).

    Vectorizing fails for a few models, e.g. the gradient of a Keras LSTM run as a `tf.while_loop` (its
    TensorList cannot be batched by `pfor`; `FunctionalModel` fuses or unrolls recurrent layers to avoid it); those
    run client after client inside the same compiled program (measured on the NWP round: 2.5 s with the loop over
    clients, 0.53 s unrolled and vectorized, 0.94 s per client in TFF). ``vectorize=False`` goes straight to the
    loop, and its output `signature` (one client's `tf.TensorSpec` structure), if known, spares a trace of `fn`.
    ``pfor_loops=True`` (`FunctionalModel.pfor_loops`: the model has ops that `pfor` cannot batch but that are
    whole-sequence kernels, e.g. a fused LSTM) lets `tf.vectorized_map` run just those ops client after client in
    a parallel loop, the rest vectorized.
    """
    if vectorize:
        try:
            if not pfor_loops:
                return tf.vectorized_map(fn, elems, fallback_to_while_loop=False)
            with _quiet_pfor_loops():
                return tf.vectorized_map(fn, elems, fallback_to_while_loop=True)
        except (ValueError, TypeError, NotImplementedError):
            pass
    if signature is None:
        first = fn(tf.nest.map_structure(lambda t: t[0], elems))  # Traced only for the output structure.
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), first)
    return tf.map_fn(fn, elems, fn_output_signature=signature)


class _PforLoopNotice(logging.Filter):
    """Drops pfor's per-op notice that it loops (expected for `FunctionalModel.pfor_loops` models)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith('Using a while_loop for converting')


@contextlib.contextmanager
def _quiet_pfor_loops():
    notice, logger = _PforLoopNotice(), tf.get_logger()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def _all_finite(per_client_values: tf.Tensor) -> tf.Tensor:
    axes = list(range(1, per_client_values.shape.rank))
    return tf.reduce_all(tf.math.is_finite(per_client_values), axis=axes)


def _accumulate(delta, gradient, is_sparse: bool, learning_rate, weights) -> tf.Tensor:
    """``delta + sum_c weights_c * learning_rate * gradient_c`` (sparse rows scattered into the shared shape)."""
    learning_rate = tf.cast(learning_rate, delta.dtype)
    if not is_sparse:
        return delta + learning_rate * tf.tensordot(weights, gradient, axes=1)
    rows, indices = gradient
    scaled = rows * tf.reshape(weights * learning_rate, [-1] + [1] * (rows.shape.rank - 1))
    flat_rows = tf.reshape(scaled, tf.concat([[-1], tf.shape(rows)[2:]], 0))
    return tf.tensor_scatter_nd_add(delta, tf.reshape(indices, [-1, 1]), flat_rows)


def _sgd(value: tf.Tensor, gradient: Any, is_sparse: bool, learning_rate: tf.Tensor) -> tf.Tensor:
    """One SGD step of stacked per-client weights; sparse rows as one scatter over the whole group."""
    learning_rate = tf.cast(learning_rate, value.dtype)
    if not is_sparse:
        return value - learning_rate * gradient
    rows, indices = gradient  # [clients, k, ...], [clients, k]
    client = tf.broadcast_to(tf.range(tf.shape(indices)[0])[:, tf.newaxis], tf.shape(indices))
    return tf.tensor_scatter_nd_sub(value, tf.stack([client, indices], axis=-1), learning_rate * rows)
