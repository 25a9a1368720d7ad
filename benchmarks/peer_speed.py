"""Seconds per FedAvg round beside peers: the engine, pfl-research (PyTorch) and TFF on identical work, in one run.

  python benchmarks/peer_speed.py [--workloads dense,cnn,first_touch] [--rows engine,pfl,tff] [--repeats 3]
      [--threads 1,2,default] [--rounds 10] [--cnn_rounds 2] [--warmup 4] [--engine_strategy auto] [--pfl_venv DIR]
      [--first_touch_rows ...] [--first_touch_clients 100000] [--first_touch_memory_clients 1000000]
      [--fedjax_venv DIR] [--output FILE]

Normally run as the ``peers`` and ``first_touch`` workloads of `benchmarks/simulation_speed.py`
(``--workloads=peers,first_touch``), which passes its pinned arguments and writes these rows into
``docs/results/simulation_speed.json``.

Workloads (rows ``<name>_engine``, ``<name>_pfl``, ``<name>_tff``):

* ``dense_fedavg``: 1,000 clients of 40 generated examples (784 features, 10 classes), 100 sampled per round (the
  same seeded samples for every row), an MLP 784-200-200-10, each client 4 SGD steps of batch 10 (lr 0.1), the
  example-weighted mean of the deltas, server SGD lr 1.
* ``pfl_benchmark_cnn``: PFLlib's FedAvgCNN for 1x28x28 inputs (conv 5x5 32, ReLU, max-pool 2, conv 5x5 64, ReLU,
  max-pool 2, dense 1024-512, ReLU, dense 512-10), 20 clients, all every round, one epoch of batch 10, lr 0.005
  (PFLlib's Fashion-MNIST settings); the clients' sizes are PFLlib's Dirichlet(0.1) partition of 70,000 labels
  (7,000 per class, at least 40 examples per client, 75% of each client for training), re-implemented here with
  a fixed seed (`dirichlet_sizes`); pixels are generated (a round's time does not depend on their values).

* ``first_touch`` (issue 63): every round's clients are new. ``--first_touch_clients`` (100,000) registered
  clients, each client's data made lazily and deterministically from its id (`first_touch_data.client_arrays`: a
  numpy generator seeded by the id, 40 examples of 784 features, labels 0-9 from a fixed linear teacher), 100
  sampled per round without reuse across rounds (the same seeded schedule for every row), the dense MLP and FedAvg
  settings of ``dense_fedavg`` (4 SGD steps of batch 10, lr 0.1, server SGD 1). A registry holds ids alone. Rows
  (named as they are, without a workload prefix; see below).

Rows of dense_fedavg and pfl_benchmark_cnn, each in its own process, from the same initial weights on the same
clients' batches in the same order:
``engine`` (`fedpersonal.algorithms.build_fed_avg` on the engine: `process.run_round`, every client packed before
round 0, under ``--engine_strategy``: by default ``auto``, the engine's fixed rule; ``measure`` times the
strategies in the first rounds; the strategy that ran is reported), ``pfl`` (pfl-research's
`FederatedAveraging` with its PyTorch model and `SimulatedBackend`, `benchmarks/peer_pfl_row.py`, run in a virtual
environment of its own, built on first use: ``--pfl_venv`` with ``--pfl_requirements``, never the package's),
``tff`` (TFF 0.87's `tff.learning.algorithms.build_weighted_fed_avg`, `next`; one client at a time: the per-client
reference of ``max_abs_diff_vs_per_client``; the dense rows are also compared with a float64 numpy loop written here,
``max_abs_diff_vs_float64``). Every row runs ``--warmup`` untimed rounds, then the timed ones;
``seconds_per_round`` is the median timed round of a row process, and the median of that over ``--repeats``
(rows interleaved within each repeat, so the machine's load shifts them alike); ``speedup_vs_pfl`` and
``speedup_vs_tff`` are ratios of those medians (``ratios_per_repeat``: the same ratio within each repeat). The
TFF rows run ``--tff_repeats`` times, the CNN rows ``--cnn_repeats`` times with ``--cnn_threads``.
Each ``--threads`` setting runs every row (its ``threads``): TensorFlow's intra-op threads (inter-op 1) and
PyTorch's alike; ``cpu_seconds_per_round`` (engine, pfl: the row process' CPU time; TFF computes in its worker)
is less sensitive to other jobs on the machine than seconds. ``compute_bound_s``: the round's analytic FLOPs (2 per
multiply-add; forward, weight gradients and the input gradients backpropagation needs) over a float32 2048^2
matmul's rate measured in a process with the same threads, on CPU time per thread (``bound_ratio``: seconds per
round over it; ``cpu_bound_ratio``: CPU seconds per round per thread over it). A ``--threads`` setting ``default``
sets no thread count: each framework takes its own default (its thread variables are removed from the row's
environment).

Rows of first_touch, each in its own process, interleaved within each repeat (``--first_touch_rows``):
``engine_first_touch`` (`fedpersonal.algorithms.build_fed_avg` on the engine: ``process.run_round(state,
ArrayDatasets(ids, client_arrays, batch_size), client_ids=ids)``, each client given as its arrays, as the peers'
rows are, so making and packing the new clients' data is inside the timed round; a process with a
``prefetch(client_data, client_ids)`` method, detected with ``hasattr``, is handed the next round's clients before
each round runs, ``prefetch`` in the row), ``engine_first_touch_tf_data`` (the same, each client given as a tf.data
pipeline built by a function of its id, ``LazyDatasets(ids, make_dataset)``), ``engine_prepacked`` (the same rounds with every
sampled client's data materialized before round 0, ``prepare_s``, as the dense engine row), ``pfl_first_touch``
(pfl-research's FedAvg, `benchmarks/peer_pfl_row.py`: its `FederatedDataset` from a per-user data function that
makes a sampled user's arrays from its id) and ``fedjax_first_touch`` (FedJAX 0.0.17's
`fedjax.algorithms.fed_avg.federated_averaging` on a haiku MLP, `benchmarks/peer_fedjax_row.py`, each sampled
client's `fedjax.ClientDataset` made from its id in its round; in a virtual environment of its own built on first
use, ``--fedjax_venv`` from ``--fedjax_requirements``, `benchmarks/requirements/fedjax-0.0.17.txt`). Every row runs
``--warmup`` untimed rounds of new clients, then ``--rounds`` timed ones; ``s_per_round`` is the median timed round
of a row process and the median of that over ``--repeats`` (``s_per_round_repeats``), ``cpu_s_per_round`` alike on
the process' CPU time; ``peak_rss_mb`` is the row process' ``ru_maxrss`` in MB (the largest over repeats;
``peak_rss_mb_repeats``); ``threads`` the setting (1, or ``default``). ``engine_first_touch@N`` runs
engine_first_touch with N registered clients (``--first_touch_memory_clients``; its own seeded schedule), for its
peak memory beside the same row's at ``--first_touch_clients`` (``registered_clients`` in every row). Identical
work: ``final_accuracy`` is each row's final weights evaluated by the same float64 numpy forward pass on 2,000
held-out examples (`first_touch_data.heldout`), ``max_abs_diff_vs_engine_prepacked`` the largest weight difference
to engine_prepacked's; each row also checks a digest of the client data it generated against the workload file's.
``speedup_vs_<row>``: that row's ``s_per_round`` over this one's.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKLOADS = flags.DEFINE_list('workloads', ['dense', 'cnn'], 'Workloads: dense, cnn, first_touch.')
_ROWS = flags.DEFINE_list('rows', ['engine', 'pfl', 'tff'], 'Rows: engine, pfl, tff.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Processes per row (interleaved); medians over them.')
_THREADS = flags.DEFINE_list(
    'threads', ['1', '2'], "Intra-op threads of TensorFlow, PyTorch and XLA alike, per setting ('default': theirs)."
)
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Timed rounds per row process (dense).')
_CNN_ROUNDS = flags.DEFINE_integer('cnn_rounds', 2, 'Timed rounds per row process (cnn).')
_CNN_REPEATS = flags.DEFINE_integer('cnn_repeats', 2, 'Processes per cnn row (the rounds take ~20 s).')
_CNN_THREADS = flags.DEFINE_list('cnn_threads', None, 'Thread settings of the cnn rows (default: --threads).')
_TFF_REPEATS = flags.DEFINE_integer('tff_repeats', 1, 'Processes per TFF row (the reference; slow).')
_WARMUP = flags.DEFINE_integer(
    'warmup', 4, 'Untimed rounds first (with --engine_strategy=measure the engine measures in its first 4-6).'
)
_ENGINE_STRATEGY = flags.DEFINE_string(
    'engine_strategy', 'auto', "The engine rows' strategy (fedpersonal.backends.use(..., strategy=...))."
)
_PFL_VENV = flags.DEFINE_string(
    'pfl_venv', os.path.expanduser('~/.cache/fedpersonal-benchmarks/pfl-0.6.0'), "pfl-research's virtual environment."
)
_PFL_REQUIREMENTS = flags.DEFINE_list(
    'pfl_requirements',
    ['pfl==0.6.0', 'torch==2.13.0'],
    'Installed into --pfl_venv (torch: a CPU build where pip has one).',
)
_OUTPUT = flags.DEFINE_string(
    'output',
    os.path.join(tempfile.gettempdir(), 'peer_speed.json'),
    'JSON file written (simulation_speed.py: its rows).',
)
_FIRST_TOUCH_ROWS = flags.DEFINE_list(
    'first_touch_rows',
    ['engine_first_touch', 'engine_first_touch_tf_data', 'engine_prepacked', 'pfl_first_touch', 'fedjax_first_touch'],
    'Rows of the first_touch workload.',
)
_FIRST_TOUCH_CLIENTS = flags.DEFINE_integer('first_touch_clients', 100_000, 'Registered clients of first_touch.')
_FIRST_TOUCH_MEMORY_CLIENTS = flags.DEFINE_list(
    'first_touch_memory_clients',
    ['1000000'],
    'Registered clients of extra engine_first_touch processes (their peak memory beside --first_touch_clients).',
)
_FEDJAX_VENV = flags.DEFINE_string(
    'fedjax_venv', os.path.expanduser('~/.cache/fedpersonal-benchmarks/fedjax-0.0.17'), "FedJAX's virtual environment."
)
_FEDJAX_REQUIREMENTS = flags.DEFINE_string(
    'fedjax_requirements',
    os.path.join(_REPO, 'benchmarks', 'requirements', 'fedjax-0.0.17.txt'),
    'Requirements file installed into --fedjax_venv (FedJAX with the jax, jaxlib, optax and haiku of its release).',
)
_ROW = flags.DEFINE_string('_row', None, 'Internal: run this row.')
_FILE = flags.DEFINE_string('_file', None, 'Internal: the workload file.')
_RESULT = flags.DEFINE_string('_result', None, 'Internal: the result JSON.')

WORKLOADS = {
    'dense': dict(name='dense_fedavg', clients=1000, cohort=100, batch=10, client_lr=0.1, server_lr=1.0),
    'cnn': dict(name='pfl_benchmark_cnn', clients=20, cohort=20, batch=10, client_lr=0.005, server_lr=1.0),
    'first_touch': dict(name='first_touch', cohort=100, batch=10, client_lr=0.1, server_lr=1.0, seed=0),
}
FIRST_TOUCH = 'first_touch'


def dirichlet_sizes(seed: int = 0, clients: int = 20, classes: int = 10, per_class: int = 7000, alpha: float = 0.1):
    """Each client's training examples under PFLlib's Dirichlet label partition (its `separate_data`, 'dir'): per
    class, proportions ~ Dir(alpha) over the clients not yet above the mean size, redrawn until every client has
    at least batch / (1 - 0.75) = 40 examples; then 75% of each client trains (sklearn's split: the test part is
    the ceiling of 25%)."""
    rng = np.random.default_rng(seed)
    total = classes * per_class
    while True:
        counts = np.zeros(clients, int)
        for _ in range(classes):
            p = rng.dirichlet(np.full(clients, alpha)) * (counts < total / clients)
            cuts = (np.cumsum(p / p.sum()) * per_class).astype(int)[:-1]
            counts += np.diff(np.concatenate([[0], cuts, [per_class]]))
        if counts.min() >= 40:
            return counts - np.ceil(counts * 0.25).astype(int)


def keras_model(kind: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    glorot = lambda s: tf.keras.initializers.GlorotUniform(seed=s)
    if kind == 'dense':
        layers = [tf.keras.Input([784])]
        layers += [tf.keras.layers.Dense(200, 'relu', kernel_initializer=glorot(i)) for i in (1, 2)]
    else:
        layers = [
            tf.keras.Input([28, 28, 1]),
            tf.keras.layers.Conv2D(32, 5, activation='relu', kernel_initializer=glorot(1)),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Conv2D(64, 5, activation='relu', kernel_initializer=glorot(2)),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(512, 'relu', kernel_initializer=glorot(3)),
        ]
    return tf.keras.Sequential(layers + [tf.keras.layers.Dense(10, kernel_initializer=glorot(4))])


def round_flops(kind: str, examples: int) -> float:
    """Forward 2 x MACs, weight gradients 2 x MACs, input gradients 2 x MACs of every layer but the first."""
    if kind == 'dense':
        macs = [784 * 200, 200 * 200, 200 * 10]
    else:
        macs = [24 * 24 * 32 * 25, 8 * 8 * 64 * 32 * 25, 1024 * 512, 512 * 10]
    return float(examples * (4 * sum(macs) + 2 * sum(macs[1:])))


def write_workload(kind: str, rounds: int, path: str) -> dict[str, Any]:
    """The workload's arrays, initial weights and per-round samples (what every row reads)."""
    w = WORKLOADS[kind]
    rng = np.random.default_rng(0)
    sizes = np.full(w['clients'], 40) if kind == 'dense' else dirichlet_sizes()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shape = [784] if kind == 'dense' else [28, 28, 1]
    # Pixel-like features: about a fifth of them on, in (0, 1) (MNIST's mean intensity is 0.13).
    x = rng.random([int(offsets[-1]), *shape], np.float32) * (rng.random([int(offsets[-1]), *shape]) < 0.2)
    y = rng.integers(0, 10, int(offsets[-1])).astype(np.int32)
    if w['cohort'] == w['clients']:
        schedule = np.tile(np.arange(w['clients']), [rounds, 1])
    else:
        schedule = np.stack(
            [np.random.default_rng(100 + r).choice(w['clients'], w['cohort'], False) for r in range(rounds)]
        )
    weights = keras_model(kind).get_weights()
    arrays = {f'w{i}': v for i, v in enumerate(weights)}
    np.savez(path, kind=kind, x=x, y=y, offsets=offsets, schedule=schedule, num_weights=len(weights), **arrays,
             batch=w['batch'], client_lr=w['client_lr'], server_lr=w['server_lr'])  # fmt: skip
    examples = [int(sizes[schedule[r]].sum()) for r in range(rounds)]
    return dict(sizes=sizes.tolist(), round_flops=round_flops(kind, int(np.median(examples))))


