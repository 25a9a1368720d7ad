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

Backends run the same plan: `fedpersonal.core.per_client_plan` (one TF computation per client, mapped over the
clients by TFF: the process's ``next``, what the privacy audit reads), and the grouped engine
(`fedpersonal.simulation.plan_engine`), chosen in one place (`fedpersonal.backends`). FedPer is one phase training
both parts; FedRep trains the local head with the body frozen, then the body with the head frozen.

A plan may instead name losses and variable groups its model defines (`Phase.loss`; a model that is not one Keras
model, e.g. FedDVA's dual VAE): `fedpersonal.core.model_loss_plan` and `fedpersonal.simulation.model_loss_engine`
run those.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_start
from fedpersonal.core import client_work
from fedpersonal.core import reference_terms
from fedpersonal.core import server_table
from fedpersonal.core import shared_values
from fedpersonal.core import step_kinds

ModelWeights = tff.learning.models.ModelWeights

GLOBAL, LOCAL, PERSONAL = 'global', 'local', 'personal'
PARTS = (GLOBAL, LOCAL, PERSONAL)
# Where a round's local weights start (`ClientPlan.local_start`).
KEPT, INITIAL, LEARNED = 'kept', 'initial', 'learned'
LOCAL_STARTS = (KEPT, INITIAL, LEARNED)


@runtime_checkable
class Penalty(Protocol):
    """A term added to every batch loss of a phase (not to the reported loss): a pure function of the phase's trained
    weights by part and, if `uses_received`, the received global trainable weights (else it is given ``[]`` on the
    engine). `part` names the part it reads, which the phase trains."""

    @property
    def part(self) -> str: ...

    @property
    def uses_received(self) -> bool: ...

    def __call__(self, trained: dict[str, list[Any]], received: list[Any]) -> tf.Tensor: ...


@dataclasses.dataclass(frozen=True)
class NormPenalty:
    """``strength * sum ||v||^2`` over the trained weights of `part` (e.g. FURL's norm on its private parameters),
    added to every batch loss of the phase (not to the reported loss)."""

    part: str
    strength: float
    uses_received: bool = dataclasses.field(default=False, init=False)

    def __call__(self, trained: dict[str, list[Any]], received: list[Any]) -> tf.Tensor:
        del received
        return self.strength * tf.add_n([tf.reduce_sum(tf.square(v)) for v in trained[self.part]])


@dataclasses.dataclass(frozen=True)
class ProximalPenalty:
    """``strength / 2 * sum ||v - w||^2`` between the trained weights of `part` and the received global weights `w`
    (Ditto's lambda, FedProx's mu)."""

    part: str
    strength: float
    uses_received: bool = dataclasses.field(default=True, init=False)

    def __call__(self, trained: dict[str, list[Any]], received: list[Any]) -> tf.Tensor:
        pairs = zip(trained[self.part], received)
        return 0.5 * self.strength * tf.add_n([tf.reduce_sum(tf.square(v - w)) for v, w in pairs])


def _unchanged(values: list[Any], model: list[Any]) -> list[Any]:
    del model
    return values


@dataclasses.dataclass(frozen=True)
class Personalization:
    """How a client's personal copy becomes the model it trains and predicts with: an algorithm's own math, as pure
    functions over weight lists that every backend calls (`ClientPlan.personalization`; e.g. APFL's mixture,
    `fedpersonal.algorithms.apfl`).

    The client keeps its copy's trainable weights followed by `extras` (trained with them); a phase that trains the
    personal copy runs the model at ``predicts_with(kept, received)`` and the gradient reaches the kept values
    through it; after the phase its kept values are ``finish(kept, model)``; after training the client predicts with
    ``predicts_with(kept, global weights)`` (`personalized_weights`). The functions take one client's values (the
    engine maps them over a group's clients) and use TF ops.

    Attributes:
      extras: ``global trainable weights -> values`` the client keeps after its copy's trainable weights (APFL's
        mixing weight), from the model's initial weights, once.
      predicts_with: ``(copy's trainable weights + extras, received global trainable weights) -> trainable
        weights`` the model runs with.
      finish: ``(copy's trainable weights + extras, the model's global trainable weights) -> the former``, at the
        end of each phase that trains them or whose step kind carries them (APFL projects its mixing weight onto
        [0, 1]; PFLlib's APFL sets the copy to its mixture with the trained model).
    """

    extras: Callable[[list[Any]], list[Any]]
    predicts_with: Callable[[list[Any], list[Any]], list[Any]]
    finish: Callable[[list[Any], list[Any]], list[Any]] = _unchanged


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
        weights by part and the received global weights: a `Penalty`, e.g. `NormPenalty`, `ProximalPenalty`.
      metrics_prefix: The phase's metrics are a set of their own, reported as ``<prefix>_<name>`` (e.g. Ditto's
        ``personal_accuracy``); None: the plan's shared set, reported by name.
      data: The part of the plan's `DataSplit` the phase trains on; None: the client's whole dataset.
      reports_metrics: Whether the phase's steps update the metrics (False: FedRecon's reconstruction).
      step: What a batch's step computes (a `fedpersonal.core.step_kinds.StepKind`, e.g. Per-FedAvg's); None: the
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
    penalty: Penalty | None = None
    metrics_prefix: str | None = None
    data: str | None = None
    reports_metrics: bool = True
    step: step_kinds.StepKind | None = None
    loss: str | None = None
    statistic: str | None = None

    def __post_init__(self):
        if self.loss is not None:  # Variable groups, loss and metrics are the model's (model_loss_plan).
            if not self.trains or not all(isinstance(g, str) and g for g in self.trains):
                raise ValueError(f'Phase.trains must name variable groups of the model, got {self.trains!r}.')
            if not isinstance(self.epochs, int) or self.epochs < 0:
                raise ValueError(f'Phase.epochs must be an int >= 0, got {self.epochs!r}.')
            if self.penalty is not None or self.step is not None:
                raise ValueError('A phase with a model-defined loss takes no penalty or step kind.')
            return
        if self.statistic is not None:
            raise ValueError('Phase.statistic needs a model-defined Phase.loss.')
        if not self.trains or not set(self.trains) <= set(PARTS) or len(set(self.trains)) != len(self.trains):
            raise ValueError(f'Phase.trains must be a non-empty subset of {PARTS}, got {self.trains!r}.')
        if PERSONAL in self.trains and len(self.trains) > 1:
            raise ValueError(f'A phase that trains the personal copy trains nothing else, got {self.trains!r}.')
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f'Phase.epochs must be an int >= 1, got {self.epochs!r}.')
        if self.penalty is not None and not isinstance(self.penalty, Penalty):
            raise ValueError(f'Phase.penalty must be a client_plan.Penalty, got {self.penalty!r}.')
        if self.penalty is not None and self.penalty.part not in self.trains:
            raise ValueError(f'Phase.penalty applies to {self.penalty.part!r}, which the phase does not train.')
        if self.step is not None:
            if not isinstance(self.step, step_kinds.StepKind):
                raise ValueError(f'Phase.step must be a step_kinds.StepKind, got {self.step!r}.')
            self.step.check(self.trains)


