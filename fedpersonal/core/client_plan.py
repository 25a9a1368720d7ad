"""A client's work stated once, as data: which weights step, in which order, for how many epochs.

A `ClientPlan` is a sequence of `Phase`s over a partially local model (`fedpersonal.models.from_keras_model`, global
and local layers): each phase trains some of the weight parts for some epochs with a TFF optimizer whose state
starts fresh, on the client's whole dataset, with the model's loss plus an optional penalty. The parts are
``'global'`` (the received global weights), ``'local'`` (the model's local layers) and ``'personal'`` (a copy of the
global weights that the client keeps, as Ditto's personal model). After the phases the client uploads the change of
its global trainable weights (weighted by `client_weighting`; zero weight for a non-finite update) and keeps its
local weights, or its personal copy, as its private state (its previous ones if the update was not finite). The
Keras metrics are updated with every step's pre-step predictions: one set per `Phase.metrics_prefix`.

Reconstruction (FedRecon) is a plan too: its phases read parts of a `DataSplit` of the client's dataset (support
and query), and its local weights start every round from their initializer (`ClientPlan.local_start='initial'`: a
stateless process, nothing kept) or from a default the server learns (``'learned'``: broadcast after the global
weights, its displacement uploaded with the global update through the same aggregator).

Backends run the same plan: `build_client_update` here (one TF computation per client, mapped over the clients by
TFF: the process's ``next``, what the privacy audit reads), and the grouped engine
(`fedpersonal.simulation.plan_engine`), chosen in one place (`fedpersonal.backends`). FedPer is one phase training
both parts; FedRep trains the local head with the body frozen, then the body with the head frozen.

A plan may instead name losses and variable groups its model defines (`Phase.loss`; a model that is not one Keras
model, e.g. FedDVA's dual VAE): `fedpersonal.core.model_loss_plan` and `fedpersonal.simulation.model_loss_engine`
run those.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import local_aggregation as aggregation_lib
from fedpersonal.core import process as process_lib
from fedpersonal.core import step_kinds
from fedpersonal.models import partially_local_model

ModelWeights = tff.learning.models.ModelWeights

GLOBAL, LOCAL, PERSONAL = 'global', 'local', 'personal'
PARTS = (GLOBAL, LOCAL, PERSONAL)
# Where a round's local weights start (`ClientPlan.local_start`).
KEPT, INITIAL, LEARNED = 'kept', 'initial', 'learned'
LOCAL_STARTS = (KEPT, INITIAL, LEARNED)


@dataclasses.dataclass(frozen=True)
class NormPenalty:
    """``strength * sum ||v||^2`` over the trained weights of `part` (e.g. FURL's norm on its private parameters),
    added to every batch loss of the phase (not to the reported loss)."""

    part: str
    strength: float

    def __call__(self, trained: dict[str, list[Any]], received: list[Any]) -> tf.Tensor:
        del received
        return self.strength * tf.add_n([tf.reduce_sum(tf.square(v)) for v in trained[self.part]])


@dataclasses.dataclass(frozen=True)
class ProximalPenalty:
    """``strength / 2 * sum ||v - w||^2`` between the trained weights of `part` and the received global weights `w`
    (Ditto's lambda, FedProx's mu)."""

    part: str
    strength: float

    def __call__(self, trained: dict[str, list[Any]], received: list[Any]) -> tf.Tensor:
        pairs = zip(trained[self.part], received)
        return 0.5 * self.strength * tf.add_n([tf.reduce_sum(tf.square(v - w)) for v, w in pairs])


@dataclasses.dataclass(frozen=True)
class DataSplit:
    """A division of each client's dataset into named parts that phases train on (`Phase.data`), e.g. FedRecon's
    support and query sets. The parts carry their own epochs and step caps (a phase on a part makes
    `Phase.epochs` passes over it, usually 1).

    Attributes:
      names: The parts' names, in the order the functions return them.
      dataset_fn: ``dataset -> (part datasets...)``: in the client's TF computation (per-client backend), and on
        the engine (eagerly, when it packs a client) unless `batches_fn` is given.
      batches_fn: Optional: the same division of a client's batches held as numpy structures (what the engine
        packs; much faster than iterating `dataset_fn`'s datasets). Must give the batches `dataset_fn` gives.
    """

    names: tuple[str, ...]
    dataset_fn: Callable[[tf.data.Dataset], Sequence[tf.data.Dataset]]
    batches_fn: Callable[[list[Any]], Sequence[list[Any]]] | None = None

    def __post_init__(self):
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f'DataSplit.names must be distinct and non-empty, got {self.names!r}.')


@dataclasses.dataclass(frozen=True)
class Phase:
    """One local training phase.

    Attributes:
      trains: The weights that step: ``('global',)``, ``('local',)`` or both; the others are frozen.
      epochs: Passes over the client's dataset (at least 1).
      optimizer: A `tff.learning.optimizers.Optimizer`; its state starts fresh in every phase.
      penalty: Optional term added to each batch loss (not to the reported one), a function of the phase's trained
        weights by part and the received global weights: `NormPenalty`, `ProximalPenalty`.
      metrics_prefix: The phase's metrics are a set of their own, reported as ``<prefix>_<name>`` (e.g. Ditto's
        ``personal_accuracy``); None: the plan's shared set, reported by name.
      mixed: With ``trains=('personal',)`` in a plan with `ClientPlan.initial_alpha`: the loss is the model's at
        the mixed weights ``alpha * v + (1 - alpha) * w`` (v the personal copy, w the received global weights,
        alpha the client's mixing weight), and v and alpha step (APFL); alpha is projected onto [0, 1] at the
        phase's end (in between, the model uses alpha clipped to [0, 1]).
      data: The part of the plan's `DataSplit` the phase trains on; None: the client's whole dataset.
      reports_metrics: Whether the phase's steps update the metrics (False: FedRecon's reconstruction).
      step: What a batch's step computes (`fedpersonal.core.step_kinds`, e.g. Per-FedAvg's `MetaStep`); None: the
        gradient of the batch loss.
      loss: A loss the model defines (`fedpersonal.core.model_loss_plan.PhasedModel`, e.g. FedDVA's dual VAE)
        instead of the plan's Keras loss: `trains` then names variable groups the model defines, `epochs` may be
        0 (the phase is skipped) and the phase reports ratio metrics (see `fedpersonal.core.model_loss_plan`).
      statistic: With `loss`: a statistic the model defines (e.g. ``'accuracy'``), summed over each batch after
        its step and reported per example.
    """

    trains: tuple[str, ...]
    epochs: int
    optimizer: tff.learning.optimizers.Optimizer
    penalty: NormPenalty | ProximalPenalty | None = None
    metrics_prefix: str | None = None
    mixed: bool = False
    data: str | None = None
    reports_metrics: bool = True
    step: step_kinds.MetaStep | step_kinds.InnerProblem | None = None
    loss: str | None = None
    statistic: str | None = None

    def __post_init__(self):
        if self.loss is not None:  # Variable groups, loss and metrics are the model's (model_loss_plan).
            if not self.trains or not all(isinstance(g, str) and g for g in self.trains):
                raise ValueError(f'Phase.trains must name variable groups of the model, got {self.trains!r}.')
            if not isinstance(self.epochs, int) or self.epochs < 0:
                raise ValueError(f'Phase.epochs must be an int >= 0, got {self.epochs!r}.')
            if self.penalty is not None or self.mixed or self.step is not None:
                raise ValueError('A phase with a model-defined loss takes no penalty or step kind and is not mixed.')
            return
        if self.statistic is not None:
            raise ValueError('Phase.statistic needs a model-defined Phase.loss.')
        if not self.trains or not set(self.trains) <= set(PARTS) or len(set(self.trains)) != len(self.trains):
            raise ValueError(f'Phase.trains must be a non-empty subset of {PARTS}, got {self.trains!r}.')
        if PERSONAL in self.trains and len(self.trains) > 1:
            raise ValueError(f'A phase that trains the personal copy trains nothing else, got {self.trains!r}.')
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f'Phase.epochs must be an int >= 1, got {self.epochs!r}.')
        if self.mixed and self.trains != (PERSONAL,):
            raise ValueError(f"A mixed phase trains ('personal',) only, got {self.trains!r}.")
        if self.penalty is not None and self.penalty.part not in self.trains:
            raise ValueError(f'Phase.penalty applies to {self.penalty.part!r}, which the phase does not train.')
        if self.step is not None:
            self.step.check(self.trains)


@dataclasses.dataclass(frozen=True)
class ClientPlan:
    """A client's work: its phases, in order (exactly one of them trains the global weights), and whether the client
    keeps a personal copy of the global weights as its private state (`personal_copy`; else the model's local
    weights), with a mixing weight alpha appended to its trainable weights (`initial_alpha`, APFL).

    `split` divides each client's dataset into the parts phases name (`Phase.data`). `local_start` says where a
    round's local weights start: ``'kept'`` (default), the client's private state (a stateful process);
    ``'initial'``, the model's initial local weights, every round (a stateless process: nothing is kept); or
    ``'learned'``, a default the server learns, broadcast after the global trainable weights and updated with the
    aggregated displacement of the clients' trained local weights, uploaded after their global update (stateless).

    Phases with model-defined losses (`Phase.loss`: all of a plan's phases or none) may train the global weights in
    several phases or none; with `counts_participations` the client increments the model's ``participations``
    counter (a local non-trainable variable, e.g. seeding noise per round) after its phases; with `counts_labels`
    it sets the model's ``label_counts`` (a local non-trainable float vector, e.g. FedRoD's label prior) to the
    counts of its dataset's labels before them.

    `local_aggregation` (FedALA, `fedpersonal.core.local_aggregation.AdaptiveLocalAggregation`): the personal copy
    is the model the client trained last, and the global phase starts from its element-wise aggregation with the
    received weights instead of the received weights.

    Example:

    >>> import tensorflow_federated as tff
    >>> sgd = tff.learning.optimizers.build_sgdm(0.1)
    >>> plan = ClientPlan((Phase(('local',), 2, sgd), Phase(('global',), 1, sgd)))  # FedRep
    >>> plan.global_phase
    1
    """

    phases: tuple[Phase, ...]
    personal_copy: bool = False
    initial_alpha: float | None = None
    split: DataSplit | None = None
    local_start: str = KEPT
    counts_participations: bool = False
    counts_labels: bool = False
    local_aggregation: aggregation_lib.AdaptiveLocalAggregation | None = None

    def __post_init__(self):
        if self.model_losses:
            _check_model_loss_plan(self)
            return
        if self.counts_participations or self.counts_labels:
            raise ValueError('counts_participations and counts_labels need phases with model-defined losses.')
        if self.local_aggregation is not None:
            self.local_aggregation.check(self)
        if self.local_start not in LOCAL_STARTS:
            raise ValueError(f'ClientPlan.local_start must be one of {LOCAL_STARTS}, got {self.local_start!r}.')
        if self.local_start != KEPT and self.personal_copy:
            raise ValueError(f"A personal copy is kept: local_start must be 'kept', got {self.local_start!r}.")
        for phase in self.phases:
            if phase.data is not None and (self.split is None or phase.data not in self.split.names):
                raise ValueError(f"Phase.data {phase.data!r} is not a part of the plan's split {self.split}.")
        if not any(p.reports_metrics for p in self.phases):
            raise ValueError('At least one phase of a ClientPlan reports metrics.')
        inner = any(isinstance(p.step, step_kinds.InnerProblem) for p in self.phases)
        if (inner or any(PERSONAL in p.trains for p in self.phases)) and not self.personal_copy:
            raise ValueError('A phase trains the personal copy: the plan needs personal_copy=True.')
        if self.initial_alpha is not None and not (self.personal_copy and 0.0 <= self.initial_alpha <= 1.0):
            raise ValueError(f'initial_alpha needs personal_copy=True and a value in [0, 1], got {self.initial_alpha}.')
        if self.initial_alpha is not None and any(PERSONAL in p.trains and not p.mixed for p in self.phases):
            raise ValueError('With initial_alpha, the phases that train the personal copy are mixed phases.')
        if any(p.mixed for p in self.phases) and self.initial_alpha is None:
            raise ValueError("A mixed phase needs the plan's initial_alpha (the private mixing weight).")
        global_phases = [i for i, p in enumerate(self.phases) if GLOBAL in p.trains]
        if len(global_phases) != 1:
            raise ValueError(f'A ClientPlan needs exactly one phase that trains the global weights, got {self.phases}.')

    @property
    def model_losses(self) -> bool:
        """Whether the phases minimize losses the model defines (`Phase.loss`), run by `fedpersonal.core.model_loss_plan`."""
        return any(p.loss is not None for p in self.phases)

    @property
    def global_phase(self) -> int:
        """The index of the phase that trains the global weights."""
        return next(i for i, p in enumerate(self.phases) if GLOBAL in p.trains)

    @property
    def personal(self) -> bool:
        """Whether the private state is a personal copy of the global weights (else the model's local weights)."""
        return self.personal_copy

    @property
    def stateful(self) -> bool:
        """Whether clients keep private state between rounds (else a round's local weights start afresh)."""
        return self.local_start == KEPT

    @property
    def metric_prefixes(self) -> list[str | None]:
        """The metric sets, in order of first use."""
        return list(dict.fromkeys(p.metrics_prefix for p in self.phases if p.reports_metrics))


def _check_model_loss_plan(plan: ClientPlan) -> None:
    """A plan of model-defined losses: every phase has one, no personal copy; distinct metric names."""
    if any(p.loss is None for p in plan.phases):
        raise ValueError("A plan's phases either all use the Keras loss or all name a model-defined Phase.loss.")
    if plan.personal_copy or plan.initial_alpha is not None or plan.local_start != KEPT or plan.local_aggregation:
        raise ValueError("A plan with model-defined losses keeps the model's local weights (no personal copy).")
    if plan.split is not None or any(p.data is not None or not p.reports_metrics for p in plan.phases):
        raise ValueError('The phases of a plan with model-defined losses train on the whole dataset and report.')
    if plan.counts_labels and not any(p.epochs for p in plan.phases):
        raise ValueError('counts_labels needs a phase that iterates the data (epochs >= 1).')
    prefixes = [p.metrics_prefix or p.loss for p in plan.phases]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(
            f'The phases of a plan with model-defined losses need distinct metrics prefixes, got {prefixes}.'
        )


def prefixed(prefix: str | None, values: collections.OrderedDict) -> collections.OrderedDict:
    """`values` keyed ``<prefix>_<name>`` (as they are without a prefix)."""
    return collections.OrderedDict((k if prefix is None else f'{prefix}_{k}', v) for k, v in values.items())


class Initial(NamedTuple):
    """The no-arg TF computations of a model's initial global and local weights (None for a stateless plan), and
    the type of the model's input batches."""

    global_weights: tff.Computation
    local_weights: tff.Computation | None
    element_type: tff.Type


def server_weights(model: tff.learning.models.ReconstructionModel, local_start: str = KEPT) -> Any:
    """The weights (`ModelWeights`) the server holds and broadcasts: the model's global weights, with
    ``local_start='learned'`` followed in the trainable ones by the default of its local trainable weights."""
    weights = client_work.global_weights(model)
    if local_start != LEARNED:
        return weights
    return ModelWeights(list(weights.trainable) + list(model.local_trainable_variables), weights.non_trainable)


def initial_weights(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    personal: bool = False,
    initial_alpha: float | None = None,
    local_start: str = KEPT,
    stateful: bool = True,
    local_aggregation: aggregation_lib.AdaptiveLocalAggregation | None = None,
) -> Initial:
    """`Initial` of the partially local model `model_fn` builds; with `personal`, the private state is a copy of
    its global weights (and, with `initial_alpha`, the mixing weight after its trainable weights; with
    `local_aggregation`, its weights W, ones, after them and its count of aggregations, 0, after the non-trainable
    ones); the global weights are `server_weights` for `local_start`. Calls `model_fn` once (twice if `stateful`),
    as TFF's builders count their calls."""
    input_specs = []

    @tff.tensorflow.computation
    def initial_global():
        model = model_fn()
        input_specs.append(model.input_spec)
        return server_weights(model, local_start)

    initial_local = None
    if stateful:

        @tff.tensorflow.computation
        def initial_local():
            model = model_fn()
            if not personal:
                return client_work.local_weights(model)
            weights = client_work.global_weights(model)
            if local_aggregation is not None:
                k = local_aggregation.count(len(weights.trainable))
                mixing = [tf.ones_like(v) for v in weights.trainable[-k:]]
                return ModelWeights(list(weights.trainable) + mixing, list(weights.non_trainable) + [tf.constant(0)])
            if initial_alpha is None:
                return weights
            alpha = tf.constant(initial_alpha, tf.float32)
            return ModelWeights(list(weights.trainable) + [alpha], weights.non_trainable)

    return Initial(initial_global, initial_local, tff.types.tensorflow_to_type(input_specs[0]))


def plan_initial_weights(plan: ClientPlan, model_fn: Callable[[], tff.learning.models.ReconstructionModel]) -> Initial:
    """`initial_weights` as `plan` keeps its clients' state."""
    return initial_weights(
        model_fn,
        personal=plan.personal,
        initial_alpha=plan.initial_alpha,
        local_start=plan.local_start,
        stateful=plan.stateful,
        local_aggregation=plan.local_aggregation,
    )


def build_client_update(
    plan: ClientPlan,
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    finalizers: collections.OrderedDict,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    initial: Initial | None = None,
) -> tff.Computation:
    """The plan as one client's TF computation ``(global weights, dataset, local weights) -> (ClientResult,
    unfinalized metrics, new local weights)`` (a stateless plan: ``(global weights, dataset) -> (ClientResult,
    unfinalized metrics)``), recording the metrics' finalizers in `finalizers`; the update's weight by
    `client_weighting` (``NUM_EXAMPLES``: the examples of the global phase's steps). `initial`: the plan's
    `plan_initial_weights` if already built."""
    if plan.model_losses:
        raise ValueError('A plan with model-defined losses runs on fedpersonal.core.model_loss_plan.')
    initial = initial or plan_initial_weights(plan, model_fn)
    weights_type, dataset_type = initial.global_weights.type_signature.result, tff.SequenceType(initial.element_type)

    def work(received, dataset, private):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            ala = plan.local_aggregation
            personal = client_work.construct(model_fn) if plan.personal and ala is None else None
            mixing = plan.initial_alpha is not None
            alpha = tf.Variable(0.0, name='alpha') if mixing else None
            mixed_model = client_work.construct(model_fn) if mixing else None
            needs_scratch = personal is None and any(p.step for p in plan.phases)  # `MetaStep`s trial weights.
            scratch = client_work.construct(model_fn) if needs_scratch else None
            metrics = {}
            for prefix in plan.metric_prefixes:
                built: collections.OrderedDict = collections.OrderedDict()
                metrics[prefix] = client_work.build_metrics(metrics_fn, loss_fn, built)
                finalizers.update(prefixed(prefix, built))
            parts = {GLOBAL: list(model.global_trainable_variables), LOCAL: list(model.local_trainable_variables)}
            if personal is not None:
                parts[PERSONAL] = list(personal.global_trainable_variables)
            trained = [[v for part in phase.trains for v in parts[part]] for phase in plan.phases]
            trained = [t + [alpha] if phase.mixed else t for t, phase in zip(trained, plan.phases)]
            optimizers = [client_work.prepare_optimizer(p.optimizer, v) for p, v in zip(plan.phases, trained)]
            if ala is not None:  # FedALA's W and its count of aggregations.
                k = ala.count(len(parts[GLOBAL]))
                ala_weights = [tf.Variable(tf.zeros_like(v), name='mixing') for v in parts[GLOBAL][-k:]]
                aggregations = tf.Variable(0, name='aggregations')
        client_work.assign_weights(client_work.global_weights(model), received)
        if ala is not None:
            aggregation_lib.aggregate_locally(
                ala, model, private, received, dataset, loss_fn(), ala_weights, aggregations
            )
            own = client_work.global_weights(model)  # Kept after training: the model the client trained last.
            kept = ModelWeights(list(own.trainable) + ala_weights, list(own.non_trainable) + [aggregations])
        elif personal is not None and alpha is not None:
            client_work.assign(personal.global_trainable_variables, private.trainable[:-1])
            client_work.assign(personal.global_non_trainable_variables, private.non_trainable)
            alpha.assign(private.trainable[-1])
            if mixed_model is not None:  # Its own statistics (e.g. batch norm's) are the personal copy's.
                client_work.assign(mixed_model.global_non_trainable_variables, private.non_trainable)
            own = client_work.global_weights(personal)
            kept = ModelWeights(list(own.trainable) + [alpha], own.non_trainable)
        elif personal is not None:
            client_work.assign_weights(client_work.global_weights(personal), private)
            kept = client_work.global_weights(personal)
        elif plan.stateful:
            client_work.assign_weights(client_work.local_weights(model), private)
            kept = client_work.local_weights(model)
        elif plan.local_start == LEARNED:  # The default follows the global weights; 'initial': as the model made them.
            client_work.assign(parts[LOCAL], received.trainable[len(parts[GLOBAL]) :])
        uploaded = parts[GLOBAL] + (parts[LOCAL] if plan.local_start == LEARNED else [])
        split, split_names = (plan.split.dataset_fn(dataset), plan.split.names) if plan.split is not None else ((), ())
        received_trainable = [tf.identity(w) for w in received.trainable[: len(parts[GLOBAL])]]
        num_examples = tf.constant(0)
        previous: list[tf.Tensor] = []
        for i, (phase, variables, optimizer) in enumerate(zip(plan.phases, trained, optimizers)):
            stepped = personal if PERSONAL in phase.trains else model
            phase_metrics = metrics[phase.metrics_prefix] if phase.reports_metrics else []
            if phase.mixed:
                assert mixed_model is not None and alpha is not None
                batch_loss = _mixed_batch_loss(
                    mixed_model, parts[PERSONAL], alpha, received_trainable, loss_fn(), phase_metrics
                )
            elif phase.step is not None:
                batch_loss = step_kinds.step_batch_loss(
                    phase, model, variables, personal or scratch, loss_fn(), phase_metrics
                )
            else:
                batch_loss = client_work.model_batch_loss(stepped, loss_fn(), phase_metrics)
            data = dataset if phase.data is None else split[split_names.index(phase.data)]
            penalty = None
            if phase.penalty is not None:
                by_part = {part: parts[part] for part in phase.trains}
                penalty = functools.partial(phase.penalty, by_part, received_trainable)
            # In order: phases that train disjoint variables have no automatic control dependency, and the order in
            # which they open the dataset decides which shuffle each sees (a reshuffling dataset's k-th iteration).
            with tf.control_dependencies(previous):
                steps = client_work.optimizer_steps(
                    variables, data, optimizer, batch_loss, epochs=phase.epochs, penalty=penalty
                )
            previous = [steps.num_examples, steps.loss_sum]
            if i == plan.global_phase:
                num_examples = steps.num_examples
            if phase.mixed:
                assert alpha is not None
                alpha.assign(tf.clip_by_value(alpha, 0.0, 1.0))
        delta, non_finite = client_work.weights_delta(received.trainable, uploaded)
        unfinalized: collections.OrderedDict = collections.OrderedDict()
        for prefix, metric_set in metrics.items():
            unfinalized.update(prefixed(prefix, client_work.read_metrics(metric_set)))
        weight = client_work.client_weight(client_weighting, num_examples, unfinalized, non_finite)
        result = tff.learning.templates.ClientResult(update=delta, update_weight=weight)
        if not plan.stateful:
            return result, unfinalized
        return result, unfinalized, client_work.keep_previous_if_non_finite(non_finite, private, kept)

    if not plan.stateful:

        @tff.tensorflow.computation(weights_type, dataset_type)
        @tf.function
        def stateless_update(received, dataset):
            return work(received, dataset, None)

        return stateless_update

    assert initial.local_weights is not None  # A stateful plan's.

    @tff.tensorflow.computation(weights_type, dataset_type, initial.local_weights.type_signature.result)
    @tf.function
    def client_update(received, dataset, private):
        return work(received, dataset, private)

    return client_update


def _mixed_batch_loss(
    mixed_model: tff.learning.models.ReconstructionModel,
    personal: list[tf.Variable],
    alpha: tf.Variable,
    received: list[tf.Tensor],
    loss: tf.keras.losses.Loss,
    metrics: list[tf.keras.metrics.Metric],
) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of the model at ``a * v + (1 - a) * w`` (a = alpha clipped to [0, 1]) as a function of the
    personal weights v and alpha: the mixed weights are assigned to `mixed_model`, and the gradient g there gives
    ``a * g`` for v and ``sum <v - w, g>`` for alpha (zero where alpha is clipped)."""
    mixed_variables = list(mixed_model.global_trainable_variables)

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def mixed_loss(raw_alpha, *values):
            a = tf.clip_by_value(raw_alpha, 0.0, 1.0)
            client_work.assign(mixed_variables, [a * v + (1.0 - a) * w for v, w in zip(values, received)])
            with tf.GradientTape() as tape:
                output = mixed_model.forward_pass(batch, training=True)
                value = loss(output.labels, output.predictions)
            g = tape.gradient(value, mixed_variables)
            for metric in metrics:
                metric.update_state(output.labels, output.predictions)
            inside = tf.cast(tf.logical_and(raw_alpha >= 0.0, raw_alpha <= 1.0), tf.float32)

            def grad(upstream, variables=None):
                d_alpha = inside * tf.add_n([tf.reduce_sum((v - w) * gi) for v, w, gi in zip(values, received, g)])
                inputs = [upstream * d_alpha] + [upstream * a * gi for gi in g]
                return inputs, [None] * len(variables or [])

            return value, grad

        value = mixed_loss(alpha.read_value(), *[v.read_value() for v in personal])
        _, labels = partially_local_model.split_batch(batch)
        return client_work.BatchLoss(value, tf.shape(labels)[0])

    return batch_loss


def build_per_client_process(
    plan: ClientPlan,
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Any = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
) -> process_lib.PersonalizedProcess:
    """The plan as a process on the per-client backend: `model_distributor` (default TFF's broadcast),
    `model_aggregator` (default the weighted mean, weights by `client_weighting`) and `server_optimizer` around
    `build_client_update`; the local weights (or the personal copy) are the private state of a stateful plan (a
    stateless one's process is TFF's `LearningProcess`, kept as `process.learning_process`)."""
    initial = plan_initial_weights(plan, model_fn)
    finalizers: collections.OrderedDict = collections.OrderedDict()
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=build_client_update(
            plan, model_fn, loss_fn, metrics_fn, finalizers, client_weighting, initial=initial
        ),
        aggregate_metrics=compose.keras_metrics(finalizers, metrics_aggregator),
        server_optimizer=server_optimizer,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
        model_distributor=model_distributor,
    )


def personalized_weights(plan: ClientPlan, global_weights: Any, private_state: Any) -> tff.learning.models.ModelWeights:
    """The weights a client predicts with after its rounds, as numpy arrays.

    With a personal copy (Ditto), the copy; with a mixing weight (APFL), ``a * v + (1 - a) * w`` of the copy v and
    the global weights w (a = alpha clipped to [0, 1], the copy's non-trainable weights); with local aggregation
    (FedALA), the start of its next round without learning W further (w below, ``v + (w - v) * W`` above); else
    the client's local weights, which it predicts with beside `global_weights`. Evaluate the first three with a
    model whose variables are all local and no global weights, the last with the training model.

    >>> import numpy as np
    >>> sgd = tff.learning.optimizers.build_sgdm(0.1)
    >>> plan = ClientPlan((Phase(('personal',), 1, sgd, mixed=True), Phase(('global',), 1, sgd)),
    ...                   personal_copy=True, initial_alpha=0.5)
    >>> w = ModelWeights([np.float32(0.0)], [])
    >>> personalized_weights(plan, w, ModelWeights([np.float32(2.0), np.float32(0.5)], [])).trainable
    [1.0]
    """
    trainable = [np.asarray(v) for v in private_state.trainable]
    non_trainable = [np.asarray(v) for v in private_state.non_trainable]
    if plan.local_aggregation is not None:  # FedALA's start, with the client's W (not learned further here).
        received = [np.asarray(v) for v in global_weights.trainable]
        k = len(trainable) - len(received)
        own, mixing = trainable[:-k], trainable[-k:]
        upper = [v + (w - v) * m for v, w, m in zip(own[-k:], received[-k:], mixing)]
        return ModelWeights(received[:-k] + upper, non_trainable[:-1])
    if plan.initial_alpha is not None:
        *trainable, alpha = trainable
        a = float(np.clip(alpha, 0.0, 1.0))
        trainable = [a * v + (1.0 - a) * np.asarray(w) for v, w in zip(trainable, global_weights.trainable)]
    return ModelWeights(trainable, non_trainable)
