"""What one TFF client slot reports for its group of logical clients: the per-client results, pre-aggregated.

A group's `ClientResult` is the weighted mean of its clients' updates with the sum of their weights as its
weight, so TFF's weighted `MeanFactory` over the groups equals TFF's weighted mean over the logical clients.
Everything an aggregator would do per client that is not a plain weighted mean must therefore happen here,
per logical client: zeroing a non-finite update (and its weight) is; so is DP-FedAvg's fixed clipping
(`fedpersonal.privacy.dp.FixedClipDpFactory`): a group then reports the *sum* of its clients' updates, each clipped
to C (`clipped_sum_update`), and the process aggregates the groups with the same factory for slots of a group's
size (`FixedClipDpFactory.for_client_slots`: the same noise z * C and denominator), which is DP-FedAvg over the
logical clients. Other aggregators that need each client's own value (adaptive clipping, zeroing by norm,
secure-sum bounds) are refused (`check_aggregator`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.core import client_work
from fedpersonal.privacy import dp

T = TypeVar('T')


def per_client_clip(model_aggregator: Any) -> float | None:
    """C when `model_aggregator` is a `FixedClipDpFactory` (the engine clips each logical client), else None."""
    return model_aggregator.clip if isinstance(model_aggregator, dp.FixedClipDpFactory) else None


def slot_aggregator(model_aggregator: Any, group_size: int) -> Any:
    """The aggregator of the process's client slots (groups of up to `group_size` logical clients): a
    `FixedClipDpFactory` for such slots (`for_client_slots`), any other aggregator as it is."""
    if isinstance(model_aggregator, dp.FixedClipDpFactory):
        return model_aggregator.for_client_slots(group_size)
    return model_aggregator


def check_aggregator(model_aggregator: Any, *, fixed_clip_dp: bool = False) -> None:
    """Raises `ConfigError` unless `model_aggregator` is a plain weighted mean (the only one a group can pre-sum) or,
    for an algorithm whose group work clips each logical client (`fixed_clip_dp`), a `FixedClipDpFactory`."""
    if model_aggregator is None or (fixed_clip_dp and per_client_clip(model_aggregator) is not None):
        return
    if type(model_aggregator) is tff.aggregators.MeanFactory:  # pylint: disable=unidiomatic-typecheck
        inner = getattr(model_aggregator, '_value_sum_factory', None)
        if inner is None or type(inner) is tff.aggregators.SumFactory:  # pylint: disable=unidiomatic-typecheck
            return
    raise errors.ConfigError(
        f'The fast simulation engine pre-aggregates each group of logical clients as a weighted mean, so it '
        f"cannot apply {type(model_aggregator).__name__} to each client's own update (adaptive DP clipping, "
        f'norm zeroing and secure sums need per-client values; FedRecon, FedAvg and FURL take a fixed DP clip). Use '
        f"simulation='per_client' with this aggregator."
    )


def clipped_sum_update(
    received: Sequence[tf.Tensor], trained: Sequence[tf.Tensor], weights: tf.Tensor, clip: float
) -> tff.learning.templates.ClientResult:
    """The group's `ClientResult` under a fixed DP clip: the sum of its clients' updates ``received - trained``,
    each clipped to global L2 norm `clip` (as `tf.clip_by_global_norm` clips one client's update on the per-client
    path), with the number of clients summed as its weight (unused: the DP aggregator is unweighted).

    A client without weight (no examples, or a padding slot) or with a non-finite update adds nothing, as the
    per-client path zeroes a non-finite update before aggregation.
    """
    deltas = [r[tf.newaxis] - t for r, t in zip(received, trained)]
    squares = tf.zeros_like(weights)
    for delta in deltas:
        axes = list(range(1, delta.shape.rank))
        squares += tf.reduce_sum(tf.square(delta), axis=axes) if axes else tf.square(delta)
    norm = tf.sqrt(squares)
    keep = tf.logical_and(client_finite(received, trained), weights > 0)
    # tf.clip_by_global_norm's scale: clip * min(1 / norm, 1 / clip).
    scale = tf.where(keep, clip * tf.minimum(1.0 / norm, 1.0 / clip), 0.0)
    update = []
    for delta in deltas:
        shaped = tf.reshape(scale, [-1] + [1] * (delta.shape.rank - 1))
        update.append(tf.reduce_sum(tf.where(shaped > 0, delta * shaped, 0.0), axis=0))
    return tff.learning.templates.ClientResult(update=update, update_weight=tf.reduce_sum(tf.cast(keep, tf.float32)))


def client_weights(client_weighting: Any, num_examples: tf.Tensor) -> tf.Tensor:
    """Per-client aggregation weights ``[clients]`` (0 for a client without examples)."""
    if client_weighting is tff.learning.ClientWeighting.NUM_EXAMPLES:
        weight = num_examples
    elif client_weighting is tff.learning.ClientWeighting.UNIFORM:
        weight = tf.ones_like(num_examples)
    else:
        raise errors.ConfigError(
            'The fast simulation engine supports client_weighting NUM_EXAMPLES or UNIFORM (a callable of each '
            "client's unfinalized metrics needs per-client metrics); use simulation='per_client'."
        )
    return tf.where(num_examples > 0, weight, 0.0)


def weighted_update(
    received: Sequence[tf.Tensor],
    trained: Sequence[tf.Tensor],
    weights: tf.Tensor,
    accumulated: Sequence[tf.Tensor | None] | None = None,
    finite: tf.Tensor | None = None,
) -> tff.learning.templates.ClientResult:
    """The group's `ClientResult`: the weighted mean of ``received - trained`` over its clients.

    A client whose update has a non-finite value is dropped (update and weight zero), as the per-client path
    zeroes it (`tensor_utils.zero_all_if_any_non_finite`).

    Args:
      received: The weights the clients started from (shared by the group).
      trained: Their trained values per client (``[clients, ...]``).
      weights: Per-client weights ``[clients]``.
      accumulated: Optional, per weight: its weighted delta sum accumulated during training with
        ``delta_weights=weights`` (`lockstep.GroupSteps.weighted_deltas`, aligned with `received`), used when
        every client's gradients were finite (`finite`, the common case): it spares a pass over each
        client's copy of large tables.
      finite: ``[clients]`` bool, with `accumulated` (`lockstep.GroupSteps.finite`).
    """
    accumulated = list(accumulated or [None] * len(received))
    if finite is not None and any(a is not None for a in accumulated):
        dense = lambda: _dense_weighted_update(received, trained, weights)
        total = tf.reduce_sum(weights)

        def fast():
            rest = iter(_dense_weighted_update(received, trained, weights, only=accumulated).update)
            update = [tf.math.divide_no_nan(a, total) if a is not None else next(rest) for a in accumulated]
            return tff.learning.templates.ClientResult(update=update, update_weight=total)

        all_finite = tf.reduce_all(tf.logical_or(finite, weights <= 0))
        return tf.cond(all_finite, fast, dense)
    return _dense_weighted_update(received, trained, weights)


def update_after_steps(
    received: Sequence[tf.Tensor], trained: Sequence[tf.Tensor], weights: tf.Tensor, steps: Any
) -> tuple[tff.learning.templates.ClientResult, tf.Tensor]:
    """`weighted_update` of the first ``len(received)`` slots a `lockstep_steps` call trained (with
    ``delta_weights=weights``), and each client's finiteness ``[clients]`` (e.g. to keep its previous private state).

    Trained weights that came back shared (`client_loop.client_loop_steps` with ``keep_trained=False``) have only
    their accumulated deltas, which leave out the clients whose update is not finite: the update is their sum over
    the weight of the finite clients.
    """
    accumulated = list(steps.weighted_deltas[: len(received)])
    if all(t.shape.rank == r.shape.rank for t, r in zip(trained, received)):
        total = tf.reduce_sum(tf.where(steps.finite, weights, 0.0))
        update = [tf.math.divide_no_nan(a, total) for a in accumulated]
        return tff.learning.templates.ClientResult(update=update, update_weight=total), steps.finite
    if all(a is not None for a in accumulated):
        finite = steps.finite
    else:
        finite = client_finite(received, trained)
    return weighted_update(received, trained, weights, accumulated, finite), finite


def client_finite(received: Sequence[tf.Tensor], trained: Sequence[tf.Tensor]) -> tf.Tensor:
    """``[clients]`` bool: every value of the client's update ``received - trained`` is finite."""
    finite = None
    for r, t in zip(received, trained):
        delta = r[tf.newaxis] - t
        axes = list(range(1, delta.shape.rank))
        ok = tf.reduce_all(tf.math.is_finite(delta), axis=axes) if axes else tf.math.is_finite(delta)
        finite = ok if finite is None else tf.logical_and(finite, ok)
    return finite


