"""ReconEval as TFF 0.87's `build_fed_recon_eval` builds it: a `tff.learning.templates.LearningProcess`.

`build_fed_recon_eval` takes TFF's arguments (and fedpersonal's names for them) and returns a process of TFF's
shape, composed from TFF's templates as TFF composes it: `initialize()`, `set_model_weights(state, weights)`,
`get_model_weights(state)`, and `next(state, client_datasets)` whose metrics are
``metrics['client_work']['eval']['current_round_metrics' | 'total_rounds_metrics']`` (TFF's
`SumThenFinalizeFactory` accumulating over calls), with `distributor`, `aggregator` and `finalizer` entries; the
model weights never change. The client work is `fedpersonal.evaluation.build_recon_eval`'s evaluation plan
(`fedpersonal.core.eval_plan.EvalPlan`: reconstruct the local variables on the first dataset of the split,
optionally fine-tune, evaluate on the second, iterated as the split iterates it), so the two builders agree on a
client's metrics.

Differences from TFF, on purpose (docs/MIGRATING.md): the default split is fedpersonal's `ReconstructionSplit()`
(hash-based, disjoint support and query examples), not TFF's even/odd batches; `num_examples` is always reported
(a `NumExamplesCounter` in `metrics_fn` is that metric); the Keras model's regularization losses are part of the
reconstruction loss.
"""

from __future__ import annotations

import collections
from typing import Any

import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import finalizers

from fedpersonal.algorithms import fed_recon
from fedpersonal.core import eval_plan
from fedpersonal.core import tff_names
from fedpersonal.data import dataset_split as dataset_split_lib
from fedpersonal.evaluation import federated_evaluation
from fedpersonal.models import partially_local_model