@dataclasses.dataclass(frozen=True)
class ClientPlan:
    """A client's work: its phases, in order (exactly one of them trains the global weights), and whether the client
    keeps a personal copy of the global weights as its private state (`personal_copy`; else the model's local
    weights); with `personalization`, the copy's values and the model it runs with are the algorithm's
    (`Personalization`, e.g. APFL's mixture).

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

    `global_start` (a `fedpersonal.core.client_start.ClientStart`, e.g. FedALA's adaptive local aggregation): the
    personal copy is the model the client trained last, followed by the start's extras, and the global phase starts
    where the start's own math puts it instead of at the received weights.

    `shared` (a `fedpersonal.core.shared_values.SharedValues`, e.g. SCAFFOLD's control variates): the server keeps
    values after its global trainable weights and each client keeps values after its local trainable weights,
    both shaped as the global trainable weights; they offset every gradient of the global phase and are updated
    after it (`fedpersonal.core.shared_values`).

    `reference` (a `fedpersonal.core.reference_terms.ReferenceTerm`, e.g. MOON's model-contrastive loss): each
    client keeps weights shaped as the global trainable weights after its local trainable weights; every batch loss
    of the global phase gets a term of the batch's representations at the trained, the received and the kept
    weights, and the kept weights are updated after the phase (`fedpersonal.core.reference_terms`).

    `table` (a `fedpersonal.core.server_table.ServerTable`, e.g. FedAMP's attention-weighted centres): the server
    keeps the round's uploaded models as rows instead of their mean; each client keeps the model it trained last
    (``personal_copy=True``), trains it in the one phase, with the phase's penalty centred at its own centre from
    the table, and uploads it (`fedpersonal.core.server_table`).

    Example:

    >>> import tensorflow_federated as tff
    >>> sgd = tff.learning.optimizers.build_sgdm(0.1)
    >>> plan = ClientPlan((Phase(('local',), 2, sgd), Phase(('global',), 1, sgd)))  # FedRep
    >>> plan.global_phase
    1
    """

    phases: tuple[Phase, ...]
    personal_copy: bool = False
    personalization: Personalization | None = None
    split: DataSplit | None = None
    local_start: str = KEPT
    counts_participations: bool = False
    counts_labels: bool = False
    global_start: client_start.ClientStart | None = None
    shared: shared_values.SharedValues | None = None
    reference: reference_terms.ReferenceTerm | None = None
    table: server_table.ServerTable | None = None

    def __post_init__(self):
        if self.model_losses:
            _check_model_loss_plan(self)
            return
        if self.table is not None:
            _check_table(self)
        if self.shared is not None:
            _check_kept_hook(self, 'shared', shared_values.SharedValues)
        if self.reference is not None:
            _check_kept_hook(self, 'reference', reference_terms.ReferenceTerm)
        if self.counts_participations or self.counts_labels:
            raise ValueError('counts_participations and counts_labels need phases with model-defined losses.')
        if self.global_start is not None:
            if not isinstance(self.global_start, client_start.ClientStart):
                raise ValueError(f'ClientPlan.global_start must be a ClientStart, got {self.global_start!r}.')
            self.global_start.check(self)
        if self.local_start not in LOCAL_STARTS:
            raise ValueError(f'ClientPlan.local_start must be one of {LOCAL_STARTS}, got {self.local_start!r}.')
        if self.local_start != KEPT and self.personal_copy:
            raise ValueError(f"A personal copy is kept: local_start must be 'kept', got {self.local_start!r}.")
        for phase in self.phases:
            if phase.data is not None and (self.split is None or phase.data not in self.split.names):
                raise ValueError(f"Phase.data {phase.data!r} is not a part of the plan's split {self.split}.")
        if not any(p.reports_metrics for p in self.phases):
            raise ValueError('At least one phase of a ClientPlan reports metrics.')
        inner = any(p.step is not None and p.step.carries_personal for p in self.phases)
        if (inner or any(PERSONAL in p.trains for p in self.phases)) and not self.personal_copy:
            raise ValueError('A phase trains the personal copy: the plan needs personal_copy=True.')
        if self.personalization is not None and not self.personal_copy:
            raise ValueError('ClientPlan.personalization needs personal_copy=True.')
        from_received = any(
            p.step is not None and p.step.carries_personal and p.step.carried_start != step_kinds.KEPT
            for p in self.phases
        )
        if self.personalization is not None and (from_received or self.global_start is not None):
            raise ValueError(
                'ClientPlan.personalization takes no global_start and no step kind whose carried copy starts at the '
                'received weights.'
            )
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
    if plan.personal_copy or plan.personalization is not None or plan.local_start != KEPT or plan.global_start:
        raise ValueError("A plan with model-defined losses keeps the model's local weights (no personal copy).")
    if plan.shared is not None or plan.reference is not None or plan.table is not None:
        raise ValueError('A plan with model-defined losses takes no shared values, reference term or table.')
    if plan.split is not None or any(p.data is not None or not p.reports_metrics for p in plan.phases):
        raise ValueError('The phases of a plan with model-defined losses train on the whole dataset and report.')
    if plan.counts_labels and not any(p.epochs for p in plan.phases):
        raise ValueError('counts_labels needs a phase that iterates the data (epochs >= 1).')
    prefixes = [p.metrics_prefix or p.loss for p in plan.phases]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(
            f'The phases of a plan with model-defined losses need distinct metrics prefixes, got {prefixes}.'
        )


