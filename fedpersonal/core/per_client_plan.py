"""The per-client backend of a `fedpersonal.core.client_plan.ClientPlan`: the plan as one TF computation per client,
mapped over the clients by TFF (the process's ``next``, what the privacy audit reads).

`build_client_update` runs the plan's phases on a client's Keras variables (`client_work.optimizer_steps`);
`build_per_client_process` composes it with TFF's distributor, aggregator and server optimizer. The grouped engine
(`fedpersonal.simulation.plan_engine`) runs the same plan to float precision; `fedpersonal.backends` chooses.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_start
from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.core import reference_terms
from fedpersonal.core import server_table
from fedpersonal.core import shared_values
from fedpersonal.core import step_kinds
from fedpersonal.core.client_plan import GLOBAL
from fedpersonal.core.client_plan import LEARNED
from fedpersonal.core.client_plan import LOCAL
from fedpersonal.core.client_plan import PERSONAL
from fedpersonal.core.client_plan import ClientPlan
from fedpersonal.core.client_plan import Initial
from fedpersonal.core.client_plan import plan_initial_weights
from fedpersonal.core.client_plan import prefixed
from fedpersonal.models import partially_local_model

ModelWeights = tff.learning.models.ModelWeights


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
            begin = plan.global_start
            table = plan.table  # Its model is the one it trained last, as with a start.
            own_model = begin is not None or table is not None
            personal = client_work.construct(model_fn) if plan.personal and not own_model else None
            personalization = plan.personalization
            extras: list[tf.Variable] = []
            mapped_model = None
            if personalization is not None:  # The copy's extras; a phase training it runs at `predicts_with`.
                extras = [tf.Variable(e) for e in personalization.extras(list(model.global_trainable_variables))]
                if any(PERSONAL in p.trains for p in plan.phases):
                    mapped_model = client_work.construct(model_fn)
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
            trained = [t + extras if PERSONAL in phase.trains else t for t, phase in zip(trained, plan.phases)]
            optimizers = [client_work.prepare_optimizer(p.optimizer, v) for p, v in zip(plan.phases, trained)]
            # The client's kept values (SCAFFOLD's control variate, MOON's previous model), assigned from its
            # private state: initialized as zeros, not from the model's variables, whose initialization TFF may order
            # after theirs.
            kept_shared: list[tf.Variable] = []
            if plan.shared is not None or plan.reference is not None:
                kept_shared = [tf.Variable(tf.zeros(v.shape, v.dtype)) for v in model.global_trainable_variables]
            references = _reference_models(plan, model, model_fn)
            if begin is not None:  # The start's extras (e.g. FedALA's W and its count of aggregations).
                made = begin.extras(client_work.global_weights(model))
                extras_kept = ModelWeights(
                    [tf.Variable(v) for v in made.trainable], [tf.Variable(v) for v in made.non_trainable]
                )
        if table is None:
            client_work.assign_weights(client_work.global_weights(model), received)
            received_trainable = [tf.identity(w) for w in received.trainable[: len(parts[GLOBAL])]]
        else:  # Trains the model it kept, and its penalty is centred at its centre from the table.
            client_work.assign_weights(client_work.global_weights(model), private)
            kept = client_work.global_weights(model)
            centre = table.centre(list(received.trainable), received.non_trainable[0], list(private.trainable))
            received_trainable = [tf.identity(c) for c in centre]
        if begin is not None:
            kept_model, kept_extras = client_start.split_private(
                private, len(parts[GLOBAL]), len(model.global_non_trainable_variables)
            )
            started = begin.start(
                list(received.trainable), kept_model, kept_extras, _examples(dataset), _gradient(model, loss_fn())
            )
            client_work.assign([parts[GLOBAL][i] for i in begin.changes(len(parts[GLOBAL]))], started.changed)
            client_work.assign(model.global_non_trainable_variables, started.non_trainable)
            client_work.assign(extras_kept.trainable, started.extras.trainable)
            client_work.assign(extras_kept.non_trainable, started.extras.non_trainable)
            own = client_work.global_weights(model)  # Kept after training: the model the client trained last.
            kept = ModelWeights(
                list(own.trainable) + list(extras_kept.trainable),
                list(own.non_trainable) + list(extras_kept.non_trainable),
            )
        elif personal is not None and personalization is not None:
            kept_values = personal.global_trainable_variables
            client_work.assign(kept_values, private.trainable[: len(kept_values)])
            client_work.assign(extras, private.trainable[len(kept_values) :])
            client_work.assign(personal.global_non_trainable_variables, private.non_trainable)
            if mapped_model is not None:  # Its own statistics (e.g. batch norm's) are the personal copy's.
                client_work.assign(mapped_model.global_non_trainable_variables, private.non_trainable)
            own = client_work.global_weights(personal)
            kept = ModelWeights(list(own.trainable) + extras, own.non_trainable)
        elif personal is not None:
            client_work.assign_weights(client_work.global_weights(personal), private)
            kept = client_work.global_weights(personal)
        elif plan.stateful and table is None:
            client_work.assign_weights(client_work.local_weights(model), private)
            kept = client_work.local_weights(model)
            if kept_shared:  # Its kept values follow the local trainable weights.
                client_work.assign(kept_shared, private.trainable[len(parts[LOCAL]) :])
                kept = ModelWeights(list(kept.trainable) + kept_shared, kept.non_trainable)
        elif plan.local_start == LEARNED:  # The default follows the global weights; 'initial': as the model made them.
            client_work.assign(parts[LOCAL], received.trainable[len(parts[GLOBAL]) :])
        uploaded = parts[GLOBAL] + (parts[LOCAL] if plan.local_start == LEARNED else [])
        split, split_names = (plan.split.dataset_fn(dataset), plan.split.names) if plan.split is not None else ((), ())
        shared: list[Any] = []
        offsets: list[Any] = []
        shared_upload: list[Any] = []
        if plan.shared is not None:  # The server's values follow the global weights; the offsets are constants.
            shared = list(received.trainable[len(parts[GLOBAL]) :])
            offsets = [tf.identity(o) for o in plan.shared.offset(shared, [v.read_value() for v in kept_shared])]
        term = None
        if references:  # The representations at the received and the kept weights are constants.
            client_work.assign(references[0].global_trainable_variables, received_trainable)
            client_work.assign(references[1].global_trainable_variables, [v.read_value() for v in kept_shared])
            term = _reference_term(plan, model, references)
        num_examples = tf.constant(0)
        previous: list[tf.Tensor] = []
        for i, (phase, variables, optimizer) in enumerate(zip(plan.phases, trained, optimizers)):
            stepped = personal if PERSONAL in phase.trains else model
            phase_metrics = metrics[phase.metrics_prefix] if phase.reports_metrics else []
            personalized = personalization is not None and PERSONAL in phase.trains
            carries = phase.step is not None and phase.step.carries_personal
            if personalized:
                assert mapped_model is not None and personalization is not None
                batch_loss = _personalized_batch_loss(
                    mapped_model, variables, personalization.predicts_with, received_trainable, loss_fn(), phase_metrics
                )
            elif phase.step is not None:
                batch_loss = step_kinds.step_batch_loss(
                    phase, model, variables, personal or scratch, loss_fn(), phase_metrics, extras=extras
                )
            else:
                batch_loss = client_work.model_batch_loss(stepped, loss_fn(), phase_metrics)
            data = dataset if phase.data is None else split[split_names.index(phase.data)]
            penalty = None
            if phase.penalty is not None:
                by_part = {part: parts[part] for part in phase.trains}
                penalty = functools.partial(phase.penalty, by_part, received_trainable)
            if offsets and i == plan.global_phase:
                penalty = functools.partial(shared_values.linear_term, parts[GLOBAL], offsets)
            # In order: phases that train disjoint variables have no automatic control dependency, and the order in
            # which they open the dataset decides which shuffle each sees (a reshuffling dataset's k-th iteration).
            with tf.control_dependencies(previous):
                steps = client_work.optimizer_steps(
                    variables,
                    data,
                    optimizer,
                    batch_loss,
                    epochs=phase.epochs,
                    penalty=penalty,
                    batch_term=term if i == plan.global_phase else None,
                )
            previous = [steps.num_examples, steps.loss_sum]
            if i == plan.global_phase:
                num_examples = steps.num_examples
                if plan.shared is not None:  # The uploaded shared values and the new kept ones.
                    assert steps.num_steps is not None
                    shared_upload, new_kept = plan.shared.finish(
                        received_trainable,
                        [v.read_value() for v in parts[GLOBAL]],
                        shared,
                        [v.read_value() for v in kept_shared],
                        steps.num_steps,
                    )
                    client_work.assign(kept_shared, new_kept)
                if plan.reference is not None:  # The new kept weights.
                    trained_now = [v.read_value() for v in parts[GLOBAL]]
                    kept_now = [v.read_value() for v in kept_shared]
                    with tf.control_dependencies(trained_now + kept_now):
                        client_work.assign(kept_shared, plan.reference.finish(trained_now, kept_now))
            if personalization is not None and (personalized or carries):  # Its kept values, once the phase ends.
                kept_values = parts[PERSONAL] + extras
                client_work.assign(
                    kept_values,
                    personalization.finish(
                        [v.read_value() for v in kept_values], [w.read_value() for w in parts[GLOBAL]]
                    ),
                )
        unfinalized: collections.OrderedDict = collections.OrderedDict()
        for prefix, metric_set in metrics.items():
            unfinalized.update(prefixed(prefix, client_work.read_metrics(metric_set)))
        result: Any
        if table is not None:  # Its trained model, one row, unless not finite or trained on nothing.
            _, non_finite = client_work.weights_delta(private.trainable, uploaded)
            rows = [v.read_value()[tf.newaxis] for v in uploaded]
            valid = tf.logical_and(tf.equal(non_finite, 0), tf.greater(num_examples, 0))
            result = server_table.Rows(rows, tf.cast(valid, tf.float32)[tf.newaxis])
        else:
            delta, non_finite = client_work.weights_delta(received.trainable, uploaded + list(shared_upload))
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


def _reference_models(plan: ClientPlan, model: Any, model_fn: Callable[[], Any]) -> tuple[Any, ...]:
    """With a `ClientPlan.reference`, two more models (at the received and at the kept weights); call in
    `tf.init_scope`. The model's weights must all be global and trainable: the representations run at weight lists."""
    if plan.reference is None:
        return ()
    others = [
        model.global_non_trainable_variables,
        model.local_trainable_variables,
        model.local_non_trainable_variables,
    ]
    if any(others) or partially_local_model.keras_model_of(model) is None:
        raise ValueError(
            'ClientPlan.reference needs a Keras model whose weights are all global and trainable, got '
            f'{[len(v) for v in others]} global non-trainable, local trainable and local non-trainable weights.'
        )
    return client_work.construct(model_fn), client_work.construct(model_fn)


