"""A group's phase as a compiled loop over its clients: each client runs all its steps on its own weights, in turn.

`lockstep.lockstep_steps` steps every client of a group at once, with the trained weights stacked per client: one
vectorized call per step. `client_loop_steps` is the same phase with the loops the other way round, as the
per-client path runs it: a `tf.while_loop` over the clients, and inside it one over the client's batches, on one
copy of the weights shaped as the model's (same loss, penalty, optimizer, metrics, statistics and example counts;
`lockstep.client_gradients` is the shared step). The clients' weighted deltas are summed as each client finishes,
so a weight the caller does not need per client (``keep_trained=False``: FedAvg's globals) never exists per
client. For a dense model with per-client weights this keeps each client's weights in the CPU cache and runs
plain matrix products instead of batched ones of stacked copies; for an embedding table, or a model whose
clients' steps batch well, the lockstep wins, unless a proximal penalty makes every step touch all of a client's
tables (`SPARSE_LOCKSTEP`: the lockstep, such phases the loop). `STRATEGIES` names them; `runs` says which runs a
workload (a fixed rule by default, `auto_strategy`; measured on the first rounds on request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.models import partially_local_model
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import low_rank
from fedpersonal.simulation import options

LOCKSTEP, CLIENT_LOOP, LOW_RANK = 'lockstep', 'client_loop', 'low_rank'
# The lockstep for a phase of sparse row updates, the client loop for a penalized one (`phase_steps`).
SPARSE_LOCKSTEP = 'lockstep (client_loop for penalized phases)'
STRATEGIES = (LOCKSTEP, CLIENT_LOOP, LOW_RANK, SPARSE_LOCKSTEP)
# Compiled with XLA, a phase of at most this many (padded) steps runs them unrolled, a padded step keeping the
# client's values (measured on the dense FedAvg round: the loop over 4 steps cost 25% more than the steps).
UNROLL_STEPS = 8


def auto_strategy(model: Any) -> str:
    """``engine_strategy='auto'``'s fixed rule (measured: docs/ENGINE.md, "Engine strategies"): the low-rank
    steps for a model of dense layers (`low_rank`; its phases that do not fit it run the client loop), the client
    loop for another model whose client step multiplies matrices (convolutional, recurrent layers), the lockstep
    for one of embedding lookups and elementwise products only (matrix factorization), whose tiny steps batch
    well, except in a phase with a proximal penalty (Ditto's personal phase, FedProx), whose gradient is dense
    over every table the client trains: that phase runs the client loop (`SPARSE_LOCKSTEP`)."""
    if low_rank.dense_layers(model):
        return LOW_RANK
    return CLIENT_LOOP if getattr(model, 'multiplies_matrices', True) else SPARSE_LOCKSTEP


def runs(strategy: str, model: Any, *, parts: int, splittable: bool) -> list[tuple[str, int]]:
    """The ``(group work, parts)`` runs of `strategy` (`options.ENGINE_STRATEGIES`) for the round runner
    (`fedpersonal.simulation.driver.GroupRoundRunner`): one, except for ``'measure'``, which times them all.
    ``'spread'`` (the client loop, a group's clients split over the cores, one program per core) runs only on
    request or under ``'measure'``: ``'auto'`` never splits, since the client loop given the same cores as threads
    was as fast (docs/ENGINE.md, "Engine strategies") and a split's sums depend on the number of cores.

    Args:
      strategy: ``'auto'``, ``'lockstep'``, ``'client_loop'``, ``'spread'`` or ``'measure'``.
      model: The `functional.FunctionalModel` the groups train.
      parts: The cores a round may use (`options.parallel_parts`): a spread group is split into this many parts.
      splittable: Whether a group may be split (not under a DP aggregator, whose noise depends on the groups).

    Raises:
      fedpersonal.errors.ConfigError: An unknown strategy.
    """
    options.check_engine_strategy(strategy)
    spread = [(CLIENT_LOOP, parts)] if parts > 1 and splittable else []
    if strategy == options.SPREAD:
        return spread or [(CLIENT_LOOP, 1)]
    if strategy == options.MEASURE:
        own = auto_strategy(model)  # Also timed where the rule chooses neither of the first two.
        return [(LOCKSTEP, 1), (CLIENT_LOOP, 1)] + spread + ([(own, 1)] if own in (LOW_RANK, SPARSE_LOCKSTEP) else [])
    return [(auto_strategy(model) if strategy == options.AUTO else strategy, 1)]


def phase_steps(
    strategy: str,
    model: functional.FunctionalModel,
    weights: functional.Parts,
    train: Sequence[lockstep.Slot],
    phase: Any,
    optimizer: tff.learning.optimizers.Optimizer,
    loss: tf.keras.losses.Loss | None = None,
    *,
    keep_trained: bool = True,
    **kwargs: Any,
) -> tuple[functional.Parts, lockstep.GroupSteps]:
    """`lockstep.lockstep_steps` (``strategy='lockstep'``), `client_loop_steps` (``'client_loop'``) or
    `low_rank.low_rank_steps` (``'low_rank'``, for a phase that `low_rank.fits`; the client loop for another) of a
    phase; under `SPARSE_LOCKSTEP` the lockstep's, or the client loop's for a phase with a ``penalty``.

    `keep_trained` is read by the client loop only (the lockstep keeps every trained weight per client).

    Raises:
      ValueError: An unknown strategy.
    """
    if strategy == SPARSE_LOCKSTEP:
        strategy = CLIENT_LOOP if kwargs.get('penalty') is not None else LOCKSTEP
    if strategy == LOCKSTEP:
        return lockstep.lockstep_steps(model, weights, train, phase, optimizer, loss, **kwargs)
    if strategy == LOW_RANK:
        if low_rank.fits(model, weights, train, phase, optimizer, loss, keep_trained=keep_trained, **kwargs):
            return low_rank.low_rank_steps(model, weights, train, phase, optimizer, loss, **kwargs)
        # The group program around the low-rank steps may be a plain TF graph: the loop is compiled on its own.
        loop = lambda: client_loop_steps(
            model, weights, train, phase, optimizer, loss, keep_trained=keep_trained, **kwargs
        )
        return tf.function(loop, jit_compile=getattr(model, 'xla', False), autograph=False)()
    if strategy == CLIENT_LOOP:
        return client_loop_steps(model, weights, train, phase, optimizer, loss, keep_trained=keep_trained, **kwargs)
    raise ValueError(f'strategy must be one of {STRATEGIES}, got {strategy!r}.')


@tf.autograph.experimental.do_not_convert
def client_loop_steps(
    model: functional.FunctionalModel,
    weights: functional.Parts,
    train: Sequence[lockstep.Slot],
    phase: Any,
    optimizer: tff.learning.optimizers.Optimizer,
    loss: tf.keras.losses.Loss | None = None,
    *,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
    penalty: lockstep.Penalty | None = None,
    centre: Sequence[Any] = (),
    delta_weights: tf.Tensor | None = None,
    client_loss: lockstep.ClientLoss | None = None,
    step_inputs: Any = None,
    after_step: lockstep.AfterStep | None = None,
    zero_stats: Any = (),
    keep_trained: bool = True,
) -> tuple[functional.Parts, lockstep.GroupSteps]:
    """`lockstep.lockstep_steps`' phase, client after client (call inside a `tf.function`; arguments as there).

    Args:
      keep_trained: False: a trained weight that starts shared by the group comes back as it went in (shared, not
        trained), and only its weighted delta sum is returned (`GroupSteps.weighted_deltas`, which needs
        `delta_weights`); True: every trained weight comes back per client.

    Returns:
      ``(weights, GroupSteps)`` as `lockstep.lockstep_steps`, except: ``weighted_deltas`` (with `delta_weights`)
      sums ``delta_weights[c] * (start - trained)`` over the clients whose whole update is finite, for every
      trained weight that started shared; ``finite`` says per client whether its whole update is finite.
    """
    if (loss is None) == (client_loss is None):
        raise ValueError('Give exactly one of loss and client_loss.')
    if metrics and client_loss is not None:
        raise ValueError('metrics need the Keras loss path (predictions); sum statistics with after_step instead.')
    base = model.initial_weights
    clients = tf.shape(phase['mask'])[0]
    if not train:
        zeros = tf.zeros([clients])
        return weights, lockstep.GroupSteps(zeros, zeros, [], tf.ones([clients], tf.bool))
    own = lambda slot: lockstep.is_per_client(weights[slot[0]][slot[1]], base[slot[0]][slot[1]])
    shared_start = [not own(s) for s in train]
    accumulate = [shared and delta_weights is not None for shared in shared_start]
    kept = [keep_trained or not shared for shared in shared_start]
    if not all(a or k for a, k in zip(accumulate, kept)):
        raise ValueError('keep_trained=False needs delta_weights (the deltas are all that is returned).')
    stateful = [s for s in model.stateful_slots if s not in train]
    frozen = [(g, i) for g in range(4) for i in range(len(base[g])) if (g, i) not in train and (g, i) not in stateful]
    frozen_own = [s for s in frozen if own(s)]
    centre_own = [k for k, c in enumerate(centre) if lockstep.is_per_client(c, base[train[k][0]][train[k][1]])]
    learning_rate = lockstep.plain_sgd_learning_rate(optimizer)
    num_steps = phase['mask'].shape[1]
    unrolled = model.xla and num_steps is not None and num_steps <= UNROLL_STEPS
    slice_of = lambda value, c, per_client: lockstep.at(value, c) if per_client else value

    def array(dtype: tf.DType) -> tf.TensorArray:
        return tf.TensorArray(dtype, size=clients, element_shape=None)

    def client(c, sums, out):
        start = [slice_of(weights[g][i], c, not shared) for (g, i), shared in zip(train, shared_start)]
        parts = lockstep.replace_slots(weights, frozen_own, [lockstep.at(weights[g][i], c) for g, i in frozen_own])
        carried = [slice_of(weights[g][i], c, own((g, i))) for g, i in stateful]
        client_centre = list(centre)
        for k in centre_own:
            client_centre[k] = lockstep.at(centre[k], c)
        state = (
            optimizer.initialize(tuple(tf.TensorSpec(v.shape, v.dtype) for v in start)) if learning_rate is None else ()
        )
        stats = tf.nest.map_structure(tf.constant, zero_stats)

        def step(t, values, state, carried, num_examples, loss_sum, stats):
            batch = tf.nest.map_structure(lambda a: lockstep.at(lockstep.at(a, c), t), phase['batch'])
            mask = lockstep.at(lockstep.at(phase['mask'], c), t)
            extra = (
                tf.nest.map_structure(lambda a: lockstep.at(lockstep.at(a, c), t), step_inputs)
                if step_inputs is not None
                else ()
            )
            now = lockstep.replace_slots(lockstep.replace_slots(parts, stateful, carried), train, values)
            batch_loss, n, predictions, gradients, updates = lockstep.client_gradients(
                model, now, values, batch, mask, extra, loss, client_loss, penalty, client_centre, bool(stateful)
            )
            carried = [tf.stop_gradient(updates.get(s, v)) for s, v in zip(stateful, carried)]
            if learning_rate is not None:
                values = [_sgd(v, g, learning_rate) for v, g in zip(values, gradients)]
            else:
                state, new = optimizer.next(state, tuple(values), tuple(tf.convert_to_tensor(g) for g in gradients))
                values = list(new)
            if metrics:
                one = lambda s: tf.nest.map_structure(lambda a: a[tf.newaxis], s)
                labels = partially_local_model.split_batch(batch)[1]
                lockstep.update_metrics(
                    metrics, one(labels), one(predictions), mask[tf.newaxis], loss, batch_loss[None]
                )
            if after_step is not None:
                after = lockstep.replace_slots(lockstep.replace_slots(parts, stateful, carried), train, values)
                stats = tf.nest.map_structure(tf.add, stats, after_step(after, batch, mask, extra))
            return t + 1, values, state, carried, num_examples + n, loss_sum + batch_loss * n, stats

        loop = (tf.constant(0), start, state, carried, tf.constant(0.0), tf.constant(0.0), stats)
        if unrolled:  # A client's few steps written out: XLA keeps the weights in place from step to step.
            client_steps = lockstep.at(phase['steps'], c)
            for t in range(num_steps):
                active = t < client_steps
                keep = lambda new, old, active=active: tf.where(active, new, old)
                loop = (loop[0] + 1,) + tf.nest.map_structure(keep, step(t, *loop[1:])[1:], loop[1:])
        else:
            loop = tf.while_loop(lambda t, *_: t < lockstep.at(phase['steps'], c), step, loop)
        _, values, _, carried, num_examples, loss_sum, stats = loop
        deltas = [s - v for s, v in zip(start, values)]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in deltas])
        if delta_weights is not None:
            weight = tf.where(finite, lockstep.at(delta_weights, c), 0.0)
            added = iter(tf.where(finite, weight * d, tf.zeros_like(d)) for d, a in zip(deltas, accumulate) if a)
            sums = [s + next(added) for s in sums]
        written = [v for v, k in zip(values, kept) if k] + carried + [num_examples, loss_sum, finite]
        out = [a.write(c, v) for a, v in zip(out, written + tf.nest.flatten(stats))]
        return c + 1, sums, out

    sums = [tf.zeros(base[g][i].shape, base[g][i].dtype) for (g, i), a in zip(train, accumulate) if a]
    kinds = [base[g][i].dtype for (g, i), k in zip(train, kept) if k] + [base[g][i].dtype for g, i in stateful]
    kinds += [tf.float32, tf.float32, tf.bool] + [tf.float32] * len(tf.nest.flatten(zero_stats))
    out = [array(tf.as_dtype(kind)) for kind in kinds]
    _, sums, out = tf.while_loop(lambda c, *_: c < clients, client, (tf.constant(0), sums, out))
    stacked = iter(a.stack() for a in out)
    trained = [next(stacked) if k else weights[g][i] for (g, i), k in zip(train, kept)]
    carried = [next(stacked) for _ in stateful]
    num_examples, loss_sum, finite = next(stacked), next(stacked), next(stacked)
    stats = tf.nest.pack_sequence_as(zero_stats, list(stacked)) if after_step is not None else ()
    remaining = iter(sums)
    weighted_deltas = [next(remaining) if a else None for a in accumulate]
    weights = lockstep.replace_slots(lockstep.replace_slots(weights, train, trained), stateful, carried)
    return weights, lockstep.GroupSteps(num_examples, loss_sum, weighted_deltas, finite, stats)


def _sgd(value: tf.Tensor, gradient: Any, learning_rate: tf.Tensor) -> tf.Tensor:
    """One plain SGD step of one client's weight; an embedding's gradient rows are scattered."""
    learning_rate = tf.cast(learning_rate, value.dtype)
    if isinstance(gradient, tf.IndexedSlices):
        rows = learning_rate * gradient.values
        return tf.tensor_scatter_nd_sub(value, tf.reshape(tf.cast(gradient.indices, tf.int32), [-1, 1]), rows)
    return value - learning_rate * gradient