def write_first_touch_workload(rounds: int, registered: int, path: str) -> dict[str, Any]:
    """The first_touch workload's file: each round's new client ids among `registered`, the initial weights (the
    dense MLP's, as dense_fedavg's) and the hyperparameters; the rows make the clients' data from their ids."""
    import first_touch_data  # pylint: disable=g-import-not-at-top

    w = WORKLOADS[FIRST_TOUCH]
    schedule = first_touch_data.schedule(registered, rounds, w['cohort'], w['seed'])
    weights = keras_model('dense').get_weights()
    arrays = {f'w{i}': v for i, v in enumerate(weights)}
    fingerprint = first_touch_data.fingerprint(int(schedule[0, 0]), w['seed'])
    np.savez(path, kind=FIRST_TOUCH, registered=registered, schedule=schedule, seed=w['seed'],
             fingerprint=fingerprint, num_weights=len(weights), **arrays, batch=w['batch'],
             client_lr=w['client_lr'], server_lr=w['server_lr'])  # fmt: skip
    examples = w['cohort'] * first_touch_data.EXAMPLES
    return dict(registered_clients=registered, examples_per_client=first_touch_data.EXAMPLES,
                round_flops=round_flops('dense', examples))  # fmt: skip


# ------------------------------------------------------------------------------------------ row processes
def _client_datasets(data):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    x, y, offsets, batch = data['x'], data['y'], data['offsets'], int(data['batch'])

    def dataset(c: int):
        part = collections.OrderedDict(x=x[offsets[c] : offsets[c + 1]], y=y[offsets[c] : offsets[c + 1]])
        return tf.data.Dataset.from_tensor_slices(part).batch(batch)

    spec = collections.OrderedDict(x=tf.TensorSpec([None, *x.shape[1:]], tf.float32), y=tf.TensorSpec([None], tf.int32))
    return dataset, spec


