"""The grouped engine's backend of a `fedpersonal.core.client_plan.ClientPlan`: a group of clients runs the plan's
phases in lockstep, as one compiled program (`lockstep.lockstep_steps` per phase), and the driver applies the
groups' mean update in its own runtime (`driver.GroupRoundRunner`). Same arithmetic as the per-client backend
(`client_plan.build_client_update`), to float precision; the process's ``next`` maps the same group program over
TFF's CLIENTS, so the placements the privacy audit reads are unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing


def unsupported(plan: client_plan.ClientPlan, model_aggregator: Any) -> str | None:
    """Why the engine cannot run `plan` with `model_aggregator`, or None if it can."""
    for phase in plan.phases:
        if not isinstance(phase.optimizer, tff.learning.optimizers.Optimizer):
            return f'a phase optimizer is a {type(phase.optimizer).__name__}, not a functional TFF optimizer'
    if model_aggregator is not None and type(model_aggregator) is not tff.aggregators.MeanFactory:
        return f'the aggregator {type(model_aggregator).__name__} needs each client update (the engine sums groups)'
    return None


def build_engine_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    server_optimizer: tff.learning.optimizers.Optimizer,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """The plan as a stateful process whose `run_round` runs groups of clients on the engine."""
    initial = client_plan.initial_weights(model_fn)
    model = functional.FunctionalModel(model_fn)
    base = model.initial_weights
    slots = {
        client_plan.GLOBAL: [(functional.GLOBAL_TRAINABLE, i) for i in range(len(base.global_trainable))],
        client_plan.LOCAL: [(functional.LOCAL_TRAINABLE, i) for i in range(len(base.local_trainable))],
    }
    names = tuple(f'phase_{i}' for i in range(len(plan.phases)))
    with tf.Graph().as_default():
        element_spec = model_fn().input_spec
    packer = packing.ClientPacker(
        None,
        names,
        element_spec,
        group_size or simulation_options.default_group_size(list(base.global_trainable) + list(base.local_trainable)),
        batch_phase_fn=lambda batches: tuple(batches * p.epochs for p in plan.phases),
    )
    weights_type = initial.global_weights.type_signature.result
    group_private_type = packing.stacked_type(initial.local_weights.type_signature.result)

    def build_group_work(finalizers: collections.OrderedDict, *, now: bool):
        metrics_and_loss = group_lib.metrics_and_loss(metrics_fn, loss_fn, finalizers, now=now)

        @tf.function
        def group_work(server_weights, group, private_states):
            metrics, loss = metrics_and_loss()
            for metric in metrics:
                metric.reset_state()

            @tf.function(jit_compile=model.xla)
            def train(received, non_trainable, group, local_trainable, local_non_trainable):
                weights = functional.Parts(received, non_trainable, local_trainable, local_non_trainable)
                weight = steps = None
                for i, (name, phase) in enumerate(zip(names, plan.phases)):
                    # Globals first: `update_after_steps` reads the first slots' accumulated deltas. They start
                    # shared in their phase (the only one that trains them), as the accumulation needs.
                    train_slots = [
                        s
                        for part in (client_plan.GLOBAL, client_plan.LOCAL)
                        if part in phase.trains
                        for s in slots[part]
                    ]
                    examples = tf.reduce_sum(group[name]['mask'], axis=[1, 2])
                    weights, phase_steps = lockstep.lockstep_steps(
                        model,
                        weights,
                        train_slots,
                        group[name],
                        phase.optimizer,
                        loss,
                        metrics=metrics,
                        delta_weights=examples if i == plan.global_phase else None,
                    )
                    if i == plan.global_phase:
                        weight, steps = examples, phase_steps
                result, finite = group_lib.update_after_steps(received, list(weights.global_trainable), weight, steps)
                keep = lambda new, old: tf.where(
                    tf.reshape(finite, [-1] + [1] * (new.shape.rank - 1)), new, tf.cast(old, new.dtype)
                )
                new_private = tff.learning.models.ModelWeights(
                    trainable=[keep(n, o) for n, o in zip(weights.local_trainable, local_trainable)],
                    non_trainable=list(local_non_trainable),
                )
                return result, new_private

            result, new_private = train(
                list(server_weights.trainable),
                list(server_weights.non_trainable),
                group,
                list(private_states.trainable),
                list(private_states.non_trainable),
            )
            with tf.control_dependencies(tf.nest.flatten(result)):
                return result, client_work.read_metrics(metrics), new_private

        return group_work

    finalizers: collections.OrderedDict = collections.OrderedDict()
    client_update = lambda: tff.tensorflow.computation(weights_type, packer.group_type(), group_private_type)(
        build_group_work(finalizers, now=False)
    )
    runner = driver.GroupRoundRunner(
        build_group_work(collections.OrderedDict(), now=True),
        server_optimizer,
        driver.KerasMetricsFinalizer(lambda: client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())),
    )
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.keras_metrics(finalizers, tff.learning.metrics.sum_then_finalize),
        packer=packer,
        round_runner=runner,
        group_private_state_type=group_private_type,
    )
