"""Federated evaluation on the fast simulation engine: many clients' evaluation as compiled groups.

`GroupEvaluation` is the engine's backend of a client evaluation plan (`fedpersonal.core.eval_plan.EvalPlan`), the
plan the per-client TFF computations of `fedpersonal.evaluation` (`build_recon_eval`, `build_standard_eval`,
`build_private_state_eval`) run with `eval_plan.build_client_eval_fn`; same inputs and outputs:

1. each client's data is packed once per cache key (`plan_engine.split_packer`): every part of the plan's split
   that a phase or the scoring reads (ReconEval's support set with its reconstruction epochs and step cap, its
   query set in one plain pass), as the per-client backend iterates them, else the whole dataset;
2. a group's clients start from the server's global weights and their local weights: a learned or seeded
   initial default, or each client's own private state (`EvalPlan.local_start`);
3. the plan's phases train their weights on their parts (`lockstep.lockstep_steps`, the clients in lockstep,
   XLA where it pays): ReconEval's reconstruction of the locals, FedRecon+Finetune's globals;
4. every scored batch's inference-mode predictions, vectorized over the group (one model call when no client
   has weights of its own);
5. each client's Keras metrics are updated with its own batches, as `client_work.evaluate_batches` updates
   them, in a compiled loop over the group's clients: per-client unfinalized values (summed over clients and
   finalized, `tff.learning.metrics.sum_then_finalize`) and finalized values (the per-client distribution).

Why: with the engine's training rounds 10-200x cheaper, the per-client TFF evaluation (~5-10 ms a client)
became most of an experiment's time (e.g. FURL's evaluation of all 2,380 ASSISTments students).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import progress
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import eval_plan
from fedpersonal.models import partially_local_model
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options
from fedpersonal.simulation import packing
from fedpersonal.simulation import plan_engine

PREDICTIONS_BUDGET_BYTES = 1 << 30  # Per group: its query predictions, float32, with 2 more copies in the loss.
EXAMPLES_PER_CALL = 512  # Per model call: bounds its activations' memory (a CNN's are many times its input).


class GroupEvaluation:
    """Evaluates many clients as compiled groups; called like the per-client evaluation computation.

    Build it through `fedpersonal.evaluation.build_recon_eval` / `build_standard_eval` /
    `build_private_state_eval` (on the engine, the default of `fedpersonal.backends.use`).

    Args:
      plan: The client evaluation (`fedpersonal.core.eval_plan.EvalPlan`), as the per-client backend runs it
        (`eval_plan.build_client_eval_fn`).
      model_fn: No-arg function returning the `ReconstructionModel` (as for the per-client computations).
      loss_fn: The loss (the plan's phases, and the reported `loss` metric).
      metrics_fn: The Keras metrics (`loss` and `num_examples` are added).
      per_client_sample_size: The most clients whose own metrics are returned (a seeded uniform sample beyond).
      group_size: The most clients per compiled group (default: within the engine's memory budget).
      cache_bytes: The bound of the packer's client cache (`packing.ClientPacker`; None: the machine's default).
    """

    def __init__(
        self,
        plan: eval_plan.EvalPlan,
        model_fn: Callable[[], Any],
        *,
        loss_fn: Callable[[], tf.keras.losses.Loss],
        metrics_fn: Callable[[], list[tf.keras.metrics.Metric]] | None,
        per_client_sample_size: int,
        group_size: int | None = None,
        cache_bytes: int | None = None,
    ):
        for phase in plan.phases:
            lockstep.check_optimizer(phase.optimizer, f"the evaluation's {'/'.join(phase.trains)} optimizer")
        self._model = model = functional.FunctionalModel(model_fn)
        initial = model.initial_weights
        self._num_global = len(initial.global_trainable)
        self._with_private_states = plan.local_start == client_plan.KEPT
        self._per_client_sample_size = per_client_sample_size
        slots = {
            client_plan.GLOBAL: [(functional.GLOBAL_TRAINABLE, i) for i in range(self._num_global)],
            client_plan.LOCAL: [(functional.LOCAL_TRAINABLE, i) for i in range(len(initial.local_trainable))],
        }
        per_client: list[np.ndarray] = []
        if plan.phases or self._with_private_states:
            per_client += list(initial.local_trainable) + list(initial.local_non_trainable)
        if plan.trains(client_plan.GLOBAL):
            per_client += list(initial.global_trainable)
        # Each distinct (part, passes) the plan reads is packed once, e.g. FedRecon+Finetune's support set.
        uses = list(dict.fromkeys([(p.data, p.epochs) for p in plan.phases] + [(plan.scores, 1)]))
        names = tuple(f'{data or "dataset"}_x{epochs}' for data, epochs in uses)
        phase_names = [names[uses.index((p.data, p.epochs))] for p in plan.phases]
        self._scored = scored = names[uses.index((plan.scores, 1))]
        element_spec = model.input_spec  # From the functional model's model_fn call (None: a plain Keras model).
        if element_spec is None:
            with tf.Graph().as_default():
                element_spec = model_fn().input_spec
        self._packer = plan_engine.split_packer(
            plan.split,
            uses,
            names,
            element_spec,
            group_size or options.default_group_size(per_client),
            cache_bytes=cache_bytes,
        )
        self._finalize = driver.KerasMetricsFinalizer(
            lambda: client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())
        )
        loss = loss_fn()

        @tf.function(jit_compile=model.xla)
        def predict(received, non_trainable, group, local_trainable, local_non_trainable):
            """The plan's phases, then every scored batch's predictions and batch loss."""
            weights = functional.Parts(
                received[: self._num_global], non_trainable, local_trainable, local_non_trainable
            )
            for phase, name in zip(plan.phases, phase_names):
                trained = [
                    s for part in (client_plan.GLOBAL, client_plan.LOCAL) if part in phase.trains for s in slots[part]
                ]
                weights, _ = lockstep.lockstep_steps(model, weights, trained, group[name], phase.optimizer, loss)
            return _query_predictions(model, weights, group[scored], loss)

        self._metrics: list[tf.keras.metrics.Metric] = []  # Built eagerly before the first call (`__call__`).
        self._build_metrics = lambda: client_work.build_metrics(metrics_fn, loss_fn, collections.OrderedDict())

        @tf.function
        def group_eval(received, non_trainable, group, local_trainable, local_non_trainable, num_real):
            metrics = self._metrics
            predictions, batch_loss = predict(received, non_trainable, group, local_trainable, local_non_trainable)
            query = group[scored]
            labels = partially_local_model.split_batch(query['batch'])[1]
            return _per_client_metrics(metrics, loss, labels, predictions, query['mask'], batch_loss, num_real)

        self._group_eval = group_eval
        self._output_elements = _output_elements(model.template)
        self._initial_local = functional.Parts([], [], list(initial.local_trainable), list(initial.local_non_trainable))

    def _group_size_within_budget(self, groups: Sequence[Any]) -> int:
        """The largest group size whose query predictions (and the loss's copies of them, 3 in all) fit the
        memory budget, e.g. a next-word model's ``[examples, length, vocabulary]`` logits."""
        mask = groups[0][self._scored]['mask']  # [clients, steps, batch]
        per_client = 3 * 4 * int(np.prod(mask.shape[1:])) * self._output_elements
        return int(max(1, min(self._packer.group_size, PREDICTIONS_BUDGET_BYTES // max(per_client, 1))))

    def __call__(
        self,
        server_weights: Any,
        client_datasets: Sequence[tf.data.Dataset],
        private_states: Sequence[Any] | None = None,
        *,
        client_ids: Sequence[str] | None = None,
    ) -> collections.OrderedDict:
        """``OrderedDict(eval=aggregate metrics, per_client=each client's metrics)``, as the TFF computation.

        Args:
          server_weights: The server's weights (`tff.learning.models.ModelWeights`: globals, then learned local
            defaults with ``learn_local_init``).
          client_datasets: The clients' batched datasets; with `client_ids`, a sequence indexed only for clients
            not packed before (so it may build each pipeline lazily).
          private_states: With private-state evaluation: each client's private state (`ModelWeights`).
          client_ids: Optional cache keys of the clients' data, one per dataset: a key's data is packed once
            (its dataset must then yield the same batches every time; use a different key for another split).
        """
        if not client_datasets:
            raise ValueError('Evaluation needs at least one client dataset.')
        if self._with_private_states != (private_states is not None):
            raise ValueError('Pass private_states exactly when the evaluation was built for private states.')
        if private_states is not None and len(private_states) != len(client_datasets):
            raise ValueError(f'{len(private_states)} private states for {len(client_datasets)} datasets.')
        if not self._metrics:
            self._metrics = self._build_metrics()
        n = len(client_datasets)
        groups = self._packer.pack(client_datasets, client_ids, description='evaluation: reading clients')
        fitting = self._group_size_within_budget(groups)
        if fitting < self._packer.group_size:  # Repacked from the cache; later calls keep the smaller groups.
            self._packer.group_size = fitting
            groups = self._packer.pack(client_datasets, client_ids)
        received = [tf.convert_to_tensor(w) for w in server_weights.trainable]
        non_trainable = [tf.convert_to_tensor(w) for w in server_weights.non_trainable]
        if self._with_private_states:
            assert private_states is not None
            locals_per_group = [
                (list(s.trainable), list(s.non_trainable))
                for s in packing.stack_per_group(groups, [_as_model_weights(p) for p in private_states])
            ]
        else:
            local_trainable = (
                received[self._num_global :]
                if len(received) > self._num_global
                else [tf.constant(v) for v in self._initial_local.local_trainable]
            )
            local_non_trainable = [tf.constant(v) for v in self._initial_local.local_non_trainable]
            locals_per_group = [(local_trainable, local_non_trainable)] * len(groups)
        unfinalized: list[Any] = []
        finalized: list[Any] = []
        start = 0
        for group, (local_trainable, local_non_trainable) in progress.logged(
            zip(groups, locals_per_group), len(groups), f'evaluation: groups of {self._packer.group_size} clients'
        ):
            size = packing.group_clients(group)
            real = min(size, n - start)
            start += size
            group = packing.as_tensors(group)
            unf, fin = self._group_eval(
                received, non_trainable, group, local_trainable, local_non_trainable, tf.constant(real)
            )
            unfinalized.append(unf)
            finalized.append(fin)
        sums = tf.nest.map_structure(lambda *parts: tf.add_n([tf.reduce_sum(p, axis=0) for p in parts]), *unfinalized)
        per_client = collections.OrderedDict(
            (name, np.concatenate([np.asarray(f[name]) for f in finalized])) for name in finalized[0]
        )
        if n > self._per_client_sample_size:
            keep = np.sort(np.random.default_rng(0).choice(n, self._per_client_sample_size, replace=False))
            per_client = collections.OrderedDict((k, v[keep]) for k, v in per_client.items())
        return collections.OrderedDict(eval=self._finalize(sums), per_client=per_client)


def _output_elements(template: Any) -> int:
    """Scalars of the model's output per example (unknown dimensions counted as 1)."""
    keras_models = [p for p in functional.keras_parts(template) if isinstance(p, tf.keras.Model)]
    if not keras_models:
        return 1
    shapes = keras_models[0].output_shape
    shapes = shapes if isinstance(shapes, list) else [shapes]
    return sum(int(np.prod([d or 1 for d in shape[1:]])) for shape in shapes)


def _as_model_weights(state: Any) -> tff.learning.models.ModelWeights:
    if isinstance(state, tff.learning.models.ModelWeights):
        return state
    return tff.learning.models.ModelWeights(trainable=list(state[0]), non_trainable=list(state[1]))


def _flatten_examples(t: tf.Tensor, leading: int) -> tf.Tensor:
    """Merges the first `leading` axes of `t` into one."""
    inner = t.shape[leading:]
    shape = [-1] + inner.as_list() if inner.is_fully_defined() else tf.concat([[-1], tf.shape(t)[leading:]], 0)
    return tf.reshape(t, shape)


def _steps_per_call(mask: tf.Tensor) -> int | None:
    """Each client's steps per model call so that one call sees at most `EXAMPLES_PER_CALL` examples (halving the
    padded steps, a power of two, so that it divides them); None: every step in one call (or shapes unknown)."""
    clients, steps, batch = mask.shape
    if None in (clients, steps, batch):
        return None
    k = steps
    while k > 1 and k % 2 == 0 and clients * k * batch > EXAMPLES_PER_CALL:
        k //= 2
    return k if k < steps else None


def _query_predictions(model: functional.FunctionalModel, weights: functional.Parts, query: Any, loss: Any):
    """Inference-mode predictions ``[clients, steps, batch, ...]`` of every query batch and each batch's mean loss
    over its real examples ``[clients, steps]``; the model called on at most `EXAMPLES_PER_CALL` examples at once
    (its activations, e.g. a CNN's, take many times its input's memory), a loop over chunks of steps beyond."""
    x, y = partially_local_model.split_batch(query['batch'])
    mask = query['mask']
    clients, steps, batch = tf.shape(mask)[0], tf.shape(mask)[1], tf.shape(mask)[2]
    base = model.initial_weights
    slots = [(g, i) for g in range(4) for i in range(len(base[g]))]
    own = [s for s in slots if lockstep.is_per_client(weights[s[0]][s[1]], base[s[0]][s[1]])]

    def predict(x: Any) -> Any:  # [clients, k, batch, ...] inputs -> predictions.
        k = tf.shape(tf.nest.flatten(x)[0])[1]
        if not own:  # Every client has the same weights: one call on all examples.
            flat_x = tf.nest.map_structure(lambda t: _flatten_examples(t, 3), x)
            unflatten = lambda t: tf.reshape(t, tf.concat([[clients, k, batch], tf.shape(t)[1:]], 0))
            return tf.nest.map_structure(unflatten, model.apply(weights, flat_x, training=False)[0])

        def client_predictions(args):
            values, client_x = args
            groups = [list(g) for g in weights]
            for (g, i), v in zip(own, values):
                groups[g][i] = v
            flat_x = tf.nest.map_structure(lambda t: _flatten_examples(t, 2), client_x)
            out = model.apply(functional.Parts(*groups), flat_x, training=False)[0]
            return tf.nest.map_structure(lambda t: tf.reshape(t, tf.concat([[k, batch], tf.shape(t)[1:]], 0)), out)

        return lockstep.for_each_client(
            client_predictions,
            ([weights[g][i] for g, i in own], x),
            vectorize=getattr(model, 'vectorizes', True),
            pfor_loops=model.pfor_loops,
        )

    per_call = _steps_per_call(mask)
    if per_call is None:
        predictions = predict(x)
    else:
        chunks = mask.shape[1] // per_call

        def split(t: tf.Tensor) -> tf.Tensor:  # [clients, steps, ...] -> [chunks, clients, per_call, ...]
            t = tf.reshape(t, [t.shape[0], chunks, per_call, *t.shape[2:]])
            return tf.transpose(t, [1, 0, *range(2, t.shape.rank)])

        def join(t: tf.Tensor) -> tf.Tensor:  # The inverse of `split`.
            t = tf.transpose(t, [1, 0, *range(2, t.shape.rank)])
            return tf.reshape(t, tf.concat([[clients, steps], tf.shape(t)[3:]], 0))

        parts = tf.nest.map_structure(split, x)
        first = predict(tf.nest.map_structure(lambda t: t[0], parts))  # Outside the loop: the outputs' types.
        rest = tf.map_fn(
            predict,
            tf.nest.map_structure(lambda t: t[1:], parts),
            fn_output_signature=tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), first),
            parallel_iterations=1,
        )
        predictions = tf.nest.map_structure(lambda a, b: join(tf.concat([a[None], b], 0)), first, rest)
    flat = lambda t: _flatten_examples(t, 2)
    batch_loss = tf.reshape(
        lockstep.batch_mean_loss(
            loss,
            tf.nest.map_structure(flat, y),
            tf.nest.map_structure(flat, predictions),
            tf.reshape(mask, [-1, batch]),
        ),
        [clients, steps],
    )
    return predictions, batch_loss


def _per_client_metrics(metrics, loss, labels, predictions, mask, batch_loss, num_real):
    """Each real client's unfinalized and finalized metrics (``[clients, ...]`` each), its metrics updated with its
    own batches as `client_work.evaluate_batches` updates them (one value per batch for a loss metric)."""
    variables = [v for m in metrics for v in m.variables]
    unfinalized0 = [tf.TensorArray(v.dtype, size=num_real, element_shape=v.shape) for v in variables]
    finalized0 = [tf.TensorArray(tf.float32, size=num_real) for _ in metrics]

    def body(c, unfinalized, finalized):
        for metric in metrics:
            metric.reset_state()
        client = lambda t: lockstep.at(t, c)
        lockstep.update_metrics(
            metrics,
            tf.nest.map_structure(client, labels),
            tf.nest.map_structure(client, predictions),
            lockstep.at(mask, c),
            loss,
            lockstep.at(batch_loss, c),
        )
        unfinalized = [a.write(c, v.read_value()) for a, v in zip(unfinalized, variables)]
        finalized = [a.write(c, tf.cast(m.result(), tf.float32)) for a, m in zip(finalized, metrics)]
        return c + 1, unfinalized, finalized

    _, unfinalized, finalized = tf.while_loop(
        lambda c, *_: c < num_real, body, (tf.constant(0), unfinalized0, finalized0)
    )
    stacked = iter([a.stack() for a in unfinalized])
    unfinalized_by_name = collections.OrderedDict((m.name, [next(stacked) for _ in m.variables]) for m in metrics)
    finalized_by_name = collections.OrderedDict((m.name, a.stack()) for m, a in zip(metrics, finalized))
    return unfinalized_by_name, finalized_by_name
