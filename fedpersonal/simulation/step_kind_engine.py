"""The grouped engine's loop for a phase with a step kind (a `fedpersonal.core.step_kinds.StepKind`, e.g.
Per-FedAvg's, pFedMe's): every client of a group steps in lockstep, as `lockstep.lockstep_steps` steps a plain
phase, but a batch's direction is the step kind's own `direction`, the function the per-client backend calls, on
the model as a pure function of its weights (`step_kinds.pure_derivatives` of `functional.FunctionalModel.apply`).

A batch is padded to the group's batch size (its real examples first, mask 1). Each part of a batch cut into parts
is read as a window of ``ceil(padded batch size / parts)`` examples from its start (`step_kinds.part_bounds` of the
client's real example count), masked to the part: static shapes, so one step of all clients is one vectorized (or
XLA-compiled) call. Carried values (the personal copy) go per client from batch to batch, starting at the received
weights; a client without a batch at a step (a shorter client) keeps its weights, carried values and optimizer
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.core import step_kinds
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep


def check(phases: Sequence[Any], model: functional.FunctionalModel) -> None:
    """Raises `ConfigError` if a phase has a step kind the engine cannot run on `model`."""
    if any(p.step is not None for p in phases) and model.stateful_slots:
        raise errors.ConfigError(
            'The fast simulation engine runs step kinds for models without batch normalization (its moving '
            'statistics would change inside a step)'
        )


@tf.autograph.experimental.do_not_convert
def step_kind_steps(
    model: functional.FunctionalModel,
    step: step_kinds.StepKind,
    weights: functional.Parts,
    train: Sequence[lockstep.Slot],
    phase: Any,
    optimizer: tff.learning.optimizers.Optimizer,
    loss: tf.keras.losses.Loss,
    *,
    metrics: Sequence[tf.keras.metrics.Metric] = (),
    carried: Sequence[tf.Tensor] | None = None,
) -> tuple[functional.Parts, list[tf.Tensor] | None, lockstep.GroupSteps]:
    """One step of `step`'s kind per batch of `phase` for every client of a group, on the weights at `train` slots.

    Call inside a `tf.function` (the engine's group computation).

    Args:
      model: The model as a pure function of its weights (no batch normalization, see `check`).
      step: The phase's step kind.
      weights: The group's weights; each entry shared (the model's shape) or per client (``[clients, ...]``).
      train: The slots of the weights that train (they come back per client); the others stay frozen.
      phase: A packed phase (`fedpersonal.simulation.packing`): ``{'batch', 'mask', 'steps'}``.
      optimizer: A TFF optimizer applied to each step's direction; its state starts fresh for every client.
      loss: The Keras loss.
      metrics: Keras metrics updated with each step's model output (`StepKind.direction`'s).
      carried: A step that carries the personal copy from the kept one: each client's (``[clients, ...]``, the
        copy's weights then the extras); None: from the received weights.

    Returns:
      ``(weights, carried, GroupSteps)``: the trained slots per client, the others as given; with a step that
      carries the personal copy, each client's (``[clients, ...]`` per trained weight), else None. `GroupSteps.weighted_deltas` is all
      None (the update is read from the trained copies).
    """
    base = model.initial_weights
    clients = tf.shape(phase['mask'])[0]
    trained = [lockstep.per_client(weights[g][i], base[g][i], clients) for g, i in train]
    others = [(g, i) for g in range(4) for i in range(len(base[g])) if (g, i) not in train]
    frozen_per_client = [s for s in others if lockstep.is_per_client(weights[s[0]][s[1]], base[s[0]][s[1]])]
    inner = step.carries_personal
    # Each client's carried copy starts at its received weights, or its kept copy.
    theta = (list(carried) if carried is not None else list(trained)) if inner else []
    compact = not model.xla
    vectorize = getattr(model, 'vectorizes', True)
    pfor_loops = getattr(model, 'pfor_loops', False)
    one_client = lambda structure: tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), structure)

    def client_step(args):
        values, theta_values, frozen, batch, mask = args
        parts = _replace(weights, frozen_per_client, frozen)

        def loss_at(at: Sequence[tf.Tensor], part: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
            part_batch, part_mask = part
            x, y = partially_local_model.split_batch(part_batch)
            at_parts = _replace(parts, train, at)
            predictions, regularization, _ = model.apply(at_parts, x, training=True)
            return lockstep.masked_loss(loss, y, predictions, part_mask), regularization, (y, predictions)

        derivatives = step_kinds.pure_derivatives(loss_at)
        if step.parts == 1:
            windows = [(batch, mask)]
        else:
            windows = [_window(batch, mask, k, step.parts) for k in range(step.parts)]
        value, output, theta_values, direction = step.direction(values, theta_values, windows, derivatives)
        seen = windows[step.output_part][1]
        labels, predictions = output
        return value, tf.reduce_sum(mask), labels, predictions, seen, direction, theta_values

    def optimizer_step(args):
        new_state, new_values = optimizer.next(args[0], tuple(args[1]), tuple(args[2]))
        return new_state, list(new_values)

    state_specs = tuple(tf.TensorSpec(t.shape[1:], t.dtype) for t in trained)
    optimizer_state = tf.nest.map_structure(
        lambda s: tf.broadcast_to(tf.convert_to_tensor(s)[tf.newaxis], tf.concat([[clients], tf.shape(s)], 0)),
        optimizer.initialize(state_specs),
    )

    def body(t, values, theta, optimizer_state, num_examples, loss_sum):
        # Without XLA a step runs only the clients that still have a batch (as `lockstep_steps`).
        index = tf.cast(tf.where(t < phase['steps'])[:, 0], tf.int32) if compact else None
        take = lambda value: value if index is None else tf.gather(value, index)
        put = lambda full, part: part if index is None else tf.tensor_scatter_nd_update(full, index[:, None], part)
        expand = lambda part: put(tf.zeros_like(phase['steps'], part.dtype), part)
        batch = tf.nest.map_structure(lambda a: take(lockstep.at(a, t, axis=1)), phase['batch'])
        mask = take(lockstep.at(phase['mask'], t, axis=1))
        frozen = [take(weights[g][i]) for g, i in frozen_per_client]
        stepped, stepped_theta = [take(v) for v in values], [take(v) for v in theta]
        value, n, labels, predictions, seen, direction, new_theta = lockstep.for_each_client(
            client_step, (stepped, stepped_theta, frozen, batch, mask), vectorize=vectorize, pfor_loops=pfor_loops
        )
        active = n > 0
        keep = lambda new, old: tf.where(tf.reshape(active, [-1] + [1] * (new.shape.rank - 1)), new, old)
        state_now = tf.nest.map_structure(take, optimizer_state)
        new_state, new_values = lockstep.for_each_client(
            optimizer_step,
            (state_now, stepped, direction),
            vectorize=vectorize,
            signature=one_client((optimizer_state, values)),
        )
        values = [put(full, keep(a, b)) for full, a, b in zip(values, new_values, stepped)]
        theta = [put(full, keep(a, b)) for full, a, b in zip(theta, new_theta, stepped_theta)]
        optimizer_state = tf.nest.map_structure(
            lambda full, new, old: put(full, keep(new, old)), optimizer_state, new_state, state_now
        )
        if metrics:
            lockstep.update_metrics(metrics, labels, predictions, seen, loss, value)
        return t + 1, values, theta, optimizer_state, num_examples + expand(n), loss_sum + expand(value * n)

    zeros = tf.zeros([clients])
    _, trained, theta, _, num_examples, loss_sum = tf.while_loop(
        lambda t, *_: t < tf.reduce_max(phase['steps']),
        body,
        (tf.constant(0), trained, theta, optimizer_state, zeros, zeros),
    )
    steps = lockstep.GroupSteps(num_examples, loss_sum, [None] * len(trained), tf.ones([clients], tf.bool))
    weights = _replace(weights, train, trained)
    return weights, (list(theta) if inner else None), steps


def _replace(parts: functional.Parts, slots: Sequence[lockstep.Slot], values: Sequence[Any]) -> functional.Parts:
    groups = [list(g) for g in parts]
    for (g, i), v in zip(slots, values):
        groups[g][i] = v
    return functional.Parts(*groups)


def _window(batch: Any, mask: tf.Tensor, index: int, parts: int) -> tuple[Any, tf.Tensor]:
    """The `index`-th of `parts` parts of one client's padded `batch` (`step_kinds.part_bounds` of its real
    examples): ``ceil(batch size / parts)`` examples (at least the longest part) from the part's start, masked to
    the part."""
    n = tf.cast(tf.reduce_sum(mask), tf.int32)
    size = tf.shape(mask)[0]
    start, end = step_kinds.part_bounds(n, index, parts)
    positions = start + tf.range((size + parts - 1) // parts)
    inside = tf.gather(mask, tf.minimum(positions, size - 1)) * tf.cast(positions < end, mask.dtype)
    return tf.nest.map_structure(lambda a: tf.gather(a, tf.minimum(positions, size - 1)), batch), inside
