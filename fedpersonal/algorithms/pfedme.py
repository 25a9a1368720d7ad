"""pFedMe (T. Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020).

Each client's personalized model theta solves, approximately, the Moreau envelope's inner problem around its local
copy w of the global model:

    theta = argmin_theta f(theta; batch) + lam / 2 * ||theta - w||^2

by `inner_steps` (K) gradient steps of `personal_learning_rate` on every batch, then w moves toward it,
``w <- w - lr * lam * (w - theta)``; theta carries over from batch to batch and starts each round at the received
global model. The server averages w's change (the paper's beta: the server optimizer's learning rate, 1 = plain
averaging). As PFLlib's ``clientpFedMe.py``/``pFedMeOptimizer``: theta's steps include a weight decay ``mu * theta``
(``mu`` = 0.001 there). A client predicts with its last theta, its CLIENTS-placed private state, as the paper's
personalized model; PFLlib (d832e76) scores the global model instead: its ``personalized_params`` alias the model's
own parameters, which ``set_parameters`` overwrites with the global ones (``benchmarks/pfllib_crosscheck.py``).

The client work is one phase of a `ClientPlan` whose step kind is `fedpersonal.core.step_kinds.InnerProblem`, with
the plan's personal copy as theta, on every backend: the per-client one and the grouped engine
(`fedpersonal.simulation.step_kind_engine`) compute the step with the same function (`step_kinds.inner_problem`).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib
from fedpersonal.core import step_kinds


def pfedme_plan(
    *,
    lam: float,
    inner_steps: int,
    personal_learning_rate: float,
    learning_rate: float,
    client_epochs: int = 1,
    mu: float = 0.0,
) -> client_plan.ClientPlan:
    """pFedMe's client work: per batch, theta's K steps on the inner problem, then w's SGD step of `learning_rate`."""
    step = step_kinds.InnerProblem(inner_steps, personal_learning_rate, lam, mu)
    sgd = tff.learning.optimizers.build_sgdm(learning_rate)
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, sgd, step=step)
    return client_plan.ClientPlan((phase,), personal_copy=True)


def build_pfedme(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: object,
    lam: float = 15.0,
    inner_steps: int = 5,
    personal_learning_rate: float = 0.01,
    learning_rate: float = 0.005,
    client_epochs: int = 1,
    mu: float = 0.0,
    server_optimizer: tff.learning.optimizers.Optimizer,
) -> process_lib.PersonalizedProcess:
    """Builds pFedMe on the context's backend, for a Keras classifier (logits).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      lam: The proximal weight lambda (the paper: 15; PFLlib's default 1).
      inner_steps: K, theta's steps per batch.
      personal_learning_rate: theta's learning rate.
      learning_rate: w's learning rate (its step is ``lr * lam * (w - theta)``).
      client_epochs: Passes over the client's data per round.
      mu: theta's weight decay (PFLlib's pFedMeOptimizer: 0.001).
      server_optimizer: Applied to the averaged update (SGD of learning rate beta).

    Returns:
      A stateful `PersonalizedProcess` whose private state is theta.
    """
    plan = pfedme_plan(
        lam=lam,
        inner_steps=inner_steps,
        personal_learning_rate=personal_learning_rate,
        learning_rate=learning_rate,
        client_epochs=client_epochs,
        mu=mu,
    )
    return backends.build_classifier_process(
        plan, model_fn, element_spec=element_spec, server_optimizer=server_optimizer, name='pFedMe'
    )
