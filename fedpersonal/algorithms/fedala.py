"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023).

Each client keeps the model it trained last. At the start of its round it does not overwrite that model with the
received global one; it aggregates the two element-wise: the lower layers take the global weights, and the top
layers (the last `layer_idx` trainable tensors) start at ``local + (global - local) * W``, with weights W in
[0, 1] per element, learned on a random `rand_percent`% of its training data by projected SGD (until the loss
settles the first time, one pass later). Then it trains that model as FedAvg does, uploads it, and keeps it; the
server averages (FedAvg). W and the model never leave the client. A client predicts with its aggregated start.

As PFLlib (``system/utils/ALA.py``, ``clientala.py``; defaults eta = 1, rand_percent = 80, layer_idx = 2, threshold
0.1 over the last 10 losses), with two differences: the first learning stops after `max_epochs` epochs (PFLlib's
has no limit), and the slice's start is drawn from a seed and the client's count of aggregations (reproducible).

The client work is a `ClientPlan` whose global phase starts from the aggregation: `AdaptiveLocalAggregation` is a
`fedpersonal.core.client_start.ClientStart`, its rules (`slice_bounds`, `mix`, `mixing_step`, `settled`, `learns`)
and its loop (`AdaptiveLocalAggregation.start`, one client's examples) defined here once, which every backend calls:
per client, and on the grouped engine client after client inside the group's program, since each client learns W
for as many epochs as its own losses decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import errors
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import client_start
from fedpersonal.core import process as process_lib


@dataclasses.dataclass(frozen=True)
class AdaptiveLocalAggregation:
    """FedALA's adaptive local aggregation (the module docstring; PFLlib's ``system/utils/ALA.py``, its defaults).

    Attributes:
      layer_idx: How many trainable tensors, counted from the model's last, are aggregated element-wise (PFLlib's
        ``layer_idx``: 2, the head's kernel and bias); 0: all. The others take the received weights.
      eta: W's learning rate.
      rand_percent: The share (%) of the client's examples W learns on: a contiguous slice from a random start.
      batch_size: The batch size W learns with (PFLlib: the client's).
      threshold: The first time a client aggregates, W learns until the standard deviation of the last
        `num_pre_loss` epochs' last batch losses is below `threshold` (after more than `num_pre_loss` epochs);
        later, one epoch.
      num_pre_loss: See `threshold`.
      max_epochs: The most epochs of that first learning (PFLlib has no limit).
      seed: Seeds the slice's start, with the client's count of aggregations (clients that have aggregated as
        often and hold as many examples start their slices at the same example).
    """

    layer_idx: int = 2
    eta: float = 1.0
    rand_percent: int = 80
    batch_size: int = 10
    threshold: float = 0.1
    num_pre_loss: int = 10
    max_epochs: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.layer_idx < 0 or not self.eta > 0 or not 0 < self.rand_percent <= 100 or self.batch_size < 1:
            raise ValueError(
                f'AdaptiveLocalAggregation needs layer_idx >= 0, eta > 0, rand_percent in (0, 100] and '
                f'batch_size >= 1, got {self}.'
            )
        if self.threshold < 0 or self.num_pre_loss < 1 or self.max_epochs <= self.num_pre_loss:
            raise ValueError(
                f'AdaptiveLocalAggregation needs threshold >= 0, num_pre_loss >= 1 and max_epochs > '
                f'num_pre_loss, got {self}.'
            )

    def check(self, plan: Any) -> None:
        """Raises ValueError unless `plan` keeps a personal copy and its one phase trains the global weights."""
        phases = plan.phases
        if not plan.personal_copy or plan.personalization is not None or plan.split is not None:
            raise ValueError('Adaptive local aggregation needs personal_copy=True, no personalization and no split.')
        if len(phases) != 1 or phases[0].trains != ('global',) or phases[0].step is not None or phases[0].data:
            raise ValueError(
                f'Adaptive local aggregation starts one phase that trains the global weights, got {phases}.'
            )

    def changes(self, num_trainable: int) -> list[int]:
        """The aggregated (last) trainable tensors' indices."""
        return list(range(num_trainable - self.count(num_trainable), num_trainable))

    def extras(self, weights: tff.learning.models.ModelWeights) -> tff.learning.models.ModelWeights:
        """W, ones for each aggregated tensor, and the count of aggregations, 0."""
        k = self.count(len(weights.trainable))
        return tff.learning.models.ModelWeights(
            [tf.ones_like(v) for v in list(weights.trainable)[-k:]], [tf.constant(0)]
        )

    def start(
        self,
        received: list[Any],
        kept: tff.learning.models.ModelWeights,
        extras: tff.learning.models.ModelWeights,
        examples: client_start.Examples,
        gradient: client_start.GradientFn,
    ) -> client_start.Started:
        """One client's aggregation: W learns on its slice (projected SGD, batches of `batch_size`), epoch after
        epoch until `settled`, unless the client `learns` nothing (its model is the received one)."""
        k, bs = len(extras.trainable), self.batch_size
        own, statistics = list(kept.trainable), list(kept.non_trainable)
        v, w = own[-k:], list(received[-k:])
        count = extras.non_trainable[0]
        capacity = tf.shape(examples.mask)[0]
        start, size = slice_bounds(self, tf.reduce_sum(examples.mask), count)
        wrt = self.changes(len(own))

        def step(j, m, statistics, last):
            offsets = tf.cast(j * bs + tf.range(bs), tf.int64)
            indices = tf.cast(tf.minimum(start + offsets, tf.cast(capacity - 1, tf.int64)), tf.int32)
            batch = tf.nest.map_structure(lambda e: tf.gather(e, indices), examples.batch)
            upper = mix(v, w, m)
            value, gradients, statistics = gradient(
                list(received[:-k]) + upper, statistics, batch, tf.cast(offsets < size, tf.float32), wrt
            )
            return j + 1, mixing_step(self, m, gradients, v, w), statistics, value

        batches = tf.cast((size + bs - 1) // bs, tf.int32)
        first = tf.equal(count, 0)

        def epoch(i, m, statistics, losses, done):
            _, m, statistics, last = tf.while_loop(
                lambda j, *_: j < batches, step, (tf.constant(0), m, statistics, tf.constant(0.0))
            )
            losses = tf.tensor_scatter_nd_update(losses, [[i]], [last])
            return i + 1, m, statistics, losses, settled(self, losses, i, first)

        learning = learns(own, received)
        _, m, statistics, _, _ = tf.while_loop(
            lambda i, *args: tf.logical_and(tf.logical_not(args[-1]), i < self.max_epochs),
            epoch,
            (tf.constant(0), list(extras.trainable), statistics, tf.zeros([self.max_epochs]), tf.logical_not(learning)),
        )
        upper = [tf.where(learning, a, b) for a, b in zip(mix(v, w, m), w)]
        return client_start.Started(
            upper, list(statistics), tff.learning.models.ModelWeights(m, [count + tf.cast(learning, count.dtype)])
        )

    def predicts_with(
        self, received: list[Any], kept: tff.learning.models.ModelWeights, extras: tff.learning.models.ModelWeights
    ) -> tff.learning.models.ModelWeights:
        """The start of the client's next round without learning W further: w below, ``v + (w - v) * W`` above."""
        received = [np.asarray(t) for t in received]
        k = len(extras.trainable)
        own = [np.asarray(t) for t in kept.trainable]
        upper = [v + (w - v) * np.asarray(m) for v, w, m in zip(own[-k:], received[-k:], extras.trainable)]
        return tff.learning.models.ModelWeights(received[:-k] + upper, [np.asarray(t) for t in kept.non_trainable])

    def count(self, num_trainable: int) -> int:
        """How many of `num_trainable` trainable tensors are aggregated element-wise."""
        if self.layer_idx > num_trainable:
            raise ValueError(f"layer_idx {self.layer_idx} exceeds the model's {num_trainable} trainable tensors.")
        return self.layer_idx or num_trainable


def slice_bounds(ala: AdaptiveLocalAggregation, num_examples: tf.Tensor, aggregations: tf.Tensor):
    """``(start, size)`` (int64) of the contiguous slice of a client's `num_examples` examples that W learns on, drawn
    from the seed and the client's count of aggregations."""
    n = tf.cast(num_examples, tf.int64)
    size = n * ala.rand_percent // 100
    seed = tf.stack([tf.constant(ala.seed, tf.int64), tf.cast(aggregations, tf.int64)])
    return tf.random.stateless_uniform([], seed, 0, n - size + 1, dtype=tf.int64), size


def mix(own: Sequence[Any], received: Sequence[Any], mixing: Sequence[Any]) -> list[tf.Tensor]:
    """The aggregated tensors ``v + (w - v) * W`` of the client's own `v` and the received `w`."""
    return [v + (w - v) * m for v, w, m in zip(own, received, mixing)]


def mixing_step(
    ala: AdaptiveLocalAggregation, mixing: Sequence[Any], gradients: Sequence[Any], own: Sequence[Any], received
) -> list[tf.Tensor]:
    """W after one projected SGD step, from the loss's `gradients` at the aggregated tensors (W's gradient is
    theirs times ``w - v``)."""
    return [
        tf.clip_by_value(m - ala.eta * g * (w - v), 0.0, 1.0) for m, g, w, v in zip(mixing, gradients, received, own)
    ]


def settled(ala: AdaptiveLocalAggregation, losses: tf.Tensor, epoch: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
    """Whether W's learning stops after `epoch` (from 0) with the epochs' last batch losses `losses`
    (``[max_epochs]``): after one epoch unless it is the client's `first` aggregation; then once the standard
    deviation of the last `num_pre_loss` losses is below the threshold (the caller stops at `max_epochs`)."""
    window = tf.slice(losses, [tf.maximum(epoch + 1 - ala.num_pre_loss, 0)], [ala.num_pre_loss])
    calm = tf.logical_and(epoch + 1 > ala.num_pre_loss, tf.math.reduce_std(window) < ala.threshold)
    return tf.logical_or(tf.logical_not(first), calm)


def learns(own: Sequence[Any], received: Sequence[Any]) -> tf.Tensor:
    """Whether a client aggregates: as PFLlib (``sum(w[0] - v[0]) != 0``), not while its copy equals the received
    weights (before its first round; it then starts from them, W unchanged)."""
    return tf.reduce_any(tf.not_equal(own[0], received[0]))


PFLLIB_DEFAULTS = AdaptiveLocalAggregation()


def fedala_plan(
    *,
    client_epochs: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    aggregation: AdaptiveLocalAggregation,
) -> client_plan.ClientPlan:
    """FedALA's client work: the adaptive local aggregation, then local training of the aggregated model."""
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer)
    return client_plan.ClientPlan((phase,), personal_copy=True, global_start=aggregation)


def build_fedala(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: object,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    aggregation: AdaptiveLocalAggregation = PFLLIB_DEFAULTS,
) -> process_lib.PersonalizedProcess:
    """Builds FedALA on the context's backend, for a Keras classifier (logits).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The local optimizer (fresh state every round; PFLlib: SGD).
      server_optimizer: Applied to the averaged update.
      client_epochs: Local epochs per round.
      aggregation: The aggregation's hyperparameters (default PFLlib's, batch 10; set its `batch_size` to the
        clients').

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's model with W after its trainable
      weights and its count of aggregations after its non-trainable ones
      (`client_plan.personalized_weights` gives the model it predicts with).

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_fedala(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...     element_spec=spec, client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
    ...     server_optimizer=tff.learning.optimizers.build_sgdm(1.0))
    >>> private = process.initial_private_state()
    >>> [w.shape for w in private.trainable], private.non_trainable
    ([(4, 3), (3,), (4, 3), (3,)], [0])
    """
    plan = fedala_plan(client_epochs=client_epochs, client_optimizer=client_optimizer, aggregation=aggregation)
    return backends.build_classifier_process(
        plan, model_fn, element_spec=element_spec, server_optimizer=server_optimizer, name='FedALA'
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """FedALA's options in the benchmark binary (`fedpersonal.registry`): PFLlib's defaults (system/main.py: eta,
    rand_percent, layer_idx; system/utils/ALA.py: threshold, num_pre_loss); the cap on W's first learning is ours."""

    eta: float = registry.option(1.0, "FedALA's learning rate of the aggregation weights W (PFLlib's --eta).", above=0)
    rand_percent: int = registry.option(
        80,
        "FedALA: the share (%) of a client's train data W learns on (PFLlib's --rand_percent).",
        above=0,
        maximum=100,
    )
    layer_idx: int = registry.option(
        2,
        "FedALA: the last trainable tensors aggregated element-wise, 0 all (PFLlib's --layer_idx; 2: the head).",
        minimum=0,
    )
    threshold: float = registry.option(
        0.1,
        "FedALA: W first learns until the std of its last losses is below this (PFLlib's ALA threshold).",
        minimum=0,
    )
    num_pre_loss: int = registry.option(10, 'FedALA: how many last losses that std is over (PFLlib: 10).', minimum=1)
    max_epochs: int = registry.option(100, "FedALA: the most epochs of W's first learning (PFLlib: no limit).")

    def __post_init__(self):
        if self.max_epochs <= self.num_pre_loss:
            raise errors.ConfigError(f'max_epochs ({self.max_epochs}) must be > num_pre_loss ({self.num_pre_loss}).')


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    aggregation = AdaptiveLocalAggregation(
        layer_idx=options.layer_idx,
        eta=options.eta,
        rand_percent=options.rand_percent,
        batch_size=settings.batch_size,
        threshold=options.threshold,
        num_pre_loss=options.num_pre_loss,
        max_epochs=options.max_epochs,
        seed=settings.seed,
    )
    return fedala_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd(), aggregation=aggregation)


BENCHMARK_ROWS = (registry.Row('fedala', 'FedALA', _benchmark_plan, leaderboard=15),)
