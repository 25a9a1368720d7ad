"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020).

The mirror image of FedPer: each client keeps its own representation layers (the model's local layers, e.g. the
convolutions and the first dense layer) and shares the top layers (its global layers, e.g. the classifier); every
round the sampled clients train both on their data, the shared layers' change is averaged on the server, the local
representation never leaves the client (the process's CLIENTS-placed private state). The client work is FedPer's
plan (`fedpersonal.algorithms.fedper.fedper_plan`: both parts step together); what differs is which layers the model
declares local, so this module only builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Unpack

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import registry
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib


def build_lg_fedavg(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel], **options: Unpack[fedper.Options]
) -> process_lib.PersonalizedProcess:
    """Builds LG-FedAvg on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with ``element_spec``; every layer with weights
        but the last local, unless ``local_layers`` names others) or a partially local model (local representation
        layers, global top).
      **options: FedPer's (`fedpersonal.algorithms.fedper.Options`; ``loss_fn``, ``client_optimizer`` and
        ``server_optimizer`` required).

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's representation layers.
    """
    return fedper.build_with_plan(
        fedper.fedper_plan, model_fn, name='LG-FedAvg', default_local=fedper.body_layers, **options
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    return fedper.fedper_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (registry.Row('lg_fedavg', 'LG-FedAvg', _benchmark_plan, leaderboard=7, local_layers=registry.BODY),)
