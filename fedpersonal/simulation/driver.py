"""A round of an engine process with its groups' client work compiled by XLA in the driver's TF runtime.

Why not inside TFF's runtime: TFF 0.87 executes every computation in its C++ `worker_binary`, which has no
XLA JIT (measured: a ``jit_compile=True`` function runs there at its uncompiled speed). The engine's group
computation loses most of its speed without XLA (docs/RESULTS.md, "Fast simulation"), so `GroupRoundRunner`
runs the round as TFF's computation would, step for step, with TFF's own pieces:

1. the broadcast is the identity (the engine accepts only TFF's default broadcast);
2. each group's client work is the *same* `tf.function` that `process.next` maps over CLIENTS, run here;
3. the groups' `ClientResult`s are combined as TFF's `MeanFactory` combines client slots
   (``sum(weight * update) / sum(weight)``, `tf.math.divide` as in TFF), or, for any other aggregator the
   engine supports (a fixed-clip DP aggregator: `simulation.group`), by that aggregator's own TFF
   `AggregationProcess` (``aggregation``), called on the groups' results as `process.next` calls it;
4. the server step is TFF's apply-optimizer finalizer logic: the TFF optimizer's `next`, and
   `reject_non_finite_update` keeping the previous weights and optimizer state on a non-finite update;
5. the clients' unfinalized metrics are summed and finalized with the recorded Keras finalizers
   (`tff.learning.metrics.sum_then_finalize`).

With ``measure_communication=True`` the round's metrics also carry what
`fedpersonal.metrics.communication`'s measured broadcast and `MeasuredAggregationFactory` report on the
per-client path, under the same keys: ``metrics['distributor']`` = (``scalars_down_per_client``,
``bytes_down_per_client``, ``clients``) and ``metrics['aggregator']`` = (``scalars_up_per_client``,
``bytes_up_per_client``, ``inner``), computed from the tensors each logical client receives (the broadcast
server weights) and sends (its update, shaped as the group's update, plus its aggregation weight), with
``clients`` the round's real logical clients (padding slots excluded). The engine refuses the measured parts
themselves: in its TFF computation a client slot is a group, so they would count groups.

`process.next` stays the full TFF computation (placements, the privacy audit, other runtimes); the tests check
that `process.run_round` (this runner) and `process.next` give the same state and metrics.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import queue
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal.core import process as process_lib
from fedpersonal.core import server_table
from fedpersonal.core.compose import apply_update as apply_update
from fedpersonal.simulation import packing
from fedpersonal.simulation.packing import group_clients as group_clients
from fedpersonal.simulation.packing import stack_per_group as stack_per_group
from fedpersonal.simulation.packing import unstack as unstack


class KerasMetricsFinalizer:
    """`tff.learning.metrics.sum_then_finalize`'s finalization of summed Keras metric variables, run eagerly.

    TFF's Keras finalizers build a metric inside a `tf.function` on every trace, which only works in a TFF
    computation's graph; here one set of metrics (from `build_metrics`) is kept, and one `tf.function` (traced
    once) sets its variables and returns every result: one call per round instead of an eager op per variable.
    """

    def __init__(
        self,
        build_metrics: Callable[[], Sequence[tf.keras.metrics.Metric] | Mapping[str, tf.keras.metrics.Metric]],
    ):
        self._build_metrics = build_metrics
        self._finalize: Callable[[Any], Any] | None = None

    def __call__(self, unfinalized: Any) -> collections.OrderedDict:
        if self._finalize is None:
            built = self._build_metrics()  # Metrics (keyed by name), or a mapping from the key they are reported as.
            named = list(built.items()) if isinstance(built, Mapping) else [(m.name, m) for m in built]

            @tf.function
            def finalize(unfinalized):
                finalized = collections.OrderedDict()
                for key, metric in named:
                    for variable, value in zip(metric.variables, unfinalized[key]):
                        variable.assign(value)
                    finalized[key] = metric.result()
                return finalized

            self._finalize = finalize
        return collections.OrderedDict((k, v.numpy()) for k, v in self._finalize(unfinalized).items())


def _as_tensors(weights: Any) -> tff.learning.models.ModelWeights:
    """Model weights (numpy, as the server state holds them) as tensors, as the group programs take them."""
    return tff.learning.models.ModelWeights(
        trainable=[tf.convert_to_tensor(w) for w in weights.trainable],
        non_trainable=[tf.convert_to_tensor(w) for w in weights.non_trainable],
    )


def finalize_ratios(sums: Any) -> collections.OrderedDict:
    """`fedpersonal.core.compose.ratio_metrics`' finalization of summed ``[numerator, denominator]`` pairs."""
    return collections.OrderedDict(
        (k, process_lib.as_numpy(v[0] if k == 'num_examples' else v[0] / tf.maximum(v[1], 1.0)))
        for k, v in sums.items()
    )


