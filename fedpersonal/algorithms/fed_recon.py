"""Federated Reconstruction (Singhal et al., NeurIPS 2021, Algorithm 1).

Each round, every sampled client

1. receives the global variables g (and, optionally, a learned default for the
   local variables);
2. splits its data into a support and a query set (`ReconstructionSplit`);
3. *reconstructs* its local variables l from their initializer (or the learned
   default) with k_r optimizer steps on the support set, g frozen;
4. *updates* g with k_u optimizer steps on the query set, l frozen (or trained
   jointly when `jointly_train_locals`);
5. sends back only the update g_initial - g_final and a weight.

Local variables exist only inside the client computation: nothing derived from
them is returned, except (opt-in, `learn_local_init`) the displacement of the
reconstructed locals from the shared default, which then goes through the same
aggregator as the global update (so secure or DP aggregation applies to it too).

The client work is a `fedpersonal.core.client_plan.ClientPlan` (`fed_recon_plan`): two phases on the support and
query parts of the split, local weights started afresh every round; every backend runs it (`fedpersonal.backends`),
with TFF's broadcast, any `tff.aggregators` factory and TFF's apply-optimizer finalizer around it. ReconEval's
client work is a `fedpersonal.core.eval_plan.EvalPlan` (`recon_eval_plan`), run by `fedpersonal.evaluation`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.core import eval_plan
from fedpersonal.core import process as process_lib
from fedpersonal.core import tff_names
from fedpersonal.data import dataset_split as dataset_split_lib
from fedpersonal.models import partially_local_model

ReconstructionModel: TypeAlias = tff.learning.models.ReconstructionModel
ModelWeights: TypeAlias = tff.learning.models.ModelWeights
LossFn: TypeAlias = Callable[[], tf.keras.losses.Loss]
MetricsFn: TypeAlias = Callable[[], list[tf.keras.metrics.Metric]]
ModelFn: TypeAlias = Callable[[], ReconstructionModel]
AggregationFactory: TypeAlias = (
    tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory
)
SplitArg: TypeAlias = dataset_split_lib.ReconstructionSplit | dataset_split_lib.DatasetSplitFn
# A TFF optimizer, or (as TFF accepts) a no-arg function returning a Keras optimizer.
OptimizerArg: TypeAlias = tff.learning.optimizers.Optimizer | Callable[[], tf.keras.optimizers.Optimizer]
_DEFAULT_SERVER = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
_DEFAULT_CLIENT = tff.learning.optimizers.build_sgdm(learning_rate=0.1)


def resolve_split_fn(dataset_split: SplitArg) -> dataset_split_lib.DatasetSplitFn:
    if isinstance(dataset_split, dataset_split_lib.ReconstructionSplit):
        return dataset_split_lib.build_dataset_split_fn(dataset_split)
    if callable(dataset_split):
        return dataset_split
    raise TypeError(f'dataset_split must be a ReconstructionSplit or a split function, got {dataset_split!r}.')


def data_split(dataset_split: SplitArg, *, query_once: bool = False) -> client_plan.DataSplit:
    """FedRecon's support and query parts of a client's dataset: a `ReconstructionSplit`'s (with `query_once` the
    query set in one plain pass, as `fedpersonal.evaluation.build_recon_eval` scores it), or a TFF-style split
    function's two datasets as they are."""
    if not isinstance(dataset_split, dataset_split_lib.ReconstructionSplit):
        return client_plan.DataSplit(('support', 'query'), resolve_split_fn(dataset_split))
    if query_once:
        dataset_fn = dataset_split_lib.build_support_only_fn(dataset_split)
        dataset_split = dataclasses.replace(dataset_split, post_recon_epochs=1, post_recon_steps_max=None)
    else:
        dataset_fn = dataset_split_lib.build_dataset_split_fn(dataset_split)
    return client_plan.DataSplit(
        ('support', 'query'), dataset_fn, functools.partial(dataset_split_lib.split_batches, split=dataset_split)
    )


def global_weights_with_local_default(model: ReconstructionModel, learn_local_init: bool) -> ModelWeights:
    """The server-side weights: global variables (+ local trainable defaults)."""
    return client_plan.server_weights(model, client_plan.LEARNED if learn_local_init else client_plan.INITIAL)


def server_weights_type(model_fn: Callable[[], ReconstructionModel], learn_local_init: bool = False) -> tff.Type:
    """The type of the weights `build_fed_recon` broadcasts (e.g. for a custom `model_distributor`)."""

    @tff.tensorflow.computation
    def initial_weights():
        return global_weights_with_local_default(model_fn(), learn_local_init)

    return initial_weights.type_signature.result


