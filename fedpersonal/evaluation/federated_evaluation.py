"""Federated evaluation of partially local models: ReconEval and StandardEval.

* **ReconEval** (`build_recon_eval`, paper Section 4.1): each client splits its
  data into support and query sets, reconstructs its local variables on the
  support set with the global variables frozen, optionally fine-tunes the
  global variables on the support set too (FedRecon+Finetune), and reports
  metrics on its query set. Works for clients never seen in training.
* **StandardEval** (`build_standard_eval`): the model is evaluated on each
  client's whole dataset as received (no reconstruction). Used for seen users
  whose parameters were trained (e.g. a user table trained centrally or by
  FedAvg, evaluated on their held-out ratings).

Both return a `tff.Computation` `(weights@SERVER, {dataset}@CLIENTS) ->
<eval=..., per_client=...>@SERVER`: `eval` is the example-weighted aggregate
(TFF's `sum_then_finalize`), `per_client` holds each client's own finalized
metrics (a reservoir sample of up to `per_client_sample_size` clients, via
`tff.aggregators.UnweightedReservoirSamplingFactory`) for distributions
(`fedpersonal.metrics.summarize_per_client`). Locally reconstructed variables
never leave the client computation.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeAlias

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import progress
from fedpersonal.algorithms import fed_recon
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import eval_plan
from fedpersonal.core import tff_names
from fedpersonal.core.process import LazyDatasets
from fedpersonal.data import dataset_split as dataset_split_lib
from fedpersonal.simulation import options as simulation_options

ReconstructionModel: TypeAlias = tff.learning.models.ReconstructionModel
# A per-client TFF computation (``backends.use('per_client')``) or the engine's `GroupEvaluation` (the default); both
# are called as ``evaluate(weights, datasets[, private_states])`` and return ``<eval, per_client>``.
Evaluation: TypeAlias = Any


def eval_split_fn(
    dataset_split: dataset_split_lib.ReconstructionSplit | dataset_split_lib.DatasetSplitFn, *, query_once: bool
) -> dataset_split_lib.DatasetSplitFn:
    """The split function of an evaluation: a `ReconstructionSplit`'s (its query set in one full pass when
    `query_once`, as `build_recon_eval` evaluates it; else with its post-reconstruction epochs and step cap, as
    TFF's evaluation iterates the second dataset), or a TFF-style split function used as it is.

    Raises:
      TypeError: `dataset_split` is neither.
    """
    split_fn: Any = fed_recon.data_split(_checked_split(dataset_split), query_once=query_once).dataset_fn
    return split_fn


def _checked_split(dataset_split: Any) -> fed_recon.SplitArg:
    if isinstance(dataset_split, dataset_split_lib.ReconstructionSplit) or callable(dataset_split):
        return dataset_split
    raise TypeError(
        'dataset_split must be a ReconstructionSplit or a split function dataset -> (reconstruction dataset, '
        f'evaluation dataset), got {dataset_split!r}.'
    )


def evaluation_plan(
    *,
    dataset_split: fed_recon.SplitArg | None,
    reconstruction_optimizer: Any,
    finetune_optimizer: Any,
    learn_local_init: bool,
    with_private_states: bool = False,
    query_once: bool = True,
) -> eval_plan.EvalPlan:
    """The client evaluation every backend runs: ReconEval's (`fed_recon.recon_eval_plan`) with a split, else
    StandardEval's (the whole dataset scored, the locals from their initial values, the learned default, or each
    client's private state with `with_private_states`).

    Raises:
      TypeError: `dataset_split` is neither a `ReconstructionSplit` nor a split function.
    """
    if dataset_split is not None:
        return fed_recon.recon_eval_plan(
            reconstruction_optimizer=reconstruction_optimizer,
            dataset_split=_checked_split(dataset_split),
            finetune_optimizer=finetune_optimizer,
            learn_local_init=learn_local_init,
            query_once=query_once,
        )
    if with_private_states:
        return eval_plan.EvalPlan(local_start=client_plan.KEPT)
    return eval_plan.EvalPlan(local_start=client_plan.LEARNED if learn_local_init else client_plan.INITIAL)


def build_client_eval_fn(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None,
    split_fn: dataset_split_lib.DatasetSplitFn | None,
    reconstruction_optimizer: Any,
    finetune_optimizer: Any,
    learn_local_init: bool,
    metric_finalizers: collections.OrderedDict,
) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """One client's evaluation as a `tf.function` ``(server weights, dataset, private state or None) ->
    (unfinalized metrics, finalized metrics)``; builds its model (one `model_fn` call) when traced.

    With `split_fn`, the local variables are reconstructed on its first dataset (and the globals fine-tuned there
    with `finetune_optimizer`, if given) and the metrics computed on its second; without, on the whole dataset.
    `metric_finalizers` is filled while tracing. The `evaluation_plan` of these arguments, run by
    `fedpersonal.core.eval_plan.build_client_eval_fn`.
    """
    plan = evaluation_plan(
        dataset_split=split_fn,
        reconstruction_optimizer=reconstruction_optimizer,
        finetune_optimizer=finetune_optimizer,
        learn_local_init=learn_local_init,
    )
    return eval_plan.build_client_eval_fn(
        plan, model_fn, loss_fn=loss_fn, metrics_fn=metrics_fn, metric_finalizers=metric_finalizers
    )


def initial_weights_and_element_type(
    model_fn: fed_recon.ModelFn, learn_local_init: bool
) -> tuple[tff.Computation, tff.Type]:
    """The server's initial weights as a TF computation and the model's batch type, from one `model_fn` call.

    Raises:
      TypeError: `model_fn` does not return a `tff.learning.models.ReconstructionModel`.
    """
    element_types = []

    @tff.tensorflow.computation
    def initial_weights():
        model = model_fn()
        # The class, not the alias: mypy cannot isinstance() an alias of an untyped module's class.
        if not isinstance(model, tff.learning.models.ReconstructionModel):
            raise TypeError(f'model_fn must return a tff.learning.models.ReconstructionModel, got {type(model)}.')
        element_types.append(tff.types.tensorflow_to_type(model.input_spec))
        return fed_recon.global_weights_with_local_default(model, learn_local_init)

    return initial_weights, element_types[0]


def _build_evaluation(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None,
    dataset_split: dataset_split_lib.ReconstructionSplit | dataset_split_lib.DatasetSplitFn | None,
    reconstruction_optimizer: tff.learning.optimizers.Optimizer | None,
    finetune_optimizer: tff.learning.optimizers.Optimizer | None,
    learn_local_init: bool,
    per_client_sample_size: int,
    metrics_aggregator: Callable[..., tff.Computation],
    with_private_states: bool = False,
    simulation: str | None = None,
    group_size: int | None = None,
) -> Evaluation:
    from fedpersonal import backends  # pylint: disable=g-import-not-at-top

    if simulation is None:  # The one chooser: the context's backend, as every training process's.
        simulation = backends.current()
    simulation_options.check_simulation(simulation)
    plan = evaluation_plan(
        dataset_split=dataset_split,
        reconstruction_optimizer=reconstruction_optimizer,
        finetune_optimizer=finetune_optimizer,
        learn_local_init=learn_local_init,
        with_private_states=with_private_states,
    )
    if simulation == 'engine':
        from fedpersonal.simulation import evaluation as engine_evaluation  # pylint: disable=g-import-not-at-top

        simulation_options.check_engine_parts(metrics_aggregator=metrics_aggregator)
        return engine_evaluation.GroupEvaluation(
            plan,
            model_fn,
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            per_client_sample_size=per_client_sample_size,
            group_size=group_size,
            cache_bytes=backends.current_cache_bytes(),  # The context's bound, as the training processes'.
        )
    initial_weights, element_type = initial_weights_and_element_type(model_fn, learn_local_init)
    weights_type = initial_weights.type_signature.result
    dataset_type = tff.SequenceType(element_type)
    metric_finalizers: collections.OrderedDict = collections.OrderedDict()
    client_eval_fn = eval_plan.build_client_eval_fn(
        plan, model_fn, loss_fn=loss_fn, metrics_fn=metrics_fn, metric_finalizers=metric_finalizers
    )

    def aggregate_results(unfinalized, per_client):
        aggregate = metrics_aggregator(metric_finalizers, unfinalized.type_signature.member)(unfinalized)
        sampler = tff.aggregators.UnweightedReservoirSamplingFactory(per_client_sample_size).create(
            per_client.type_signature.member
        )
        sampled = sampler.next(sampler.initialize(), per_client).result
        return tff.federated_zip(collections.OrderedDict(eval=aggregate, per_client=sampled))

    server_weights_type = tff.FederatedType(weights_type, tff.SERVER)
    client_datasets_type = tff.FederatedType(dataset_type, tff.CLIENTS)
    if with_private_states:

        @tff.tensorflow.computation
        def initial_private_state():
            return client_work.local_weights(model_fn())

        private_type = initial_private_state.type_signature.result

        @tff.tensorflow.computation(weights_type, dataset_type, private_type)
        def client_eval_private(server_weights, dataset, private_state):
            return client_eval_fn(server_weights, dataset, private_state)

        @tff.federated_computation(
            server_weights_type, client_datasets_type, tff.FederatedType(private_type, tff.CLIENTS)
        )
        def evaluate_with_private(server_weights, client_datasets, private_states):
            client_weights = tff.federated_broadcast(server_weights)
            return aggregate_results(
                *tff.federated_map(client_eval_private, (client_weights, client_datasets, private_states))
            )

        return evaluate_with_private

    @tff.tensorflow.computation(weights_type, dataset_type)
    def client_eval(server_weights, dataset):
        return client_eval_fn(server_weights, dataset, None)

    @tff.federated_computation(server_weights_type, client_datasets_type)
    def evaluate(server_weights, client_datasets):
        client_weights = tff.federated_broadcast(server_weights)
        return aggregate_results(*tff.federated_map(client_eval, (client_weights, client_datasets)))

    return evaluate


def build_recon_eval(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    reconstruction_optimizer: fed_recon.OptimizerArg | None = None,
    dataset_split: fed_recon.SplitArg | None = None,
    finetune_optimizer: fed_recon.OptimizerArg | None = None,
    learn_local_init: bool = False,
    per_client_sample_size: int = 100_000,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    simulation: str | None = None,
    group_size: int | None = None,
    reconstruction_optimizer_fn: fed_recon.OptimizerArg | None = None,
    dataset_split_fn: fed_recon.SplitArg | None = None,
    model_distributor: Any = None,
    metrics_aggregation_process: Any = None,
) -> Evaluation:
    """Builds ReconEval (optionally FedRecon+Finetune) as a function of the weights and the clients' datasets.

    `build_fed_recon_eval` builds the same evaluation as TFF's `LearningProcess` (`initialize`,
    `set_model_weights`, `next`).

    Args:
      model_fn: No-arg function returning a new `ReconstructionModel`.
      loss_fn: Loss used for reconstruction (and fine-tuning) and reported as `loss`.
      metrics_fn: Metrics computed on each client's query set.
      reconstruction_optimizer: Optimizer for the k_r reconstruction steps (default SGD, learning rate 0.1; a
        no-arg function returning a Keras optimizer with ``simulation='per_client'``).
      dataset_split: Support/query split (default `ReconstructionSplit()`); a `ReconstructionSplit`'s
        reconstruction epochs and step cap apply and the query set is evaluated in one full pass (the same
        split can then be the training's, whose update epochs and cap do not shrink the evaluation;
        `build_fed_recon_eval` applies them as TFF does). A TFF-style split function ``dataset ->
        (reconstruction dataset, evaluation dataset)`` is used as it is.
      finetune_optimizer: If set, the global variables are also trained on the
        support set after reconstruction, before evaluating (FedRecon+Finetune).
      learn_local_init: The weights carry learned local defaults (as produced by
        `build_fed_recon(..., learn_local_init=True)`).
      per_client_sample_size: Max number of clients whose own metrics are kept.
      metrics_aggregator: As in TFF (the engine takes only `sum_then_finalize`).
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser, as for the
        training builders) for this evaluation alone; None (default) follows the context. ``'engine'`` (the
        context's default): clients evaluated in compiled groups (`fedpersonal.simulation.evaluation`; call it
        with ``client_ids=`` to pack each client's data once); ``'per_client'``: one TFF client computation per
        client. Same results to float precision (tests/simulation/evaluation_engine_test.py).
      group_size: Engine only: the most clients per compiled group (default: within the engine's memory budget).
      reconstruction_optimizer_fn, dataset_split_fn: TFF 0.87's names of `reconstruction_optimizer` and
        `dataset_split` (giving both names of one argument is a `TypeError`).
      model_distributor, metrics_aggregation_process: TFF's `build_fed_recon_eval` arguments, refused here with a
        `TypeError` (a function has no process state); `build_fed_recon_eval` takes them.

    Returns:
      ``evaluate(weights, client_datasets) -> <eval, per_client>``: the engine's `GroupEvaluation`, or a
      `tff.Computation` `(weights@SERVER, datasets@CLIENTS) -> <eval, per_client>@SERVER` (per_client).
    """
    name = 'build_recon_eval'
    for tff_arg, value in (
        ('model_distributor', model_distributor),
        ('metrics_aggregation_process', metrics_aggregation_process),
    ):
        tff_names.refuse(name, tff_arg, value, 'it returns a function, not a process; build_fed_recon_eval takes it.')
    reconstruction_optimizer = tff_names.resolve(
        name,
        'reconstruction_optimizer',
        reconstruction_optimizer,
        'reconstruction_optimizer_fn',
        reconstruction_optimizer_fn,
        tff.learning.optimizers.build_sgdm(0.1),
    )
    dataset_split = tff_names.resolve(
        name,
        'dataset_split',
        dataset_split,
        'dataset_split_fn',
        dataset_split_fn,
        dataset_split_lib.ReconstructionSplit(),
    )
    return _build_evaluation(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        dataset_split=dataset_split,
        reconstruction_optimizer=reconstruction_optimizer,
        finetune_optimizer=finetune_optimizer,
        learn_local_init=learn_local_init,
        per_client_sample_size=per_client_sample_size,
        metrics_aggregator=metrics_aggregator,
        simulation=simulation,
        group_size=group_size,
    )


def build_standard_eval(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    learn_local_init: bool = False,
    per_client_sample_size: int = 100_000,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    simulation: str | None = None,
    group_size: int | None = None,
) -> Evaluation:
    """Builds StandardEval: metrics of the given weights on each client's whole dataset.

    Args: as `build_recon_eval` (without reconstruction); `simulation` and `group_size` likewise.
    """
    return _build_evaluation(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        dataset_split=None,
        reconstruction_optimizer=None,
        finetune_optimizer=None,
        learn_local_init=learn_local_init,
        per_client_sample_size=per_client_sample_size,
        metrics_aggregator=metrics_aggregator,
        simulation=simulation,
        group_size=group_size,
    )


def build_private_state_eval(
    model_fn: fed_recon.ModelFn,
    *,
    loss_fn: fed_recon.LossFn,
    metrics_fn: fed_recon.MetricsFn | None = None,
    per_client_sample_size: int = 100_000,
    metrics_aggregator: Callable[..., tff.Computation] = tff.learning.metrics.sum_then_finalize,
    simulation: str | None = None,
    group_size: int | None = None,
) -> Evaluation:
    """StandardEval for stateful personalization (FURL): each client uses its own private state.

    Returns ``evaluate(global_weights, client_datasets, private_states) -> <eval, per_client>``: the engine's
    `GroupEvaluation` (on the engine, the default of `fedpersonal.backends.use`) or a `tff.Computation` `(global_weights@SERVER,
    {dataset}@CLIENTS, {private_state}@CLIENTS) -> <eval, per_client>@SERVER` (``'per_client'``). Seen users pass the
    private state their training left; never-seen users pass a default (e.g.
    `PersonalizedProcess.initial_private_state()`). Private states are only read inside
    the client computation.
    """
    return _build_evaluation(
        model_fn,
        loss_fn=loss_fn,
        metrics_fn=metrics_fn,
        dataset_split=None,
        reconstruction_optimizer=None,
        finetune_optimizer=None,
        learn_local_init=False,
        per_client_sample_size=per_client_sample_size,
        metrics_aggregator=metrics_aggregator,
        with_private_states=True,
        simulation=simulation,
        group_size=group_size,
    )


def evaluate_clients(
    evaluate: Evaluation,
    weights: Any,
    client_ids: Sequence[str],
    make_dataset: Callable[[str], tf.data.Dataset],
    private_states: Sequence[Any] | None = None,
    *,
    cache_key: str = '',
) -> Any:
    """Runs an evaluation built here (engine or per-client) on `client_ids`, their datasets built on demand.

    The engine's evaluation packs a client's data once per ``(cache_key, client id)`` and builds its dataset only
    then (a tf.data pipeline costs ~10 ms a client); give each distinct client data and dataset function its own
    `cache_key` (e.g. the split's name). The per-client computation gets every dataset.

    Args:
      evaluate: From `build_recon_eval`, `build_standard_eval` or `build_private_state_eval`.
      weights: The server's weights.
      client_ids: The clients to evaluate.
      make_dataset: A client id -> its batched evaluation dataset.
      private_states: Each client's private state (private-state evaluation only).
      cache_key: Names the client data and dataset function (engine cache).

    Returns:
      What `evaluate` returns: ``<eval, per_client>``.
    """
    from fedpersonal.simulation import evaluation as engine_evaluation  # pylint: disable=g-import-not-at-top

    extra = () if private_states is None else (list(private_states),)
    if isinstance(evaluate, engine_evaluation.GroupEvaluation):
        datasets = LazyDatasets(client_ids, make_dataset)
        return evaluate(weights, datasets, *extra, client_ids=[f'{cache_key}/{c}' for c in client_ids])
    client_datasets = [make_dataset(c) for c in client_ids]
    # One TFF call over every client, which reports no progress of its own: its elapsed time and the time left,
    # estimated from the previous call of this evaluation (per client), are logged while it lasts.
    key = (id(evaluate), cache_key)
    per_client = _seconds_per_client.get(key)
    expected = None if per_client is None else per_client * len(client_ids)
    started = time.monotonic()
    with progress.waiting(f'evaluation: {len(client_ids)} clients in one TFF call', expected):
        result = evaluate(weights, client_datasets, *extra)
    _seconds_per_client[key] = (time.monotonic() - started) / max(len(client_ids), 1)
    return result


# The measured seconds per client of each per-client evaluation (for `evaluate_clients`' estimate of the next).
_seconds_per_client: dict[tuple[int, str], float] = {}