def _check_kept_hook(plan: ClientPlan, name: str, kind: type) -> None:
    """A hook whose values clients keep after the model's local weights (`ClientPlan.shared`,
    `ClientPlan.reference`): it needs those weights kept (no personal copy, start, personalization or other such
    hook) and a global phase of plain steps without a penalty."""
    if not isinstance(getattr(plan, name), kind):
        raise ValueError(f'ClientPlan.{name} must be a {kind.__module__}.{kind.__name__}, got {getattr(plan, name)!r}.')
    both = plan.shared is not None and plan.reference is not None
    if plan.personal_copy or plan.personalization is not None or plan.global_start is not None or both:
        raise ValueError(
            f'ClientPlan.{name} takes no personal copy, personalization, global_start or other kept values.'
        )
    if plan.local_start != KEPT:
        raise ValueError(
            f"ClientPlan.{name} keeps values on the clients: local_start must be 'kept', got {plan.local_start!r}."
        )
    phase = next((p for p in plan.phases if GLOBAL in p.trains), None)
    if phase is not None and (phase.penalty is not None or phase.step is not None):
        raise ValueError(f'With ClientPlan.{name} the global phase takes no penalty and no step kind.')


def _check_table(plan: ClientPlan) -> None:
    """A plan with a `ClientPlan.table`: the client keeps its model (``personal_copy``) and trains it in one phase
    of plain steps; nothing else is kept or started."""
    table = plan.table
    if not isinstance(table, server_table.ServerTable):
        raise ValueError(f'ClientPlan.table must be a server_table.ServerTable, got {table!r}.')
    if not isinstance(table.capacity, int) or table.capacity < 1:
        raise ValueError(f'ClientPlan.table.capacity must be an int >= 1, got {table.capacity!r}.')
    others = (plan.personalization, plan.global_start, plan.shared, plan.reference, plan.split)
    if not plan.personal_copy or any(o is not None for o in others) or plan.local_start != KEPT:
        raise ValueError(
            'ClientPlan.table: the client keeps its own model (personal_copy=True) and nothing else (no '
            'personalization, global_start, shared values, reference term or split).'
        )
    if len(plan.phases) != 1 or plan.phases[0].trains != (GLOBAL,) or plan.phases[0].step is not None:
        raise ValueError(f"ClientPlan.table needs one phase training ('global',) with plain steps, got {plan.phases}.")


