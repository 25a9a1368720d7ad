"""A client's evaluation stated once, as data: which weights are trained on which part of its data, then which part
is scored.

An `EvalPlan` is the evaluation twin of a `fedpersonal.core.client_plan.ClientPlan`: its `Phase`s (of
`client_plan`) train some weight parts (``'global'``, ``'local'``) on a part of the plan's `DataSplit` with a fresh
optimizer and the model's loss, reporting nothing (FedRecon's ReconEval: the local weights reconstructed on the
support set, then with FedRecon+Finetune the global weights fine-tuned there too); then the Keras metrics are
updated with the model's inference-mode predictions on every batch of the scored part (`EvalPlan.scores`; the
whole dataset when None). The local weights start from the model's initial values (``'initial'``), from the
default the server learned (``'learned'``, after the global trainable weights) or from the client's private state
(``'kept'``, FURL's evaluation).

Backends run the same plan: `build_client_eval_fn` here (one TF function per client, which
`fedpersonal.evaluation` maps over TFF's CLIENTS) and the grouped engine (`fedpersonal.simulation.evaluation`).

Example:

>>> import tensorflow_federated as tff
>>> sgd = tff.learning.optimizers.build_sgdm(0.1)
>>> split = DataSplit(('support', 'query'), lambda dataset: (dataset, dataset))
>>> plan = EvalPlan((Phase(('local',), 1, sgd, data='support', reports_metrics=False),), split, scores='query')
>>> plan.trains(client_plan.LOCAL), plan.trains(client_plan.GLOBAL)
(True, False)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core.client_plan import DataSplit
from fedpersonal.core.client_plan import Phase

_TRAINED_PARTS = (client_plan.GLOBAL, client_plan.LOCAL)


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """A client's evaluation: its training phases in order (none for StandardEval), the split they read, the part
    scored and where the local weights start.

    Attributes:
      phases: `Phase`s training ``'global'`` and/or ``'local'`` weights on a part of `split` (`Phase.data`), with
        the model's Keras loss and no penalty, reporting no metrics.
      split: Divides each client's dataset into the parts the phases and the scoring read; None: the whole dataset.
      scores: The part of `split` whose batches the metrics are computed on; None: the whole dataset.
      local_start: ``'initial'``, ``'learned'`` or ``'kept'`` (`fedpersonal.core.client_plan.LOCAL_STARTS`).
    """

    phases: tuple[Phase, ...] = ()
    split: DataSplit | None = None
    scores: str | None = None
    local_start: str = client_plan.INITIAL

    def __post_init__(self):
        if self.local_start not in client_plan.LOCAL_STARTS:
            raise ValueError(
                f'EvalPlan.local_start must be one of {client_plan.LOCAL_STARTS}, got {self.local_start!r}.'
            )
        names = self.split.names if self.split is not None else ()
        for phase in self.phases:
            if not set(phase.trains) <= set(_TRAINED_PARTS) or phase.loss is not None:
                raise ValueError(f'An evaluation phase trains global and/or local weights, got {phase.trains!r}.')
            if phase.penalty is not None or phase.step is not None or phase.reports_metrics:
                raise ValueError('An evaluation phase takes no penalty or step kind and reports no metrics.')
            if phase.data is not None and phase.data not in names:
                raise ValueError(f"Phase.data {phase.data!r} is not a part of the evaluation's split {self.split}.")
        if self.scores is not None and self.scores not in names:
            raise ValueError(f"EvalPlan.scores {self.scores!r} is not a part of the evaluation's split {self.split}.")

    def trains(self, part: str) -> bool:
        """Whether a phase trains the weights of `part` (``'global'`` or ``'local'``)."""
        return any(part in phase.trains for phase in self.phases)


def build_client_eval_fn(
    plan: EvalPlan,
    model_fn: Callable[[], Any],
    *,
    loss_fn: client_work.LossFn,
    metrics_fn: client_work.MetricsFn | None,
    metric_finalizers: collections.OrderedDict,
) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """The plan as one client's `tf.function` ``(server weights, dataset, private state or None) -> (unfinalized
    metrics, finalized metrics)``, the per-client backend; builds its model (one `model_fn` call) when traced and
    fills `metric_finalizers` then.

    The server weights are the global ones, followed in the trainable ones by the learned local default with
    ``local_start='learned'``; a private state (``'kept'``) replaces the model's local weights.
    """

    @tf.function
    def client_eval_fn(server_weights, dataset, private_state):
        with tf.init_scope():
            model = client_work.construct(model_fn)
            metrics = client_work.build_metrics(metrics_fn, loss_fn, metric_finalizers)
            loss = client_work.construct(loss_fn)
            parts = {
                client_plan.GLOBAL: list(model.global_trainable_variables),
                client_plan.LOCAL: list(model.local_trainable_variables),
            }
            trained = [[v for part in _TRAINED_PARTS if part in p.trains for v in parts[part]] for p in plan.phases]
            optimizers = [client_work.prepare_optimizer(p.optimizer, v) for p, v in zip(plan.phases, trained)]

        num_global = len(parts[client_plan.GLOBAL])
        client_work.assign(parts[client_plan.GLOBAL], server_weights.trainable[:num_global])
        client_work.assign(model.global_non_trainable_variables, server_weights.non_trainable)
        if plan.local_start == client_plan.LEARNED:
            client_work.assign(parts[client_plan.LOCAL], server_weights.trainable[num_global:])
        if private_state is not None:
            client_work.assign_weights(client_work.local_weights(model), private_state)

        split_parts = plan.split.dataset_fn(dataset) if plan.split is not None else ()
        part_of = lambda name: dataset if name is None else split_parts[plan.split.names.index(name)]  # type: ignore[union-attr]
        for phase, variables, optimizer in zip(plan.phases, trained, optimizers):
            batch_loss = client_work.model_batch_loss(model, loss)
            client_work.optimizer_steps(variables, part_of(phase.data), optimizer, batch_loss, epochs=phase.epochs)
        client_work.evaluate_batches(model, part_of(plan.scores), metrics)
        unfinalized = client_work.read_metrics(metrics)
        finalized = collections.OrderedDict(
            (name, tf.cast(metric_finalizers[name](value), tf.float32)) for name, value in unfinalized.items()
        )
        return unfinalized, finalized

    return client_eval_fn
