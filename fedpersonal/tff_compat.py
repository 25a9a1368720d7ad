"""`tff.learning.algorithms.build_fed_recon` / `build_fed_recon_eval` as fedpersonal: the same signatures and
return types, so that TFF 0.87 code runs with its import changed (docs/MIGRATING.md)::

    algorithms = tff.learning.algorithms                            # TFF
    from fedpersonal import tff_compat as algorithms                # fedpersonal

* `build_fed_recon`: fedpersonal's FedRecon (`fedpersonal.algorithms.build_fed_recon`) on the per-client path,
  returned as the `tff.learning.templates.LearningProcess` it is composed of: ``next(state, client_datasets)``,
  `get_model_weights`, `set_model_weights`, TFF's metrics layout (``metrics['client_work']['train']``).
* `build_fed_recon_eval`: `fedpersonal.evaluation.build_fed_recon_eval`, TFF's evaluation `LearningProcess`.

Both report the metrics TFF reports: `metrics_fn`'s and ``loss``, and ``num_examples`` only when `metrics_fn` has a
`tff.learning.metrics.NumExamplesCounter` (fedpersonal's own builders always report it).

Every TFF 0.87 argument of the two builders is taken (TFF's `None` defaults mean fedpersonal's defaults); the
intentional differences (the default split is fedpersonal's hash-based support/query split, ...) are listed in
docs/MIGRATING.md. For speed, move to `fedpersonal.algorithms.build_fed_recon`
(the fast simulation engine, `process.run_round(state, client_datasets)`), which takes TFF's argument names too.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import fed_recon
from fedpersonal.data import dataset_split as dataset_split_lib
from fedpersonal.evaluation import fed_recon_eval

__all__ = ['build_fed_recon', 'build_fed_recon_eval']


def _asks_for_num_examples(metrics_fn: fed_recon.MetricsFn | None) -> bool:
    """Whether the user's metrics include TFF's `NumExamplesCounter` (TFF then reports ``num_examples``)."""
    if metrics_fn is None:
        return False
    with tf.Graph().as_default():  # Keras metrics create variables: in a graph of their own.
        return any(isinstance(m, tff.learning.metrics.NumExamplesCounter) for m in metrics_fn())


def _with_tff_metric_names(
    process: tff.learning.templates.LearningProcess, metrics_fn: fed_recon.MetricsFn | None
) -> tff.learning.templates.LearningProcess:
    """`process` reporting the client metrics TFF reports: without the ``num_examples`` fedpersonal adds, unless the
    user's metrics ask for it (the weighting and every other number are unchanged)."""
    if _asks_for_num_examples(metrics_fn):
        return process
    next_fn = process.next
    state_type, data_type = next_fn.type_signature.parameter
    metrics_type = next_fn.type_signature.result.metrics.member

    def drop(value: Any, value_type: Any) -> Any:
        if not isinstance(value_type, tff.StructType):
            return value
        names = [name for name, _ in tff.structure.iter_elements(value_type)]
        return collections.OrderedDict(
            (name, drop(value[name], value_type[name])) for name in names if name != 'num_examples'
        )

    @tff.tensorflow.computation(metrics_type)
    def without_num_examples(metrics):
        work = collections.OrderedDict((name, metrics[name]) for name, _ in tff.structure.iter_elements(metrics_type))
        work['client_work'] = drop(metrics['client_work'], metrics_type['client_work'])
        return work

    @tff.federated_computation(state_type, data_type)
    def next_with_tff_names(state, data):
        output = next_fn(state, data)
        return tff.learning.templates.LearningProcessOutput(
            output.state, tff.federated_map(without_num_examples, output.metrics)
        )

    return tff.learning.templates.LearningProcess(
        process.initialize, next_with_tff_names, process.get_model_weights, process.set_model_weights
    )


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
    return _with_tff_metric_names(process.learning_process, metrics_fn)


def build_fed_recon_eval(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    reconstruction_optimizer_fn: fed_recon.OptimizerArg | None = None,
    dataset_split_fn: fed_recon.SplitArg | None = None,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    metrics_aggregation_process: tff.templates.AggregationProcess | None = None,
    finetune_optimizer: fed_recon.OptimizerArg | None = None,
    learn_local_init: bool = False,
) -> tff.learning.templates.LearningProcess:
    """ReconEval with `tff.learning.algorithms.build_fed_recon_eval`'s signature, return type and metric names.

    Args:
      model_fn, loss_fn, metrics_fn, reconstruction_optimizer_fn, dataset_split_fn, model_distributor,
        metrics_aggregation_process: As in TFF 0.87 (see `fedpersonal.evaluation.build_fed_recon_eval`).
      finetune_optimizer, learn_local_init: fedpersonal's options.

    Returns:
      A `tff.learning.templates.LearningProcess` reporting `metrics_fn`'s metrics and ``loss`` (``num_examples``
      only with a `tff.learning.metrics.NumExamplesCounter` in `metrics_fn`, as TFF).
    """
    process = fed_recon_eval.build_fed_recon_eval(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        reconstruction_optimizer_fn=reconstruction_optimizer_fn,
        dataset_split_fn=dataset_split_fn,
        model_distributor=model_distributor,
        metrics_aggregation_process=metrics_aggregation_process,
        finetune_optimizer=finetune_optimizer,
        learn_local_init=learn_local_init,
    )
    return _with_tff_metric_names(process, metrics_fn)
