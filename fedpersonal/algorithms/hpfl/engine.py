"""The HPFL family on the fast simulation engine: a round's silos as XLA-compiled programs, same results.

HPFL is cross-silo: a few clients with many records each, every silo every round, each holding GUM tables padded
to the largest silo. A round's cost is the silos' dense optimizer steps over those tables, their k-means, the
server's clustering and the fine-grained update of every table row, run per silo in TFF's runtime without XLA
(`benchmarks/simulation_speed.py`). The engine runs the same TF functions (`process.build_process` passes
them in; nothing here re-implements a formula) as three compiled programs per round:

1. **client phase** (one compiled program, called once per silo): the silo's data as
   `client_work.PaddedBatches` (all silos padded to the round's largest, so one program serves them all, and
   a silo runs only its own steps in a `tf.while_loop`), its training, validation statistics and uploads (the
   k-means centres of its tables, or its update). Silos are not run in lockstep: their steps differ by up to
   60x and every step updates the full padded tables, so lockstep would multiply the work; and a compiled loop
   over silos (`tf.map_fn`) measured 10x slower than this loop of calls (docs/RESULTS.md). XLA fuses a step's
   dense Adam update of the tables (memory-bound: the largest silo's epoch 0.85 -> 0.56 s, measured with the
   machine otherwise idle); silos are submitted longest first to the two threads;
2. **server phase** (one program): only the silos' uploads go in -- the reports' public components,
   accuracies and counts, the centres or the updates -- never a table row. It sums the uploads as TFF's
   default `SumFactory`/`MeanFactory` would, divides (`server.divide_public`, `aggregation.divide_attention`),
   applies the server optimizer as TFF's finalizer does (`fedpersonal.simulation.driver.apply_update`) and
   clusters the centres (`server.CentreClustering.cluster_collection`) collected in silo order;
3. **client update phase** (one compiled program, called once per silo): the client step after aggregation.

The engine refuses what it would not apply as TFF does: a custom ``public_sum_factory`` or ``model_aggregator``
(they may act on each silo's own upload) and ``row_updates='lazy'`` (its `tf.unique` has no XLA kernel).
`process.next` stays the TFF computation (the privacy audit's subject); tests check that `run_round` equals it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.algorithms.hpfl import aggregation
from fedpersonal.algorithms.hpfl import server
from fedpersonal.algorithms.hpfl.spec import RoundSpec
from fedpersonal.algorithms.hpfl.types import ClientData
from fedpersonal.algorithms.hpfl.types import GlobalComponents
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib
from fedpersonal.models import gum
from fedpersonal.simulation import driver
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import packing

_MIN_ROWS = 16  # Smallest table cut (fewer compiled shapes).
_FIELDS = ('user', 'item', 'label')


def check_engine_options(*, row_updates: str, public_sum_factory: Any, model_aggregator: Any) -> None:
    """Raises `ConfigError` for options the engine would not apply as the per-silo TFF path does."""
    if row_updates != 'dense':
        raise errors.ConfigError(
            "row_updates='lazy' steps the rows a batch touches (tf.unique), which XLA cannot compile; use "
            "row_updates='dense' or simulation='per_client'."
        )
    if public_sum_factory is not None:
        raise errors.ConfigError(
            'The fast simulation engine sums the public uploads itself (as the default SumFactory); a custom '
            f"public_sum_factory ({type(public_sum_factory).__name__}) needs simulation='per_client'."
        )
    group_lib.check_aggregator(model_aggregator)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class SiloPacker:
    """Packs silos' `ClientData` as `PaddedBatches` of one shape for all silos (batches materialized once per id).

    Args:
      epochs: Local epochs (the train batches of every epoch, in the order the per-silo path iterates them).
    """

    # Its silos are for the round runner only: the process's TFF `next` takes the silos' datasets as they are.
    packs_next_input = False

    def __init__(self, *, epochs: int):
        self._epochs = epochs
        self._cache: dict[Any, dict[str, Any]] = {}

    def _silo(self, get_data: Callable[[], ClientData], key: Any) -> dict[str, Any]:
        """A silo's materialized batches; `get_data` is only called for a silo not cached under `key`."""
        if key is not None and key in self._cache:
            return self._cache[key]
        data = get_data()
        silo = dict(
            train=packing.batches_as_tff_sees(data.train.repeat(self._epochs)),
            validation=packing.batches_as_tff_sees(data.validation),
            item_attributes=np.asarray(data.item_attributes, np.float32),
            seed=np.int64(data.seed),
        )
        if key is not None:
            self._cache[key] = silo
        return silo

    def pack(self, client_data: Sequence[ClientData], client_ids: Sequence[Any] | None = None) -> list[ClientData]:
        """Each silo's `ClientData` with `PaddedBatches`, padded to the round's largest silo (a power of 2 steps)."""
        keys = list(client_ids) if client_ids is not None else [None] * len(client_data)
        silos = [
            self._silo(functools.partial(client_data.__getitem__, i), k) for i, k in enumerate(keys)
        ]  # Lazy: see `_silo`.
        splits = ('train', 'validation')
        batch = max([len(b['label']) for s in silos for split in splits for b in s[split]] or [1])
        steps = {split: _pow2(max([len(s[split]) for s in silos] or [1])) for split in splits}
        return [
            ClientData(
                train=_padded(silo['train'], steps['train'], batch),
                validation=_padded(silo['validation'], steps['validation'], batch),
                item_attributes=silo['item_attributes'],
                seed=silo['seed'],
            )
            for silo in silos
        ]