class GroupRoundRunner:
    """Runs one round of a stateless engine process from its group client work and server optimizer.

    Args:
      group_work: ``(ModelWeights, group) -> (ClientResult, unfinalized metrics)``, a `tf.function` (the
        function the process's TFF client computation wraps), or several such functions by name: strategies
        that compute the same (e.g. `fedpersonal.simulation.client_loop.STRATEGIES`). A name may map to a list of
        independent copies (one per part of a split run): the parts of a group run at once, and a work's Keras
        metrics are variables that one call resets, updates and reads, so two parts never share a copy.
      server_optimizer: The process's TFF server optimizer.
      finalize_metrics: The clients' summed unfinalized metrics -> the round's metrics (e.g.
        `KerasMetricsFinalizer`).
      measure_communication: Also report each logical client's download and upload as the per-client path's
        measured broadcast and aggregator do (`metrics['distributor']`, `metrics['aggregator']`; see above).
      aggregation: The process's weighted `tff.templates.AggregationProcess` of the groups' updates when it is not
        a plain weighted mean (its state is the process state's ``aggregator``); None: `MeanFactory`'s mean.
      runs: The ways a round may run, ``(group work name, parts)``: the work on each group whole (1 part), or on
        each group's clients split into that many parts run at once, one program per core (each program then
        runs on one core: e.g. a compiled loop over clients; never with an `aggregation`, whose DP noise and
        denominator depend on the number of groups). Several: the fastest on the first rounds runs the rest
        (`StrategyChoice`; not bit-reproducible). Default: each group work whole.
      table: The group work uploads rows (`fedpersonal.core.server_table.Rows`: a plan with a server table), which
        replace the server's weights in the clients' order (`server_table.from_rows`); no mean, no optimizer.
    """

    worker_program = 'groups'  # What engine workers run of it (`fedpersonal.runtime.worker_actor`).

    def __init__(
        self,
        group_work: tf.types.experimental.GenericFunction,
        server_optimizer: tff.learning.optimizers.Optimizer,
        finalize_metrics: Callable[[Any], Any],
        measure_communication: bool = False,
        aggregation: tff.templates.AggregationProcess | None = None,
        runs: Sequence[tuple[str, int]] | None = None,
        table: bool = False,
    ):
        self._table = table
        works = dict(group_work) if isinstance(group_work, Mapping) else {'': group_work}
        copies = {name: list(w) if isinstance(w, Sequence) else [w] for name, w in works.items()}
        self._works = {name: w[0] for name, w in copies.items()}
        runs = list(runs) if runs is not None else [(name, 1) for name in works]
        if aggregation is not None and any(k > 1 for _, k in runs):
            raise ValueError('A group is split into parts only with the mean aggregator.')
        for name, k in runs:
            if k > len(copies[name]):
                raise ValueError(
                    f'A run of {name!r} in {k} parts needs {k} copies of its group work, got {len(copies[name])}.'
                )
        self._free: dict[str, queue.SimpleQueue] = {name: queue.SimpleQueue() for name in copies}
        for name, w in copies.items():
            for work in w:
                self._free[name].put(work)
        self._copies = copies
        self._runs = {run_name(name, k): (name, k) for name, k in runs}
        self.choice = StrategyChoice(list(self._runs))
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._aggregation = aggregation
        if aggregation is not None and measure_communication:
            raise ValueError('measure_communication is only supported with the mean aggregator.')
        self._finalize_metrics = finalize_metrics
        self._measure_communication = measure_communication
        self.compile_seconds: float | None = None

        # One definition of the server's arithmetic; compiled as the round (`server_step`), a worker's share
        # (`weighted_sum`), the merged shares (`mean_step`) and an aggregation process's result (`apply`) need it.
        def apply(optimizer_state, trainable, update):
            return apply_update(server_optimizer, optimizer_state, trainable, update)

        def weighted_sum(updates, weights):
            total = [tf.add_n([u[k] * w for u, w in zip(updates, weights)]) for k in range(len(updates[0]))]
            return total, tf.add_n(weights)

        def mean_step(optimizer_state, trainable, update_sum, weight):
            return apply(optimizer_state, trainable, [u / weight for u in update_sum])

        def server_step(optimizer_state, trainable, updates, weights):
            return mean_step(optimizer_state, trainable, *weighted_sum(updates, weights))

        compiled = functools.partial(tf.function, jit_compile=True)
        self._server_step, self._weighted_sum = compiled(server_step), compiled(weighted_sum)
        self._mean_step, self._apply_update = compiled(mean_step), compiled(apply)

    @staticmethod
    def merge(a: dict, b: dict) -> dict:
        """Two shares' partial aggregates as one (the module's `merge`)."""
        return merge(a, b)

    @property
    def strategy(self) -> str | None:
        """The run that runs the rounds (`run_name`), None while several are still being measured."""
        return self.choice.chosen

    @property
    def traces(self) -> int:
        """How often a group work has been traced (the most of any strategy): once per experiment, as groups are
        padded to fixed shapes."""
        return max(work.experimental_get_tracing_count() for w in self._copies.values() for work in w)

    def __call__(
        self,
        state: Any,
        groups: Sequence[Any],
        private_states: Sequence[Any] | None = None,
        *,
        num_clients: int | None = None,
    ) -> process_lib.ProcessOutput:
        """The round's output; a stateful process's private states go in and come out one per logical client.

        `num_clients` (the round's real logical clients) is only read by the communication measurement; without
        it the count is that of the private states, else inferred from the packed groups (`_real_clients`).
        """
        stacked = stack_per_group(groups, private_states) if private_states is not None else None
        model_weights = _as_tensors(state.global_model_weights)
        results, metric_sums, new_private = [], None, []
        strategy = self.choice.next()
        (name, parts), started = self._runs[strategy], time.perf_counter()
        pieces, private_pieces, order = [], [], []
        for g, group in enumerate(groups):
            split: list[tuple[Any, np.ndarray | None]] = [(group, None)]
            if parts > 1:
                split = list(packing.split_group(group, parts))
            pieces += [piece for piece, _ in split]
            offset = sum(group_clients(previous) for previous in groups[:g])
            order += [offset + (np.arange(group_clients(piece)) if i is None else i) for piece, i in split]
            if stacked is not None:
                take = lambda a, i: a if i is None else np.take(np.asarray(a), i, axis=0)
                private_pieces += [tf.nest.map_structure(lambda a, i=i: take(a, i), stacked[g]) for _, i in split]

        def run(k: int) -> Any:
            args = (model_weights, packing.as_tensors(pieces[k]))
            work = self._free[name].get()  # A copy no other part is running.
            try:
                return work(*args) if stacked is None else work(*args, private_pieces[k])
            finally:
                self._free[name].put(work)

        if len(pieces) > 1 and parts > 1:
            self._pool = self._pool or concurrent.futures.ThreadPoolExecutor(parts)
            outputs = list(self._pool.map(run, range(len(pieces))))
        else:
            outputs = [run(k) for k in range(len(pieces))]
        by_slot: dict[int, Any] = {}
        rows_by_slot: dict[int, Any] = {}
        for piece, slots, (result, metrics, *private) in zip(pieces, order, outputs):
            if stacked is not None:
                by_slot.update(zip(slots.tolist(), unstack(private[0], group_clients(piece))))
            if self._table:
                rows_by_slot.update(zip(slots.tolist(), unstack(result, group_clients(piece))))
            results.append(result)
            metric_sums = metrics if metric_sums is None else tf.nest.map_structure(tf.add, metric_sums, metrics)
        new_private = [by_slot[k] for k in sorted(by_slot)]
        self.choice.record(strategy, time.perf_counter() - started)
        if self._table:
            assert private_states is not None  # A table's plan is stateful.
            rows = [rows_by_slot[k] for k in sorted(rows_by_slot)][: len(private_states)]
            return self._table_output(state, rows, metric_sums, new_private[: len(private_states)])
        if self._aggregation is None:
            server = self._server_step(
                state.finalizer,
                list(model_weights.trainable),
                [list(r.update) for r in results],
                [tf.cast(r.update_weight, tf.float32) for r in results],
            )
            aggregated = (state.aggregator, _MEAN_METRICS, *server)
        else:
            aggregated = self._aggregate(state, model_weights, [(r.update, r.update_weight) for r in results])
        if num_clients is None and self._measure_communication:
            num_clients = len(private_states) if private_states is not None else _real_clients(groups)
        private = new_private[: len(private_states)] if private_states is not None else None
        return self._output(state, model_weights, aggregated, metric_sums, results[0].update, num_clients, private)

    def share(self, weights: Any, groups: Sequence[Any], private_states: Sequence[Any] | None = None) -> dict:
        """One worker's share of a round (`fedpersonal.runtime.engine_workers`): its groups' work, summed.

        The same group work as a local round, on whole groups; what the worker sends back is a partial aggregate
        that `merge` combines with the other shares' and `finish` turns into the round's output.

        Args:
          weights: The round's global `ModelWeights` (as the server broadcasts them).
          groups: This share's packed groups.
          private_states: A stateful process's private states of this share's clients (in client order).

        Returns:
          ``{'update': [sum_g w_g * u_g per trainable tensor], 'weight': sum_g w_g, 'metrics': the summed
          unfinalized metrics}`` (numpy; with an `aggregation`, ``'results'``: every group's ``(u_g, w_g)`` in
          order, instead of the two sums), and ``'private'``: the new private states of this share's clients
          (None for a stateless process), which go to the driver's client store only.
        """
        stacked = stack_per_group(groups, private_states) if private_states is not None else None
        model_weights = _as_tensors(weights)
        name, _ = self._runs[self.choice.next()]
        started, metric_sums, outputs, private = time.perf_counter(), None, [], []
        for g, group in enumerate(groups):
            args = (model_weights, packing.as_tensors(group))
            result, metrics, *new = (
                self._works[name](*args) if stacked is None else self._works[name](*args, stacked[g])
            )
            metric_sums = metrics if metric_sums is None else tf.nest.map_structure(tf.add, metric_sums, metrics)
            if stacked is not None:
                private += unstack(new[0], group_clients(group))
            if self._table:
                outputs += unstack(result, group_clients(group))
            else:
                outputs.append((list(result.update), tf.cast(result.update_weight, tf.float32)))
        self.choice.record(self.choice.next(), time.perf_counter() - started)
        partial: dict[str, Any] = {'metrics': process_lib.as_numpy(metric_sums)}
        if self._table:
            partial['rows'] = outputs[: len(private_states)] if private_states is not None else outputs
        elif self._aggregation is not None:
            partial['results'] = [(process_lib.as_numpy(u), np.float32(process_lib.as_numpy(w))) for u, w in outputs]
        else:  # Summed in one compiled program, as the local round's server step sums the groups.
            update, weight = self._weighted_sum([u for u, _ in outputs], [w for _, w in outputs])
            partial['update'], partial['weight'] = (
                process_lib.as_numpy(update),
                np.float32(process_lib.as_numpy(weight)),
            )
        partial['private'] = private[: len(private_states)] if private_states is not None else None
        return partial

    def audit_share(self, weights: Any, group: Any, private_states: Sequence[Any]) -> list:
        """The privacy audit (`fedpersonal.privacy.audit.audit_tf_function`) of the group program a share runs,
        traced on `group`: its private-state input labelled private, its update, weight and metrics (what goes
        to the merge) checked; a stateful process's new private states go only to the clients' store."""
        from fedpersonal.privacy import audit  # pylint: disable=g-import-not-at-top

        name, _ = self._runs[self.choice.next()]
        model_weights = _as_tensors(weights)
        args = (model_weights, packing.as_tensors(group), stack_per_group([group], private_states)[0])
        concrete = self._works[name].get_concrete_function(*args)
        first = len(tf.nest.flatten(args[:2]))
        private_inputs = concrete.inputs[first : first + len(tf.nest.flatten(args[2]))]
        result, metrics, _ = concrete.structured_outputs
        return audit.audit_tf_function(concrete, private_inputs, (result, metrics))

    def finish(
        self, state: Any, partial: dict, private_states: Sequence[Any] | None, *, num_clients: int
    ) -> process_lib.ProcessOutput:
        """The round's output from every share's merged partial aggregate (`share`, `merge`): the server step,
        as a local round's, on the shares' summed updates (equal to a local round to float reassociation)."""
        model_weights = _as_tensors(state.global_model_weights)
        if self._table:
            return self._table_output(state, partial['rows'], partial['metrics'], private_states)
        if self._aggregation is None:
            aggregated = (
                state.aggregator,
                _MEAN_METRICS,
                *self._mean_step(state.finalizer, list(model_weights.trainable), partial['update'], partial['weight']),
            )
            sample = partial['update']
        else:
            aggregated = self._aggregate(state, model_weights, partial['results'])
            sample = partial['results'][0][0]
        return self._output(state, model_weights, aggregated, partial['metrics'], sample, num_clients, private_states)

    def _table_output(
        self, state: Any, rows: Sequence[Any], metric_sums: Any, private_states: Any
    ) -> process_lib.ProcessOutput:
        """The round's output with a server table: the clients' rows (one `server_table.Rows` each), in order,
        replace the server's weights."""
        stacked = tf.nest.map_structure(lambda *values: np.stack(values), *rows)
        weights, measurements = server_table.from_rows(_as_tensors(state.global_model_weights), stacked)
        new_state = state._replace(
            global_model_weights=tff.learning.models.ModelWeights(
                process_lib.as_numpy(list(weights.trainable)), process_lib.as_numpy(list(weights.non_trainable))
            )
        )
        metrics = collections.OrderedDict(
            distributor=(),
            client_work=collections.OrderedDict(train=self._finalize_metrics(metric_sums)),
            table=process_lib.as_numpy(measurements),
        )
        return process_lib.ProcessOutput(new_state, metrics, list(private_states))

    def _aggregate(self, state: Any, model_weights: Any, results: Sequence[tuple[Any, Any]]) -> tuple:
        assert self._aggregation is not None
        aggregated = self._aggregation.next(
            state.aggregator,
            [list(process_lib.as_numpy(u)) for u, _ in results],
            [np.float32(process_lib.as_numpy(w)) for _, w in results],
        )
        server = self._apply_update(
            state.finalizer, list(model_weights.trainable), [tf.convert_to_tensor(u) for u in aggregated.result]
        )
        return (aggregated.state, aggregated.measurements, *server)

    def _output(
        self,
        state: Any,
        model_weights: Any,
        aggregated: tuple,
        metric_sums: Any,
        update: Any,
        num_clients: int | None,
        private_states: Sequence[Any] | None,
    ) -> process_lib.ProcessOutput:
        aggregator_state, aggregator_metrics, optimizer_state, trainable, measurements = aggregated
        new_state = tff.learning.templates.LearningAlgorithmState(
            global_model_weights=tff.learning.models.ModelWeights(
                trainable=process_lib.as_numpy(trainable),
                non_trainable=process_lib.as_numpy(list(model_weights.non_trainable)),
            ),
            distributor=state.distributor,
            client_work=state.client_work,
            aggregator=aggregator_state,
            finalizer=process_lib.as_numpy(optimizer_state),
        )
        metrics = collections.OrderedDict(
            distributor=(),
            client_work=collections.OrderedDict(train=self._finalize_metrics(metric_sums)),
            aggregator=aggregator_metrics,
            finalizer=process_lib.as_numpy(measurements),
        )
        if self._measure_communication:
            metrics.update(_communication(model_weights, list(update), num_clients or 0))
        if private_states is not None:
            return process_lib.ProcessOutput(new_state, metrics, list(private_states))
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=())


