"""FedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021): attentive
message passing.

Each client keeps its own model w_i and uploads it after training; there is no global model. Before client i
trains, the server gives it its own cloud model, an attention-weighted combination of the models uploaded in the
previous round: ``u_i = sum_{j != i} xi_ij w_j + (1 - sum_{j != i} xi_ij) w_i`` with
``xi_ij = alpha * exp(-||w_i - w_j||^2 / sigma) / sigma`` (the derivative of the attention function
``1 - exp(-x / sigma)``), so similar clients weigh more. Client i then trains w_i on its data with the proximal term
``lamda / (2 alpha) ||w_i - u_i||^2``. Before any upload, ``u_i = w_i``.

As PFLlib (``serveramp.py``, ``clientamp.py``; defaults alphaK = lamda = sigma = 1), whose table is the last
round's uploads. PFLlib's proximal term reads the weights' ``.data`` (no gradient): its clients train on their
loss alone, and ``u_i`` changes only the loss they print. ``variant='pfllib'`` runs that (no proximal term in
training), ``'paper'`` (the default of `build_fedamp`) the paper's.

The math is one `fedpersonal.core.server_table.ServerTable`, `AttentionCentre`, defined here and called by every
backend: the server keeps the round's uploads as rows, each client computes its centre from them and its kept model,
``u_i = w_i + sum_j xi_ij (w_j - w_i)`` over the rows (its own row, if there, adds 0: it is w_i). The numbers are
the paper's server's, but every client receives the rows: TFF's server sends all clients one value, and the
simulation's ``next`` broadcasts the table. A deployment would compute ``u_i`` on the server (which holds each
client's last upload) so that no client sees another's model.
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
from fedpersonal.core import process as process_lib

PAPER, PFLLIB = 'paper', 'pfllib'


@dataclasses.dataclass(frozen=True)
class AttentionCentre:
    """FedAMP's centres (module docstring), a `fedpersonal.core.server_table.ServerTable`.

    Attributes:
      capacity: The most clients a round samples (the rows the server keeps).
      alpha: alpha_k (PFLlib's ``alphaK``).
      sigma: The attention function's scale sigma.
    """

    capacity: int
    alpha: float = 1.0
    sigma: float = 1.0

    def __post_init__(self):
        if not self.alpha > 0 or not self.sigma > 0:
            raise ValueError(f'AttentionCentre needs alpha > 0 and sigma > 0, got {self}.')

    def coefficients(self, rows: list[Any], filled: tf.Tensor, kept: list[Any]) -> tf.Tensor:
        """``xi_ij`` of each row j (0 for an empty one): ``alpha * exp(-||w_i - w_j||^2 / sigma) / sigma``."""
        squares = [
            tf.reduce_sum(tf.reshape(tf.square(r - k[tf.newaxis]), [tf.shape(r)[0], -1]), 1) for r, k in zip(rows, kept)
        ]
        return filled * self.alpha * tf.exp(-tf.add_n(squares) / self.sigma) / self.sigma

    def centre(self, rows: list[Any], filled: tf.Tensor, kept: list[Any]) -> list[Any]:
        """``u_i = w_i + sum_j xi_ij (w_j - w_i)``."""
        coefficients = self.coefficients(rows, filled, kept)
        return [k + tf.tensordot(coefficients, r - k[tf.newaxis], axes=1) for r, k in zip(rows, kept)]


def fedamp_plan(
    *,
    capacity: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    alpha: float = 1.0,
    sigma: float = 1.0,
    lamda: float = 1.0,
    variant: str = PAPER,
) -> client_plan.ClientPlan:
    """FedAMP's client work: the client's own model trained towards its centre (``'pfllib'``: on its loss alone)."""
    if variant not in (PAPER, PFLLIB) or lamda < 0:
        raise ValueError(f"FedAMP's variant must be 'paper' or 'pfllib' and lamda >= 0, got {variant!r}, {lamda}.")
    penalty = client_plan.ProximalPenalty(client_plan.GLOBAL, lamda / alpha) if variant == PAPER and lamda else None
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer, penalty=penalty)
    return client_plan.ClientPlan((phase,), personal_copy=True, table=AttentionCentre(capacity, alpha, sigma))


def build_fedamp(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    client_optimizer: tff.learning.optimizers.Optimizer,
    clients_per_round: int,
    client_epochs: int = 1,
    alpha: float = 1.0,
    sigma: float = 1.0,
    lamda: float = 1.0,
    variant: str = PAPER,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds FedAMP for a Keras classifier (logits; all its weights the clients' own) on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The clients' TFF optimizer (PFLlib's SGD).
      clients_per_round: The most clients a round samples: the rows of the server's table (`run_round` refuses a
        round of more clients; ``next`` called directly drops the extra uploads and counts them in
        ``metrics['table']['rows_dropped']``).
      client_epochs: Local epochs per round.
      alpha: alpha_k, the attention's scale and the proximal term's divisor.
      sigma: The attention function's sigma.
      lamda: The proximal term's weight lambda.
      variant: ``'paper'`` or ``'pfllib'`` (no proximal term in training; see the module docstring).
      group_size: Engine only: the most clients per compiled group.

    Returns:
      A stateful `PersonalizedProcess`: each client's private state is its model; the server's weights are the
      last round's uploads (`fedpersonal.core.server_table`).

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_fedamp(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...     element_spec=spec, client_optimizer=tff.learning.optimizers.build_sgdm(0.1), clients_per_round=5)
    >>> [w.shape for w in process.get_model_weights(process.initialize()).trainable]  # The rows.
    [(5, 4, 3), (5, 3)]
    >>> [w.shape for w in process.initial_private_state().trainable]  # The client's model.
    [(4, 3), (3,)]
    """
    plan = fedamp_plan(
        capacity=clients_per_round,
        client_optimizer=client_optimizer,
        client_epochs=client_epochs,
        alpha=alpha,
        sigma=sigma,
        lamda=lamda,
        variant=variant,
    )
    return backends.build_classifier_process(
        plan,
        model_fn,
        element_spec=element_spec,
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),  # Unused: the table replaces the mean.
        group_size=group_size,
        name='FedAMP',
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """FedAMP's options in the benchmark binary (`fedpersonal.registry`)."""

    alpha: float = registry.option(1.0, "FedAMP's alpha_k (PFLlib's --alphaK default 1).", above=0.0)
    sigma: float = registry.option(1.0, "FedAMP's attention scale sigma (PFLlib's --sigma default 1).", above=0.0)
    lamda: float = registry.option(1.0, "FedAMP's proximal weight lambda (PFLlib's --lamda default 1).", minimum=0.0)
    variant: str = registry.option(
        'pfllib',
        "FedAMP's client work: 'pfllib' (PFLlib's clientamp.py: its proximal term has no gradient, so clients train "
        "on their loss alone) or 'paper' (the proximal term towards the attention-weighted centre).",
        choices=('pfllib', 'paper'),
    )


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return fedamp_plan(
        capacity=settings.num_clients,
        client_optimizer=settings.sgd(),
        client_epochs=settings.client_epochs,
        alpha=options.alpha,
        sigma=options.sigma,
        lamda=options.lamda,
        variant=options.variant,
    )


BENCHMARK_ROWS = (registry.Row('fedamp', 'FedAMP', _benchmark_plan),)
