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

PFLlib's variant (``system/flcore/clients/clientapfl.py``, the personalization benchmark's default;
`pfllib_plan`): on every batch w takes an SGD step on its own loss, v one on its own loss (not the mixture's),
and alpha ``alpha - lr * (<v' - w', alpha * g_v + (1 - alpha) * g_w> + 0.02 * alpha)`` clipped to [0, 1], with
v', w' after their steps and g_v, g_w their gradients before them (`PfllibStep`, a step kind carrying v and alpha
from round to round); after its epochs the client sets v to ``(1 - alpha) * w + alpha * v`` with its trained w, and
predicts with v (`pfllib_personal_model`).
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

PAPER, PFLLIB = 'paper', 'pfllib'  # The variants (module docstring).
VARIANTS = (PAPER, PFLLIB)


def mixture(initial_alpha: float) -> client_plan.Personalization:
    """APFL's personal model: the client keeps v and alpha (starting at `initial_alpha`), trains and predicts with
    ``a * v + (1 - a) * w`` (a = alpha clipped to [0, 1], w the global weights), and projects alpha onto [0, 1]
    after its phase.

    >>> import numpy as np
    >>> mix = mixture(0.5)
    >>> [float(t) for t in mix.predicts_with([np.float32(2.0), np.float32(0.75)], [np.float32(0.0)])]
    [1.5]
    >>> float(mix.finish([np.float32(2.0), np.float32(1.5)], [np.float32(0.0)])[-1])
    1.0
    """
    if not 0.0 <= initial_alpha <= 1.0:
        raise ValueError(f'APFL needs an initial alpha in [0, 1], got {initial_alpha}.')

    def extras(global_trainable: list[Any]) -> list[Any]:
        del global_trainable
        return [tf.constant(initial_alpha, tf.float32)]

    def predicts_with(kept: list[Any], received: list[Any]) -> list[Any]:
        *v, alpha = [tf.convert_to_tensor(t) for t in kept]
        received = [tf.convert_to_tensor(w) for w in received]

        # The gradient g at the mixture reaches v as ``a * g`` and alpha as ``sum <v - w, g>`` (zero where alpha is
        # clipped), the difference taken first: autodiff of the mixture would subtract two large sums instead.
        @tf.custom_gradient
        def mix(raw_alpha, *values):
            a = tf.clip_by_value(raw_alpha, 0.0, 1.0)
            inside = tf.cast(tf.logical_and(raw_alpha >= 0.0, raw_alpha <= 1.0), raw_alpha.dtype)

            def grad(*upstream):
                d_alpha = inside * tf.add_n([tf.reduce_sum((x - w) * g) for x, w, g in zip(values, received, upstream)])
                return [d_alpha] + [a * g for g in upstream]

            return [a * x + (1.0 - a) * w for x, w in zip(values, received)], grad

        return list(mix(alpha, *v))

    def finish(kept: list[Any], model: list[Any]) -> list[Any]:
        del model
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


@dataclasses.dataclass(frozen=True)
class PfllibStep:
    """PFLlib's APFL step (a `step_kinds.StepKind`, module docstring): w's direction is its gradient (the phase's
    optimizer: SGD of `learning_rate`), v (the carried copy, from the kept one) and alpha step as ``clientapfl.py``.
    """

    learning_rate: float
    alpha_decay: float = 0.02
    parts: int = dataclasses.field(default=1, init=False)
    output_part: int = dataclasses.field(default=0, init=False)
    carries_personal: bool = dataclasses.field(default=True, init=False)
    carried_start: str = dataclasses.field(default=step_kinds.KEPT, init=False)

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless the phase trains the global weights only (v is the personal copy)."""
        if trains != (client_plan.GLOBAL,):
            raise ValueError(f"PFLlib's APFL step trains the global weights only, got {trains!r}.")

    def direction(
        self,
        weights: step_kinds.Weights,
        carried: step_kinds.Weights,
        parts: Sequence[Any],
        derivatives: step_kinds.Derivatives,
    ) -> step_kinds.Step:
        """w's loss, output and gradient at the batch; v and alpha after their steps."""
        (batch,) = parts
        *v, alpha = carried
        lr = self.learning_rate
        loss, g_w, output = derivatives.gradient(weights, batch)
        _, g_v, _ = derivatives.gradient(v, batch)
        w_next = [w - lr * g for w, g in zip(weights, g_w)]
        v_next = [x - lr * g for x, g in zip(v, g_v)]
        mixed = [alpha * gv + (1.0 - alpha) * gw for gv, gw in zip(g_v, g_w)]
        grad_alpha = tf.add_n([tf.reduce_sum((x - w) * m) for x, w, m in zip(v_next, w_next, mixed)])
        alpha = tf.clip_by_value(alpha - lr * (grad_alpha + self.alpha_decay * alpha), 0.0, 1.0)
        return step_kinds.Step(loss, output, v_next + [alpha], list(g_w))


def pfllib_personal_model(initial_alpha: float) -> client_plan.Personalization:
    """PFLlib's APFL personal model: the client keeps v and alpha (from `initial_alpha`), sets v to ``(1 - alpha) *
    w + alpha * v`` with its trained w after its epochs, and predicts with v.

    >>> import numpy as np
    >>> model = pfllib_personal_model(1.0)
    >>> [float(t) for t in model.finish([np.float32(2.0), np.float32(0.25)], [np.float32(6.0)])]
    [5.0, 0.25]
    """
    if not 0.0 <= initial_alpha <= 1.0:
        raise ValueError(f'APFL needs an initial alpha in [0, 1], got {initial_alpha}.')

    def extras(global_trainable: list[Any]) -> list[Any]:
        del global_trainable
        return [tf.constant(initial_alpha, tf.float32)]

    def predicts_with(kept: list[Any], received: list[Any]) -> list[Any]:
        del received
        return list(kept[:-1])

    def finish(kept: list[Any], model: list[Any]) -> list[Any]:
        *v, alpha = kept
        return [(1.0 - alpha) * w + alpha * x for x, w in zip(v, model)] + [alpha]

    return client_plan.Personalization(extras, predicts_with, finish)


def pfllib_plan(*, client_epochs: int, learning_rate: float, initial_alpha: float) -> client_plan.ClientPlan:
    """PFLlib's APFL client work: one phase of `PfllibStep`s (w by SGD of `learning_rate`), then v's mixture."""
    sgd = tff.learning.optimizers.build_sgdm(learning_rate)
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, sgd, step=PfllibStep(learning_rate))
    return client_plan.ClientPlan((phase,), personal_copy=True, personalization=pfllib_personal_model(initial_alpha))


