"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

The global model w is trained by FedAvg. Every sampled client k also trains its *personal* model v_k on

    h_k(v_k; w) = F_k(v_k) + lambda / 2 * ||v_k - w||^2

with w the global model it received this round (Algorithm 1 of the paper), for `personal_epochs` epochs:
v_k <- v_k - eta * (grad F_k(v_k) + lambda * (v_k - w)) with SGD (any TFF optimizer may be given). The
personal models never leave the clients: they are the process's `tff.CLIENTS`-placed private state, like
FURL's (`fedpersonal.algorithms.furl`), kept between rounds in a client state store. The personal update is
`fedpersonal.core.client_work.optimizer_steps` with the proximal term `client_work.proximal_term`.

    next: (<state@SERVER, {data}@CLIENTS, {personal}@CLIENTS> -> <state@SERVER, metrics@SERVER, {personal}@CLIENTS>)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing

ModelWeights: TypeAlias = tff.learning.models.ModelWeights
keras_weights = client_work.keras_weights


def cross_entropy_loss(model: tf.keras.Model) -> Callable[[Any], client_work.BatchLoss]:
    """The batch loss of a Keras classifier (logits): mean sparse cross-entropy, with the correct predictions."""

    def batch_loss(batch) -> client_work.BatchLoss:
        logits = model(batch['x'], training=True)
        labels = tf.cast(batch['y'], tf.int32)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
        return client_work.BatchLoss(loss, tf.shape(batch['y'])[0], collections.OrderedDict(correct=correct))

    return batch_loss


def personal_steps(
    personal: tf.keras.Model,
    global_values: list[tf.Tensor],
    dataset: tf.data.Dataset,
    epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
    lam: float,
):
    """Ditto's personal update in place on `personal` (inside a `tf.function`); returns (n, loss sum, correct)."""
    variables = list(personal.trainable_variables)
    result = client_work.optimizer_steps(
        variables,
        dataset,
        optimizer,
        cross_entropy_loss(personal),
        epochs=epochs,
        penalty=client_work.proximal_term(variables, global_values, lam),
        count_dtype=tf.float32,
        zero_stats=collections.OrderedDict(correct=0.0),
    )
    return result.num_examples, result.loss_sum, result.stats['correct']


def global_steps(
    model: tf.keras.Model, dataset: tf.data.Dataset, epochs: int, optimizer: tff.learning.optimizers.Optimizer
):
    """Local FedAvg training of the global model copy in place (at least one epoch); returns (n, loss sum)."""
    result = client_work.optimizer_steps(
        list(model.trainable_variables),
        dataset,
        optimizer,
        cross_entropy_loss(model),
        epochs=max(epochs, 1),
        count_dtype=tf.float32,
        zero_stats=collections.OrderedDict(correct=0.0),
    )
    return result.num_examples, result.loss_sum


def build_ditto(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    lam: float = 0.1,
    client_epochs: int = 1,
    personal_epochs: int = 1,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_adam(learning_rate=1e-3),
    personal_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.05),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    simulation: str = 'engine',
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds Ditto as an iterative process with personal models as CLIENTS-placed private state.

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: `OrderedDict(x=..., y=[None] int)` of the client datasets.
      lam: Ditto's lambda (the proximal weight; 0 gives independent local models).
      client_epochs: Local epochs of the global model (FedAvg) per round.
      personal_epochs: Epochs of the personal model per round.
      client_optimizer: For the global model's local training (fresh state every round).
      personal_optimizer: For the personal model (fresh state every round; SGD as in the paper).
      server_optimizer: Applied to the averaged global update.
      simulation: ``'engine'`` (default: groups of clients as one XLA-compiled program each, personal models
        stacked per group; `process.run_round`) or ``'per_client'``. Same results to float precision.
      group_size: Engine only: the most logical clients per group.

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess` whose private state is the personal model.

    Example:

    >>> import collections
    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = algorithms.build_ditto(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...                                  element_spec=spec, lam=0.1)
    >>> process.stateful, len(process.initial_private_state().trainable)
    (True, 2)
    """
    if lam < 0:
        raise ValueError(f'lam must be >= 0, got {lam}')
    if client_epochs < 1 or personal_epochs < 0:
        raise ValueError(f'client_epochs must be >= 1 and personal_epochs >= 0, got {client_epochs}, {personal_epochs}')

    @tff.tensorflow.computation
    def initial_weights():
        return client_work.keras_weights(model_fn())

    weights_type = initial_weights.type_signature.result
    dataset_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
    simulation_options.check_simulation(simulation)
    if simulation == 'engine':
        return _build_engine_process(
            model_fn,
            element_spec=element_spec,
            lam=lam,
            client_epochs=client_epochs,
            personal_epochs=personal_epochs,
            client_optimizer=client_optimizer,
            personal_optimizer=personal_optimizer,
            server_optimizer=server_optimizer,
            group_size=group_size,
            initial_weights=initial_weights,
        )

    @tff.tensorflow.computation(weights_type, dataset_type, weights_type)
    @tf.function
    def client_update(server_weights, dataset, personal_state):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            personal = client_work.construct(model_fn)
        client_work.assign_weights(client_work.keras_weights(model), server_weights)
        client_work.assign_weights(client_work.keras_weights(personal), personal_state)
        global_values = [tf.identity(w) for w in server_weights.trainable]
        p_count, p_total, p_correct = personal_steps(
            personal, global_values, dataset, personal_epochs, personal_optimizer, lam
        )
        count, total = global_steps(model, dataset, client_epochs, client_optimizer)
        delta, has_non_finite = client_work.weights_delta(server_weights.trainable, model.trainable_variables)
        num_examples = count / float(max(client_epochs, 1))
        weight = tf.where(tf.logical_or(has_non_finite > 0, tf.equal(num_examples, 0)), 0.0, num_examples)
        new_personal = client_work.snapshot(client_work.keras_weights(personal))
        sums = collections.OrderedDict(
            global_loss=tf.stack([total, count]),
            personal_loss=tf.stack([p_total, p_count]),
            personal_accuracy=tf.stack([p_correct, p_count]),
            num_examples=tf.stack([num_examples, 1.0]),
        )
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), sums, new_personal

    return compose.compose_personalized_process(
        initial_global_weights=initial_weights,
        initial_private_state=initial_weights,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(client_update.type_signature.result[1]),
    )


def _build_engine_process(
    model_fn,
    *,
    element_spec,
    lam,
    client_epochs,
    personal_epochs,
    client_optimizer,
    personal_optimizer,
    server_optimizer,
    group_size,
    initial_weights,
) -> process_lib.PersonalizedProcess:
    """Ditto on the fast simulation engine: both local trainings of a group of clients in lockstep."""
    for role, optimizer in (('client_optimizer', client_optimizer), ('personal_optimizer', personal_optimizer)):
        lockstep.check_optimizer(optimizer, role)
    model = functional.FunctionalModel(model_fn)
    initial = model.initial_weights
    slots = [(functional.GLOBAL_TRAINABLE, i) for i in range(len(initial.global_trainable))]
    packer = packing.ClientPacker(
        None,
        ('personal', 'global'),
        element_spec,
        group_size or simulation_options.default_group_size(list(initial.global_trainable) * 2),
        batch_phase_fn=lambda batches: (batches * personal_epochs, batches * max(client_epochs, 1)),
    )
    weights_type = initial_weights.type_signature.result
    group_private_type = packing.stacked_type(weights_type)
    proximal = lambda values, centre: (
        0.5 * lam * tf.add_n([tf.reduce_sum(tf.square(v - c)) for v, c in zip(values, centre)])
    )

    def build_group_work(*, now: bool):
        personal_accuracy = group_lib.built_once(tf.keras.metrics.SparseCategoricalAccuracy, now=now)

        @tf.function
        def group_work(server_weights, group, personal_states):
            accuracy = personal_accuracy()
            accuracy.reset_state()

            @tf.function(jit_compile=model.xla)
            def train(received, non_trainable, group, personal_trainable, personal_non_trainable):
                loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                personal = functional.Parts(personal_trainable, personal_non_trainable, [], [])
                personal, p_steps = lockstep.lockstep_steps(
                    model,
                    personal,
                    slots,
                    group['personal'],
                    personal_optimizer,
                    loss,
                    metrics=[accuracy],
                    penalty=proximal,
                    centre=received,
                )
                phase = group['global']
                one_epoch = tf.reduce_sum(phase['mask'], axis=[1, 2]) / float(max(client_epochs, 1))
                weight = tf.where(one_epoch > 0, one_epoch, 0.0)
                weights = functional.Parts(received, non_trainable, [], [])
                weights, steps = lockstep.lockstep_steps(
                    model, weights, slots, phase, client_optimizer, loss, delta_weights=weight
                )
                trained = list(weights.global_trainable)
                result, _ = group_lib.update_after_steps(received, trained, weight, steps)
                clients = tf.cast(tf.reduce_sum(tf.cast(phase['steps'] > 0, tf.float32)), tf.float32)
                sums = collections.OrderedDict(
                    global_loss=tf.stack([tf.reduce_sum(steps.loss_sum), tf.reduce_sum(steps.num_examples)]),
                    personal_loss=tf.stack([tf.reduce_sum(p_steps.loss_sum), tf.reduce_sum(p_steps.num_examples)]),
                    personal_accuracy=tf.stack([accuracy.total, tf.reduce_sum(p_steps.num_examples)]),
                    num_examples=tf.stack([tf.reduce_sum(one_epoch), clients]),  # The denominator is unused.
                )
                new_personal = ModelWeights(
                    trainable=list(personal.global_trainable), non_trainable=list(personal.global_non_trainable)
                )
                return result, sums, new_personal

            return train(
                list(server_weights.trainable),
                list(server_weights.non_trainable),
                group,
                list(personal_states.trainable),
                list(personal_states.non_trainable),
            )

        return group_work

    client_update = lambda: tff.tensorflow.computation(weights_type, packer.group_type(), group_private_type)(
        build_group_work(now=False)
    )
    runner = driver.GroupRoundRunner(build_group_work(now=True), server_optimizer, driver.finalize_ratios)
    return compose.compose_personalized_process(
        initial_global_weights=initial_weights,
        initial_private_state=initial_weights,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(),
        packer=packer,
        round_runner=runner,
        group_private_state_type=group_private_type,
    )
