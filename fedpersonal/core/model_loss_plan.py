"""Client plans whose phases minimize losses the model defines: the model's protocol and the per-client backend.

A `fedpersonal.core.client_plan.Phase` with a ``loss`` steps variable groups the model names (``trains``) on a loss
the model computes (FedDVA: a dual VAE whose decoder, z-encoder, c-encoder and head phases each have their own loss
and variables). The model is any object with a partially local model's four variable groups and three methods
(`PhasedModel`); its global trainable weights are uploaded (their change, weighted), its local weights (trainable
and not, e.g. batch-norm statistics) are the client's private state.

A client runs the phases in plan order, each for its epochs with a fresh optimizer state, on the whole dataset
iterated once per phase (``dataset.repeat(epochs)``: a dataset that reshuffles on every iteration gives each phase
and epoch its own order); a batch's loss is ``model.phase_loss(loss, x, y, step)``, `step` the batch's index in the
phase counted over its epochs. It reports ratio metrics (numerator, denominator; `compose.ratio_metrics`), with
``<prefix>`` the phase's `metrics_prefix` or `loss`:

* ``<prefix>_loss``: the summed batch loss x batch size over the phase's examples (0/0 for a skipped phase);
* ``<prefix>_<statistic>``: with `Phase.statistic`, ``model.phase_statistic(statistic, x, y)`` after each step,
  summed, over the phase's examples;
* ``num_examples``: the examples of one pass over the dataset (summed over clients), also the update's weight
  under ``NUM_EXAMPLES``.

With `ClientPlan.counts_labels` the model's ``label_counts`` are set to the client's label counts (one pass over
its dataset) before the phases. With `ClientPlan.counts_participations` the model's ``participations`` counter
grows by one after the phases. A
non-finite update is dropped (weight 0) and the previous private state kept. The grouped engine's backend of such
plans is `fedpersonal.simulation.model_loss_engine`; `fedpersonal.backends.build_process` chooses.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Protocol

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import partially_local_model


class PhasedModel(Protocol):
    """A model that defines its phases' losses and variable groups (e.g. `fedpersonal.models.feddva_models.DualVae`).

    Its variables are in a partially local model's four groups (global/local x trainable/not); a plan with
    `ClientPlan.counts_participations` also needs a ``participations`` int64 variable among the local non-trainable
    ones, and one with `ClientPlan.counts_labels` a float32 ``label_counts`` vector (one entry per class) there.
    Batches are ``(x, y)`` pairs or ``{'x', 'y'}`` mappings.
    """

    @property
    def global_trainable_variables(self) -> Sequence[tf.Variable]: ...

    @property
    def global_non_trainable_variables(self) -> Sequence[tf.Variable]: ...

    @property
    def local_trainable_variables(self) -> Sequence[tf.Variable]: ...

    @property
    def local_non_trainable_variables(self) -> Sequence[tf.Variable]: ...

    def variables_of(self, group: str) -> Sequence[tf.Variable]:
        """The trainable variables of a named group."""

    def phase_loss(self, loss: str, x: Any, y: Any, step: Any) -> tf.Tensor:
        """The batch's scalar loss named `loss`, its `step`-th step in the phase (e.g. to seed noise)."""

    def phase_statistic(self, statistic: str, x: Any, y: Any) -> tf.Tensor:
        """A scalar statistic of the batch, summed over its examples (e.g. correct predictions)."""


def prefix(phase: client_plan.Phase) -> str:
    """The prefix of the phase's metrics: its `metrics_prefix`, else its loss's name."""
    return phase.metrics_prefix or str(phase.loss)


def trained_variables(model: PhasedModel, phase: client_plan.Phase) -> list[tf.Variable]:
    """The variables the phase steps: its groups', in order."""
    return [v for group in phase.trains for v in model.variables_of(group)]


def run_phases(
    model: PhasedModel,
    plan: client_plan.ClientPlan,
    dataset: tf.data.Dataset,
    optimizers: Sequence[tff.learning.optimizers.Optimizer] | None = None,
) -> collections.OrderedDict:
    """The plan's phases on `model`'s variables in place (inside a `tf.function`), and the counter's increment.

    Args:
      model: The model.
      plan: A plan with model-defined losses.
      dataset: The client's batches.
      optimizers: The phases' optimizers prepared for their variables (default: the phases' own).

    Returns:
      ``{name: (numerator, denominator)}`` float32 scalars (the module docstring's metrics).
    """
    sums: collections.OrderedDict = collections.OrderedDict()
    num_examples = tf.constant(0.0)
    previous: list[tf.Tensor] = []
    if plan.counts_labels:
        counts = model.label_counts  # type: ignore[attr-defined]
        previous = [counts.assign(label_counts(dataset, counts.shape[0]))]
    for i, phase in enumerate(plan.phases):
        optimizer = phase.optimizer if optimizers is None else optimizers[i]
        # In plan order: which phase opens a reshuffling dataset first decides which order each sees.
        with tf.control_dependencies(previous):
            count, total, statistic = _phase_steps(model, phase, dataset, optimizer)
        previous = [count, total]
        count = tf.cast(count, tf.float32)
        sums[f'{prefix(phase)}_loss'] = (total, count)
        if phase.statistic is not None:
            sums[f'{prefix(phase)}_{phase.statistic}'] = (statistic, count)
        num_examples = tf.maximum(num_examples, count / float(max(phase.epochs, 1)))
    sums['num_examples'] = (num_examples, tf.constant(1.0))
    if plan.counts_participations:
        with tf.control_dependencies([num_examples]):
            model.participations.assign_add(1)  # type: ignore[attr-defined]  # The next round draws fresh noise.
    return sums


