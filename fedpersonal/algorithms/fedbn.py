"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR 2021).

FedAvg in which every batch normalization layer stays on its client: its scale and offset (trained) and its moving
mean and variance (updated by the client's training steps) are the client's own, kept between rounds; the other
layers are trained with them and averaged by examples on the server (Algorithm 1 of the paper). Here the batch norm
layers are the model's local layers (`fedbn_model_fn` declares them), the process's CLIENTS-placed private state;
the client work is FedPer's plan (`fedpersonal.algorithms.fedper.fedper_plan`: both parts step together), run by
every backend (`fedpersonal.backends`; the engine carries each client's moving statistics through its steps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Unpack

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import fedper
from fedpersonal.core import process as process_lib


def batch_norm_layers(keras_model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """The model's batch normalization layers (nested ones included), in order."""
    return [layer for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.BatchNormalization)]


def local_batch_norm_layers(keras_model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """FedBN's local layers: the model's batch normalization layers.

    Raises:
      ValueError: The Keras model has no batch normalization layer (FedBN would be FedAvg).
    """
    local = batch_norm_layers(keras_model)
    if not local:
        raise ValueError(f'FedBN needs a model with BatchNormalization layers; {keras_model.name} has none.')
    return local


def fedbn_model_fn(
    keras_model_fn: Callable[[], tf.keras.Model], *, input_spec: Any
) -> Callable[[], tff.learning.models.ReconstructionModel]:
    """A model function whose batch normalization layers are local and whose other weights are global.

    Raises (when called):
      ValueError: The Keras model has no batch normalization layer (FedBN would be FedAvg).
    """

    return fedper.keras_model_fn(keras_model_fn, element_spec=input_spec, default_local=local_batch_norm_layers)


def build_fedbn(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel], **options: Unpack[fedper.Options]
) -> process_lib.PersonalizedProcess:
    """Builds FedBN on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with ``element_spec``; its batch normalization
        layers local unless ``local_layers`` names others) or a partially local model whose local layers are its
        batch normalization layers (`fedbn_model_fn`).
      **options: FedPer's (`fedpersonal.algorithms.fedper.Options`; ``loss_fn``, ``client_optimizer`` and
        ``server_optimizer`` required).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's batch normalization weights
      (trainable: scale and offset; non-trainable: moving mean and variance).
    """
    return fedper.build_with_plan(
        fedper.fedper_plan, model_fn, name='FedBN', default_local=local_batch_norm_layers, **options
    )
