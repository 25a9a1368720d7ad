"""FedDVA: the federated dual variational autoencoder (Yan et al., "Personalization Disentanglement for FL").

Only the two encoders (z and c, with the c-encoder's embeddings) are federated: they are broadcast, trained on
each sampled client and averaged (FedAvg with a server optimizer, plain averaging by default). Each client's
decoder, classifier head and every batch-norm statistic are its *private state*: a `tff.CLIENTS`-placed input and
output of the round, kept between rounds in a `fedpersonal.client_state` store, never reaching a SERVER intrinsic
(as in `fedpersonal.algorithms.furl`).

A client round (fresh Adam for every phase of every round, as in the authors' code):

1. `decoder_epochs` epochs on the reconstruction loss, stepping only the decoder;
2. `z_epochs` epochs on reconstruction + KL(q(z|x) || N(0, I)), stepping only the z-encoder;
3. `c_epochs` epochs on reconstruction + the c regularizers, stepping only the c-encoder (and its embeddings);
4. optionally `head_epochs` epochs of the classifier head on [mu_z, mu_c] (a personalized head; the encoders step
   too when the model's ``head_tunes_encoders`` is set, and their change is part of the averaged update).

See `fedpersonal.models.feddva_models` for the losses. The process has FURL's signature:

    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> -> <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
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
from fedpersonal.models import feddva_models

ModelWeights: TypeAlias = tff.learning.models.ModelWeights
_METRIC_TERMS = ('decoder_loss', 'z_loss', 'c_loss', 'head_loss', 'head_accuracy')


def global_weights(model: feddva_models.DualVae) -> ModelWeights:
    """The federated (encoder) variables as `ModelWeights`."""
    return ModelWeights(trainable=model.global_trainable, non_trainable=[])


def private_weights(model: feddva_models.DualVae) -> ModelWeights:
    """The private variables (decoder, head; batch-norm statistics) as `ModelWeights`."""
    return ModelWeights(trainable=model.private_trainable, non_trainable=model.private_non_trainable)


def set_weights(model: feddva_models.DualVae, global_state: Any, private_state: Any) -> None:
    """Assigns federated and private weights (eagerly or in a `tf.function`)."""
    client_work.assign(model.global_trainable, global_state.trainable)
    client_work.assign(model.private_trainable, private_state.trainable)
    client_work.assign(model.private_non_trainable, private_state.non_trainable)


def run_phase(
    model: feddva_models.DualVae,
    phase: str,
    dataset: tf.data.Dataset,
    epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`epochs` passes of one phase with a freshly initialized optimizer on that phase's variables.

    Must run inside a `tf.function`. Returns (examples seen, summed batch loss x batch size, correct predictions;
    the last only for the head phase).
    """

    def batch_loss(batch) -> client_work.BatchLoss:
        return client_work.BatchLoss(model.phase_loss(phase, batch['x'], batch['y']), tf.shape(batch['x'])[0])

    def correct_after_step(batch) -> collections.OrderedDict:
        predicted = tf.argmax(model.classify(batch['x']), axis=-1, output_type=tf.int32)
        return collections.OrderedDict(
            correct=tf.reduce_sum(tf.cast(tf.equal(predicted, tf.cast(batch['y'], tf.int32)), tf.float32))
        )

    head = phase == 'head'
    result = client_work.optimizer_steps(
        model.variables_of(phase),
        dataset,
        optimizer,
        batch_loss,
        epochs=epochs,
        zero_stats=collections.OrderedDict(correct=0.0) if head else (),
        after_step=correct_after_step if head else None,
    )
    return result.num_examples, result.loss_sum, result.stats['correct'] if head else tf.constant(0.0)


