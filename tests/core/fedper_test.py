"""A new partially local algorithm from the public templates alone: FedPer (shared body, local head per client).

`build_fedper` below is the whole algorithm (the proof of issue 13 that a method needs only its client work):
the body is aggregated by TFF's mean and applied by the server optimizer, the head is each client's private
state. The tests train it and check the head never reaches a SERVER-placed value.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import core
from fedpersonal import models
from fedpersonal.core import client_work
from fedpersonal.privacy import audit


# ---------------------------------------------------------------- FedPer, from the public templates (< 60 lines)
def build_fedper(model_fn, *, loss_fn, client_optimizer, server_optimizer, client_epochs=1):
    """FedPer: global (body) variables averaged with FedAvg, local (head) variables kept on each client."""
    with tf.Graph().as_default():
        element_type = tff.types.tensorflow_to_type(model_fn().input_spec)

    @tff.tensorflow.computation
    def initial_body():
        return client_work.global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_head():
        return client_work.local_weights(model_fn())

    finalizers = collections.OrderedDict()

    @tff.tensorflow.computation(
        initial_body.type_signature.result, tff.SequenceType(element_type), initial_head.type_signature.result
    )
    @tf.function
    def client_update(body, dataset, head):
        with tf.init_scope():
            model = model_fn()
            metrics = client_work.build_metrics(None, loss_fn, finalizers)
            trainable = list(model.global_trainable_variables) + list(model.local_trainable_variables)
            optimizer = client_work.prepare_optimizer(client_optimizer, trainable)
        client_work.assign_weights(client_work.global_weights(model), body)
        client_work.assign_weights(client_work.local_weights(model), head)
        steps = client_work.optimizer_steps(
            trainable, dataset, optimizer, client_work.model_batch_loss(model, loss_fn(), metrics), epochs=client_epochs
        )
        delta, non_finite = client_work.weights_delta(body.trainable, model.global_trainable_variables)
        unfinalized = client_work.read_metrics(metrics)
        weight = client_work.client_weight(
            tff.learning.ClientWeighting.NUM_EXAMPLES, steps.num_examples, unfinalized, non_finite
        )
        new_head = client_work.keep_previous_if_non_finite(non_finite, head, client_work.local_weights(model))
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), unfinalized, new_head

    return core.compose_personalized_process(
        initial_global_weights=initial_body,
        initial_private_state=initial_head,
        client_update=client_update,
        aggregate_metrics=core.keras_metrics(finalizers, tff.learning.metrics.sum_then_finalize),
        server_optimizer=server_optimizer,
    )


# -------------------------------------------------------------------------------------------------------------


NUM_CLIENTS, NUM_CLASSES, DIM = 4, 3, 6


def model_fn():
    inputs = tf.keras.Input(shape=[DIM])
    body = tf.keras.layers.Dense(16, activation='relu', kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    keras_model = tf.keras.Model(inputs, head(body(inputs)))
    spec = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))
    return models.from_keras_model(keras_model, input_spec=spec, global_layers=[body], local_layers=[head])


def client_datasets(seed=0):
    """Shared features -> class structure, but every client names the classes differently (a permutation)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=[NUM_CLASSES, DIM]) * 3
    datasets = []
    for client in range(NUM_CLIENTS):
        permutation = np.roll(np.arange(NUM_CLASSES), client)
        cls = rng.integers(0, NUM_CLASSES, 60)
        x = (centres[cls] + rng.normal(size=[60, DIM])).astype(np.float32)
        y = permutation[cls].astype(np.int32)
        datasets.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(10))
    return datasets


def build():
    return build_fedper(
        model_fn,
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
    )


def test_fedper_learns_personal_heads():
    process = build()
    assert process.stateful
    datasets = client_datasets()
    state = process.initialize()
    heads = [process.initial_private_state()] * NUM_CLIENTS
    losses = []
    for _ in range(25):
        output = process.next(state, datasets, heads)
        state, heads = output.state, list(output.private_states)
        losses.append(output.metrics['client_work']['train']['loss'])
    assert losses[-1] < 0.35 * losses[0], losses
    # Different clients ended with different heads (a shared head cannot fit the per-client label permutations).
    assert not np.allclose(heads[0].trainable[0], heads[1].trainable[0])
    # The server's weights are the body only.
    assert [np.shape(w) for w in process.get_model_weights(state).trainable] == [(DIM, 16), (16,)]


def test_fedper_head_never_reaches_the_server():
    process = build()
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    head_shapes = {(16, NUM_CLASSES), (NUM_CLASSES,)}
    server_shapes = audit.tensor_shapes(process.next.type_signature.result.state) | audit.tensor_shapes(
        process.next.type_signature.result.metrics
    )
    assert not head_shapes & server_shapes
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS
