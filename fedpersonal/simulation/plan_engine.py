"""The grouped engine's backend of a `fedpersonal.core.client_plan.ClientPlan`: a group of clients runs the plan's
phases as one compiled program (per phase `lockstep.lockstep_steps`, or `client_loop.client_loop_steps`, possibly
spread over the cores: chosen by `strategy`, by default a fixed rule from the model, `client_loop.runs`), and the
driver applies the
groups' mean update in its own runtime (`driver.GroupRoundRunner`). Same arithmetic as the per-client backend
(`per_client_plan.build_client_update`), to float precision; the process's ``next`` maps the same group program over
TFF's CLIENTS, so the placements the privacy audit reads are unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import errors
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.core import server_table
from fedpersonal.simulation import client_loop
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing
from fedpersonal.simulation import plan_program
from fedpersonal.simulation import round_backend
from fedpersonal.simulation import step_kind_engine


def unsupported(
    plan: client_plan.ClientPlan,
    *,
    model_aggregator: Any = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator: Any = None,
    model_distributor: Any = None,
) -> str | None:
    """Why the engine cannot run `plan` with these parts, or None if it can (every engine check, in one place)."""
    try:
        for i, phase in enumerate(plan.phases):
            lockstep.check_optimizer(phase.optimizer, f'the optimizer of phase {i}')
        if plan.model_losses and model_aggregator is not None:  # `model_loss_engine` aggregates by the mean.
            raise errors.ConfigError('The engine runs a plan with model-defined losses with the default aggregator.')
        if plan.table is not None and model_aggregator is not None:
            raise errors.ConfigError('A plan with a server table keeps the uploads as rows: no model_aggregator.')
        group_lib.check_aggregator(model_aggregator, fixed_clip_dp=True)
        group_lib.client_weights(client_weighting, tf.zeros([1]))
        simulation_options.check_engine_parts(
            model_distributor=model_distributor, metrics_aggregator=metrics_aggregator
        )
    except errors.ConfigError as error:
        return str(error)
    return None


def _packer(
    plan: client_plan.ClientPlan, element_spec: Any, group_size: int, cache_bytes: int | None = None
) -> packing.ClientPacker:
    """Packs each phase's batches (its part of the plan's split, or the whole dataset; `Phase.epochs` passes), as
    the per-client backend iterates them; `cache_bytes` as `packing.ClientPacker`'s."""
    names = tuple(f'phase_{i}' for i in range(len(plan.phases)))
    uses = [(p.data, p.epochs) for p in plan.phases]
    if plan.global_start is not None:  # The examples a plan's start reads: the whole dataset, once.
        names, uses = names + (plan_program.START,), uses + [(None, 1)]
    return split_packer(plan.split, uses, names, element_spec, group_size, cache_bytes=cache_bytes)


def split_packer(
    split: client_plan.DataSplit | None,
    uses: Sequence[tuple[str | None, int]],
    names: Sequence[str],
    element_spec: Any,
    group_size: int,
    *,
    cache_bytes: int | None = None,
) -> packing.ClientPacker:
    """Packs, under each of `names`, the batches of a use ``(part of split or None: the whole dataset, passes)`` as
    the per-client backend iterates them; with the split's `batches_fn` from the client's batches in memory.
    `cache_bytes`: as `packing.ClientPacker`'s (None: the machine's default)."""

    def part(data: str | None, whole: Any, parts: Any) -> Any:
        if data is None or split is None:
            return whole
        return parts[split.names.index(data)]

    if split is None or split.batches_fn is not None:
        batches_fn = split.batches_fn if split is not None else None

        def batch_phases(batches: list[Any]) -> tuple[list[Any], ...]:
            parts = batches_fn(batches) if batches_fn is not None else ()
            return tuple(list(part(data, batches, parts)) * epochs for data, epochs in uses)

        return packing.ClientPacker(
            None, names, element_spec, group_size, batch_phase_fn=batch_phases, cache_bytes=cache_bytes
        )

    def dataset_phases(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, ...]:
        parts = split.dataset_fn(dataset)
        return tuple(part(data, dataset, parts).repeat(epochs) for data, epochs in uses)

    return packing.ClientPacker(dataset_phases, names, element_spec, group_size, cache_bytes=cache_bytes)


def build_engine_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Any = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    group_size: int | None = None,
    measure_communication: bool = False,
    strategy: str = simulation_options.AUTO,
    cache_bytes: int | None = None,
    name: str = 'plan',
) -> process_lib.PersonalizedProcess:
    """The plan as a process whose `run_round` runs groups of clients on the engine (check `unsupported` first).
    Under a fixed-clip DP aggregator (`fedpersonal.privacy.dp`) each logical client's update is clipped in the
    group, as the per-client backend clips it. `measure_communication`: `run_round` also reports each logical
    client's download and upload (`simulation.driver`). `strategy`: how a group runs its phases
    (`simulation_options.ENGINE_STRATEGIES`, `client_loop.runs`; logged once under `name`). `cache_bytes`: the
    bound of the packer's client cache (`packing.ClientPacker`; None: the machine's default)."""
    dp_clip = group_lib.per_client_clip(model_aggregator)
    initial = client_plan.plan_initial_weights(plan, model_fn)
    # Batch norm's moving statistics are carried per client through the phases (FedBN keeps them local).
    model = functional.FunctionalModel(model_fn, batch_norm=True)
    step_kind_engine.check(plan.phases, model)
    program = plan_program.PlanProgram(plan, model, client_weighting, dp_clip)
    base, prefixes = model.initial_weights, plan.metric_prefixes
    element_spec = tff.types.type_to_tf_tensor_specs(initial.element_type)
    group_size = group_size or simulation_options.default_group_size(
        list(base.global_trainable) + list(base.local_trainable)
    )
    packer = _packer(plan, element_spec, group_size, cache_bytes)
    weights_type = initial.global_weights.type_signature.result
    group_private_type = None
    if initial.local_weights is not None:
        group_private_type = packing.stacked_type(initial.local_weights.type_signature.result)

    def build_group_work(
        raw_finalizers: dict[str | None, collections.OrderedDict], *, now: bool, strategy: str = client_loop.LOCKSTEP
    ):
        metric_sets = {
            prefix: group_lib.metrics_and_loss(
                metrics_fn, loss_fn, raw_finalizers.setdefault(prefix, collections.OrderedDict()), now=now
            )
            for prefix in prefixes
        }

        # Not converted by AutoGraph: its control flow is Python's (over the plan), its loops explicit TF ones
        # (`lockstep_steps`, which runs the model unconverted); converting it cost ~1.6 s of a MovieLens first round.
        def work(server_weights, group, private_states):
            metrics = {prefix: build()[0] for prefix, build in metric_sets.items()}
            loss = metric_sets[prefixes[0]]()[1]
            for metric in [m for ms in metrics.values() for m in ms]:
                metric.reset_state()
            result, new_private = program.train_function(strategy, loss, metrics)(
                list(server_weights.trainable),
                list(server_weights.non_trainable),
                group,
                list(private_states.trainable) if plan.stateful else [],
                list(private_states.non_trainable) if plan.stateful else [],
            )
            unfinalized: collections.OrderedDict = collections.OrderedDict()
            for prefix, metric_set in metrics.items():
                unfinalized.update(client_plan.prefixed(prefix, client_work.read_metrics(metric_set)))
            with tf.control_dependencies(tf.nest.flatten(result)):
                if not plan.stateful:
                    return result, unfinalized
                return result, unfinalized, new_private

        if not plan.stateful:

            @tf.function(autograph=False)
            def stateless_work(server_weights, group):
                return work(server_weights, group, None)

            return stateless_work
        return tf.function(work, autograph=False)

    finalizers: collections.OrderedDict = collections.OrderedDict()

    def client_update() -> tff.Computation:
        raw: dict[str | None, collections.OrderedDict] = {}
        types = [weights_type, packer.group_type()] + ([group_private_type] if plan.stateful else [])
        computation = tff.tensorflow.computation(*types)(build_group_work(raw, now=False))
        for prefix in prefixes:  # Recorded while tracing; read when the metrics' aggregation is traced.
            finalizers.update(client_plan.prefixed(prefix, raw[prefix]))
        return computation

    def finalized_metrics() -> collections.OrderedDict:
        named: collections.OrderedDict = collections.OrderedDict()
        for prefix in prefixes:
            built = client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())
            named.update(client_plan.prefixed(prefix, collections.OrderedDict((m.name, m) for m in built)))
        return named

    # A slot is a group: under a fixed DP clip its record is the sum of up to group_size clipped updates.
    aggregator = compose.weighted_aggregator(group_lib.slot_aggregator(model_aggregator, group_size), client_weighting)
    table_step = server_table.server_step(weights_type) if plan.table is not None else None
    if table_step is not None and measure_communication:
        raise errors.ConfigError('measure_communication is only supported with the mean aggregator.')
    parts = simulation_options.parallel_parts()
    runs = client_loop.runs(strategy, model, parts=parts, splittable=dp_clip is None)
    if len(runs) == 1:
        logging.info(
            '%s: engine strategy %s (engine_strategy=%s, %d core(s)).', name, driver.run_name(*runs[0]), strategy, parts
        )
    runner = driver.GroupRoundRunner(
        {work: [build_group_work({}, now=True, strategy=work) for _ in range(k)] for work, k in _copies(runs).items()},
        server_optimizer,
        driver.KerasMetricsFinalizer(finalized_metrics),
        measure_communication=measure_communication,
        aggregation=None if dp_clip is None else aggregator.create(weights_type.trainable, tff.TensorType(np.float32)),
        runs=runs,
        table=table_step is not None,
    )
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=client_update,
        model_aggregator=aggregator,
        server_optimizer=server_optimizer,
        server_step=table_step,
        aggregate_metrics=compose.keras_metrics(finalizers, tff.learning.metrics.sum_then_finalize),
        backend=round_backend.EngineBackend(packer, runner, stacks_private_states=group_private_type is not None),
    )


def _copies(runs: Sequence[tuple[str, int]]) -> dict[str, int]:
    """How many independent copies of each group work the runs need: one per part of its most split run."""
    copies: dict[str, int] = {}
    for work, parts in runs:
        copies[work] = max(copies.get(work, 1), parts)
    return copies
