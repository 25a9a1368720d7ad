"""FedAvg as FedRecon's special case: FedRecon's client plan without its reconstruction phase.

FedAvg is FedRecon with every variable global and the whole client dataset as the update set: with no local
variables there is nothing to reconstruct (`fed_recon.fed_recon_plan(reconstruct=False)`: the plan is the update
phase alone), and with ``allow_overlap`` the update phase makes one optimizer step per batch of the client's data
for ``epochs`` passes, from the broadcast weights; the weighted mean of the clients' deltas (weights: their example
counts) goes to the server optimizer. That is TFF's `tff.learning.algorithms.build_weighted_fed_avg` step for step
(tests/algorithms/fed_avg_test.py: equal server weights after several rounds), on every backend; on the engine
(the default, ~100x fewer seconds per round on MovieLens), which is what the converged paper baselines need.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import registry
from fedpersonal.algorithms import fed_recon
from fedpersonal.algorithms import fedprox
from fedpersonal.core import client_plan
from fedpersonal.core import process as process_lib
from fedpersonal.data import dataset_split
from fedpersonal.models import partially_local_model


def build_fed_avg(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    client_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    epochs: int = 1,
    steps_max: int | None = None,
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_aggregator: Any = None,
    simulation: str | None = None,
    group_size: int | None = None,
    measure_communication: bool = False,
) -> process_lib.PersonalizedProcess:
    """Builds weighted FedAvg for a model whose variables are all global.

    Args:
      model_fn: No-arg function returning a new `ReconstructionModel` with no local variables (e.g.
        `fedpersonal.models.from_keras_model(keras_model, input_spec=..., global_variables=<all of them>)`).
      loss_fn: No-arg function returning the Keras loss.
      metrics_fn: No-arg function returning Keras metrics (a `loss` and `num_examples` are added).
      client_optimizer: The clients' optimizer (fresh state every round, as in TFF).
      server_optimizer: Applied to the weighted mean of the clients' deltas.
      epochs: Passes over each client's dataset per round.
      steps_max: Optional cap on each client's steps per round (after epochs).
      client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (default) or `UNIFORM`.
      model_aggregator: Any `tff.aggregators` factory (default weighted `MeanFactory`).
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context.
        As in `build_fed_recon`.
      group_size: Engine only: the most logical clients per group.
      measure_communication: Engine only: report each client's download and upload as TFF's measured
        broadcast and aggregator would (`build_fed_recon`).

    Returns:
      A stateless `fedpersonal.core.PersonalizedProcess`.

    Raises:
      fedpersonal.models.ModelSpecError: the model has local variables (FedAvg would never train them).

    Example:

    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms, models
    >>> def model_fn():
    ...     keras_model = tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.Dense(1)])
    ...     spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))
    ...     return models.from_keras_model(keras_model, input_spec=spec, global_variables=keras_model.variables)
    >>> process = algorithms.build_fed_avg(model_fn, loss_fn=tf.keras.losses.MeanSquaredError)
    >>> process.stateful, process.simulation
    (False, 'engine')
    """
    with tf.Graph().as_default():
        probe = model_fn()
        if list(probe.local_trainable_variables) or list(probe.local_non_trainable_variables):
            raise partially_local_model.ModelSpecError(
                'build_fed_avg needs a model whose variables are all global; this one has local variables '
                f'({[v.name for v in probe.local_trainable_variables]}): use build_fed_recon for it.'
            )
    return fed_recon.build_fed_recon(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer=server_optimizer,
        client_optimizer=client_optimizer,
        dataset_split=dataset_split.ReconstructionSplit(
            allow_overlap=True, recon_epochs=1, post_recon_epochs=epochs, post_recon_steps_max=steps_max
        ),
        client_weighting=client_weighting,
        model_aggregator=model_aggregator,
        simulation=simulation,
        group_size=group_size,
        measure_communication=measure_communication,
    )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    """FedAvg in the benchmark: FedProx's plan with no proximal term (`fedprox.fedprox_plan`)."""
    return fedprox.fedprox_plan(mu=0.0, client_epochs=settings.client_epochs, client_optimizer=settings.sgd())


BENCHMARK_ROWS = (
    registry.Row('fedavg', 'FedAvg', _benchmark_plan, leaderboard=1),
    # Each client fine-tunes its whole model before evaluation (FedBABU's fine-tuning, `fedbabu.finetune_plan`).
    registry.Row('fedavg_ft', 'FedAvg+FT', _benchmark_plan, leaderboard=8, finetune=True),
)