def _padded(batches: list[Any], steps: int, batch: int) -> client_work.PaddedBatches:
    arrays = {f: np.zeros([steps, batch], np.float32 if f == 'label' else np.int64) for f in _FIELDS}
    mask = np.zeros([steps, batch], np.float32)
    for t, b in enumerate(batches):
        n = len(b['label'])
        for f in _FIELDS:
            arrays[f][t, :n] = b[f]
        mask[t, :n] = 1.0
    padded = collections.OrderedDict((f, arrays[f]) for f in _FIELDS)
    padded['mask'] = mask
    return client_work.PaddedBatches(padded, np.int32(len(batches)))


def _numpy(structure: Any) -> Any:
    return tf.nest.map_structure(lambda t: np.asarray(t), structure)


class HpflRoundRunner:
    """`process.run_round` of an engine HPFL-family process (see the module docstring).

    Args:
      spec: The round's `RoundSpec`.
      train: The client work ``(data, state[, global weights, round_num]) -> (state, report[, ClientResult])``.
      centres: ``state -> Centres`` (clustered private aggregation), else None.
      update_client: The client step after aggregation ``(GlobalComponents, state, report) -> state``.
      upload_noise: Fednoise's ``(silo seed, round) -> noise`` (run outside XLA: XLA's stateless random numbers
        differ from TF's), passed to `train` as ``noise``; else None.
      clustering: The `server.CentreClustering` (clustered private aggregation), else None.
      server_optimizer: The update aggregations' server optimizer (else None).
      metric_sums: ``report -> additive sums``; finalize_metrics: summed sums -> the round's client_work metrics.
    """

    def __init__(
        self,
        *,
        spec: RoundSpec,
        train: Callable[..., Any],
        centres: Callable[[Any], Any] | None,
        update_client: Callable[..., Any],
        upload_noise: Callable[[Any, Any], Any] | None,
        clustering: server.CentreClustering | None,
        server_optimizer: tff.learning.optimizers.Optimizer | None,
        metric_sums: Callable[[Any], Any],
        finalize_metrics: Callable[[Any], Any],
    ):
        self._spec = spec
        self.compile_seconds: float | None = None  # The first round's seconds (tracing and XLA compiles).
        self.phase_seconds: dict[str, float] = {}  # The last round's seconds per phase (client, server, update).
        own = spec.start == 'own'

        self._noise = tf.function(upload_noise) if upload_noise is not None else None

        @tf.function(jit_compile=True)
        def client_phase(data, state, global_weights, round_num, noise):
            if own:
                trained, report = train(data, state)
                return trained, report, centres(trained) if centres is not None else ()
            if noise is None:
                return train(data, state, global_weights, round_num)
            return train(data, state, global_weights, round_num, noise=noise)

        @tf.function(jit_compile=False)
        def server_phase(trainable, centres_state, optimizer_state, reports, uploads):
            measurements = collections.OrderedDict()
            trainable = list(trainable)
            if spec.public_aggregation == 'accuracy_weighted':
                upload = tf.vectorized_map(
                    lambda r: server.weighted_public_upload(r[0], r[1], r[2], spec.accuracy_threshold),
                    (reports.public, reports.attribute_accuracy, reports.attribute_iterations),
                )
                new_public, measurements['attributes_aggregated'] = server.divide_public(
                    trainable, tf.nest.map_structure(lambda t: tf.reduce_sum(t, 0), upload)
                )
                trainable = list(new_public)
            if spec.updates_public:
                if spec.public_aggregation == 'attention':
                    scored = tf.vectorized_map(lambda u: aggregation.attention_upload(u[0], u[1]), tuple(uploads))
                    mean = aggregation.divide_attention(tf.nest.map_structure(lambda t: tf.reduce_sum(t, 0), scored))
                    measurements['aggregator'] = ()
                else:
                    weight = uploads.update_weight
                    total = tf.reduce_sum(weight)
                    mean = [tf.math.divide(tf.tensordot(weight, u, 1), total) for u in uploads.update]
                    measurements['aggregator'] = collections.OrderedDict(mean_value=(), mean_weight=())
                optimizer_state, trainable, measurements['finalizer'] = driver.apply_update(
                    server_optimizer, optimizer_state, trainable, mean
                )
            if clustering is not None:
                centres_state, measurements['clustering'] = clustering.cluster_collection(
                    centres_state, _collection(uploads, clustering)
                )
            sums = tf.nest.map_structure(lambda t: tf.reduce_sum(t, 0), tf.vectorized_map(metric_sums, reports))
            return trainable, centres_state, optimizer_state, finalize_metrics(sums), measurements

        update_phase = tf.function(update_client, jit_compile=True)

        self._client_phase, self._server_phase, self._update_phase = client_phase, server_phase, update_phase
        # Silos are independent: one compiled call per core at a time (XLA's fused loops use one core each).
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))

    def __call__(
        self, state: Any, silos: Sequence[ClientData], private_states: Sequence[Any], *, num_clients: int | None = None
    ) -> process_lib.ProcessOutput:
        del num_clients
        first = self.compile_seconds is None
        started = time.perf_counter()
        tensors = lambda structure: tf.nest.map_structure(tf.convert_to_tensor, structure)  # Numpy scalars retrace.
        weights = tensors(state.global_model_weights)
        round_num = tf.constant(state.round_num, tf.int32)

        cut = [_cut(data, private) for data, private in zip(silos, private_states)]

        def client(data, private):
            data = tensors(data)
            noise = self._noise(data.seed, round_num) if self._noise is not None else None
            return self._client_phase(data, tensors(private), weights, round_num, noise)

        # Longest silo first: the round waits for its slowest thread (the largest silo has ~30% of the steps).
        order = sorted(range(len(cut)), key=lambda i: -int(cut[i][0].train.num_steps))
        futures = {i: self._pool.submit(client, *cut[i]) for i in order}
        outputs = [futures[i].result() for i in range(len(cut))]
        trained, reports, uploads = ([out[i] for out in outputs] for i in range(3))
        client_done = time.perf_counter()
        stack = lambda values: tf.nest.map_structure(lambda *t: tf.stack(t), *values)
        trainable, centres, optimizer_state, train_metrics, measurements = self._server_phase(
            list(weights.trainable), tensors(state.centres), tensors(state.finalizer), stack(reports), stack(uploads)
        )
        server_done = time.perf_counter()
        if self._spec.personalizes:
            components = GlobalComponents(gum.PublicWeights(*trainable), *centres)
            trained = list(self._pool.map(lambda t, r: self._update_phase(components, t, r), trained, reports))
        new_states = [_paste(full, _numpy(t)) for full, t in zip(private_states, trained)]
        new_state = state._replace(
            global_model_weights=tff.learning.models.ModelWeights(trainable=_numpy(trainable), non_trainable=[]),
            centres=_numpy(centres),
            finalizer=_numpy(optimizer_state),
            round_num=np.int32(state.round_num + 1),
        )
        metrics = collections.OrderedDict(client_work=_numpy(train_metrics), **_numpy(measurements))
        done = time.perf_counter()
        self.phase_seconds = dict(
            client=client_done - started, server=server_done - client_done, update=done - server_done
        )
        if first:
            self.compile_seconds = done - started
        return process_lib.ProcessOutput(state=new_state, metrics=metrics, private_states=new_states)