def _row_engine(data, kind: str, warmup: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top
    from fedpersonal import backends  # pylint: disable=g-import-not-at-top
    from fedpersonal import models  # pylint: disable=g-import-not-at-top
    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

    dataset, spec = _client_datasets(data)

    def model_fn():
        keras = keras_model(kind)
        return models.from_keras_model(keras, input_spec=spec, global_variables=keras.variables)

    with runtime.LocalRuntime(), backends.use('engine', strategy=_ENGINE_STRATEGY.value):  # Its worker ends here.
        process = algorithms.build_fed_avg(
            model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
            client_optimizer=tff.learning.optimizers.build_sgdm(float(data['client_lr'])),
            server_optimizer=tff.learning.optimizers.build_sgdm(float(data['server_lr'])),
        )
        schedule = data['schedule']
        started = time.perf_counter()
        clients = sorted({int(c) for c in schedule.reshape(-1)})
        process.backend.pack([dataset(c) for c in clients], client_ids=[str(c) for c in clients])
        prepare_s = time.perf_counter() - started
        state = process.initialize()
        initial = [data[f'w{i}'] for i in range(int(data['num_weights']))]
        for got, want in zip(process.get_model_weights(state).trainable, initial):
            np.testing.assert_array_equal(got, want)  # The same initial weights as the other rows.
        seconds, cpu = [], []
        for ids in schedule:
            datasets = [dataset(int(c)) for c in ids]
            t, c = time.perf_counter(), time.process_time()
            state = process.run_round(state, datasets, client_ids=[str(c) for c in ids]).state
            seconds.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        choice = process.backend.round_runner.choice
        info = dict(prepare_s=prepare_s, strategy=process.engine_strategy, cpu_seconds=cpu)
        info.update(engine_strategy=_ENGINE_STRATEGY.value, strategy_seconds=choice.seconds)
        if choice.chosen is None or len(choice.seconds) * 2 > warmup:
            info['note'] = 'the strategy was still being measured in timed rounds'
        return process.get_model_weights(state).trainable, seconds, info


def _row_first_touch(data, prepacked: bool, tf_data: bool = False):
    """first_touch on the engine: every round's clients new, their data made from their ids when read (an
    `ArrayDatasets` of their arrays; `tf_data`: a `LazyDatasets` of their tf.data pipelines); packing them is inside
    the timed round unless `prepacked` (all materialized before round 0). A process with `prefetch` (e.g. a later
    `PersonalizedProcess`) is handed the next round's clients first."""
    import first_touch_data  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top
    from fedpersonal import backends  # pylint: disable=g-import-not-at-top
    from fedpersonal import models  # pylint: disable=g-import-not-at-top
    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top
    from fedpersonal.core.process import ArrayDatasets  # pylint: disable=g-import-not-at-top
    from fedpersonal.core.process import LazyDatasets  # pylint: disable=g-import-not-at-top

    seed, batch = int(data['seed']), int(data['batch'])
    registered = [str(i) for i in range(int(data['registered']))]  # The registry: ids only.
    check = int(data['schedule'][0, 0])
    assert first_touch_data.fingerprint(check, seed) == float(data['fingerprint']), 'other client data'

    def make_dataset(client_id: str):
        x, y = first_touch_data.client_arrays(int(client_id), seed)
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch)

    def arrays(client_id: str):
        x, y = first_touch_data.client_arrays(int(client_id), seed)
        return collections.OrderedDict(x=x, y=y)

    def clients(ids):
        return LazyDatasets(ids, make_dataset) if tf_data else ArrayDatasets(ids, arrays, batch)

    spec = collections.OrderedDict(x=tf.TensorSpec([None, 784], tf.float32), y=tf.TensorSpec([None], tf.int32))

    def model_fn():
        keras = keras_model('dense')
        return models.from_keras_model(keras, input_spec=spec, global_variables=keras.variables)

    with runtime.LocalRuntime(), backends.use('engine', strategy=_ENGINE_STRATEGY.value):
        process = algorithms.build_fed_avg(
            model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
            client_optimizer=tff.learning.optimizers.build_sgdm(float(data['client_lr'])),
            server_optimizer=tff.learning.optimizers.build_sgdm(float(data['server_lr'])),
        )
        rounds = [[registered[int(c)] for c in ids] for ids in data['schedule']]
        prefetch = getattr(process, 'prefetch', None) if not prepacked else None
        started = time.perf_counter()
        if prepacked:
            every = [c for ids in rounds for c in ids]
            process.backend.pack(clients(every), client_ids=every)
        prepare_s = time.perf_counter() - started
        state = process.initialize()
        initial = [data[f'w{i}'] for i in range(int(data['num_weights']))]
        for got, want in zip(process.get_model_weights(state).trainable, initial):
            np.testing.assert_array_equal(got, want)  # The same initial weights as the other rows.
        seconds, cpu = [], []
        for r, ids in enumerate(rounds):
            t, c = time.perf_counter(), time.process_time()
            if prefetch is not None and r + 1 < len(rounds):
                prefetch(clients(rounds[r + 1]), rounds[r + 1])
            state = process.run_round(state, clients(ids), client_ids=ids).state
            seconds.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            print(f'round {r}: {seconds[-1]:.4f} s', flush=True)
        info = dict(prepare_s=prepare_s, strategy=process.engine_strategy, cpu_seconds=cpu)
        info.update(engine_strategy=_ENGINE_STRATEGY.value, prefetch=prefetch is not None, tf_data=tf_data)
        return process.get_model_weights(state).trainable, seconds, info


