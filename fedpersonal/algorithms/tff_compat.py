"""`tff.learning.algorithms.build_fed_recon` / `build_fed_recon_eval` as fedpersonal: the same signatures and
return types, so that TFF 0.87 code runs with its import changed (docs/MIGRATING.md)::

    algorithms = tff.learning.algorithms                            # TFF
    from fedpersonal.algorithms import tff_compat as algorithms     # fedpersonal

* `build_fed_recon`: fedpersonal's FedRecon (`fedpersonal.algorithms.build_fed_recon`) on the per-client path,
  returned as the `tff.learning.templates.LearningProcess` it is composed of: ``next(state, client_datasets)``,
  `get_model_weights`, `set_model_weights`, TFF's metrics layout (``metrics['client_work']['train']``).
* `build_fed_recon_eval`: `fedpersonal.evaluation.build_fed_recon_eval`, TFF's evaluation `LearningProcess`.

Every TFF 0.87 argument of the two builders is taken (TFF's `None` defaults mean fedpersonal's defaults); the
intentional differences (the default split is fedpersonal's hash-based support/query split, `num_examples` is
always reported, ...) are listed in docs/MIGRATING.md. For speed, move to `fedpersonal.algorithms.build_fed_recon`
(the fast simulation engine, `process.run_round(state, client_datasets)`), which takes TFF's argument names too.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow_federated as tff

from fedpersonal.algorithms import dataset_split as dataset_split_lib
from fedpersonal.algorithms import fed_recon
from fedpersonal.evaluation.fed_recon_eval import build_fed_recon_eval

__all__ = ['build_fed_recon', 'build_fed_recon_eval']


def build_fed_recon(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    server_optimizer_fn: fed_recon.OptimizerArg | None = None,
    client_optimizer_fn: fed_recon.OptimizerArg | None = None,
    reconstruction_optimizer_fn: fed_recon.OptimizerArg | None = None,
    dataset_split_fn: fed_recon.SplitArg | None = None,
    client_weighting: object = None,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    model_aggregator_factory: fed_recon.AggregationFactory | None = None,
    metrics_aggregator: Callable[..., tff.Computation] | None = None,
    jointly_train_locals: bool = False,
    learn_local_init: bool = False,
) -> tff.learning.templates.LearningProcess:
    """FedRecon with `tff.learning.algorithms.build_fed_recon`'s signature and return type.

    Args:
      model_fn, loss_fn, metrics_fn, server_optimizer_fn, client_optimizer_fn, reconstruction_optimizer_fn,
        client_weighting, model_distributor, model_aggregator_factory, metrics_aggregator: As in TFF 0.87
        (`None`: TFF's defaults: SGD with learning rates 1.0 / 0.1 / 0.1, weighting by examples, broadcast,
        `MeanFactory`, `sum_then_finalize`). A `NumExamplesCounter` in `metrics_fn` is the `num_examples`
        fedpersonal always reports.
      dataset_split_fn: A TFF split function (used as it is) or a `fedpersonal.algorithms.ReconstructionSplit`;
        `None`: fedpersonal's default `ReconstructionSplit()` (hash-based disjoint halves), where TFF's default
        alternates batches (docs/MIGRATING.md).
      jointly_train_locals, learn_local_init: fedpersonal's options (`fedpersonal.algorithms.build_fed_recon`).

    Returns:
      A `tff.learning.templates.LearningProcess`.
    """
    process = fed_recon.build_fed_recon(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        server_optimizer_fn=server_optimizer_fn,
        client_optimizer_fn=client_optimizer_fn,
        reconstruction_optimizer_fn=reconstruction_optimizer_fn,
        dataset_split=dataset_split_fn if dataset_split_fn is not None else dataset_split_lib.ReconstructionSplit(),
        client_weighting=client_weighting,
        model_distributor=model_distributor,
        model_aggregator_factory=model_aggregator_factory,
        metrics_aggregator=metrics_aggregator,
        jointly_train_locals=jointly_train_locals,
        learn_local_init=learn_local_init,
        simulation='per_client',
    )
    return process.learning_process
