"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

The global model w is trained by FedAvg. Every sampled client k also trains its *personal* model v_k on

    h_k(v_k; w) = F_k(v_k) + lambda / 2 * ||v_k - w||^2

with w the global model it received this round (Algorithm 1 of the paper), for `personal_epochs` epochs:
v_k <- v_k - eta * (grad F_k(v_k) + lambda * (v_k - w)) with SGD (any TFF optimizer may be given). The
personal models never leave the clients: they are the process's `tff.CLIENTS`-placed private state, like
FURL's (`fedpersonal.algorithms.furl`), kept between rounds in a client state store.

The client work is a `fedpersonal.core.client_plan.ClientPlan`: the personal copy with a `ProximalPenalty`, then
the global model, run by every backend (`fedpersonal.backends`). Training metrics: ``personal_loss``,
``personal_accuracy`` (the personal phase) and ``global_loss``, ``global_accuracy`` (the global phase), each with
its ``*_num_examples``.

    next: (<state@SERVER, {data}@CLIENTS, {personal}@CLIENTS> -> <state@SERVER, metrics@SERVER, {personal}@CLIENTS>)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib


def global_steps(
    model: tf.keras.Model, dataset: tf.data.Dataset, epochs: int, optimizer: tff.learning.optimizers.Optimizer
):
    """Local training of a Keras classifier (logits) in place, at least one epoch (e.g. fine-tuning); returns
    (n, loss sum)."""

    def batch_loss(batch) -> client_work.BatchLoss:
        logits = model(batch['x'], training=True)
        labels = tf.cast(batch['y'], tf.int32)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return client_work.BatchLoss(loss, tf.shape(batch['y'])[0])

    result = client_work.optimizer_steps(
        list(model.trainable_variables),
        dataset,
        optimizer,
        batch_loss,
        epochs=max(epochs, 1),
        count_dtype=tf.float32,
    )
    return result.num_examples, result.loss_sum


def ditto_plan(
    *,
    lam: float,
    client_epochs: int,
    personal_epochs: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
) -> client_plan.ClientPlan:
    """Ditto's client work: the personal copy (proximal to the received model), then the global model."""
    global_phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer, metrics_prefix='global')
    phases: tuple[client_plan.Phase, ...] = (global_phase,)
    if personal_epochs > 0:
        penalty = client_plan.ProximalPenalty(client_plan.PERSONAL, lam)
        personal = client_plan.Phase((client_plan.PERSONAL,), personal_epochs, personal_optimizer, penalty, 'personal')
        phases = (personal, global_phase)
    return client_plan.ClientPlan(phases, personal_copy=True)


def build_ditto(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    lam: float = 0.1,
    client_epochs: int = 1,
    personal_epochs: int = 1,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.005),
    personal_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.005),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    simulation: str | None = None,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds Ditto as an iterative process with personal models as CLIENTS-placed private state.

    The defaults are the personalization benchmark's (`fedpersonal.tasks.pfl_benchmark_config`: PFLlib's SGD
    learning rate 0.005 for both models, lambda 0.1, one epoch each).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: `OrderedDict(x=..., y=[None] int)` of the client datasets.
      lam: Ditto's lambda (the proximal weight; 0 gives independent local models).
      client_epochs: Local epochs of the global model (FedAvg) per round.
      personal_epochs: Epochs of the personal model per round.
      client_optimizer: For the global model's local training (fresh state every round).
      personal_optimizer: For the personal model (fresh state every round; SGD as in the paper).
      server_optimizer: Applied to the averaged global update.
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context. Same results to float precision.
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
    plan = ditto_plan(
        lam=lam,
        client_epochs=client_epochs,
        personal_epochs=personal_epochs,
        client_optimizer=client_optimizer,
        personal_optimizer=personal_optimizer,
    )
    with backends.use(simulation or backends.current()):
        return backends.build_classifier_process(
            plan,
            model_fn,
            element_spec=element_spec,
            server_optimizer=server_optimizer,
            group_size=group_size,
            name='Ditto',
        )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """Ditto's options in the benchmark binary (`fedpersonal.registry`)."""

    lambda_: float = registry.option(0.1, "Ditto's lambda (PFLlib's --mu).", minimum=0.0)


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return ditto_plan(
        lam=options.lambda_,
        client_epochs=settings.client_epochs,
        personal_epochs=settings.personal_epochs,
        client_optimizer=settings.sgd(),
        personal_optimizer=settings.sgd(),
    )


BENCHMARK_ROWS = (registry.Row('ditto', 'Ditto', _benchmark_plan, leaderboard=3),)