def _row_tff(data, kind: str, warmup: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

    del warmup
    dataset, spec = _client_datasets(data)
    loss = lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    metrics = lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]
    model_fn = lambda: tff.learning.models.from_keras_model(
        keras_model(kind), input_spec=spec, loss=loss(), metrics=metrics()
    )
    with runtime.LocalRuntime():
        process = tff.learning.algorithms.build_weighted_fed_avg(
            model_fn,
            client_optimizer_fn=tff.learning.optimizers.build_sgdm(float(data['client_lr'])),
            server_optimizer_fn=tff.learning.optimizers.build_sgdm(float(data['server_lr'])),
        )
        initial = [data[f'w{i}'] for i in range(int(data['num_weights']))]
        state = process.set_model_weights(process.initialize(), tff.learning.models.ModelWeights(initial, []))
        seconds = []
        for ids in data['schedule']:
            datasets = [dataset(int(c)) for c in ids]
            t = time.perf_counter()
            state = process.next(state, datasets).state
            seconds.append(time.perf_counter() - t)
        return process.get_model_weights(state).trainable, seconds, {}


def _row_flops(data, kind: str, warmup: int):
    del data, kind, warmup
    return [], [], dict(gflops=measure_flop_rate())


def run_row(row: str, path: str | None, result_path: str) -> None:
    data = dict(np.load(path)) if path else {}
    kind = str(data.get('kind'))
    if row in ('engine_first_touch', 'engine_first_touch_tf_data', 'engine_prepacked'):
        weights, seconds, info = _row_first_touch(data, row == 'engine_prepacked', row == 'engine_first_touch_tf_data')
    else:
        weights, seconds, info = {'engine': _row_engine, 'tff': _row_tff, 'flops': _row_flops}[row](
            data, kind, _WARMUP.value
        )
    np.savez(result_path + '.npz', *[np.asarray(w) for w in weights])
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes.
    with open(result_path, 'w') as f:
        json.dump(dict(round_seconds=seconds, peak_rss_mb=peak_rss_mb, **info), f)


