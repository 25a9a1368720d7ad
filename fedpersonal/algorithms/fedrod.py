"""FedRoD (Chen and Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR
2022).

The model is a shared body with two heads on its features: a generic head, federated with the body, and a personal
head that never leaves its client. On every batch the body and the generic head step on the balanced softmax loss
(the cross-entropy of the generic logits plus the log of the client's label counts, which corrects for its label
skew), and the personal head steps on the ordinary cross-entropy of the generic logits (held fixed) plus its own,
on the body's features (held fixed); a client predicts with the sum of the two heads' logits. The server averages
the body and the generic head. As PFLlib's ``clientrod.py``: both steps from the batch's pre-step values, the same
learning rate, the personal head starting as a copy of the generic one, the label counts of the client's train data.

The client work is one phase of a `ClientPlan` on the loss `FedRodModel` defines (`fedpersonal.core.model_loss_plan`;
with `ClientPlan.counts_labels` each client counts its labels before it trains), run by every backend
(`fedpersonal.backends`). The private state is the personal head's weights and the label counts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import models
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib

SHARED, PERSONAL_HEAD = 'shared', 'personal_head'


def balanced_softmax_loss(labels: Any, logits: tf.Tensor, label_counts: tf.Tensor) -> tf.Tensor:
    """The mean cross-entropy of ``logits + log(label_counts)`` (Ren et al.'s balanced softmax; a class the client
    has no example of gets the logit -inf, as in PFLlib)."""
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    adjusted = logits + tf.math.log(label_counts)[tf.newaxis]
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=adjusted))


class FedRodModel:
    """A Keras classifier split into FedRoD's parts (a `fedpersonal.core.model_loss_plan.PhasedModel`).

    Args:
      keras_model: A Keras classifier (logits) whose last layer is the head (e.g. a ``Dense`` layer); the layers
        before it are the body.
      num_classes: The classes (the head's outputs).

    Attributes:
      prediction_model: The Keras model that predicts with both heads (the generic logits plus the personal ones).
      label_counts: The client's label counts (private, non-trainable; set before each round's training).
    """

    def __init__(self, keras_model: tf.keras.Model, num_classes: int):
        self.generic_head = keras_model.layers[-1]
        features = keras_model.layers[-2].output
        self.body = tf.keras.Model(keras_model.inputs, features, name='body')
        # PFLlib deep-copies the head: a layer of the same config (its seeded initializers give the same values).
        self.personal_head = type(self.generic_head).from_config({**self.generic_head.get_config(), 'name': 'personal'})
        logits = tf.keras.layers.Add()([self.generic_head(features), self.personal_head(features)])
        self.prediction_model = tf.keras.Model(keras_model.inputs, logits, name='fedrod')
        self.label_counts = tf.Variable(tf.zeros([num_classes]), trainable=False, name='label_counts')

    @property
    def global_trainable_variables(self) -> list[tf.Variable]:
        return list(self.body.trainable_variables) + list(self.generic_head.trainable_variables)

    @property
    def global_non_trainable_variables(self) -> list[tf.Variable]:
        return list(self.body.non_trainable_variables) + list(self.generic_head.non_trainable_variables)

    @property
    def local_trainable_variables(self) -> list[tf.Variable]:
        return list(self.personal_head.trainable_variables)

    @property
    def local_non_trainable_variables(self) -> list[tf.Variable]:
        return list(self.personal_head.non_trainable_variables) + [self.label_counts]

    def variables_of(self, group: str) -> list[tf.Variable]:
        """The trainable variables of `SHARED` (body and generic head) or `PERSONAL_HEAD`."""
        if group == SHARED:
            return self.global_trainable_variables
        if group == PERSONAL_HEAD:
            return self.local_trainable_variables
        raise ValueError(f'FedRoD has the variable groups {SHARED!r} and {PERSONAL_HEAD!r}, got {group!r}.')

    def phase_loss(self, loss: str, x: Any, y: Any, step: Any) -> tf.Tensor:
        """FedRoD's batch loss: the generic head's balanced softmax loss (its gradient reaches the body and the
        generic head only) plus the cross-entropy of both heads' logits (its gradient reaches the personal head
        only)."""
        del step
        if loss != 'fedrod':
            raise ValueError(f"FedRoD's model defines the loss 'fedrod', got {loss!r}.")
        features = self.body(x, training=True)
        generic = self.generic_head(features)
        personal = self.personal_head(tf.stop_gradient(features))
        labels = tf.reshape(tf.cast(y, tf.int32), [-1])
        own = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.stop_gradient(generic) + personal)
        return balanced_softmax_loss(labels, generic, self.label_counts) + tf.reduce_mean(own)

    def phase_statistic(self, statistic: str, x: Any, y: Any) -> tf.Tensor:
        """``'accuracy'``: the correct predictions of both heads on the batch (inference mode)."""
        if statistic != 'accuracy':
            raise ValueError(f"FedRoD's model defines the statistic 'accuracy', got {statistic!r}.")
        predicted = tf.argmax(self.prediction_model(x, training=False), axis=-1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(tf.equal(predicted, tf.reshape(tf.cast(y, tf.int32), [-1])), tf.float32))


def prediction_model_fn(
    model_fn: Callable[[], FedRodModel], element_spec: Any
) -> Callable[[], tff.learning.models.ReconstructionModel]:
    """The model a client predicts with, as a partially local model (body and generic head global, the personal
    head local), for `fedpersonal.evaluation.build_private_state_eval` with `prediction_state`."""

    def build() -> tff.learning.models.ReconstructionModel:
        model = model_fn()
        return models.from_keras_model(
            model.prediction_model,
            input_spec=collections.OrderedDict(x=element_spec['x'], y=element_spec['y']),
            global_variables=model.global_trainable_variables + model.global_non_trainable_variables,
            local_variables=model.local_trainable_variables + list(model.personal_head.non_trainable_variables),
        )

    return build


def prediction_state(private_state: Any) -> tff.learning.models.ModelWeights:
    """A client's private state as `prediction_model_fn`'s local weights (without its label counts)."""
    return tff.learning.models.ModelWeights(list(private_state.trainable), list(private_state.non_trainable)[:-1])


def fedrod_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedRoD's client work: body, generic head and personal head on `FedRodModel`'s loss, after counting labels."""
    phase = client_plan.Phase(
        (SHARED, PERSONAL_HEAD), client_epochs, client_optimizer, loss='fedrod', statistic='accuracy'
    )
    return client_plan.ClientPlan((phase,), counts_labels=True)


