"""FedBABU (Oh et al., "FedBABU: Toward Enhanced Representation for Federated Image Classification", ICLR 2022).

The model is a body and a head. The head is randomly initialized once, the same on every client, and never updated
during federated training: every round each sampled client trains only the body on its data (the head frozen at its
initial values), and the server averages the bodies by examples (Algorithm 1 of the paper). Personalization happens
at evaluation: each client fine-tunes the trained model on its own training data for a few epochs before it
predicts; the paper's default fine-tunes the whole model (body and head; Section 4, "fine-tuning" of Algorithm 1).

Here the head is the model's local layers and the plan's local weights start from their initial values every round
(`ClientPlan.local_start='initial'`, seeded initializers: identical on every client): a stateless process whose one
phase trains only the global body, run by every backend (`fedpersonal.backends`). `finetune_plan` is the
evaluation-time fine-tuning (also FedAvg + fine-tuning's): a plan over a model whose weights are all the client's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Unpack

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import registry
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib


def fedbabu_plan(*, client_epochs: int, client_optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """FedBABU's client work: the body trained for `client_epochs` epochs, the head at its initial values."""
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer)
    return client_plan.ClientPlan((phase,), local_start=client_plan.INITIAL)


def finetune_plan(*, epochs: int, optimizer: tff.learning.optimizers.Optimizer) -> client_plan.ClientPlan:
    """Fine-tuning before evaluation: every weight trained for `epochs` epochs on the client's data. Run it over a
    model whose weights are all local (nothing global to upload), each client's private state its full model."""
    return client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL, client_plan.LOCAL), epochs, optimizer),))


def build_fedbabu(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel], **options: Unpack[fedper.Options]
) -> process_lib.PersonalizedProcess:
    """Builds FedBABU's federated training on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with ``element_spec``; its head, the last layer
        with weights, local unless ``local_layers`` names others) or a partially local model (global body, local
        head); its initializers seeded, so that every client's head starts the same.
      **options: FedPer's (`fedpersonal.algorithms.fedper.Options`; ``loss_fn``, ``client_optimizer`` (the
        body's) and ``server_optimizer`` required).

    Returns:
      A stateless `PersonalizedProcess` (nothing is kept on the clients; the head is the model's initial one).
    """
    return fedper.build_with_plan(fedbabu_plan, model_fn, name='FedBABU', **options)


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    # The head kept (not 'initial'): no phase trains it, so it is every client's initial one, as the evaluation reads.
    plan = fedbabu_plan(client_epochs=settings.client_epochs, client_optimizer=settings.sgd())
    return dataclasses.replace(plan, local_start=client_plan.KEPT)


BENCHMARK_ROWS = (
    registry.Row('fedbabu', 'FedBABU', _benchmark_plan, leaderboard=9, local_layers=registry.HEAD, finetune=True),
)