def measure_flop_rate() -> float:
    """GFLOP/s of a 2048^2 float32 matmul (best of 5) with this process' threads, on its CPU time per thread:
    other jobs on a shared machine take turns on the cores, which a wall clock would count."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    n, threads = 2048, int(os.environ.get('TF_NUM_INTRAOP_THREADS', os.cpu_count()))
    a, b = tf.random.uniform([n, n]), tf.random.uniform([n, n])
    tf.matmul(a, b).numpy()
    times = []
    for _ in range(5):
        t = time.process_time()
        tf.matmul(a, b).numpy()
        times.append((time.process_time() - t) / threads)
    return 2.0 * n**3 / min(times) / 1e9


def dense_reference(path: str) -> list[np.ndarray]:
    """The dense workload's rounds in float64 numpy, by hand (forward, backpropagation, SGD, weighted mean)."""
    data = np.load(path)
    x, y, offsets, batch, lr = data['x'].astype(np.float64), data['y'], data['offsets'], int(data['batch']), 0.1
    server = [data[f'w{i}'].astype(np.float64) for i in range(6)]
    for ids in data['schedule']:
        total, sums = 0, [np.zeros_like(w) for w in server]
        for c in ids:
            w = [v.copy() for v in server]
            for s in range(offsets[c], offsets[c + 1], batch):
                xb, yb = x[s : min(s + batch, offsets[c + 1])], y[s : min(s + batch, offsets[c + 1])]
                a1 = xb @ w[0] + w[1]
                h1 = np.maximum(a1, 0)
                a2 = h1 @ w[2] + w[3]
                h2 = np.maximum(a2, 0)
                logits = h2 @ w[4] + w[5]
                p = np.exp(logits - logits.max(1, keepdims=True))
                d3 = p / p.sum(1, keepdims=True)
                d3[np.arange(len(yb)), yb] -= 1.0
                d3 /= len(yb)
                d2 = (d3 @ w[4].T) * (a2 > 0)
                d1 = (d2 @ w[2].T) * (a1 > 0)
                grads = [xb.T @ d1, d1.sum(0), h1.T @ d2, d2.sum(0), h2.T @ d3, d3.sum(0)]
                w = [v - lr * g for v, g in zip(w, grads)]
            n = offsets[c + 1] - offsets[c]
            sums = [t + n * (s0 - v) for t, s0, v in zip(sums, server, w)]
            total += n
        server = [s0 - t / total for s0, t in zip(server, sums)]  # Server SGD, learning rate 1.
    return server


# ---------------------------------------------------------------------------------------------- the parent
def _venv_python(venv: str, imports: str, install: list[str]) -> str:
    """The Python of a peer's venv, building it on first use (``pip install *install`` from the package registry)
    unless ``import <imports>`` already works there."""
    python = os.path.join(venv, 'bin', 'python')
    check = [python, '-c', f'import {imports}']
    if os.path.exists(python) and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f'building {venv}: {" ".join(install)}', flush=True)
    base = getattr(sys, '_base_executable', sys.executable)
    subprocess.run([base, '-m', 'venv', venv], check=True)
    subprocess.run([python, '-m', 'pip', 'install', '-q', *install], check=True)
    subprocess.run(check, check=True)
    return python


@functools.cache
def pfl_python() -> str:
    """The pfl venv's Python (CPU torch)."""
    return _venv_python(_PFL_VENV.value, 'pfl, torch', list(_PFL_REQUIREMENTS.value))


@functools.cache
def fedjax_python() -> str:
    """The FedJAX venv's Python (the pinned requirements file)."""
    return _venv_python(_FEDJAX_VENV.value, 'fedjax, jax, haiku, optax', ['-r', _FEDJAX_REQUIREMENTS.value])