def merge(a: dict, b: dict) -> dict:
    """Two shares' partial aggregates (`GroupRoundRunner.share`, without their private states) as one: sums
    added, per-group results concatenated in order (a tree of these is the round's merge)."""
    merged: dict[str, Any] = {'metrics': tf.nest.map_structure(np.add, a['metrics'], b['metrics'])}
    if 'rows' in a:
        merged['rows'] = list(a['rows']) + list(b['rows'])
    elif 'results' in a:
        merged['results'] = list(a['results']) + list(b['results'])
    else:
        merged['update'] = [np.add(x, y, dtype=np.asarray(x).dtype) for x, y in zip(a['update'], b['update'])]
        merged['weight'] = np.float32(a['weight'] + b['weight'])
    return merged


_MEAN_METRICS = collections.OrderedDict(mean_value=(), mean_weight=())


def run_name(work: str, parts: int) -> str:
    """A run's name, as `StrategyChoice` reports it: the group work's, with ``x<parts>`` when split."""
    return work if parts == 1 else f'{work} x{parts}'


class StrategyChoice:
    """Which of several equivalent group works runs the rounds: each runs whole rounds in turn, its first round
    untimed (it compiles), its second timed; then the fastest runs every later round, logged once. The candidates
    are in order of preference: a later one is chosen only if it is `MARGIN` times faster than the one before it
    that was chosen, so that a choice does not follow the noise of a shared machine.

    Every round's result is exact whichever strategy computes it (they agree to float rounding, not bit for bit),
    so measuring costs no work, only the slower strategy's time for a few rounds; but which one wins depends on
    the machine's load, so reruns need not be bit-identical. With one candidate it is chosen from the start.

    Attributes:
      chosen: The strategy that runs the rounds, once measured (None before).
      seconds: The timed round's client work (seconds) of each strategy measured so far.
    """

    MARGIN = 1.2

    def __init__(self, names: Sequence[str]):
        self._names = list(names)
        self._calls = dict.fromkeys(self._names, 0)
        self.seconds: dict[str, float] = {}
        self.chosen: str | None = self._names[0] if len(self._names) == 1 else None

    def next(self) -> str:
        """The strategy of the next round."""
        if self.chosen is not None:
            return self.chosen
        return next(n for n in self._names if self._calls[n] < 2)

    def record(self, name: str, seconds: float) -> None:
        """Records a round's client work time; chooses once every strategy has a timed round."""
        self._calls[name] += 1
        if self.chosen is not None or self._calls[name] < 2:
            return
        self.seconds[name] = seconds
        if len(self.seconds) == len(self._names):
            self.chosen = self._names[0]
            for candidate in self._names[1:]:  # A later strategy must be clearly faster: noise flips no choice.
                if self.seconds[candidate] * self.MARGIN < self.seconds[self.chosen]:
                    self.chosen = candidate
            measured = ', '.join(f'{n} {s:.4g} s' for n, s in self.seconds.items())
            logging.info('Engine strategy: %s runs the rounds (client work of one round: %s).', self.chosen, measured)


