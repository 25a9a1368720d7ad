"""The grouped engine's backend of a client plan with model-defined losses (`fedpersonal.core.model_loss_plan`).

A group of clients runs the plan's phases in lockstep in one TF program (`lockstep.lockstep_steps` per phase) and
the driver applies the groups' mean update (`driver.GroupRoundRunner`); the process's ``next`` maps the same group
program over TFF's CLIENTS, so the placements the privacy audit reads are the per-client backend's. Equal to the
per-client backend (`model_loss_plan.build_client_update`) to float precision:

* a step of a client is the per-client step on the same batch: the model rebuilt from the client's weights
  (`functional.FunctionalModel`, its batch norms recording their moving-statistic updates, carried per client)
  computes the phase's loss and its gradient on the client's real examples only (the packed batch sliced to them,
  so batch norms and every batch statistic of the loss see exactly the per-client batch), with the step's index;
* each phase's batches are materialized as the per-client backend iterates them (`phases_as_tff_sees`), so a
  dataset that reshuffles on every iteration gives the same orders on both backends.

The program runs without XLA and its clients in a loop: a client's step slices its real examples (a shape that
depends on the data), and per-client convolution filters neither vectorize nor ran faster under XLA on the CPU
(FedDVA's convolutions: XLA 4-5x slower than TF's oneDNN kernels, configs/feddva_scaled.flags on MNIST: 17 s per
round against 3.5 s).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_plan
from fedpersonal.core import compose
from fedpersonal.core import model_loss_plan
from fedpersonal.core import process as process_lib
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing
from fedpersonal.simulation import round_backend


def _groups(model: model_loss_plan.PhasedModel) -> tuple[Sequence[tf.Variable], ...]:
    return (
        model.global_trainable_variables,
        model.global_non_trainable_variables,
        model.local_trainable_variables,
        model.local_non_trainable_variables,
    )


def build_engine_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], model_loss_plan.PhasedModel],
    *,
    element_spec: Any,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    group_size: int | None = None,
    measure_communication: bool = False,
    cache_bytes: int | None = None,
) -> process_lib.PersonalizedProcess:
    """The plan as a stateful process whose `run_round` runs groups of clients on the engine (default aggregator:
    the weighted mean; check `plan_engine.unsupported` first). `group_size`: the most clients per group (default:
    as many as fit 1 GiB); `measure_communication`: as `driver.GroupRoundRunner`'s; `cache_bytes`: the bound of
    the packer's client cache (`packing.ClientPacker`; None: the machine's default)."""
    initial = model_loss_plan.initial_weights(model_fn, element_spec)
    assert initial.local_weights is not None
    model = functional.FunctionalModel(model_fn, groups=_groups, batch_norm=True)
    base = model.initial_weights
    phase_slots = [model.slots_of(functools.partial(model_loss_plan.trained_variables, phase=p)) for p in plan.phases]
    counter = model.slots_of(lambda m: [m.participations])[0] if plan.counts_participations else None
    label_slot = model.slots_of(lambda m: [m.label_counts])[0] if plan.counts_labels else None
    names = tuple(f'phase_{i}' for i in range(len(plan.phases)))
    per_client_arrays = [w for part in base for w in part]
    packer = packing.ClientPacker(
        phases_as_tff_sees(element_spec, [p.epochs for p in plan.phases]),
        names,
        element_spec,
        group_size or simulation_options.default_group_size(per_client_arrays),
        cache_bytes=cache_bytes,
    )
    weights_type = initial.global_weights.type_signature.result
    group_private_type = packing.stacked_type(initial.local_weights.type_signature.result)

    def real_examples(batch, mask):
        """The batch's real examples (packed first); one padded example for a client without a batch at this step
        (its step is computed and discarded, a batch of one keeps every statistic finite)."""
        n = tf.maximum(tf.cast(tf.reduce_sum(mask), tf.int32), 1)
        return partially_local_model.split_batch(tf.nest.map_structure(lambda t: t[:n], batch))

    def client_loss_fn(phase: client_plan.Phase) -> lockstep.ClientLoss:
        def client_loss(parts, batch, mask, step):
            x, y = real_examples(batch, mask)
            rebuilt = model.rebuild(parts)
            return rebuilt.model.phase_loss(str(phase.loss), x, y, step), rebuilt.updates

        return client_loss

    def statistic_fn(phase: client_plan.Phase) -> lockstep.AfterStep:
        def statistic(parts, batch, mask, step):
            del step
            x, y = real_examples(batch, mask)
            return collections.OrderedDict(value=model.rebuild(parts).model.phase_statistic(str(phase.statistic), x, y))

        return statistic

    @tf.function(autograph=False)
    def group_work(server_weights, group, private_states):
        received, private_trainable = list(server_weights.trainable), list(private_states.trainable)
        private_non_trainable = list(private_states.non_trainable)
        weights = functional.Parts(
            received, list(server_weights.non_trainable), private_trainable, private_non_trainable
        )
        clients = tf.shape(group[names[0]]['mask'])[0]
        if label_slot is not None:  # Each client's label counts, from one pass of the first phase that has one.
            weights = _with_label_counts(weights, label_slot, plan, names, group)
        sums: collections.OrderedDict = collections.OrderedDict()
        zeros = tf.zeros([clients])
        num_examples = zeros
        for name, phase, slots in zip(names, plan.phases, phase_slots):
            count, loss_sum, statistic = zeros, zeros, zeros
            if phase.epochs > 0 and slots:
                data = group[name]
                steps = tf.shape(data['mask'])[1]
                has_statistic = phase.statistic is not None
                weights, result = lockstep.lockstep_steps(
                    model,
                    weights,
                    slots,
                    data,
                    phase.optimizer,
                    client_loss=client_loss_fn(phase),
                    step_inputs=tf.broadcast_to(tf.range(steps, dtype=tf.int64)[tf.newaxis], [clients, steps]),
                    after_step=statistic_fn(phase) if has_statistic else None,
                    zero_stats=collections.OrderedDict(value=0.0) if has_statistic else (),
                    vectorize=False,  # Real examples sliced per client (and per-client filters): a loop over clients.
                )
                count, loss_sum = result.num_examples, result.loss_sum
                statistic = result.stats['value'] if has_statistic else zeros
            sums[f'{model_loss_plan.prefix(phase)}_loss'] = tf.stack([tf.reduce_sum(loss_sum), tf.reduce_sum(count)])
            if phase.statistic is not None:
                key = f'{model_loss_plan.prefix(phase)}_{phase.statistic}'
                sums[key] = tf.stack([tf.reduce_sum(statistic), tf.reduce_sum(count)])
            num_examples = tf.maximum(num_examples, count / float(max(phase.epochs, 1)))
        has_data = tf.reduce_sum(tf.cast(num_examples > 0, tf.float32))
        sums['num_examples'] = tf.stack([tf.reduce_sum(num_examples), has_data])  # The denominator is unused.
        trained = [lockstep.per_client(w, b, clients) for w, b in zip(weights.global_trainable, base.global_trainable)]
        weight = group_lib.client_weights(client_weighting, num_examples)
        update = group_lib.weighted_update(received, trained, weight)
        finite = group_lib.client_finite(received, trained)  # Else the client keeps its previous private state.
        new_private = []
        for group_index, previous_values in (
            (functional.LOCAL_TRAINABLE, private_trainable),
            (functional.LOCAL_NON_TRAINABLE, private_non_trainable),
        ):
            for i, previous in enumerate(previous_values):
                value = lockstep.per_client(weights[group_index][i], base[group_index][i], clients)
                if (group_index, i) == counter:
                    value += 1  # The next participation draws fresh noise.
                keep = tf.reshape(finite, [-1] + [1] * (value.shape.rank - 1))
                new_private.append(tf.where(keep, value, tf.cast(previous, value.dtype)))
        num_trainable = len(private_trainable)
        private = tff.learning.models.ModelWeights(
            trainable=new_private[:num_trainable], non_trainable=new_private[num_trainable:]
        )
        return update, sums, private

    client_update = lambda: tff.tensorflow.computation(weights_type, packer.group_type(), group_private_type)(
        group_work
    )
    runner = driver.GroupRoundRunner(
        group_work, server_optimizer, driver.finalize_ratios, measure_communication=measure_communication
    )
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(),
        backend=round_backend.EngineBackend(packer, runner, stacks_private_states=group_private_type is not None),
    )


def _with_label_counts(
    weights: functional.Parts, slot: functional.Slot, plan: client_plan.ClientPlan, names: Sequence[str], group: Any
) -> functional.Parts:
    """`weights` with the slot of the model's ``label_counts`` set to each client's label counts (as
    `model_loss_plan.label_counts`): a phase's real examples over its epochs."""
    index = next(i for i, p in enumerate(plan.phases) if p.epochs > 0)  # The plan has one (`ClientPlan`).
    data = group[names[index]]
    _, y = partially_local_model.split_batch(data['batch'])
    num_classes = weights[slot[0]][slot[1]].shape[-1]
    one_hot = tf.one_hot(tf.cast(y, tf.int32), num_classes) * data['mask'][..., tf.newaxis]
    counts = tf.reduce_sum(one_hot, axis=[1, 2]) / float(plan.phases[index].epochs)
    groups = [list(g) for g in weights]
    groups[slot[0]][slot[1]] = counts
    return functional.Parts(*groups)