def thread_count(setting: str) -> int | None:
    """A --threads setting's intra-op threads: an int, or None for 'default' (each framework's own)."""
    return None if setting == 'default' else int(setting)


_THREAD_VARS = ('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS')


def _env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get('TF_CPP_MIN_LOG_LEVEL', '2'))
    if threads is None:  # Each framework's default: none of the variables this parent may have inherited.
        return {k: v for k, v in env.items() if k not in _THREAD_VARS}
    return dict(
        env, TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS='1', OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )  # fmt: skip


def spawn(row: str, path: str | None, work_dir: str, tag: str, threads: int | None) -> dict[str, Any]:
    result, log = (os.path.join(work_dir, f'{tag}.{ext}') for ext in ('json', 'log'))
    peer = {'pfl': 'pfl', 'pfl_first_touch': 'pfl', 'fedjax_first_touch': 'fedjax'}.get(row)
    if peer:
        python = pfl_python() if peer == 'pfl' else fedjax_python()
        script = os.path.join(_REPO, 'benchmarks', f'peer_{peer}_row.py')
        cmd = [python, script, f'--workload={path}', f'--threads={threads or 0}', f'--result={result}']
    else:
        cmd = [sys.executable, os.path.abspath(__file__), f'--_row={row}', f'--_result={result}']
        cmd += [f'--warmup={_WARMUP.value}', f'--engine_strategy={_ENGINE_STRATEGY.value}']
        cmd += [f'--_file={path}'] if path else []
    started = time.time()
    with open(log, 'w') as out:  # A file, never a pipe: TFF's worker keeps inherited descriptors open.
        rc = subprocess.run(cmd, stdout=out, stderr=out, cwd=_REPO, env=_env(threads)).returncode
    if not os.path.exists(result):
        with open(log, errors='replace') as f:
            return dict(error=f'row process exited with {rc}: {f.read()[-1500:]}')
    with open(result) as f:
        out_row = json.load(f)
    with np.load(result + '.npz') as z:
        out_row['weights'] = [z[f'arr_{i}'] for i in range(len(z.files))]
    out_row['wall_s'] = time.time() - started
    return out_row


def summarize(name, runs, warmup: int, flops: float, gflops: float, threads: int, float64=None) -> list[dict]:
    """One output row per framework: medians over repeats, speedups, weight differences."""
    ok = {row: [r for r in results if 'error' not in r] for row, results in runs.items()}
    timed = lambda r, key: float(np.median(r[key][warmup:]))
    spr = {row: [timed(r, 'round_seconds') for r in results] for row, results in ok.items() if results}
    medians = {row: float(np.median(v)) for row, v in spr.items()}
    cpu = {
        row: float(np.median([timed(r, 'cpu_seconds') for r in rs]))
        for row, rs in ok.items()
        if rs and 'cpu_seconds' in rs[0]
    }
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(x, np.float64) - y))) for x, y in zip(a, b))
    reference = ok['tff'][-1]['weights'] if ok.get('tff') else None
    pfl_weights = ok['pfl'][-1]['weights'] if ok.get('pfl') else None
    rows = []
    for row, results in runs.items():
        out: dict[str, Any] = dict(name=f'{name}_{row}', framework=row, threads=threads)
        if not ok[row]:
            rows.append(dict(out, error=results[0]['error'] if results else 'not run'))
            continue
        last, s = ok[row][-1], medians[row]
        out.update(seconds_per_round=s, seconds_per_round_repeats=spr[row], compute_bound_s=flops / (gflops * 1e9))
        if row in cpu:
            out['cpu_seconds_per_round'] = cpu[row]
            if 'pfl' in cpu and row != 'pfl':
                out['cpu_speedup_vs_pfl'] = cpu['pfl'] / cpu[row]
        out['repeat_spread'] = (max(spr[row]) - min(spr[row])) / s
        for peer in ('pfl', 'tff'):
            if peer in medians and peer != row:
                out[f'speedup_vs_{peer}'] = medians[peer] / s
                out[f'ratios_per_repeat_vs_{peer}'] = [p / m for p, m in zip(spr[peer], spr[row])]
        if reference is not None and row != 'tff':
            out['max_abs_diff_vs_per_client'] = diff(last['weights'], reference)
        if pfl_weights is not None and row != 'pfl':
            out['max_abs_diff_vs_pfl'] = diff(last['weights'], pfl_weights)
        if float64 is not None:
            out['max_abs_diff_vs_float64'] = diff(last['weights'], float64)
        out['max_abs_weight'] = max(float(np.max(np.abs(w))) for w in last['weights'])
        out['bound_ratio'] = s / out['compute_bound_s']
        if 'cpu_seconds_per_round' in out:
            out['cpu_bound_ratio'] = out['cpu_seconds_per_round'] / threads / out['compute_bound_s']
        out['round_seconds'] = [r['round_seconds'] for r in ok[row]]
        for key in ('strategy', 'engine_strategy', 'strategy_seconds'):
            if key in last:
                out[key] = [r[key] for r in ok[row]]
        for key in ('prepare_s', 'versions', 'note'):
            if key in last:
                out[key] = last[key]
        rows.append(out)
    return rows


def first_touch_jobs(rows: list[str], path: str, memory_paths: dict[int, str]) -> list[tuple[str, str, str]]:
    """(label, row, workload file) of the first_touch processes of one repeat and thread setting: the rows, then
    engine_first_touch at each --first_touch_memory_clients (label ``engine_first_touch@N``)."""
    jobs = [(row, row, path) for row in rows]
    if 'engine_first_touch' in rows:
        jobs += [(f'engine_first_touch@{n}', 'engine_first_touch', p) for n, p in memory_paths.items()]
    return jobs


