"""A round of an engine process with its groups' client work compiled by XLA in the driver's TF runtime.

Why not inside TFF's runtime: TFF 0.87 executes every computation in its C++ `worker_binary`, which has no
XLA JIT (measured: a ``jit_compile=True`` function runs there at its uncompiled speed). The engine's group
computation loses most of its speed without XLA (docs/RESULTS.md, "Fast simulation"), so `GroupRoundRunner`
runs the round as TFF's computation would, step for step, with TFF's own pieces:

1. the broadcast is the identity (the engine accepts only TFF's default broadcast);
2. each group's client work is the *same* `tf.function` that `process.next` maps over CLIENTS, run here;
3. the groups' `ClientResult`s are combined as TFF's `MeanFactory` combines client slots
   (``sum(weight * update) / sum(weight)``, `tf.math.divide` as in TFF);
4. the server step is TFF's apply-optimizer finalizer logic: the TFF optimizer's `next`, and
   `reject_non_finite_update` keeping the previous weights and optimizer state on a non-finite update;
5. the clients' unfinalized metrics are summed and finalized with the recorded Keras finalizers
   (`tff.learning.metrics.sum_then_finalize`).

`process.next` stays the full TFF computation (placements, the privacy audit, other runtimes); the tests check
that `process.run_round` (this runner) and `process.next` give the same state and metrics.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import apply_optimizer_finalizer

from fedpersonal.core import process as process_lib


def _numpy(structure: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, 'numpy') else np.asarray(t), structure)


class KerasMetricsFinalizer:
    """`tff.learning.metrics.sum_then_finalize`'s finalization of summed Keras metric variables, run eagerly.

    TFF's Keras finalizers build a metric inside a `tf.function` on every trace, which only works in a TFF
    computation's graph; here one set of metrics (from `build_metrics`) is kept and its variables are set.
    """

    def __init__(self, build_metrics: Callable[[], Sequence[tf.keras.metrics.Metric]]):
        self._build_metrics = build_metrics
        self._metrics: Sequence[tf.keras.metrics.Metric] | None = None

    def __call__(self, unfinalized: Any) -> collections.OrderedDict:
        if self._metrics is None:
            self._metrics = self._build_metrics()
        finalized = collections.OrderedDict()
        for metric in self._metrics:
            for variable, value in zip(metric.variables, unfinalized[metric.name]):
                variable.assign(value)
            finalized[metric.name] = metric.result().numpy()
        return finalized


class GroupRoundRunner:
    """Runs one round of a stateless engine process from its group client work and server optimizer.

    Args:
      group_work: ``(ModelWeights, group) -> (ClientResult, unfinalized metrics)``, a `tf.function` (the
        function the process's TFF client computation wraps).
      server_optimizer: The process's TFF server optimizer.
      finalize_metrics: The clients' summed unfinalized metrics -> the round's metrics (e.g.
        `KerasMetricsFinalizer`).
    """

    def __init__(
        self,
        group_work: Callable[[Any, Any], Any],
        server_optimizer: tff.learning.optimizers.Optimizer,
        finalize_metrics: Callable[[Any], Any],
    ):
        self._group_work = group_work
        self._finalize_metrics = finalize_metrics
        self.compile_seconds: float | None = None

        @tf.function(jit_compile=True)
        def server_step(optimizer_state, trainable, updates, weights):
            total = tf.add_n(weights)
            mean = [
                tf.math.divide(tf.add_n([u[k] * w for u, w in zip(updates, weights)]), total)
                for k in range(len(trainable))
            ]
            new_state, new_weights = server_optimizer.next(optimizer_state, list(trainable), mean)
            reject, measurements = apply_optimizer_finalizer.reject_non_finite_update(new_state, mean)
            keep = lambda new, old: tf.nest.map_structure(lambda a, b: tf.where(reject, b, a), new, old)
            return keep(new_state, optimizer_state), keep(list(new_weights), list(trainable)), measurements

        self._server_step = server_step

    def __call__(self, state: Any, groups: Sequence[Any]) -> process_lib.ProcessOutput:
        weights = state.global_model_weights
        model_weights = tff.learning.models.ModelWeights(
            trainable=[tf.convert_to_tensor(w) for w in weights.trainable],
            non_trainable=[tf.convert_to_tensor(w) for w in weights.non_trainable],
        )
        results, metric_sums = [], None
        for group in groups:
            result, metrics = self._group_work(model_weights, tf.nest.map_structure(tf.convert_to_tensor, group))
            results.append(result)
            metric_sums = metrics if metric_sums is None else tf.nest.map_structure(tf.add, metric_sums, metrics)
        optimizer_state, trainable, measurements = self._server_step(
            state.finalizer,
            list(model_weights.trainable),
            [list(r.update) for r in results],
            [tf.cast(r.update_weight, tf.float32) for r in results],
        )
        new_state = tff.learning.templates.LearningAlgorithmState(
            global_model_weights=tff.learning.models.ModelWeights(
                trainable=_numpy(trainable), non_trainable=_numpy(list(model_weights.non_trainable))
            ),
            distributor=state.distributor,
            client_work=state.client_work,
            aggregator=state.aggregator,
            finalizer=_numpy(optimizer_state),
        )
        train = self._finalize_metrics(metric_sums)
        metrics = collections.OrderedDict(
            distributor=(),
            client_work=collections.OrderedDict(train=train),
            aggregator=collections.OrderedDict(mean_value=(), mean_weight=()),
            finalizer=_numpy(measurements),
        )
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=())
