"""A `fedpersonal.core.client_plan.ClientPlan` as one group's compiled program on the engine: where each client's
weights start, the plan's phases over the group's packed batches, the group's update and each client's new private
state. `plan_engine.build_engine_process` wraps it in a process; the arithmetic is the per-client backend's
(`per_client_plan.build_client_update`) to float precision.

Each phase runs `client_loop.phase_steps` (the lockstep, or the compiled client loop, chosen by the strategy), or a
step kind's loop (`step_kind_engine`); a `client_plan.Personalization` runs the phases that train the personal copy
at its ``predicts_with`` (`_Personalized`) and applies its ``finish`` to each client after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.core import client_plan
from fedpersonal.core import client_start
from fedpersonal.core import reference_terms
from fedpersonal.core import server_table
from fedpersonal.core import shared_values
from fedpersonal.core import step_kinds
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import client_loop
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import step_kind_engine

START = 'start'  # The packed phase a plan's `global_start` reads: the client's whole dataset, once.


class _Start(NamedTuple):
    """Where a group's clients start: the received globals, the model's weights, the personal copy (with its
    extras; None without one), with a `global_start` its new extras per client, with `shared` values the
    received ones, each client's kept ones and its gradient offsets, and with a `reference` term each client's kept
    weights."""

    received: list[Any]
    weights: functional.Parts
    personal: functional.Parts | None
    extras: tff.learning.models.ModelWeights | None
    shared: list[Any] = []
    kept: list[Any] = []
    offsets: list[Any] = []


class _Trained(NamedTuple):
    """After the phases: the model's weights, the personal copy, and the global phase's client weights and steps."""

    weights: functional.Parts
    personal: functional.Parts | None
    client_weight: Any
    steps: Any


class PlanProgram:
    """The plan's group program for `model` (a `functional.FunctionalModel`), updates weighted by
    `client_weighting`, each client's clipped to `dp_clip` if given (a fixed-clip DP aggregator)."""

    def __init__(self, plan: client_plan.ClientPlan, model: functional.FunctionalModel, client_weighting: Any, dp_clip):
        self.plan, self.model, self.client_weighting, self.dp_clip = plan, model, client_weighting, dp_clip
        self.base = base = model.initial_weights
        self.num_global = len(base.global_trainable)
        self.learned = plan.local_start == client_plan.LEARNED
        self.slots = {
            client_plan.GLOBAL: [(functional.GLOBAL_TRAINABLE, i) for i in range(len(base.global_trainable))],
            client_plan.LOCAL: [(functional.LOCAL_TRAINABLE, i) for i in range(len(base.local_trainable))],
        }
        self.slots[client_plan.PERSONAL] = self.slots[client_plan.GLOBAL]  # Of the personal copy's own weights.
        self.names = tuple(f'phase_{i}' for i in range(len(plan.phases)))
        if plan.reference is not None and (
            base.global_non_trainable or base.local_trainable or base.local_non_trainable
        ):
            raise errors.ConfigError(
                'ClientPlan.reference needs a Keras model whose weights are all global and trainable, got '
                f'{[len(base[g]) for g in range(1, 4)]} global non-trainable, local trainable and local non-trainable '
                'weights.'
            )
        self.extras: list[np.ndarray] = []
        if plan.personalization is not None:  # The extras' initial values, for their slots' shapes and types.
            with tf.init_scope():
                extras = plan.personalization.extras([tf.constant(v) for v in base.global_trainable])
                self.extras = [np.asarray(e) for e in extras]
        self.start_extras = None
        if plan.global_start is not None:  # Its extras' initial values, for their shapes (shared or per client).
            with tf.init_scope():
                made = plan.global_start.extras(
                    tff.learning.models.ModelWeights(
                        [tf.constant(v) for v in base.global_trainable],
                        [tf.constant(v) for v in base.global_non_trainable],
                    )
                )
                self.start_extras = tff.learning.models.ModelWeights(
                    [np.asarray(v) for v in made.trainable], [np.asarray(v) for v in made.non_trainable]
                )
        # The trained globals are needed per client after the global phase only to clip them, or for a later phase
        # that trains on them; else only their weighted sum leaves the client loop.
        self.keep_globals = (
            dp_clip is not None
            or self.learned
            or plan.shared is not None  # `SharedValues.finish` reads each client's trained globals.
            or plan.reference is not None  # So does `ReferenceTerm.finish`.
            or plan.global_start is not None  # The trained model is the client's own.
            or plan.table is not None  # So it is with a table: its upload and its private state.
            or any(client_plan.PERSONAL not in p.trains for p in plan.phases[plan.global_phase + 1 :])
        )
        # A plan of one phase training the shared globals by plain steps, whose weighted deltas are all that leaves
        # it (FedAvg's) may run as the low-rank steps, which TF's graph kernels run faster than XLA's
        # (docs/ENGINE.md, "Dense rows"); a phase they cannot run (`low_rank.fits`) then runs the client loop
        # compiled by XLA on its own.
        self.low_rank_plan = (
            len(plan.phases) == 1
            and plan.phases[0].trains == (client_plan.GLOBAL,)
            and plan.phases[0].step is None
            and not plan.stateful
            and not self.keep_globals
        )

    def train_function(self, strategy: str, loss: Any, metrics: dict[str | None, Any]) -> Any:
        """The group's compiled program ``(server trainable, server non-trainable, group, private trainable,
        private non-trainable) -> (update, new private state)`` (``()`` for a stateless plan) under `strategy`."""

        @tf.function(
            jit_compile=self.model.xla and not (strategy == client_loop.LOW_RANK and self.low_rank_plan),
            autograph=False,
        )
        def train(uploaded_start, non_trainable, group, private_trainable, private_non_trainable):
            start = self.start(uploaded_start, non_trainable, group, private_trainable, private_non_trainable, loss)
            trained = self.phases(start, group, strategy, loss, metrics)
            finished: tuple[list[Any], list[Any]] = ([], [])
            if self.plan.shared is not None:
                finished = self._shared_finish(start, trained, group)
            elif self.plan.reference is not None:
                finished = ([], self._reference_finish(start, trained))
            result, finite, clients = self.upload(uploaded_start, trained, finished[0], group)
            if not self.plan.stateful:
                return result, ()
            kept = self.kept(start, trained, finite, clients, private_trainable, private_non_trainable, finished[1])
            return result, kept

        return train

    def start(self, uploaded_start, non_trainable, group, private_trainable, private_non_trainable, loss) -> _Start:
        """Each client's start (the received globals; the private state as the plan keeps it)."""
        plan, base, num_global = self.plan, self.base, self.num_global
        if plan.table is not None:  # Each client trains its kept model; its penalty's centre is its own.
            table, rows, filled = plan.table, list(uploaded_start), non_trainable[0]
            centres = lockstep.for_each_client(
                lambda own: list(table.centre(rows, filled, list(own))), private_trainable
            )
            weights = functional.Parts(list(private_trainable), list(private_non_trainable), [], [])
            return _Start(list(centres), weights, None, None)
        received = uploaded_start[:num_global]  # With a learned local default, it follows the globals.
        if plan.global_start is not None:  # The global phase starts where the plan's start puts each client.
            started = self._started(received, private_trainable, private_non_trainable, group[START], loss)
            start = list(received)
            for i, value in zip(plan.global_start.changes(num_global), started.changed):
                start[i] = value
            weights = functional.Parts(start, started.non_trainable, [], [])
            return _Start(received, weights, None, started.extras)
        if plan.personal:  # The model has no local weights: the private state is a copy of its globals.
            # With a `Personalization`, its extras follow the copy's trainable weights.
            personal = functional.Parts(private_trainable, private_non_trainable, [], [])
            return _Start(received, functional.Parts(received, non_trainable, [], []), personal, None)
        if plan.stateful and (plan.shared is not None or plan.reference is not None):  # Kept after the locals.
            num_local = len(base.local_trainable)
            local, kept = list(private_trainable[:num_local]), list(private_trainable[num_local:])
            weights = functional.Parts(received, non_trainable, local, private_non_trainable)
            if plan.reference is not None:
                return _Start(received, weights, None, None, [], kept)
            shared = list(uploaded_start[num_global:])
            values = plan.shared
            assert values is not None
            offsets = lockstep.for_each_client(lambda own: list(values.offset(shared, list(own))), kept)
            return _Start(received, weights, None, None, shared, kept, list(offsets))
        if plan.stateful:
            weights = functional.Parts(received, non_trainable, private_trainable, private_non_trainable)
            return _Start(received, weights, None, None)
        # Locals start at the model's initial values (the same for every client) or the default.
        local = uploaded_start[num_global:] if self.learned else [tf.constant(v) for v in base.local_trainable]
        weights = functional.Parts(received, non_trainable, local, [tf.constant(v) for v in base.local_non_trainable])
        return _Start(received, weights, None, None)

    def _started(self, received, private_trainable, private_non_trainable, phase, loss) -> client_start.Started:
        """The plan's `global_start` of every client of the group, client after client (each may learn for as
        long as its own losses decide), from its packed examples (real ones first)."""
        begin, model = self.plan.global_start, self.model
        assert begin is not None and self.start_extras is not None
        num_trainable, num_non_trainable = self.num_global, len(self.base.global_non_trainable)
        stateful = [i for g, i in model.stateful_slots if g == functional.GLOBAL_NON_TRAINABLE]
        clients = tf.shape(phase['mask'])[0]

        def flat(a: tf.Tensor) -> tf.Tensor:  # One client's [steps, batch, ...] -> [steps * batch, ...].
            return tf.reshape(a, tf.concat([[-1], tf.shape(a)[2:]], 0))

        def client_loss(parts: functional.Parts, batch: Any, mask: tf.Tensor, _: Any):
            x, y = partially_local_model.split_batch(batch)
            predictions, regularization, updates = model.apply(
                parts, x, training=True, example_mask=mask if stateful else None
            )
            return lockstep.masked_loss(loss, y, predictions, mask) + regularization, updates

        def gradient(weights, statistics, batch, mask, wrt):
            parts = functional.Parts(list(weights), list(statistics), [], [])
            value, _, _, gradients, updates = lockstep.client_gradients(
                model, parts, [weights[i] for i in wrt], batch, mask, (), None, client_loss, None, [], False
            )
            statistics = [
                tf.stop_gradient(updates.get((functional.GLOBAL_NON_TRAINABLE, i), s)) for i, s in enumerate(statistics)
            ]
            return value, gradients, statistics

        def client(c, out):
            mask = flat(lockstep.at(phase['mask'], c))
            order = tf.argsort(-mask, stable=True)  # Its real examples first, in their order.
            batch = tf.nest.map_structure(lambda a: tf.gather(flat(lockstep.at(a, c)), order), phase['batch'])
            at = lambda tensors: [lockstep.at(t, c) for t in tensors]
            kept = tff.learning.models.ModelWeights(
                at(private_trainable[:num_trainable]), at(private_non_trainable[:num_non_trainable])
            )
            extras = tff.learning.models.ModelWeights(
                at(private_trainable[num_trainable:]), at(private_non_trainable[num_non_trainable:])
            )
            examples = client_start.Examples(batch, tf.gather(mask, order))
            started = begin.start(list(received), kept, extras, examples, gradient)
            written = (
                list(started.changed)
                + list(started.non_trainable)
                + list(started.extras.trainable)
                + list(started.extras.non_trainable)
            )
            return c + 1, [a.write(c, x) for a, x in zip(out, written)]

        changes = begin.changes(num_trainable)
        kinds = (
            [received[i].dtype for i in changes]
            + [t.dtype for t in private_non_trainable[:num_non_trainable]]
            + [t.dtype for t in private_trainable[num_trainable:]]
            + [t.dtype for t in private_non_trainable[num_non_trainable:]]
        )
        out = [tf.TensorArray(kind, size=clients) for kind in kinds]
        _, out = tf.while_loop(lambda c, _: c < clients, client, (tf.constant(0), out))
        stacked = [a.stack() for a in out]
        sizes = np.cumsum([0, len(changes), num_non_trainable, len(self.start_extras.trainable)])
        return client_start.Started(
            stacked[: sizes[1]],
            stacked[sizes[1] : sizes[2]],
            tff.learning.models.ModelWeights(stacked[sizes[2] : sizes[3]], stacked[sizes[3] :]),
        )

    def phases(self, start: _Start, group: Any, strategy: str, loss: Any, metrics: dict[str | None, Any]) -> _Trained:
        """The plan's phases for every client of the group, in order."""
        plan, slots, personalization = self.plan, self.slots, self.plan.personalization
        received, weights, personal = start.received, start.weights, start.personal
        weight = steps = None
        for i, (name, phase) in enumerate(zip(self.names, plan.phases)):
            # Globals first: `update_after_steps` reads the first slots' accumulated deltas. They start shared in
            # their phase (the only one that trains them), as the accumulation needs.
            parts = [part for part in client_plan.PARTS if part in phase.trains]
            train_slots = [s for part in parts for s in slots[part]]
            stepped_model: Any = self.model
            personalized = personalization is not None and client_plan.PERSONAL in parts
            if personalized:  # The copy's extras follow its weights; the model runs at `predicts_with`.
                assert personalization is not None
                stepped_model = _Personalized(self.model, received, personalization, self.extras)
                train_slots = train_slots + [
                    (functional.GLOBAL_TRAINABLE, self.num_global + j) for j in range(len(self.extras))
                ]
            examples = tf.reduce_sum(group[name]['mask'], axis=[1, 2])
            client_weight = group_lib.client_weights(self.client_weighting, examples)
            phase_metrics = metrics[phase.metrics_prefix] if phase.reports_metrics else ()
            if phase.step is not None:  # A step kind's (carried values: the personal copy's weights).
                from_kept = phase.step.carries_personal and phase.step.carried_start == step_kinds.KEPT
                if from_kept:
                    assert personal is not None
                weights, carried, phase_steps = step_kind_engine.step_kind_steps(
                    self.model,
                    phase.step,
                    weights,
                    train_slots,
                    group[name],
                    phase.optimizer,
                    loss,
                    metrics=phase_metrics,
                    carried=list(personal.global_trainable) if from_kept and personal is not None else None,
                )
                if carried is not None:
                    kept_statistics = personal.global_non_trainable if from_kept and personal is not None else None
                    personal = functional.Parts(carried, kept_statistics or weights.global_non_trainable, [], [])
                    personal = self._finish(personal, weights, group[name])
                if i == plan.global_phase:
                    weight, steps = client_weight, phase_steps
                continue
            start_weights = personal if client_plan.PERSONAL in parts else weights
            assert start_weights is not None  # A plan that trains the personal copy keeps one.
            penalty, centre = _penalty(phase, parts, slots), received if _uses_received(phase) else ()
            if i == plan.global_phase and start.offsets:
                penalty, centre = _linear_term, start.offsets
            elif i == plan.global_phase and plan.reference is not None:
                penalty, centre = self._reference_penalty(received), list(start.kept)
            stepped, phase_steps = client_loop.phase_steps(
                strategy,
                stepped_model,
                start_weights,
                train_slots,
                group[name],
                phase.optimizer,
                loss,
                metrics=phase_metrics,
                penalty=penalty,
                centre=centre,
                delta_weights=client_weight if i == plan.global_phase else None,
                keep_trained=self.keep_globals or i != plan.global_phase,
            )
            if personalized:  # Each client's `finish` once the phase ends, as the per-client backend.
                personal = self._finish(stepped, weights, group[name])
            elif client_plan.PERSONAL in parts:
                personal = stepped
            else:
                weights = stepped
            if i == plan.global_phase:
                weight, steps = client_weight, phase_steps
        return _Trained(weights, personal, weight, steps)

    def _finish(self, personal: functional.Parts, weights: functional.Parts, phase: Any) -> functional.Parts:
        """Each client's kept values after the plan's `Personalization.finish` (of them and its model's weights)."""
        finish = self.plan.personalization.finish if self.plan.personalization is not None else None
        if finish is None:
            return personal
        clients = tf.shape(phase['mask'])[0]
        model = [
            lockstep.per_client(v, b, clients) for v, b in zip(weights.global_trainable, self.base.global_trainable)
        ]
        finished = lockstep.for_each_client(
            lambda args: finish(list(args[0]), list(args[1])), (list(personal.global_trainable), model)
        )
        return personal._replace(global_trainable=list(finished))

    def _shared_finish(self, start: _Start, trained: _Trained, group: Any) -> tuple[list[Any], list[Any]]:
        """Each client's uploaded shared values and new kept ones (`SharedValues.finish`), from its trained
        globals and its count of steps in the global phase (batches with a real example)."""
        shared, plan = self.plan.shared, self.plan
        assert shared is not None
        mask = group[self.names[plan.global_phase]]['mask']
        steps = tf.reduce_sum(tf.cast(tf.reduce_any(mask > 0, axis=2), tf.int32), axis=1)
        clients = tf.shape(mask)[0]
        model = [
            lockstep.per_client(v, b, clients)
            for v, b in zip(trained.weights.global_trainable, self.base.global_trainable)
        ]

        def finish(args):
            uploaded, kept = shared.finish(list(start.received), list(args[0]), start.shared, list(args[1]), args[2])
            return list(uploaded), list(kept)

        uploaded, kept = lockstep.for_each_client(finish, (model, list(start.kept), steps))
        return list(uploaded), list(kept)

    def _reference_penalty(self, received: list[Any]) -> lockstep.Penalty:
        """The plan's `ReferenceTerm` as a penalty of the trained values (the globals first) and the centre (the
        client's kept weights, as the globals' first slots), at the `received` weights: the mean over the batch's
        real examples."""
        reference, model, num_global = self.plan.reference, self.model, self.num_global
        assert reference is not None

        def represent(weights: list[Any], x: Any) -> tf.Tensor:
            rebuilt = model.rebuild(functional.Parts(list(weights), [], [], [])).model
            return reference.represent(partially_local_model.keras_model_of(rebuilt) or rebuilt, x)

        def penalty(values: list[tf.Tensor], centre: Any, batch: Any, mask: tf.Tensor) -> tf.Tensor:
            x, _ = partially_local_model.split_batch(batch)
            constants = [[tf.stop_gradient(c) for c in weights] for weights in (received, centre)]
            features = [represent(w, x) for w in (values[:num_global], *constants)]
            return reference_terms.batch_mean(reference.per_example(*features), mask)

        return penalty

    def _reference_finish(self, start: _Start, trained: _Trained) -> list[Any]:
        """Each client's new kept weights (`ReferenceTerm.finish` of its trained globals and its kept weights)."""
        reference = self.plan.reference
        assert reference is not None
        clients = tf.shape(start.kept[0])[0]
        model = [
            lockstep.per_client(v, b, clients)
            for v, b in zip(trained.weights.global_trainable, self.base.global_trainable)
        ]
        kept = lockstep.for_each_client(
            lambda args: list(reference.finish(list(args[0]), list(args[1]))), (model, list(start.kept))
        )
        return list(kept)

    def _uploaded_bases(self) -> list[Any]:
        base = self.base
        return list(base.global_trainable) + (list(base.local_trainable) if self.learned else [])

    def upload(
        self, uploaded_start: Any, trained: _Trained, shared_uploads: Sequence[Any] = (), group: Any = None
    ) -> tuple[Any, Any, Any]:
        """The group's update (its clients' weighted sum and weight; with `shared` values, each client's uploaded
        ones after its globals), each client's finiteness (None: all finite, or not known per client) and the
        number of clients."""
        weights, weight, steps = trained.weights, trained.client_weight, trained.steps
        clients = tf.shape(weight)[0]
        values = list(weights.global_trainable) + (list(weights.local_trainable) if self.learned else [])
        per_client = [lockstep.per_client(v, b, clients) for v, b in zip(values, self._uploaded_bases())]
        per_client += list(shared_uploads)
        if self.plan.table is not None:  # Each client's trained model is a row, unless not finite or untrained.
            finite = group_lib.client_finite([tf.zeros_like(b) for b in self.base.global_trainable], per_client)
            examples = tf.reduce_sum(group[self.names[self.plan.global_phase]]['mask'], axis=[1, 2])
            valid = tf.cast(tf.logical_and(finite, examples > 0), tf.float32)
            return server_table.Rows(per_client, valid), finite, clients
        if self.dp_clip is not None:
            result = group_lib.clipped_sum_update(uploaded_start, per_client, weight, self.dp_clip)
            return result, group_lib.client_finite(uploaded_start, per_client), clients
        if self.plan.shared is not None:  # Each client's finiteness decides what it keeps.
            finite = group_lib.client_finite(uploaded_start, per_client)
            return group_lib.weighted_update(uploaded_start, per_client, weight), finite, clients
        if steps is not None and len(steps.weighted_deltas) >= len(per_client):  # Trained first in their phase.
            # As trained: globals the client loop returned shared have only their weighted sum.
            result, finite = group_lib.update_after_steps(uploaded_start, values, weight, steps)
            return result, finite, clients
        # A learned local default's displacement includes the reconstruction: from each client's copy.
        return group_lib.weighted_update(uploaded_start, per_client, weight), None, clients

    def kept(
        self,
        start: _Start,
        trained: _Trained,
        finite: Any,
        clients: Any,
        private_trainable,
        private_non_trainable,
        shared_kept: Sequence[Any] = (),
    ) -> tff.learning.models.ModelWeights:
        """Each client's new private state (its previous one where its update was not finite; with `shared`
        values, its new kept ones after its local weights)."""
        plan, base, weights = self.plan, self.base, trained.weights
        keep = lambda new, old: tf.where(
            tf.reshape(finite, [-1] + [1] * (new.shape.rank - 1)), new, tf.cast(old, new.dtype)
        )
        new_trainable: Sequence[Any]
        new_non_trainable: Sequence[Any]
        base_non_trainable: Sequence[Any]
        if plan.table is not None:  # The trained model.
            new_trainable = [
                lockstep.per_client(v, b, clients) for v, b in zip(weights.global_trainable, base.global_trainable)
            ]
            new_non_trainable, base_non_trainable = weights.global_non_trainable, base.global_non_trainable
        elif plan.global_start is not None:  # The trained model and the start's new extras.
            assert start.extras is not None and self.start_extras is not None
            new_trainable = [
                lockstep.per_client(v, b, clients) for v, b in zip(weights.global_trainable, self._uploaded_bases())
            ]
            new_trainable += list(start.extras.trainable)
            new_non_trainable = list(weights.global_non_trainable) + list(start.extras.non_trainable)
            base_non_trainable = list(base.global_non_trainable) + list(self.start_extras.non_trainable)
        elif plan.personal:
            assert trained.personal is not None
            new_trainable, new_non_trainable = trained.personal.global_trainable, trained.personal.global_non_trainable
            base_non_trainable = base.global_non_trainable
        else:
            new_trainable, new_non_trainable = (
                list(weights.local_trainable) + list(shared_kept),
                weights.local_non_trainable,
            )
            base_non_trainable = base.local_non_trainable
        return tff.learning.models.ModelWeights(
            trainable=[keep(n, o) for n, o in zip(new_trainable, private_trainable)],
            # Moving statistics a training step updated (batch norm), per client; others as they were.
            non_trainable=[
                keep(lockstep.per_client(n, b, clients), o)
                for n, o, b in zip(new_non_trainable, private_non_trainable, base_non_trainable)
            ],
        )