def summarize_first_touch(runs, warmup: int, setting: str, registered: dict[str, int]) -> list[dict[str, Any]]:
    """One output row per first_touch process kind: medians over repeats, peak memory, final held-out accuracy
    (the same numpy evaluation of every row's final weights), weight differences against engine_prepacked."""
    import first_touch_data  # pylint: disable=g-import-not-at-top

    x, y = first_touch_data.heldout(WORKLOADS[FIRST_TOUCH]['seed'])
    ok = {label: [r for r in results if 'error' not in r] for label, results in runs.items()}
    timed = lambda r, key: float(np.median(r[key][warmup:]))
    spr = {label: [timed(r, 'round_seconds') for r in rs] for label, rs in ok.items() if rs}
    medians = {label: float(np.median(v)) for label, v in spr.items()}
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(u, np.float64) - v))) for u, v in zip(a, b))
    prepacked = ok['engine_prepacked'][-1]['weights'] if ok.get('engine_prepacked') else None
    rows = []
    for label, results in runs.items():
        row = label.split('@')[0]
        out: dict[str, Any] = dict(
            name=label, framework=row.split('_')[0], workload=FIRST_TOUCH, threads=setting,
            registered_clients=registered[label],
        )  # fmt: skip
        if not ok[label]:
            rows.append(dict(out, error=results[0]['error'] if results else 'not run'))
            continue
        last = ok[label][-1]
        out.update(s_per_round=medians[label], s_per_round_repeats=spr[label])
        if 'cpu_seconds' in last:
            out['cpu_s_per_round'] = float(np.median([timed(r, 'cpu_seconds') for r in ok[label]]))
        out['peak_rss_mb'] = max(r['peak_rss_mb'] for r in ok[label])
        out['peak_rss_mb_repeats'] = [r['peak_rss_mb'] for r in ok[label]]
        out['final_accuracy'] = first_touch_data.accuracy(last['weights'], x, y)
        out['final_accuracy_repeats'] = [first_touch_data.accuracy(r['weights'], x, y) for r in ok[label]]
        if prepacked is not None and label != 'engine_prepacked' and registered[label] == registered[row]:
            out['max_abs_diff_vs_engine_prepacked'] = diff(last['weights'], prepacked)
        for peer in ('pfl_first_touch', 'fedjax_first_touch', 'engine_prepacked'):
            if peer in medians and peer != label and registered[label] == registered[peer]:
                out[f'speedup_vs_{peer}'] = medians[peer] / medians[label]
        out['max_abs_weight'] = max(float(np.max(np.abs(w))) for w in last['weights'])
        out['round_seconds'] = [r['round_seconds'] for r in ok[label]]
        for key in ('strategy', 'prefetch'):
            if key in last:
                out[key] = [r[key] for r in ok[label]]
        for key in ('prepare_s', 'versions'):
            if key in last:
                out[key] = last[key]
        rows.append(out)
    return rows


