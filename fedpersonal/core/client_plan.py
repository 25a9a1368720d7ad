"""A client's work stated once, as data: which weights step, in which order, for how many epochs.

A `ClientPlan` is a sequence of `Phase`s over a partially local model (`fedpersonal.models.from_keras_model`, global
and local layers): each phase trains the global weights, the local ones or both, for some epochs with a TFF
optimizer whose state starts fresh, on the client's whole dataset, with the model's loss. After the phases the client
uploads the change of its global trainable weights (weighted by the examples the global phases saw; zero weight for
a non-finite update) and keeps its local weights as its private state (its previous ones if the update was not
finite). The Keras metrics are updated with every step's pre-step predictions, in every phase.

Backends run the same plan: `build_client_update` here (one TF computation per client, mapped over the clients by
TFF: the process's ``next``, what the privacy audit reads), and the grouped engine
(`fedpersonal.simulation.plan_engine`), chosen in one place (`fedpersonal.backends`). FedPer is one phase training
both parts; FedRep trains the local head with the body frozen, then the body with the head frozen.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib

GLOBAL, LOCAL = 'global', 'local'


@dataclasses.dataclass(frozen=True)
class NormPenalty:
    """``strength * sum ||v||^2`` over the trained weights of `part` (e.g. FURL's norm on its private parameters),
    added to every batch loss of the phase (not to the reported loss)."""

    part: str
    strength: float

    def __call__(self, trained: dict[str, list[Any]]) -> tf.Tensor:
        return self.strength * tf.add_n([tf.reduce_sum(tf.square(v)) for v in trained[self.part]])


@dataclasses.dataclass(frozen=True)
class Phase:
    """One local training phase.

    Attributes:
      trains: The weights that step: ``('global',)``, ``('local',)`` or both; the others are frozen.
      epochs: Passes over the client's dataset (at least 1).
      optimizer: A `tff.learning.optimizers.Optimizer`; its state starts fresh in every phase.
      penalty: Optional term added to each batch loss, a function of the phase's trained weights by part
        (``{'global': [...], 'local': [...]}``): `NormPenalty`.
    """

    trains: tuple[str, ...]
    epochs: int
    optimizer: tff.learning.optimizers.Optimizer
    penalty: NormPenalty | None = None

    def __post_init__(self):
        if not self.trains or not set(self.trains) <= {GLOBAL, LOCAL} or len(set(self.trains)) != len(self.trains):
            raise ValueError(f"Phase.trains must be a non-empty subset of ('global', 'local'), got {self.trains!r}.")
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f'Phase.epochs must be an int >= 1, got {self.epochs!r}.')
        if self.penalty is not None and self.penalty.part not in self.trains:
            raise ValueError(f'Phase.penalty applies to {self.penalty.part!r}, which the phase does not train.')


@dataclasses.dataclass(frozen=True)
class ClientPlan:
    """A client's work: its phases, in order (at most one of them trains the global weights).

    Example:

    >>> import tensorflow_federated as tff
    >>> sgd = tff.learning.optimizers.build_sgdm(0.1)
    >>> plan = ClientPlan((Phase(('local',), 2, sgd), Phase(('global',), 1, sgd)))  # FedRep
    >>> plan.global_phase
    1
    """

    phases: tuple[Phase, ...]

    def __post_init__(self):
        global_phases = [i for i, p in enumerate(self.phases) if GLOBAL in p.trains]
        if len(global_phases) != 1:
            raise ValueError(f'A ClientPlan needs exactly one phase that trains the global weights, got {self.phases}.')

    @property
    def global_phase(self) -> int:
        """The index of the phase that trains the global weights."""
        return next(i for i, p in enumerate(self.phases) if GLOBAL in p.trains)


class Initial(NamedTuple):
    """The no-arg TF computations of a model's initial global and local weights."""

    global_weights: tff.Computation
    local_weights: tff.Computation


def initial_weights(model_fn: Callable[[], tff.learning.models.ReconstructionModel]) -> Initial:
    """`Initial` of the partially local model `model_fn` builds."""

    @tff.tensorflow.computation
    def initial_global():
        return client_work.global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_local():
        return client_work.local_weights(model_fn())

    return Initial(initial_global, initial_local)


def build_client_update(
    plan: ClientPlan,
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    finalizers: collections.OrderedDict,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> tff.Computation:
    """The plan as one client's TF computation ``(global weights, dataset, local weights) -> (ClientResult,
    unfinalized metrics, new local weights)``, recording the metrics' finalizers in `finalizers`; the update's
    weight by `client_weighting` (``NUM_EXAMPLES``: the examples of the global phase's steps)."""
    with tf.Graph().as_default():
        element_type = tff.types.tensorflow_to_type(model_fn().input_spec)
    initial = initial_weights(model_fn)

    @tff.tensorflow.computation(
        initial.global_weights.type_signature.result,
        tff.SequenceType(element_type),
        initial.local_weights.type_signature.result,
    )
    @tf.function
    def client_update(received, dataset, local):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            metrics = client_work.build_metrics(metrics_fn, loss_fn, finalizers)
            parts = {GLOBAL: list(model.global_trainable_variables), LOCAL: list(model.local_trainable_variables)}
            trained = [[v for part in phase.trains for v in parts[part]] for phase in plan.phases]
            optimizers = [client_work.prepare_optimizer(p.optimizer, v) for p, v in zip(plan.phases, trained)]
        client_work.assign_weights(client_work.global_weights(model), received)
        client_work.assign_weights(client_work.local_weights(model), local)
        batch_loss = client_work.model_batch_loss(model, loss_fn(), metrics)
        num_examples = tf.constant(0)
        for i, (phase, variables, optimizer) in enumerate(zip(plan.phases, trained, optimizers)):
            penalty = None
            if phase.penalty is not None:
                by_part = {part: parts[part] for part in phase.trains}
                penalty = functools.partial(phase.penalty, by_part)
            steps = client_work.optimizer_steps(
                variables, dataset, optimizer, batch_loss, epochs=phase.epochs, penalty=penalty
            )
            if i == plan.global_phase:
                num_examples = steps.num_examples
        delta, non_finite = client_work.weights_delta(received.trainable, model.global_trainable_variables)
        unfinalized = client_work.read_metrics(metrics)
        weight = client_work.client_weight(client_weighting, num_examples, unfinalized, non_finite)
        new_local = client_work.keep_previous_if_non_finite(non_finite, local, client_work.local_weights(model))
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), unfinalized, new_local

    return client_update


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
) -> process_lib.PersonalizedProcess:
    """The plan as a stateful process on the per-client backend: TFF's broadcast, `model_aggregator` (default the
    weighted mean, weights by `client_weighting`) and `server_optimizer` around `build_client_update`; the local
    weights are the private state."""
    initial = initial_weights(model_fn)
    finalizers: collections.OrderedDict = collections.OrderedDict()
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=build_client_update(plan, model_fn, loss_fn, metrics_fn, finalizers, client_weighting),
        aggregate_metrics=compose.keras_metrics(finalizers, metrics_aggregator),
        server_optimizer=server_optimizer,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
    )
