"""APFL (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", 2020).

Every client keeps a personal model v and a mixing weight alpha in [0, 1]; its personalized model is the mixture
``alpha * v + (1 - alpha) * w`` with the global model w. Each round a sampled client trains v and alpha on the
loss of the mixture (the gradient reaches v scaled by alpha, and alpha through ``<v - w, g>``, as in the paper's
adaptive-alpha update), then trains its copy of w by FedAvg; w's change is averaged on the server, v and alpha
never leave the client (its CLIENTS-placed private state: v's weights with alpha appended).

Where this differs from the paper's Algorithm 1: there, w and v step in the same local iterations and the mixture
uses the local iterate w_t; here the personal phase comes first and mixes with the received w (the model the client
is evaluated with), then w trains. alpha is projected onto [0, 1] at the end of the personal phase (the mixture
clips it in between). The mixture is this module's `mixture`, a `client_plan.Personalization` that every backend
(`fedpersonal.backends`) runs in one `ClientPlan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib


def mixture(initial_alpha: float) -> client_plan.Personalization:
    """APFL's personal model: the client keeps v and alpha (starting at `initial_alpha`), trains and predicts with
    ``a * v + (1 - a) * w`` (a = alpha clipped to [0, 1], w the global weights), and projects alpha onto [0, 1]
    after its phase.

    >>> import numpy as np
    >>> mix = mixture(0.5)
    >>> [float(t) for t in mix.predicts_with([np.float32(2.0), np.float32(0.75)], [np.float32(0.0)])]
    [1.5]
    >>> float(mix.finish([np.float32(2.0), np.float32(1.5)])[-1])
    1.0
    """
    if not 0.0 <= initial_alpha <= 1.0:
        raise ValueError(f'APFL needs an initial alpha in [0, 1], got {initial_alpha}.')

    def extras(global_trainable: list[Any]) -> list[Any]:
        del global_trainable
        return [tf.constant(initial_alpha, tf.float32)]

    def predicts_with(kept: list[Any], received: list[Any]) -> list[Any]:
        *v, alpha = kept
        a = tf.clip_by_value(alpha, 0.0, 1.0)
        return [a * vi + (1.0 - a) * wi for vi, wi in zip(v, received)]

    def finish(kept: list[Any]) -> list[Any]:
        return list(kept[:-1]) + [tf.clip_by_value(kept[-1], 0.0, 1.0)]

    return client_plan.Personalization(extras, predicts_with, finish)


def apfl_plan(
    *,
    client_epochs: int,
    personal_epochs: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
    initial_alpha: float,
) -> client_plan.ClientPlan:
    """APFL's client work: v and alpha on the mixture's loss, then the global model."""
    personal = client_plan.Phase(
        (client_plan.PERSONAL,), personal_epochs, personal_optimizer, metrics_prefix='personal'
    )
    global_phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer, metrics_prefix='global')
    return client_plan.ClientPlan((personal, global_phase), personal_copy=True, personalization=mixture(initial_alpha))


def build_apfl(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    initial_alpha: float = 0.25,
    client_epochs: int = 1,
    personal_epochs: int = 1,
    client_optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
) -> process_lib.PersonalizedProcess:
    """Builds APFL on the context's backend, for a Keras classifier (logits).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      initial_alpha: Every client's mixing weight before its first round.
      client_epochs: Local epochs of the global model per round.
      personal_epochs: Epochs of the personal model and alpha per round.
      client_optimizer: The global model's local optimizer (fresh state every round).
      personal_optimizer: The optimizer of v and alpha (fresh state every round; alpha shares its learning rate).
      server_optimizer: Applied to the averaged global update.

    Returns:
      A stateful `PersonalizedProcess` whose private state is v's weights with alpha appended to the trainable ones.
    """
    plan = apfl_plan(
        client_epochs=client_epochs,
        personal_epochs=personal_epochs,
        client_optimizer=client_optimizer,
        personal_optimizer=personal_optimizer,
        initial_alpha=initial_alpha,
    )
    return backends.build_classifier_process(
        plan,
        model_fn,
        element_spec=element_spec,
        server_optimizer=server_optimizer,
        name='APFL',
    )