def fed_recon_plan(
    *,
    client_optimizer: OptimizerArg,
    reconstruction_optimizer: OptimizerArg,
    dataset_split: SplitArg,
    jointly_train_locals: bool = False,
    learn_local_init: bool = False,
    reconstruct: bool = True,
) -> client_plan.ClientPlan:
    """FedRecon's client work: the locals reconstructed on the support set (globals frozen; no metrics), then the
    globals (and with `jointly_train_locals` the locals) updated on the query set; the locals start from their
    initial values, or from the learned default (`learn_local_init`, whose displacement is uploaded too), and are
    never kept. Without `reconstruct` (a model without local trainable weights, e.g. FedAvg's) only the update."""
    split = data_split(dataset_split)
    trains = (client_plan.GLOBAL, client_plan.LOCAL) if jointly_train_locals else (client_plan.GLOBAL,)
    phases: tuple[client_plan.Phase, ...] = (client_plan.Phase(trains, 1, client_optimizer, data='query'),)
    if reconstruct:
        recon = client_plan.Phase(
            (client_plan.LOCAL,), 1, reconstruction_optimizer, data='support', reports_metrics=False
        )
        phases = (recon,) + phases
    local_start = client_plan.LEARNED if learn_local_init else client_plan.INITIAL
    return client_plan.ClientPlan(phases, split=split, local_start=local_start)


def recon_eval_plan(
    *,
    reconstruction_optimizer: OptimizerArg,
    dataset_split: SplitArg,
    finetune_optimizer: OptimizerArg | None = None,
    learn_local_init: bool = False,
    query_once: bool = True,
) -> eval_plan.EvalPlan:
    """ReconEval's client work (paper Section 4.1): the locals reconstructed on the support set from their initial
    values (or the learned default), the globals frozen; with `finetune_optimizer` the globals then trained on the
    support set too (FedRecon+Finetune); the metrics computed on the query set (with `query_once` in one plain pass;
    else as the split iterates it, as TFF's `build_fed_recon_eval`)."""
    support = functools.partial(client_plan.Phase, data='support', reports_metrics=False)
    phases: tuple[client_plan.Phase, ...] = (support((client_plan.LOCAL,), 1, reconstruction_optimizer),)
    if finetune_optimizer is not None:
        phases += (support((client_plan.GLOBAL,), 1, finetune_optimizer),)
    return eval_plan.EvalPlan(
        phases,
        data_split(dataset_split, query_once=query_once),
        scores='query',
        local_start=client_plan.LEARNED if learn_local_init else client_plan.INITIAL,
    )