def _reference_term(plan: ClientPlan, model: Any, references: tuple[Any, ...]) -> Callable[[Any], tf.Tensor]:
    """The plan's `ReferenceTerm` of a batch: the mean over its examples of ``per_example`` of its representations
    by `model` (its variables, trained) and by the two `references` (the received and the kept weights)."""
    reference = plan.reference
    assert reference is not None
    keras = [partially_local_model.keras_model_of(m) for m in (model, *references)]

    def term(batch: Any) -> tf.Tensor:
        x, _ = partially_local_model.split_batch(batch)
        features, received, kept = [reference.represent(k, x) for k in keras]
        return reference_terms.batch_mean(
            reference.per_example(features, tf.stop_gradient(received), tf.stop_gradient(kept))
        )

    return term


def _personalized_batch_loss(
    model: tff.learning.models.ReconstructionModel,
    kept: list[tf.Variable],
    predicts_with: Callable[[list[Any], list[Any]], list[Any]],
    received: list[tf.Tensor],
    loss: tf.keras.losses.Loss,
    metrics: list[tf.keras.metrics.Metric],
) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of `model` at ``predicts_with(kept, received)`` as a function of the `kept` values (a
    `client_plan.Personalization`): the mapped weights are assigned to `model`, and its gradient g there reaches
    the kept values through `predicts_with`'s own gradient (e.g. APFL's ``a * g`` for v, ``sum <v - w, g>`` for
    alpha)."""
    variables = list(model.global_trainable_variables)

    def batch_loss(batch: Any) -> client_work.BatchLoss:
        @tf.custom_gradient
        def loss_at(*values):
            with tf.GradientTape() as map_tape:
                map_tape.watch(values)
                mapped = predicts_with(list(values), received)
            client_work.assign(variables, mapped)
            with tf.GradientTape() as tape:
                output = model.forward_pass(batch, training=True)
                value = loss(output.labels, output.predictions)
            g = tape.gradient(value, variables)
            for metric in metrics:
                metric.update_state(output.labels, output.predictions)
            kept_gradients = map_tape.gradient(
                mapped, list(values), output_gradients=g, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )

            def grad(upstream, variables=None):
                return [upstream * k for k in kept_gradients], [None] * len(variables or [])

            return value, grad

        value = loss_at(*[v.read_value() for v in kept])
        _, labels = partially_local_model.split_batch(batch)
        return client_work.BatchLoss(value, tf.shape(labels)[0])

    return batch_loss


def _examples(dataset: tf.data.Dataset) -> client_start.Examples:
    """The client's examples as one batch (every one real), for a `client_start.ClientStart`."""
    empty = tf.nest.map_structure(lambda s: tf.zeros([0] + s.shape[1:].as_list(), s.dtype), dataset.element_spec)
    whole = dataset.unbatch().batch(2**31 - 1).reduce(empty, lambda _, batch: batch)
    return client_start.Examples(whole, tf.ones([tf.shape(tf.nest.flatten(whole)[0])[0]], tf.float32))