def kept_values(plan: ClientPlan, weights: list[Any]) -> list[Any]:
    """The values a client keeps after its local trainable weights at first (`ClientPlan.shared`'s kept ones,
    `ClientPlan.reference`'s weights; none without either), from the model's initial global trainable `weights`."""
    if plan.shared is not None:
        _, kept = plan.shared.initial(weights)
    elif plan.reference is not None:
        kept = plan.reference.initial(weights)
    else:
        return []
    shared_values.check_shapes(kept, weights, 'kept')
    return list(kept)


def prefixed(prefix: str | None, values: collections.OrderedDict) -> collections.OrderedDict:
    """`values` keyed ``<prefix>_<name>`` (as they are without a prefix)."""
    return collections.OrderedDict((k if prefix is None else f'{prefix}_{k}', v) for k, v in values.items())


class Initial(NamedTuple):
    """The no-arg TF computations of a model's initial global and local weights (None for a stateless plan), and
    the type of the model's input batches."""

    global_weights: tff.Computation
    local_weights: tff.Computation | None
    element_type: tff.Type


def server_weights(
    model: tff.learning.models.ReconstructionModel,
    local_start: str = KEPT,
    shared: shared_values.SharedValues | None = None,
) -> Any:
    """The weights (`ModelWeights`) the server holds and broadcasts: the model's global weights, with
    ``local_start='learned'`` followed in the trainable ones by the default of its local trainable weights, with
    `shared` by its initial shared values."""
    weights = client_work.global_weights(model)
    if shared is not None:
        values, _ = shared.initial(list(weights.trainable))
        shared_values.check_shapes(values, weights.trainable, 'shared')
        return ModelWeights(list(weights.trainable) + list(values), weights.non_trainable)
    if local_start != LEARNED:
        return weights
    return ModelWeights(list(weights.trainable) + list(model.local_trainable_variables), weights.non_trainable)


def initial_weights(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    *,
    personal: bool = False,
    personalization: Personalization | None = None,
    local_start: str = KEPT,
    stateful: bool = True,
    global_start: client_start.ClientStart | None = None,
    shared: shared_values.SharedValues | None = None,
    kept: Callable[[list[Any]], list[Any]] | None = None,
    table: server_table.ServerTable | None = None,
) -> Initial:
    """`Initial` of the partially local model `model_fn` builds; with `personal`, the private state is a copy of
    its global weights (with `personalization`, its extras after the trainable weights; with `global_start`, its
    extras after the trainable and the non-trainable ones); with `kept` (``global trainable weights -> values``,
    `kept_values`), the local weights are followed in the trainable ones by the kept values; the global weights are
    `server_weights` for `local_start` and `shared`, or with `table` its empty table (`server_table.empty`).
    Calls `model_fn` once (twice if `stateful`), as TFF's builders count their calls."""
    input_specs = []

    @tff.tensorflow.computation
    def initial_global():
        model = model_fn()
        input_specs.append(model.input_spec)
        if table is not None:
            if model.local_trainable_variables or model.local_non_trainable_variables:
                raise ValueError('ClientPlan.table needs a model whose weights are all global (the client keeps it).')
            return server_table.empty(list(model.global_trainable_variables), table.capacity)
        return server_weights(model, local_start, shared)

    initial_local = None
    if stateful:

        @tff.tensorflow.computation
        def initial_local():
            model = model_fn()
            if not personal and kept is not None:
                local = client_work.local_weights(model)
                values = kept(list(model.global_trainable_variables))
                return ModelWeights(list(local.trainable) + list(values), local.non_trainable)
            if not personal:
                return client_work.local_weights(model)
            weights = client_work.global_weights(model)
            if global_start is not None:
                extras = global_start.extras(weights)
                return ModelWeights(
                    list(weights.trainable) + list(extras.trainable),
                    list(weights.non_trainable) + list(extras.non_trainable),
                )
            if personalization is None:
                return weights
            extras = personalization.extras(list(weights.trainable))
            return ModelWeights(list(weights.trainable) + list(extras), weights.non_trainable)

    return Initial(initial_global, initial_local, tff.types.tensorflow_to_type(input_specs[0]))