def main() -> None:
    if _ROW.value:
        return run_row(_ROW.value, _FILE.value, _RESULT.value)
    started, load_before = time.time(), os.getloadavg()
    unknown = [k for k in _WORKLOADS.value if k not in WORKLOADS]
    if unknown:
        sys.exit(f'unknown workloads {unknown}: {list(WORKLOADS)}')
    settings = lambda kind: _CNN_THREADS.value if kind == 'cnn' and _CNN_THREADS.value else _THREADS.value
    repeats = lambda kind: _CNN_REPEATS.value if kind == 'cnn' else _REPEATS.value
    unique = lambda items: list(dict.fromkeys(items))
    threads = unique(t for kind in _WORKLOADS.value for t in settings(kind))
    flop_threads = unique(t for kind in _WORKLOADS.value if kind != FIRST_TOUCH for t in settings(kind))
    rows_of = lambda kind: _FIRST_TOUCH_ROWS.value if kind == FIRST_TOUCH else _ROWS.value
    every_row = {r for kind in _WORKLOADS.value for r in rows_of(kind)}
    if every_row & {'pfl', 'pfl_first_touch'}:
        pfl_python()
    if 'fedjax_first_touch' in every_row:
        fedjax_python()
    report_rows, workload_info, rates = [], {}, {}
    with tempfile.TemporaryDirectory(prefix='peer_speed_') as work_dir:
        for t in flop_threads:
            rates[t] = spawn('flops', None, work_dir, f'flops.{t}', thread_count(t))['gflops']
            print(f'float32 matmul, {t} thread(s): {rates[t]:.1f} GFLOP/s', flush=True)
        jobs, runs, registered = {}, {}, {}
        for kind in _WORKLOADS.value:
            timed = _ROUNDS.value if kind != 'cnn' else _CNN_ROUNDS.value
            path = os.path.join(work_dir, f'{kind}.npz')
            if kind == FIRST_TOUCH:
                n = _FIRST_TOUCH_CLIENTS.value
                workload_info[kind] = write_first_touch_workload(_WARMUP.value + timed, n, path)
                memory = {}
                for m in sorted({int(v) for v in _FIRST_TOUCH_MEMORY_CLIENTS.value} - {n}):
                    memory[m] = os.path.join(work_dir, f'{kind}.{m}.npz')
                    write_first_touch_workload(_WARMUP.value + timed, m, memory[m])
                jobs[kind] = first_touch_jobs(rows_of(kind), path, memory)
                registered = {label: n for label, _, _ in jobs[kind]} | {f'engine_first_touch@{m}': m for m in memory}
                workload_info[kind]['memory_registered_clients'] = list(memory)
            else:
                workload_info[kind] = write_workload(kind, _WARMUP.value + timed, path)
                jobs[kind] = [(row, row, path) for row in rows_of(kind)]
            runs.update({(kind, t): {label: [] for label, _, _ in jobs[kind]} for t in settings(kind)})
        for repeat in range(max(repeats(kind) for kind in _WORKLOADS.value)):
            for t in threads:
                for kind in [k for k in _WORKLOADS.value if t in settings(k)]:
                    for label, row, path in jobs[kind]:
                        if repeat >= (_TFF_REPEATS.value if row == 'tff' else repeats(kind)):
                            continue
                        tag = f'{kind}.{label}.{t}.{repeat}'.replace('@', '.')
                        result = spawn(row, path, work_dir, tag, thread_count(t))
                        runs[kind, t][label].append(result)
                        seconds = result.get('round_seconds', [])[_WARMUP.value :]
                        outcome = result['error'][:300] if 'error' in result else f'{np.median(seconds):.4f} s/round'
                        name = label if kind == FIRST_TOUCH else f'{WORKLOADS[kind]["name"]}_{label}'
                        print(f'[repeat {repeat}, {t} thread(s)] {name}: {outcome}', flush=True)
        reference = dense_reference(os.path.join(work_dir, 'dense.npz')) if 'dense' in _WORKLOADS.value else None
        for (kind, t), by_row in runs.items():
            if kind == FIRST_TOUCH:
                report_rows += summarize_first_touch(by_row, _WARMUP.value, t, registered)
                continue
            name, flops = WORKLOADS[kind]['name'], workload_info[kind]['round_flops']
            count = thread_count(t) or os.cpu_count()
            report_rows += summarize(
                name, by_row, _WARMUP.value, flops, rates[t], count, reference if kind == 'dense' else None
            )
    command = 'python ' + ' '.join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], _REPO)] + sys.argv[1:])
    git = lambda *a: subprocess.run(['git', *a], cwd=_REPO, capture_output=True, text=True).stdout.strip()
    report = dict(
        command=command, commit=git('rev-parse', 'HEAD'), commit_dirty=bool(git('status', '--porcelain', '-uno')),
        cpus=os.cpu_count(), threads=threads, flop_rate_gflops=rates,
        warmup=_WARMUP.value, repeats=_REPEATS.value, load_average_before=load_before,
        load_average_after=os.getloadavg(),
        workloads={WORKLOADS[k]['name']: dict(WORKLOADS[k], **workload_info[k]) for k in _WORKLOADS.value},
        rows=report_rows, wall_s=time.time() - started,
    )  # fmt: skip
    output = os.path.join(_REPO, _OUTPUT.value)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, 'w') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    first_touch = [r for r in report_rows if r.get('workload') == FIRST_TOUCH]
    others = [r for r in report_rows if r.get('workload') != FIRST_TOUCH]
    if others:
        print(markdown(others))
    if first_touch:
        print(markdown_first_touch(first_touch))
    print(f'wrote {output} in {report["wall_s"]:.0f} s')


def markdown_first_touch(rows: list[dict[str, Any]]) -> str:
    fmt = lambda v, spec: '-' if v is None else format(v, spec)
    lines = [
        '| row | threads | registered | s/round (per repeat) | CPU s/round | peak RSS MB | final accuracy | '
        'max diff vs prepacked | prefetch |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        if 'error' in r:
            lines.append(
                f'| {r["name"]} | {r["threads"]} | {r["registered_clients"]} | error: {r["error"][:100]} ||||||'
            )
            continue
        repeats = ', '.join(f'{s:.3f}' for s in r['s_per_round_repeats'])
        lines.append(
            f'| {r["name"]} | {r["threads"]} | {r["registered_clients"]} | {r["s_per_round"]:.4f} ({repeats}) | '
            f'{fmt(r.get("cpu_s_per_round"), ".4f")} | {r["peak_rss_mb"]:.0f} | {r["final_accuracy"]:.4f} | '
            f'{fmt(r.get("max_abs_diff_vs_engine_prepacked"), ".1e")} | {r.get("prefetch", "-")} |'
        )
    return '\n'.join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    fmt = lambda v, spec: '-' if v is None else format(v, spec)
    lines = [
        '| row | threads | s/round (per repeat) | vs pfl | vs TFF | CPU s/round | vs pfl (CPU) | bound s | x bound '
        '(CPU) | max diff vs per-client (TFF) / float64 | strategy |',
        '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        if 'error' in r:
            lines.append(f'| {r["name"]} | {r["threads"]} | error: {r["error"][:100]} |||||||||')
            continue
        repeats = ', '.join(f'{s:.3f}' for s in r['seconds_per_round_repeats'])
        diffs = f'{fmt(r.get("max_abs_diff_vs_per_client"), ".1e")} / {fmt(r.get("max_abs_diff_vs_float64"), ".1e")}'
        lines.append(
            f'| {r["name"]} | {r["threads"]} | {r["seconds_per_round"]:.4f} ({repeats}) | '
            f'{fmt(r.get("speedup_vs_pfl"), ".2f")} | {fmt(r.get("speedup_vs_tff"), ".1f")} | '
            f'{fmt(r.get("cpu_seconds_per_round"), ".4f")} | {fmt(r.get("cpu_speedup_vs_pfl"), ".2f")} | '
            f'{r["compute_bound_s"]:.4f} | {r["bound_ratio"]:.1f} ({fmt(r.get("cpu_bound_ratio"), ".1f")}) | {diffs} | '
            f'{", ".join(sorted(set(map(str, r.get("strategy", ["-"])))))} |'
        )
    return '\n'.join(lines)


if __name__ == '__main__':
    # Flags first (importing TFF takes ~10 s), and no app.run: TensorFlow is imported only where a row needs it.
    app.define_help_flags()
    app.parse_flags_with_usage(sys.argv)
    main()