def _penalty(phase: client_plan.Phase, parts: list[str], slots: dict[str, list[Any]]) -> lockstep.Penalty | None:
    """The phase's penalty as `lockstep_steps` takes it: a function of the trained values (in `parts` order)."""
    if phase.penalty is None:
        return None
    sizes = [len(slots[part]) for part in parts]

    def penalty(values: list[tf.Tensor], centre: Any, batch: Any, mask: tf.Tensor) -> tf.Tensor:
        del batch, mask
        starts = np.cumsum([0] + sizes)
        by_part = {part: values[starts[k] : starts[k + 1]] for k, part in enumerate(parts)}
        assert phase.penalty is not None
        # The received weights are constants: a phase's trained values may start as the very same tensors.
        return phase.penalty(by_part, [tf.stop_gradient(c) for c in centre])

    return penalty


def _uses_received(phase: client_plan.Phase) -> bool:
    return phase.penalty is not None and phase.penalty.uses_received


def _linear_term(values: list[tf.Tensor], centre: Any, batch: Any, mask: tf.Tensor) -> tf.Tensor:
    """`shared_values.linear_term` of the global phase's first trained values (the globals) and the offsets."""
    del batch, mask
    return shared_values.linear_term(values[: len(centre)], centre)


class _Personalized:
    """The model at a `client_plan.Personalization`'s weights, for `lockstep.lockstep_steps`: its weights are the
    personal copy with the extras (their initial values `extras`) appended to the trainable ones, and it predicts
    with ``predicts_with`` of them and the received global weights `received`."""

    def __init__(
        self,
        model: functional.FunctionalModel,
        received: list[tf.Tensor],
        personalization: client_plan.Personalization,
        extras: list[np.ndarray],
    ):
        self._model, self._received, self._personalization = model, received, personalization
        base = model.initial_weights
        self.initial_weights = functional.Parts(
            list(base.global_trainable) + extras, list(base.global_non_trainable), [], []
        )
        self.xla, self.stateful_slots = model.xla, model.stateful_slots
        self.vectorizes = getattr(model, 'vectorizes', True)
        self.pfor_loops = getattr(model, 'pfor_loops', False)

    def apply(self, weights: functional.Parts, x: Any, training: bool = True, *, example_mask: Any = None):
        mapped = self._personalization.predicts_with(list(weights.global_trainable), self._received)
        parts = functional.Parts(list(mapped), list(weights.global_non_trainable), [], [])
        return self._model.apply(parts, x, training, example_mask=example_mask)