def plan_initial_weights(plan: ClientPlan, model_fn: Callable[[], tff.learning.models.ReconstructionModel]) -> Initial:
    """`initial_weights` as `plan` keeps its clients' state."""
    return initial_weights(
        model_fn,
        personal=plan.personal,
        personalization=plan.personalization,
        local_start=plan.local_start,
        stateful=plan.stateful,
        global_start=plan.global_start,
        shared=plan.shared,
        kept=(lambda w: kept_values(plan, w)) if plan.shared is not None or plan.reference is not None else None,
        table=plan.table,
    )


def model_weights(plan: ClientPlan, server_weights: Any) -> Any:
    """The model's global weights among the server's: without the shared values that follow them
    (`ClientPlan.shared`, as many as the model's global trainable tensors); with a `ClientPlan.table`, none (the
    server holds no model).

    >>> import numpy as np
    >>> plan = ClientPlan((Phase(('global',), 1, tff.learning.optimizers.build_sgdm(0.1)),))
    >>> model_weights(plan, ModelWeights([np.zeros(2)], [])).trainable
    [array([0., 0.])]
    """
    if plan.table is not None:
        return ModelWeights([], [])
    if plan.shared is None:
        return server_weights
    trainable = list(server_weights.trainable)
    return ModelWeights(trainable[: len(trainable) // 2], list(server_weights.non_trainable))


def personalized_weights(plan: ClientPlan, global_weights: Any, private_state: Any) -> tff.learning.models.ModelWeights:
    """The weights a client predicts with after its rounds, as numpy arrays.

    With a personal copy (Ditto; with a `table`, FedAMP's: the client's own model), the copy; with the plan's
    `Personalization` (APFL), its ``predicts_with`` of the copy's values and the global weights (the copy's
    non-trainable weights); with a `global_start` (FedALA), its ``predicts_with`` (the start of its next round,
    without learning further); else the client's local weights, which it predicts with beside `global_weights` (with `ClientPlan.shared`, its local weights
    without the kept values; `global_weights` the server's, its shared values after the model's). Evaluate the
    first three with a model whose variables are all local and no global weights, the last with the training model.

    >>> import numpy as np
    >>> sgd = tff.learning.optimizers.build_sgdm(0.1)
    >>> halfway = Personalization(extras=lambda w: [], predicts_with=lambda v, w: [(a + b) / 2 for a, b in zip(v, w)])
    >>> plan = ClientPlan((Phase(('personal',), 1, sgd), Phase(('global',), 1, sgd)), personal_copy=True,
    ...                   personalization=halfway)
    >>> w = ModelWeights([np.float32(0.0)], [])
    >>> [float(v) for v in personalized_weights(plan, w, ModelWeights([np.float32(2.0)], [])).trainable]
    [1.0]
    """
    trainable = [np.asarray(v) for v in private_state.trainable]
    non_trainable = [np.asarray(v) for v in private_state.non_trainable]
    if plan.global_start is not None:  # The start of its next round, the extras not learned further.
        kept, extras = client_start.split_private(
            private_state, len(global_weights.trainable), len(global_weights.non_trainable)
        )
        started = plan.global_start.predicts_with(list(global_weights.trainable), kept, extras)
        return ModelWeights([np.asarray(v) for v in started.trainable], [np.asarray(v) for v in started.non_trainable])
    if plan.shared is not None:  # Its kept values follow its local weights.
        trainable = trainable[: len(trainable) - len(global_weights.trainable) // 2]
    if plan.reference is not None:  # Its kept weights follow its local weights.
        trainable = trainable[: len(trainable) - len(global_weights.trainable)]
    if plan.personalization is not None:
        received = [np.asarray(w) for w in global_weights.trainable]
        trainable = [np.asarray(v) for v in plan.personalization.predicts_with(trainable, received)]
    return ModelWeights(trainable, non_trainable)