def build_fed_recon(
    model_fn: ModelFn,
    *,
    loss_fn: LossFn,
    metrics_fn: MetricsFn | None = None,
    server_optimizer: OptimizerArg | None = None,
    client_optimizer: OptimizerArg | None = None,
    reconstruction_optimizer: OptimizerArg | None = None,
    dataset_split: SplitArg | None = None,
    jointly_train_locals: bool = False,
    learn_local_init: bool = False,
    client_weighting: Any = None,
    model_aggregator: AggregationFactory | None = None,
    model_distributor: tff.learning.templates.DistributionProcess | None = None,
    metrics_aggregator: Callable[..., tff.Computation] | None = None,
    simulation: str | None = None,
    group_size: int | None = None,
    measure_communication: bool = False,
    server_optimizer_fn: OptimizerArg | None = None,
    client_optimizer_fn: OptimizerArg | None = None,
    reconstruction_optimizer_fn: OptimizerArg | None = None,
    dataset_split_fn: SplitArg | None = None,
    model_aggregator_factory: AggregationFactory | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds the Federated Reconstruction learning process.

    Args:
      model_fn: No-arg function returning a new `ReconstructionModel` (e.g. from
        `fedpersonal.models.from_keras_model`) each call.
      loss_fn: No-arg function returning the `tf.keras.losses.Loss` optimized
        in both phases (plus the Keras model's regularization losses).
      metrics_fn: No-arg function returning Keras metrics computed on query
        batches during the update (a `loss` and `num_examples` are added).
      server_optimizer: Applied to the aggregated update (SGD, Adam, Yogi, ...); default SGD, learning rate 1.
        The client and reconstruction optimizers may also be no-arg functions returning a Keras optimizer, as in
        TFF (the process then runs on the per-client backend).
      client_optimizer: For the k_u update steps on the query set; default SGD, learning rate 0.1.
      reconstruction_optimizer: For the k_r reconstruction steps on the support set; default SGD, 0.1.
      dataset_split: A `ReconstructionSplit` (support/query split, epochs, step
        caps; default `ReconstructionSplit()`) or any `tff.learning.models.ReconstructionDatasetSplitFn`
        (e.g. TFF's `ReconstructionModel.build_dataset_split_fn(...)`, used as it is).
      jointly_train_locals: Also train local variables during the update phase.
      learn_local_init: Learn a global default for the local trainable
        variables (the paper's footnote 2): clients start reconstruction from
        it, and it is updated with the aggregated displacement of their
        reconstructed locals. Off by default, since that displacement (in
        aggregate) then reaches the server.
      client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (query
        examples, default; also for None, as in TFF), `UNIFORM`, or a callable of the unfinalized metrics.
      model_aggregator: Any `tff.aggregators` factory (weighted or unweighted),
        e.g. DP or zeroing; default weighted `MeanFactory`.
      model_distributor: Default `tff.learning.templates.build_broadcast_process` (another one runs on the
        per-client backend).
      metrics_aggregator: As in TFF (default, and None: `sum_then_finalize`).
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context. ``'engine'`` (the context's default): a round's clients run in groups, each
        group as one compiled program; `process.backend.pack(datasets)` makes `next`'s input. ``'per_client'``:
        one TFF client computation per client, `next` takes the datasets. Same results to float precision; what the engine cannot run (a Keras optimizer, a
        custom distributor, an aggregator that needs each client's own update, ...) runs on the per-client
        backend, with a log line saying why.
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB of
        per-client weight copies, at most 128).
      measure_communication: Engine only: `run_round`'s metrics also report each logical client's download
        and upload as `fedpersonal.metrics.communication`'s measured broadcast and aggregator do on the
        per-client path (same keys; `simulation.driver`).
      server_optimizer_fn, client_optimizer_fn, reconstruction_optimizer_fn, dataset_split_fn,
        model_aggregator_factory: TFF 0.87's names of `server_optimizer`, `client_optimizer`,
        `reconstruction_optimizer`, `dataset_split` and `model_aggregator` (`fedpersonal.core.tff_names`);
        giving both names of one argument is a `TypeError`. `fedpersonal.tff_compat.build_fed_recon`
        returns TFF's `LearningProcess` itself (docs/MIGRATING.md).

    Returns:
      A stateless `fedpersonal.core.PersonalizedProcess` (`next(state, client_datasets)` ->
      `ProcessOutput(state, metrics, private_states=())`); `get_model_weights(state)` returns the server
      weights (globals, then local defaults when `learn_local_init`). The TFF
      `tff.learning.templates.LearningProcess` it is composed of is `process.learning_process`.

    Example:

    >>> import tensorflow as tf, tensorflow_federated as tff
    >>> from fedpersonal import algorithms, models
    >>> from fedpersonal.models import matrix_factorization as mf
    >>> process = algorithms.build_fed_recon(
    ...     mf.personal_model_fn(num_items=20, num_latent_factors=4),
    ...     loss_fn=tf.keras.losses.MeanSquaredError,
    ...     client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    >>> process.stateful
    False

    Raises:
      fedpersonal.models.ModelSpecError: the model has no global trainable
        variables, or `learn_local_init` is set and it has no local ones.
      ValueError: an unweighted aggregator with non-uniform client weighting.
      TypeError: an argument given under both its names.
    """
    name = 'build_fed_recon'
    server_optimizer = tff_names.resolve(
        name, 'server_optimizer', server_optimizer, 'server_optimizer_fn', server_optimizer_fn, _DEFAULT_SERVER
    )
    client_optimizer = tff_names.resolve(
        name, 'client_optimizer', client_optimizer, 'client_optimizer_fn', client_optimizer_fn, _DEFAULT_CLIENT
    )
    reconstruction_optimizer = tff_names.resolve(
        name,
        'reconstruction_optimizer',
        reconstruction_optimizer,
        'reconstruction_optimizer_fn',
        reconstruction_optimizer_fn,
        _DEFAULT_CLIENT,
    )
    split: SplitArg = tff_names.resolve(
        name,
        'dataset_split',
        dataset_split,
        'dataset_split_fn',
        dataset_split_fn,
        dataset_split_lib.ReconstructionSplit(),
    )
    model_aggregator = tff_names.resolve(
        name, 'model_aggregator', model_aggregator, 'model_aggregator_factory', model_aggregator_factory
    )
    if client_weighting is None:
        client_weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
    if metrics_aggregator is None:
        metrics_aggregator = tff.learning.metrics.sum_then_finalize
    with tf.Graph().as_default():
        probe = model_fn()
        # The class, not the ReconstructionModel alias: mypy cannot isinstance() an alias of an untyped module's class.
        if not isinstance(probe, tff.learning.models.ReconstructionModel):
            raise TypeError(f'model_fn must return a tff.learning.models.ReconstructionModel, got {type(probe)}.')
        partially_local_model.require_parts(
            probe, algorithm='FedRecon', needs_global=True, needs_local=learn_local_init
        )
        has_locals = bool(probe.local_trainable_variables)
    plan = fed_recon_plan(
        client_optimizer=client_optimizer,
        reconstruction_optimizer=reconstruction_optimizer,
        dataset_split=split,
        jointly_train_locals=jointly_train_locals,
        learn_local_init=learn_local_init,
        reconstruct=has_locals,
    )
    with backends.use(simulation or backends.current()):
        return backends.build_process(
            plan,
            model_fn,
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            server_optimizer=server_optimizer,
            model_aggregator=model_aggregator,
            client_weighting=client_weighting,
            metrics_aggregator=metrics_aggregator,
            model_distributor=model_distributor,
            group_size=group_size,
            measure_communication=measure_communication,
            name='FedRecon',
        )


def _benchmark_plan(settings: registry.Settings, options: None) -> client_plan.ClientPlan:
    # The head reconstructed on each client's support half every round (stateless).
    split = dataset_split_lib.ReconstructionSplit()
    return fed_recon_plan(client_optimizer=settings.sgd(), reconstruction_optimizer=settings.sgd(), dataset_split=split)


BENCHMARK_ROWS = (registry.Row('fed_recon', 'FedRecon', _benchmark_plan, leaderboard=10, local_layers=registry.HEAD),)