def _payload(structure: Any) -> tuple[float, float]:
    """``(scalars, bytes)`` of one copy of `structure`, counted as `communication`'s measured parts count them."""
    scalars = num_bytes = 0
    for leaf in tf.nest.flatten(structure):
        tensor = tf.convert_to_tensor(leaf)
        if tensor.dtype == tf.string:
            scalars += int(tf.size(tensor))
            num_bytes += int(tf.reduce_sum(tf.strings.length(tf.reshape(tensor, [-1]), unit='BYTE')))
        else:
            size = int(np.prod(tensor.shape.as_list(), dtype=np.int64))
            scalars += size
            num_bytes += size * tensor.dtype.size
    return float(scalars), float(num_bytes)


def _communication(received: Any, update: Any, num_clients: int) -> collections.OrderedDict:
    """The measured broadcast's and `MeasuredAggregationFactory`'s metrics for a round of identical payloads.

    Every logical client receives the server weights and sends an update shaped as its group's (the weighted
    mean of its clients' updates) plus one aggregation weight; their per-client means are those sizes.
    """
    scalars_down, bytes_down = _payload(received)
    scalars_up, bytes_up = _payload([list(update), np.float32(0)])
    return collections.OrderedDict(
        distributor=collections.OrderedDict(
            scalars_down_per_client=np.float64(scalars_down),
            bytes_down_per_client=np.float64(bytes_down),
            clients=np.int32(num_clients),
        ),
        aggregator=collections.OrderedDict(
            scalars_up_per_client=np.float64(scalars_up),
            bytes_up_per_client=np.float64(bytes_up),
            inner=collections.OrderedDict(mean_value=(), mean_weight=()),
        ),
    )


def _real_clients(groups: Sequence[Any]) -> int:
    """The real logical clients of a round packed by `ClientPacker` (padding slots excluded).

    The packer splits n clients into G groups of S slots, S = ceil(n / G), padding the last group's trailing
    slots: n = S for one group, and G * (S - 1) < n <= G * S otherwise; in that range the count ends at the
    last slot with data (exact unless a real client at the end of the round has no data at all).
    """
    sizes = [group_clients(g) for g in groups]
    if len(sizes) <= 1:
        return sum(sizes)
    last = groups[-1]
    has_data = np.zeros([sizes[-1]], bool)
    for phase in last.values():
        has_data |= np.asarray(phase['steps']) > 0
    filled = int(np.max(np.nonzero(has_data)[0], initial=-1)) + 1
    return max(sum(sizes[:-1]) + filled, len(sizes) * (sizes[-1] - 1) + 1)