def build_apfl(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: Any,
    initial_alpha: float = 0.5,
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
      initial_alpha: Every client's mixing weight before its first round (default the benchmark's
        ``--apfl_alpha``).
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


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """APFL's options in the benchmark binary (`fedpersonal.registry`)."""

    alpha: float = registry.option(0.5, "APFL's initial mixing weight alpha.", minimum=0.0, maximum=1.0)
    variant: str = registry.option(
        'pfllib',
        "APFL's client work: 'pfllib' (PFLlib's clientapfl.py: on every batch a step of w, one of v on its own loss "
        'and one of alpha; then v set to its mixture with w, the model the client predicts with) or '
        "'paper' (v and alpha on the mixture's loss, then w: fedpersonal.algorithms.apfl).",
        choices=('pfllib', 'paper'),
    )


def _benchmark_plan(settings: registry.Settings, options: BenchmarkOptions) -> client_plan.ClientPlan:
    if options.variant == PFLLIB:
        return pfllib_plan(
            client_epochs=settings.client_epochs,
            learning_rate=settings.client_learning_rate,
            initial_alpha=options.alpha,
        )
    return apfl_plan(
        client_epochs=settings.client_epochs,
        personal_epochs=settings.personal_epochs,
        client_optimizer=settings.sgd(),
        personal_optimizer=settings.sgd(),
        initial_alpha=options.alpha,
    )


BENCHMARK_ROWS = (registry.Row('apfl', 'APFL', _benchmark_plan, leaderboard=4),)