def build_fedrod(
    model_fn: Callable[[], FedRodModel],
    *,
    element_spec: Any,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
) -> process_lib.PersonalizedProcess:
    """Builds FedRoD on the context's backend.

    Args:
      model_fn: No-arg function returning a new `FedRodModel`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The local optimizer of every part (fresh state every round; PFLlib: SGD).
      server_optimizer: Applied to the averaged update of the body and the generic head.
      client_epochs: Local epochs per round.

    Returns:
      A stateful `PersonalizedProcess` whose private state is the personal head and the client's label counts.
      Its training metrics are ``fedrod_loss``, ``fedrod_accuracy`` (both heads' predictions after each step) and
      ``num_examples``.

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> keras_fn = lambda: tf.keras.Sequential(
    ...     [tf.keras.Input([4]), tf.keras.layers.Dense(5, 'relu'), tf.keras.layers.Dense(3)])
    >>> process = build_fedrod(lambda: FedRodModel(keras_fn(), 3), element_spec=spec,
    ...     client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
    ...     server_optimizer=tff.learning.optimizers.build_sgdm(1.0))
    >>> [w.shape for w in process.initial_private_state().trainable], process.initial_private_state().non_trainable
    ([(5, 3), (3,)], [array([0., 0., 0.], dtype=float32)])
    """
    return backends.build_process(
        fedrod_plan(client_epochs=client_epochs, client_optimizer=client_optimizer),
        model_fn,
        server_optimizer=server_optimizer,
        element_spec=element_spec,
        name='FedRoD',
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return fedrod_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


# The body and the generic head global, the personal head (a copy of the model's last layer) local.
BENCHMARK_ROWS = (
    registry.Row(
        'fedrod', 'FedRoD', _benchmark_plan, leaderboard=16, local_layers=registry.HEAD, phased_model=FedRodModel
    ),
)