def build_fed_recon_eval(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    reconstruction_optimizer: fed_recon.OptimizerArg | None = None,
    dataset_split: fed_recon.SplitArg | None = None,
    finetune_optimizer: fed_recon.OptimizerArg | None = None,
    learn_local_init: bool = False,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    metrics_aggregation_process: tff.templates.AggregationProcess | None = None,
    reconstruction_optimizer_fn: fed_recon.OptimizerArg | None = None,
    dataset_split_fn: fed_recon.SplitArg | None = None,
) -> tff.learning.templates.LearningProcess:
    """Builds ReconEval as a `tff.learning.templates.LearningProcess` with TFF 0.87's signature and shape.

    Args:
      model_fn: No-arg function returning a new `tff.learning.models.ReconstructionModel`; called twice while
        building (the initial weights and the client computation), as TFF's builder calls it.
      loss_fn: No-arg function returning the loss used for reconstruction and reported as `loss`.
      metrics_fn: No-arg function returning Keras metrics computed on each client's evaluated set (`loss` and
        `num_examples` are added; a `tff.learning.metrics.NumExamplesCounter` given here is that
        `num_examples`).
      reconstruction_optimizer: For the reconstruction steps (default SGD, learning rate 0.1); a TFF optimizer
        or a no-arg function returning a Keras optimizer. TFF's name `reconstruction_optimizer_fn` is an alias.
      dataset_split: A `ReconstructionSplit` (default `ReconstructionSplit()`), its reconstruction epochs and
        step cap applied to the support set and its post-reconstruction epochs and step cap to the evaluated
        query set, as TFF's split functions apply them (post_recon_epochs=0 evaluates nothing, as in TFF); or
        a TFF-style split function ``dataset -> (reconstruction dataset, evaluation dataset)`` (e.g.
        `tff.learning.models.ReconstructionModel.build_dataset_split_fn(...)`). TFF's name `dataset_split_fn`
        is an alias.
      finetune_optimizer: If set, the globals are also trained on the support set after reconstruction
        (FedRecon+Finetune).
      learn_local_init: The weights carry learned local defaults after the globals (from
        `build_fed_recon(..., learn_local_init=True)`).
      model_distributor: As in TFF (default `tff.learning.templates.build_broadcast_process`).
      metrics_aggregation_process: As in TFF: a `tff.templates.AggregationProcess` from the clients'
        unfinalized metrics to ``(current round metrics, total rounds metrics)``; default TFF's
        `SumThenFinalizeFactory` over the metrics' finalizers.
      reconstruction_optimizer_fn, dataset_split_fn: TFF's names of `reconstruction_optimizer` and
        `dataset_split` (giving both names of one argument is a `TypeError`).

    Returns:
      A `tff.learning.templates.LearningProcess`: ``next(state, client_datasets).metrics['client_work']['eval']``
      holds ``current_round_metrics`` and ``total_rounds_metrics``.

    Raises:
      TypeError: `model_fn` does not return a `ReconstructionModel`; an argument given under both its names;
        `metrics_aggregation_process` is not an `AggregationProcess`.
      fedpersonal.models.ModelSpecError: `learn_local_init` with a model without local trainable variables.
    """
    name = 'build_fed_recon_eval'
    reconstruction_optimizer = tff_names.resolve(
        name,
        'reconstruction_optimizer',
        reconstruction_optimizer,
        'reconstruction_optimizer_fn',
        reconstruction_optimizer_fn,
        tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    )
    split = tff_names.resolve(
        name,
        'dataset_split',
        dataset_split,
        'dataset_split_fn',
        dataset_split_fn,
        dataset_split_lib.ReconstructionSplit(),
    )
    plan = federated_evaluation.evaluation_plan(
        dataset_split=split,
        reconstruction_optimizer=reconstruction_optimizer,
        finetune_optimizer=finetune_optimizer,
        learn_local_init=learn_local_init,
        query_once=False,
    )
    if metrics_aggregation_process is not None and not isinstance(
        metrics_aggregation_process, tff.templates.AggregationProcess
    ):
        raise TypeError(
            'metrics_aggregation_process must be a tff.templates.AggregationProcess, got '
            f'{type(metrics_aggregation_process).__name__}.'
        )

    def checked_model_fn():
        model = model_fn()
        if learn_local_init and isinstance(model, tff.learning.models.ReconstructionModel):
            partially_local_model.require_parts(model, algorithm='ReconEval', needs_global=False, needs_local=True)
        return model

    initial_weights, element_type = federated_evaluation.initial_weights_and_element_type(
        checked_model_fn, learn_local_init
    )
    weights_type = initial_weights.type_signature.result
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()
    client_eval_fn = eval_plan.build_client_eval_fn(
        plan, model_fn, loss_fn=loss_fn, metrics_fn=metrics_fn, metric_finalizers=metric_finalizers
    )

    @tff.tensorflow.computation(weights_type, tff.SequenceType(element_type))
    def client_computation(weights, dataset):
        unfinalized, _ = client_eval_fn(weights, dataset, None)
        return unfinalized

    if metrics_aggregation_process is None:
        metrics_aggregation_process = tff.learning.metrics.SumThenFinalizeFactory(metric_finalizers).create(
            client_computation.type_signature.result
        )
    distributor = model_distributor or tff.learning.templates.build_broadcast_process(weights_type)
    client_work = _client_work(metrics_aggregation_process, client_computation)
    no_update = tff.learning.templates.ClientResult(update=(), update_weight=())
    update_type = tff.types.to_type(no_update)
    aggregator = tff.aggregators.MeanFactory().create(update_type.update, update_type.update_weight)
    finalizer = finalizers.build_identity_finalizer(weights_type, update_type=update_type.update_weight)
    return tff.learning.templates.compose_learning_process(
        initial_weights, distributor, client_work, aggregator, finalizer
    )


def _client_work(
    metrics_process: tff.templates.AggregationProcess, client_computation: tff.Computation
) -> tff.learning.templates.ClientWorkProcess:
    """TFF's evaluation client work: every client's metrics, aggregated by `metrics_process`; no model update."""
    weights_type, dataset_type = client_computation.type_signature.parameter

    @tff.federated_computation
    def initialize():
        return metrics_process.initialize()

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(weights_type, tff.CLIENTS),
        tff.FederatedType(dataset_type, tff.CLIENTS),
    )
    def next_fn(state, weights, client_datasets):
        unfinalized = tff.federated_map(client_computation, (weights, client_datasets))
        output = metrics_process.next(state, unfinalized)
        current_round_metrics, total_rounds_metrics = output.result
        measurements = tff.federated_zip(
            collections.OrderedDict(
                eval=collections.OrderedDict(
                    current_round_metrics=current_round_metrics, total_rounds_metrics=total_rounds_metrics
                )
            )
        )
        no_update: Any = tff.learning.templates.ClientResult(update=(), update_weight=())
        return tff.templates.MeasuredProcessOutput(
            state=output.state, result=tff.federated_value(no_update, tff.CLIENTS), measurements=measurements
        )

    return tff.learning.templates.ClientWorkProcess(initialize, next_fn)