def _dense_weighted_update(received, trained, weights, only=None) -> tff.learning.templates.ClientResult:
    """`weighted_update` from every client's trained copy (slots where `only` is not None are skipped: zeros)."""
    if only is not None:
        keep = [a is None for a in only]
        received = [r for r, k in zip(received, keep) if k]
        trained = [t for t, k in zip(trained, keep) if k]
    deltas = [r[tf.newaxis] - t for r, t in zip(received, trained)]
    finite = tf.ones_like(weights, tf.bool)
    for delta in deltas:
        axes = list(range(1, delta.shape.rank))
        finite = tf.logical_and(
            finite, tf.reduce_all(tf.math.is_finite(delta), axis=axes) if axes else tf.math.is_finite(delta)
        )
    weights = tf.where(finite, weights, 0.0)
    total = tf.reduce_sum(weights)
    scale = tf.math.divide_no_nan(weights, total)
    update = []
    for delta in deltas:
        shaped = tf.reshape(scale, [-1] + [1] * (delta.shape.rank - 1))
        update.append(tf.reduce_sum(tf.where(shaped > 0, delta, 0.0) * shaped, axis=0))
    return tff.learning.templates.ClientResult(update=update, update_weight=total)


def built_once(build: Callable[[], T], *, now: bool) -> Callable[[], T]:
    """``() -> build()``, built once and kept across a group work function's traces (its metric variables).

    A `tf.function` that creates variables on its first call is traced twice (TF traces it again to check that
    later calls create none): the group work run by `fedpersonal.simulation.driver` builds them `now`, eagerly, so
    that its first call is its only trace (measured on a tiny MovieLens FedRecon run: 2 traces instead of 3, ~3 s of
    its 20-27 s). The copy wrapped into a TFF computation must create them in that computation's graph: on its
    first trace (`now=False`), under `tf.init_scope`.
    """
    built: list[T] = []

    def get() -> T:
        if not built:
            with tf.init_scope():
                built.append(build())
        return built[0]

    if now:
        get()
    return get


def metrics_and_loss(
    metrics_fn: client_work.MetricsFn | None,
    loss_fn: client_work.LossFn,
    finalizers: Any,
    *,
    now: bool,
) -> Callable[[], tuple[list[tf.keras.metrics.Metric], Any]]:
    """``() -> (metrics, loss)`` of a group work function: `client_work.build_metrics` (recording each metric's
    finalizer in `finalizers`) and ``loss_fn()``, built once (`built_once`)."""
    return built_once(lambda: (client_work.build_metrics(metrics_fn, loss_fn, finalizers), loss_fn()), now=now)