def _rows(count: Any, capacity: int) -> int:
    """The rows a silo's tables are cut to: the smallest 2^k or 3 * 2^(k-1) >= `count` (at most 1/3 unused)."""
    count = max(_MIN_ROWS, int(count))
    power = _pow2(count)
    rows = power * 3 // 4 if power * 3 // 4 >= count else power
    return min(capacity, rows)


def _cut(data: ClientData, state: Any) -> tuple[ClientData, Any]:
    """The silo's data and state with its item tables cut to its own rows (`_rows`: 2^k or 3 * 2^(k-1) >= its items).

    Exact: rows past a silo's users/items are never indexed by its data, so their gradients are 0 and every
    optimizer leaves them unchanged (Adam's state restarts every round), and they are masked out of the
    k-means and of the fine-grained update; `_paste` puts them back. Saves the padded rows' dense optimizer
    and clustering work (the largest silo has 10,745 items, the median a few hundred).
    """
    private = state.model.private
    users = np.shape(private.theta)[0]  # User tables are small: one cut per item-table size (fewer traces).
    items = _rows(state.num_items, np.shape(private.difficulty)[0])
    rows = {field: users if field == 'theta' else items for field in private._fields}
    cut_private = private._replace(**{f: np.asarray(getattr(private, f))[:n] for f, n in rows.items()})
    return (
        data._replace(item_attributes=np.asarray(data.item_attributes)[:items]),
        state._replace(model=state.model._replace(private=cut_private)),
    )