def _gradient(model: tff.learning.models.ReconstructionModel, loss: tf.keras.losses.Loss) -> client_start.GradientFn:
    """A `client_start.GradientFn` of the model's global variables: the weights are assigned to them, the batch
    cut to its real examples (a prefix), and the loss is the model's batch loss (plus its regularization)."""
    batch_loss = client_work.model_batch_loss(model, loss)
    trainable, non_trainable = list(model.global_trainable_variables), list(model.global_non_trainable_variables)

    def gradient(weights, statistics, batch, mask, wrt):
        client_work.assign(trainable, weights)
        client_work.assign(non_trainable, statistics)
        real = tf.cast(tf.reduce_sum(mask), tf.int32)
        with tf.GradientTape() as tape:
            value = batch_loss(tf.nest.map_structure(lambda t: t[:real], batch)).loss
        gradients = tape.gradient(value, [trainable[i] for i in wrt])
        return value, list(gradients), [v.read_value() for v in non_trainable]

    return gradient


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
    client_update = build_client_update(
        plan, model_fn, loss_fn, metrics_fn, finalizers, client_weighting, initial=initial
    )
    step = None
    if plan.table is not None:  # The rows replace the table: no aggregator, no server optimizer.
        if model_aggregator is not None:
            raise ValueError('ClientPlan.table keeps the uploads as rows: it takes no model_aggregator.')
        step = server_table.server_step(initial.global_weights.type_signature.result)
    return compose.compose_personalized_process(
        initial_global_weights=initial.global_weights,
        initial_private_state=initial.local_weights,
        client_update=client_update,
        aggregate_metrics=compose.keras_metrics(finalizers, metrics_aggregator),
        server_optimizer=server_optimizer,
        model_aggregator=compose.weighted_aggregator(model_aggregator, client_weighting),
        model_distributor=model_distributor,
        server_step=step,
    )