def client_round(
    model: feddva_models.DualVae,
    dataset: tf.data.Dataset,
    *,
    decoder_epochs: int,
    z_epochs: int,
    c_epochs: int,
    head_epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
    head_optimizer: tff.learning.optimizers.Optimizer,
) -> collections.OrderedDict:
    """The three (four) phases of a client round on `model` in place; returns summed per-phase metrics."""
    metrics = collections.OrderedDict()
    num_examples = tf.constant(0.0)
    for phase, epochs in (('decoder', decoder_epochs), ('z', z_epochs), ('c', c_epochs), ('head', head_epochs)):
        count, total, correct = run_phase(
            model, phase, dataset, epochs, head_optimizer if phase == 'head' else optimizer
        )
        count = tf.cast(count, tf.float32)
        metrics[f'{phase}_loss'] = (total, count)
        if phase == 'head':
            metrics['head_accuracy'] = (correct, count)
        num_examples = tf.maximum(num_examples, count / float(max(epochs, 1)))
    metrics['num_examples'] = (num_examples, tf.constant(1.0))
    return metrics


def build_feddva(
    model_fn: Callable[[], feddva_models.DualVae],
    *,
    element_spec: Any,
    decoder_epochs: int = 1,
    z_epochs: int = 1,
    c_epochs: int = 1,
    head_epochs: int = 0,
    learning_rate: float = 1e-3,
    head_learning_rate: float = 1e-2,
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> process_lib.PersonalizedProcess:
    """Builds the FedDVA iterative process.

    Args:
      model_fn: No-arg function returning a new `DualVae` (its variables at their initializers).
      element_spec: The client datasets' element spec: `OrderedDict(x=[None, h, w, c] float32, y=[None] int32)`.
      decoder_epochs: Epochs of phase 1 per round.
      z_epochs: Epochs of phase 2 per round.
      c_epochs: Epochs of phase 3 per round.
      head_epochs: Epochs of the personalized classifier head per round (0: no head training).
      learning_rate: Adam learning rate of phases 1-3 (the paper: 1e-3); Adam is re-initialized every phase.
      head_learning_rate: Adam learning rate of the head phase (head, and encoders if the model tunes them).
      server_optimizer: Applied to the averaged encoder update (SGD 1.0: FedAvg).
      client_weighting: `NUM_EXAMPLES` or `UNIFORM`.

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess` (private state: decoder + head + batch-norm statistics).

    Example:

    >>> import collections
    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> from fedpersonal.models import feddva_models
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
    ...                                y=tf.TensorSpec([None], tf.int32))
    >>> process = algorithms.build_feddva(lambda: feddva_models.DualVae(feddva_models.SCALED), element_spec=spec)
    >>> process.stateful
    True
    """
    for name, value in (
        ('decoder_epochs', decoder_epochs),
        ('z_epochs', z_epochs),
        ('c_epochs', c_epochs),
        ('head_epochs', head_epochs),
    ):
        if value < 0:
            raise ValueError(f'{name} must be >= 0, got {value}')
    if client_weighting not in (tff.learning.ClientWeighting.NUM_EXAMPLES, tff.learning.ClientWeighting.UNIFORM):
        raise ValueError('client_weighting must be NUM_EXAMPLES or UNIFORM')

    @tff.tensorflow.computation
    def initial_global_weights():
        return global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_private_state():
        return private_weights(model_fn())

    weights_type = initial_global_weights.type_signature.result
    private_type = initial_private_state.type_signature.result
    dataset_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
    optimizer = tff.learning.optimizers.build_adam(learning_rate=learning_rate)
    head_optimizer = tff.learning.optimizers.build_adam(learning_rate=head_learning_rate)

    @tff.tensorflow.computation(weights_type, dataset_type, private_type)
    @tf.function
    def client_update(server_weights, dataset, private_state):
        with tf.init_scope():
            model = model_fn()
        set_weights(model, server_weights, private_state)
        metrics = client_round(
            model,
            dataset,
            decoder_epochs=decoder_epochs,
            z_epochs=z_epochs,
            c_epochs=c_epochs,
            head_epochs=head_epochs,
            optimizer=optimizer,
            head_optimizer=head_optimizer,
        )
        delta, has_non_finite = client_work.weights_delta(server_weights.trainable, model.global_trainable)
        num_examples = metrics['num_examples'][0]
        weight = client_work.client_weight(client_weighting, num_examples, (), has_non_finite)
        new_private = client_work.keep_previous_if_non_finite(has_non_finite, private_state, private_weights(model))
        sums = collections.OrderedDict((k, tf.stack(v)) for k, v in metrics.items())
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), sums, new_private

    return compose.compose_personalized_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(client_update.type_signature.result[1]),
    )