def _paste(full: Any, cut: Any) -> Any:
    """`cut` (a state from `_cut`'s silo, trained) with `full`'s rows past its cut restored."""
    full_private, private = full.model.private, cut.model.private
    restored = {
        f: np.concatenate([getattr(private, f), np.asarray(getattr(full_private, f))[len(getattr(private, f)) :]])
        for f in private._fields
    }
    return cut._replace(model=cut.model._replace(private=private._replace(**restored)))


def _collection(uploads: Any, clustering: server.CentreClustering) -> tuple:
    """The centre collection TFF's `federated_aggregate` builds: silo i's centres in slots i (first `max_clients`)."""
    count = tf.shape(uploads.user_mask)[0]
    capacity = clustering.max_clients

    def slots(values):
        kept = values[:capacity]
        padding = [[0, capacity - tf.shape(kept)[0]]] + [[0, 0]] * (values.shape.rank - 1)
        padded = tf.pad(kept, padding)
        return tf.reshape(padded, tf.concat([[capacity * clustering.max_local_clusters], tf.shape(padded)[2:]], 0))

    return (
        slots(uploads.user_centres),
        slots(uploads.user_mask),
        slots(uploads.item_centres),
        slots(uploads.item_mask),
        tf.minimum(count, capacity),
        tf.maximum(count - capacity, 0),
    )