def phases_as_tff_sees(element_spec: Any, epochs: Sequence[int]) -> Callable[[tf.data.Dataset], tuple]:
    """``dataset -> (phase datasets...)``: the batches of every phase exactly as the per-client backend iterates them.

    The per-client backend iterates its dataset once per phase (``repeat(epochs)``, in plan order); a dataset
    shuffled with ``reshuffle_each_iteration`` gives every phase and epoch another order. TFF serializes the dataset
    for every call, so each round starts from the first order, however often the Python object was iterated.
    Iterating it the same way inside a TFF computation gives the same batches. A phase of 0 epochs has none.
    """
    leaves = tf.nest.flatten(element_spec)

    @tff.tensorflow.computation(tff.SequenceType(tff.types.tensorflow_to_type(element_spec)))
    @tf.function(autograph=False)  # Its automatic control dependencies iterate the phases in order.
    def collect(dataset):
        def append(state, batch):  # Rows in TensorArrays: no quadratic copying.
            rows, sizes = state
            flat = tf.nest.flatten(batch)
            rows = tuple(ta.write(ta.size(), leaf) for ta, leaf in zip(rows, flat))
            return rows, sizes.write(sizes.size(), tf.shape(flat[0])[0])

        phases = []
        for phase_epochs in epochs:
            if phase_epochs:  # Iterated as `model_loss_plan.run_phases` iterates it.
                empty = tuple(
                    tf.TensorArray(s.dtype, 0, True, infer_shape=False, element_shape=s.shape) for s in leaves
                )
                initial = (empty, tf.TensorArray(tf.int32, 0, True, element_shape=[]))
                rows, sizes = dataset.repeat(phase_epochs).enumerate().reduce(initial, lambda s, b: append(s, b[1]))
                phases.append((tuple(ta.concat() for ta in rows), sizes.stack()))
        return tuple(phases)

    def phase_datasets(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, ...]:
        collected = iter(collect(dataset)) if any(epochs) else iter(())
        out = []
        for phase_epochs in epochs:
            if phase_epochs:
                rows, sizes = next(collected)
                bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
                batches = [[leaf[a:b] for leaf in rows] for a, b in zip(bounds[:-1], bounds[1:])]
                out.append(_batches_dataset(batches, element_spec))
            else:
                out.append(dataset.take(0))
        return tuple(out)

    return phase_datasets


def _batches_dataset(batches: list[list[np.ndarray]], element_spec: Any) -> tf.data.Dataset:
    """A dataset yielding the given batches (flat leaves) as `element_spec` structures."""
    flat_spec = tf.nest.flatten(element_spec)
    generator = lambda: (tuple(batch) for batch in batches)
    dataset = tf.data.Dataset.from_generator(generator, output_signature=tuple(flat_spec))
    return dataset.map(lambda *leaves: tf.nest.pack_sequence_as(element_spec, list(leaves)))
