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

The client work is one phase of a `ClientPlan` whose step kind is this module's `InnerProblem`, with the plan's
personal copy as theta: every backend (the per-client one and the grouped engine) calls its
`InnerProblem.direction` (`fedpersonal.core.step_kinds`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib
from fedpersonal.core import step_kinds


@dataclasses.dataclass(frozen=True)
class InnerProblem:
    """pFedMe's step (a `step_kinds.StepKind`): `steps` steps of `learning_rate` on theta's inner problem
    ``f(theta) + lam / 2 * ||theta - w||^2 + mu / 2 * ||theta||^2`` around the local weights w, then w's direction
    ``lam * (w - theta)``; theta (the carried personal copy) goes on from batch to batch."""

    steps: int
    learning_rate: float
    lam: float
    mu: float = 0.0
    parts: int = dataclasses.field(default=1, init=False)
    output_part: int = dataclasses.field(default=0, init=False)
    carries_personal: bool = dataclasses.field(default=True, init=False)
    carried_start: str = dataclasses.field(default='received', init=False)

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 1 or not self.learning_rate > 0 or self.lam < 0:
            raise ValueError(f'InnerProblem needs steps >= 1, learning_rate > 0 and lam >= 0, got {self}.')

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless the phase trains the global weights only (theta is the personal copy)."""
        if trains != ('global',):
            raise ValueError(f"pFedMe's inner problem is a step of the global weights only, got {trains!r}.")

    def direction(
        self,
        weights: step_kinds.Weights,
        carried: step_kinds.Weights,
        parts: Sequence[Any],
        derivatives: step_kinds.Derivatives,
    ) -> step_kinds.Step:
        """theta's loss and model output before its steps (the metrics see its first predictions), theta after
        them, and w's direction."""
        (batch,) = parts

        def theta_step(values: step_kinds.Weights) -> tuple[list[tf.Tensor], tf.Tensor, Any]:
            loss, gradient, output = derivatives.gradient(values, batch)
            pull = [g + self.lam * (t - w) + self.mu * t for g, t, w in zip(gradient, values, weights)]
            return [t - self.learning_rate * d for t, d in zip(values, pull)], loss, output

        theta, loss, output = theta_step(carried)
        if self.steps <= _UNROLLED_STEPS:
            for _ in range(self.steps - 1):
                theta = theta_step(theta)[0]
        else:
            _, theta = tf.while_loop(
                lambda k, _: k < self.steps, lambda k, values: (k + 1, theta_step(values)[0]), (tf.constant(1), theta)
            )
        direction = [self.lam * (w - t) for w, t in zip(weights, theta)]
        return step_kinds.Step(loss, output, list(theta), direction)


PFLLIB_WEIGHT_DECAY = 0.001  # theta's weight decay in PFLlib's pFedMeOptimizer (the paper has none).

# Up to this many inner steps run unrolled (the engine ran them faster than a `tf.while_loop`, vectorized over
# clients); more steps loop, keeping the program small.
_UNROLLED_STEPS = 10


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
    step = InnerProblem(inner_steps, personal_learning_rate, lam, mu)
    sgd = tff.learning.optimizers.build_sgdm(learning_rate)
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, sgd, step=step)
    return client_plan.ClientPlan((phase,), personal_copy=True)


def build_pfedme(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: object,
    lam: float = 1.0,
    inner_steps: int = 5,
    personal_learning_rate: float = 0.01,
    learning_rate: float = 0.005,
    client_epochs: int = 1,
    mu: float = PFLLIB_WEIGHT_DECAY,
    server_optimizer: tff.learning.optimizers.Optimizer,
) -> process_lib.PersonalizedProcess:
    """Builds pFedMe on the context's backend, for a Keras classifier (logits).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      lam: The proximal weight lambda (the paper: 15; PFLlib's default 1). The defaults are the personalization
        benchmark's (`fedpersonal.tasks.pfl_benchmark_config`, PFLlib's).
      inner_steps: K, theta's steps per batch.
      personal_learning_rate: theta's learning rate.
      learning_rate: w's learning rate (its step is ``lr * lam * (w - theta)``).
      client_epochs: Passes over the client's data per round.
      mu: theta's weight decay (PFLlib's pFedMeOptimizer: 0.001; 0: the paper's).
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


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """pFedMe's options in the benchmark binary (`fedpersonal.registry`)."""

    lambda_: float = registry.option(1.0, "pFedMe's lambda (PFLlib's --lamda default; the paper: 15).", minimum=0.0)
    k: int = registry.option(5, "pFedMe's inner steps K per batch (PFLlib's default).", minimum=1)
    personal_learning_rate: float = registry.option(
        0.01, "pFedMe's theta learning rate (PFLlib's --p_learning_rate).", above=0.0
    )


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    return pfedme_plan(
        lam=options.lambda_,
        inner_steps=options.k,
        personal_learning_rate=options.personal_learning_rate,
        learning_rate=settings.client_learning_rate,
        client_epochs=settings.client_epochs,
        mu=PFLLIB_WEIGHT_DECAY,
    )


BENCHMARK_ROWS = (registry.Row('pfedme', 'pFedMe', _benchmark_plan, leaderboard=14),)