def label_counts(dataset: tf.data.Dataset, num_classes: int) -> tf.Tensor:
    """How many examples of each class the batches of `dataset` hold (float32 ``[num_classes]``)."""

    def add(counts, batch):
        _, y = partially_local_model.split_batch(batch)
        return counts + tf.reduce_sum(tf.one_hot(tf.reshape(tf.cast(y, tf.int32), [-1]), num_classes), 0)

    return dataset.reduce(tf.zeros([num_classes]), add)


def _phase_steps(
    model: PhasedModel,
    phase: client_plan.Phase,
    dataset: tf.data.Dataset,
    optimizer: tff.learning.optimizers.Optimizer,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(examples, summed batch loss x batch size, summed statistic or 0) of the phase's steps."""

    def batch_loss(element) -> client_work.BatchLoss:
        step, batch = element
        x, y = partially_local_model.split_batch(batch)
        return client_work.BatchLoss(model.phase_loss(str(phase.loss), x, y, step), tf.shape(x)[0])

    def statistic_after_step(element) -> collections.OrderedDict:
        x, y = partially_local_model.split_batch(element[1])
        return collections.OrderedDict(value=model.phase_statistic(str(phase.statistic), x, y))

    has_statistic = phase.statistic is not None
    result = client_work.optimizer_steps(
        trained_variables(model, phase),
        dataset.repeat(phase.epochs).enumerate(),  # Steps numbered over the phase's epochs.
        optimizer,
        batch_loss,
        epochs=1 if phase.epochs > 0 else 0,
        zero_stats=collections.OrderedDict(value=0.0) if has_statistic else (),
        after_step=statistic_after_step if has_statistic else None,
    )
    return result.num_examples, result.loss_sum, result.stats['value'] if has_statistic else tf.constant(0.0)


def initial_weights(model_fn: Callable[[], PhasedModel], element_spec: Any) -> client_plan.Initial:
    """The no-arg TF computations of the model's initial global weights and local weights (a client's private state
    before its first round), and the type of the client datasets' batches."""

    @tff.tensorflow.computation
    def initial_global():
        return client_work.global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_local():
        return client_work.local_weights(model_fn())

    return client_plan.Initial(initial_global, initial_local, tff.types.tensorflow_to_type(element_spec))


def build_client_update(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], PhasedModel],
    initial: client_plan.Initial,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> tff.Computation:
    """The plan as one client's TF computation ``(global weights, dataset, local weights) -> (ClientResult, ratio
    metrics, new local weights)``, `initial` its `initial_weights`."""
    assert initial.local_weights is not None

    @tff.tensorflow.computation(
        initial.global_weights.type_signature.result,
        tff.SequenceType(initial.element_type),
        initial.local_weights.type_signature.result,
    )
    @tf.function
    def client_update(received, dataset, private):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            optimizers = [client_work.prepare_optimizer(p.optimizer, trained_variables(model, p)) for p in plan.phases]
        client_work.assign_weights(client_work.global_weights(model), received)
        client_work.assign_weights(client_work.local_weights(model), private)
        sums = run_phases(model, plan, dataset, optimizers)
        metrics = collections.OrderedDict((k, tf.stack(v)) for k, v in sums.items())
        delta, non_finite = client_work.weights_delta(received.trainable, model.global_trainable_variables)
        weight = client_work.client_weight(client_weighting, sums['num_examples'][0], metrics, non_finite)
        kept = client_work.local_weights(model)
        new_private = client_work.keep_previous_if_non_finite(non_finite, private, kept)
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), metrics, new_private

    return client_update


def build_per_client_process(
    plan: client_plan.ClientPlan,
    model_fn: Callable[[], PhasedModel],
    *,
    element_spec: Any,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Any = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
) -> process_lib.PersonalizedProcess:
    """The plan as a stateful process on the per-client backend: `model_distributor` (default TFF's broadcast),
    `model_aggregator` (default the weighted mean, weights by `client_weighting`) and `server_optimizer` around
    `build_client_update`; the model's local weights are the private state."""
    initial = initial_weights(model_fn, element_spec)
    client_update = build_client_update(plan, model_fn, initial, client_weighting)
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=client_update,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(client_update.type_signature.result[1]),
        model_distributor=model_distributor,
    )
