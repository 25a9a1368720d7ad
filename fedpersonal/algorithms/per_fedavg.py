"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

The global model w is meta-learned so that one local gradient step personalizes it. Each local step takes a batch
of twice the batch size (three times, Hessian-free): a trial step ``w' = w - alpha * grad f(w; D)`` on its first
part, then ``w <- w - beta * grad f(w'; D')`` with the gradient of its second part at the trial weights (the
first-order variant, PFLlib's ``clientperavg.py``, beta = alpha = the learning rate there), or with that gradient
corrected by a Hessian-vector product on a third part, ``(I - alpha * H(w; D'')) grad f(w'; D')`` (the paper's
Hessian-free variant). The server averages w's change as FedAvg; a client predicts with w after one step of alpha on
one batch of its own data (`adapt`).

The client work is one phase of a `ClientPlan` with this module's step kind, `MetaStep`, on the client's data
rebatched to 2 (3) x `batch_size` (a `DataSplit`; a last batch too small to cut is dropped): every backend (the
per-client one and the grouped engine) calls its `MetaStep.direction` (`fedpersonal.core.step_kinds`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.algorithms import fedper
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib
from fedpersonal.core import step_kinds


@dataclasses.dataclass(frozen=True)
class MetaStep:
    """Per-FedAvg's step (a `step_kinds.StepKind`): a trial step of `inner_learning_rate` on a batch's first part,
    the gradient of its second part there; with `hessian_free`, less ``inner_learning_rate * H g``, H the Hessian
    of a third part's loss at the weights (a Hessian-vector product)."""

    inner_learning_rate: float
    hessian_free: bool = False
    output_part: int = dataclasses.field(default=1, init=False)
    carries_personal: bool = dataclasses.field(default=False, init=False)
    carried_start: str = dataclasses.field(default='received', init=False)

    def __post_init__(self):
        if not self.inner_learning_rate > 0:
            raise ValueError(f'MetaStep.inner_learning_rate must be > 0, got {self.inner_learning_rate!r}.')

    @property
    def parts(self) -> int:
        """How many consecutive parts a batch is cut into."""
        return 3 if self.hessian_free else 2

    def check(self, trains: tuple[str, ...]) -> None:
        """Raises ValueError unless a phase that trains `trains` can take this step."""
        if 'personal' in trains:
            raise ValueError(f'A MetaStep trains the model (global or local), not the personal copy, got {trains!r}.')

    def direction(
        self,
        weights: step_kinds.Weights,
        carried: step_kinds.Weights,
        parts: Sequence[Any],
        derivatives: step_kinds.Derivatives,
    ) -> step_kinds.Step:
        """The second part's loss and output at the trial weights ``weights - a * grad f(weights; part 0)``, and
        the direction: the gradient of that loss there (less ``a * H(weights; part 2)`` times it, Hessian-free)."""
        a = self.inner_learning_rate
        _, first, _ = derivatives.gradient(weights, parts[0])
        trial = [w - a * g for w, g in zip(weights, first)]
        loss, direction, output = derivatives.gradient(trial, parts[1])
        if self.hessian_free:
            if derivatives.hessian_vector is None:
                raise ValueError('The Hessian-free MetaStep needs Derivatives.hessian_vector.')
            product = derivatives.hessian_vector(weights, parts[2], [tf.stop_gradient(d) for d in direction])
            direction = [d - a * h for d, h in zip(direction, product)]
        return step_kinds.Step(loss, output, list(carried), list(direction))


def per_fedavg_plan(
    *,
    batch_size: int,
    inner_learning_rate: float,
    outer_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    hessian_free: bool = False,
) -> client_plan.ClientPlan:
    """Per-FedAvg's client work: meta steps on batches of `parts` x `batch_size` (the client's data is rebatched)."""
    step = MetaStep(inner_learning_rate, hessian_free)
    size = step.parts * batch_size

    def rebatch(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset]:
        batches = dataset.unbatch().batch(size)
        return (batches.filter(lambda b: tf.shape(tf.nest.flatten(b)[0])[0] >= step.parts),)

    def rebatch_arrays(batches: list[Any]) -> tuple[list[Any]]:  # The same, on batches in memory (the engine's).
        if not batches:
            return ([],)
        whole = tf.nest.map_structure(lambda *leaves: np.concatenate(leaves), *batches)
        n = len(tf.nest.flatten(whole)[0])
        cut = [tf.nest.map_structure(lambda a: a[s : s + size], whole) for s in range(0, n, size)]
        return ([b for b in cut if len(tf.nest.flatten(b)[0]) >= step.parts],)

    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, outer_optimizer, data='meta', step=step)
    return client_plan.ClientPlan((phase,), split=client_plan.DataSplit(('meta',), rebatch, rebatch_arrays))


def adapt(
    model_fn: Callable[[], tff.learning.models.ReconstructionModel],
    weights: tff.learning.models.ModelWeights,
    batch: Any,
    learning_rate: float,
    loss_fn: client_work.LossFn,
) -> tff.learning.models.ModelWeights:
    """The weights a client predicts with: the global `weights` after one SGD step of `learning_rate` on `batch`
    (eager; PFLlib's ``train_one_step`` before each evaluation)."""
    model = model_fn()
    client_work.assign_weights(client_work.global_weights(model), weights)
    variables = list(model.global_trainable_variables)
    with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
        loss = loss_fn()(output.labels, output.predictions)
    client_work.assign(variables, [v - learning_rate * g for v, g in zip(variables, tape.gradient(loss, variables))])
    return tff.learning.models.ModelWeights(
        [v.numpy() for v in variables], [v.numpy() for v in model.global_non_trainable_variables]
    )


def build_per_fedavg(
    model_fn: Callable[[], tf.keras.Model | tff.learning.models.ReconstructionModel],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None = None,
    batch_size: int,
    inner_learning_rate: float,
    outer_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    hessian_free: bool = False,
    element_spec: Any = None,
) -> process_lib.PersonalizedProcess:
    """Builds Per-FedAvg on the context's backend.

    Args:
      model_fn: No-arg function returning a new Keras classifier (with `element_spec`; every layer global) or a
        partially local model (`fedpersonal.models.from_keras_model`, all layers global).
      loss_fn: No-arg function returning the Keras loss.
      metrics_fn: Optional no-arg function returning Keras metrics (of the second parts at the trial weights).
      batch_size: The size of each part of a meta step's batch (PFLlib: the batch size).
      inner_learning_rate: alpha, the trial step's learning rate.
      outer_optimizer: The meta step's optimizer (PFLlib: SGD of beta = alpha).
      server_optimizer: Applied to the averaged update.
      client_epochs: Passes over the client's data per round.
      hessian_free: The Hessian-free variant (three parts per batch) instead of the first-order one.
      element_spec: The client datasets' element spec when `model_fn` returns a Keras classifier.

    Returns:
      A `PersonalizedProcess` (its private state is the model's local weights, none for an all-global model).
    """
    plan = per_fedavg_plan(
        batch_size=batch_size,
        inner_learning_rate=inner_learning_rate,
        outer_optimizer=outer_optimizer,
        client_epochs=client_epochs,
        hessian_free=hessian_free,
    )
    return backends.build_process(
        plan,
        fedper.partially_local(model_fn, element_spec, None, fedper.no_layers),
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        name='Per-FedAvg',
    )


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """Per-FedAvg's options in the benchmark binary (`fedpersonal.registry`)."""

    trains_per_round: int = registry.option(
        2,
        'Per-FedAvg (both variants): local passes of --client_epochs each per round (PFLlib: 2, its server calls '
        "a Per-FedAvg client's train() twice a round, serverperavg.py; its other methods once).",
        minimum=1,
    )


def _benchmark_plan(
    settings: registry.Settings, options: BenchmarkOptions, *, hessian_free: bool
) -> client_plan.ClientPlan:
    return per_fedavg_plan(
        batch_size=settings.batch_size,
        inner_learning_rate=settings.client_learning_rate,
        outer_optimizer=settings.sgd(),  # PFLlib: beta = the learning rate.
        client_epochs=settings.client_epochs * options.trains_per_round,
        hessian_free=hessian_free,
    )


# Evaluated after one SGD step on the client's first train batch (PFLlib's evaluate_one_step takes a random one).
BENCHMARK_ROWS = (
    registry.Row(
        'per_fedavg',
        'Per-FedAvg',
        functools.partial(_benchmark_plan, hessian_free=False),
        leaderboard=12,
        adapts=True,
    ),
    registry.Row(
        'per_fedavg_hf',
        'Per-FedAvg (HF)',
        functools.partial(_benchmark_plan, hessian_free=True),
        leaderboard=13,
        adapts=True,
    ),
)
