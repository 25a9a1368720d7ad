"""fedpersonal's benchmark methods beside PFLlib's own server and client classes, on PFLlib's partition (issue 65).

  python benchmarks/pfllib_crosscheck.py --pfllib_dir ~/.cache/fedpersonal-benchmarks/PFLlib \
      [--methods fedavg,fedprox,...] [--partitions pathological,dirichlet] [--exact_rounds 2] [--exact_clients 4] \
      [--exact_train_rows 100] [--pfllib_venv DIR] [--data_dir DIR] [--overrides fedprox_mu=1.0,...] \
      [--crosscheck_output docs/results/pfllib_crosscheck.json]

(PFLlib's checkout, outside the repository: ``git clone https://github.com/TsingZ0/PFLlib``; rows record its
``git rev-parse HEAD``.)

Exact mode (the only mode so far): for each method and partition, both libraries train the same clients from the
same initial weights on the same batches in the same order for ``--exact_rounds`` rounds; the final weights and
the accuracies are compared.

* the partition: before a partition's first row, PFLlib's own ``dataset/utils/dataset_utils.py`` (its
  ``separate_data`` and ``split_data``, seeded as ``generate_FashionMNIST.py``) partitions the pooled labels in the
  PFLlib venv, and the harness stops unless all 20 clients' train and test rows equal fedpersonal's
  (`check_partition`); the clients' files PFLlib reads are written from those rows.
* fedpersonal: the benchmark's own method (`fedpersonal.tasks.pfl_benchmark`: its plan, process and evaluation,
  seed 0, the config's defaults) on `fedpersonal.data.pfllib.federate`'s partition (``partition_seed`` 1: PFLlib's
  ``generate_FashionMNIST.py noniid - pat`` / ``- dir`` bit for bit), reduced to the first ``--exact_clients``
  clients and, of each, the first ``--exact_train_rows`` train rows (rounded down to a multiple of two batches, so
  that no batch is dropped and Per-FedAvg's double batches fill) and all its test rows. Its batch order is the
  benchmark's (each client's rows permuted by the seed, the same order every epoch).
* PFLlib: `benchmarks/pfllib_crosscheck_row.py` in a virtual environment of its own (``--pfllib_venv``, built on
  first use from ``--pfllib_requirements`` by `peer_speed`'s builder), PFLlib's own ``system/`` classes from
  ``--pfllib_dir`` (a checkout of github.com/TsingZ0/PFLlib; its commit is recorded in every row). The harness
  hands it the same clients' rows in fedpersonal's order, the Keras initial weights in PyTorch's layout
  (`keras_to_torch`) and the method's hyperparameters set to fedpersonal's values; the row script turns PFLlib's
  per-epoch shuffling off (its ``load_train_data`` patched in that process, no file of PFLlib edited) and sets
  FedALA's random slice start to fedpersonal's seeded one. The run is PFLlib's own ``server.train()`` loop; after
  the rounds, the next round's ``send_models`` is where the weights are taken and its own evaluation gives the
  accuracy (see the row script).

Methods: `METHODS` (FedAvg, FedProx, Per-FedAvg, Ditto, FedPer, FedRep, LG-FedAvg, pFedMe, FedALA, FedBABU,
FedRoD, APFL), each with fedpersonal's hyperparameters on both sides (e.g. PFLlib's FedProx ``mu`` = the config's
``fedprox_mu``; ``--overrides`` sets other values on both sides). Not here: FedBN (no benchmark row: the CNN has no
batch normalization), SCAFFOLD, MOON, FedAMP, FedDBE (not benchmark methods yet), and the statistical mode. The
verdict is on the weights alone: FedBABU's accuracies differ with equal weights because fedpersonal fine-tunes
before every evaluation and PFLlib only once after training (``serverbabu.py``). With 100 train rows and 2 rounds
the accuracies are coarse (on the pathological partition FedAvg, FedProx, Per-FedAvg and FedALA give the same
per-client accuracies although their weights differ), so equal weights, not accuracies, are the check.

Row (``--output``, one per method and partition, replacing earlier rows of the same method, partition and mode):
``method``, ``partition``, ``mode`` (``exact``), ``rounds``, ``max_abs_weight_diff`` (the largest difference of the
global weights and of every client's predicting weights after the rounds), ``accuracy_fedpersonal`` and
``accuracy_pfllib`` (test accuracy over all clients' test rows after the rounds, as each library evaluates),
``verdict`` (`verdict`: ``equal`` within 1e-3; else ``explained`` with ``explanation``, PFLlib's file:line and why
the two differ; ``unexplained`` is a difference nobody has explained: a suspected bug), ``pfllib_commit``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app
from absl import flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import peer_speed  # noqa: E402  A sibling module (its venv builder; its flags are defined, unused here).

_REPO = os.path.dirname(_HERE)
TOLERANCE = 1e-3
LAYERS = ('conv1', 'conv2', 'fc1', 'fc')  # fedavg_cnn's layers with weights, as PFLlib's FedAvgCNN's parameters.
FLATTEN_CHW = (64, 4, 4)  # fc1's inputs: PyTorch flattens (channel, row, column), Keras (row, column, channel).
ROW_KEYS = (
    'method',
    'partition',
    'mode',
    'rounds',
    'max_abs_weight_diff',
    'accuracy_fedpersonal',
    'accuracy_pfllib',
    'verdict',
    'pfllib_commit',
)


@dataclasses.dataclass(frozen=True)
class PfllibMethod:
    """How PFLlib runs a benchmark method: its server, whether ``main.py`` splits the model into base and head,
    the client attribute holding the model a client predicts with, its arguments from fedpersonal's config, and a
    known reason the two differ (used only when the weights differ beyond `TOLERANCE`)."""

    server_module: str
    server_class: str
    head_split: bool = False
    client_model: str = 'model'
    args: Any = lambda config: {}
    explanation: str | None = None


METHODS: dict[str, PfllibMethod] = {
    'fedavg': PfllibMethod('serveravg', 'FedAvg', head_split=True),
    'fedprox': PfllibMethod('serverprox', 'FedProx', args=lambda c: {'mu': c.fedprox_mu}),
    'per_fedavg': PfllibMethod('serverperavg', 'PerAvg'),
    'ditto': PfllibMethod(
        'serverditto',
        'Ditto',
        client_model='model_per',
        args=lambda c: {'mu': c.ditto_lambda, 'plocal_epochs': c.personal_epochs},
    ),
    'fedper': PfllibMethod('serverper', 'FedPer', head_split=True),
    'fedrep': PfllibMethod(
        'serverrep', 'FedRep', head_split=True, args=lambda c: {'plocal_epochs': c.fedrep_head_epochs}
    ),
    'lg_fedavg': PfllibMethod('serverlg', 'LG_FedAvg', head_split=True),
    'pfedme': PfllibMethod(
        'serverpFedMe',
        'pFedMe',
        client_model='personalized_params',
        args=lambda c: {
            'lamda': c.pfedme_lambda,
            'K': c.pfedme_k,
            'p_learning_rate': c.pfedme_personal_learning_rate,
            'beta': 1.0,  # fedpersonal's server step (PFLlib's main.py default: 0.0).
        },
        explanation=(
            'PFLlib system/flcore/clients/clientpFedMe.py:81 (test_metrics_personalized) evaluates '
            "personalized_params, which is the model's own parameter list (optimizers/fedoptimizer.py:47 returns "
            "group['params']); train() ends with update_parameters(self.model, self.local_params) (line 68) and "
            "set_parameters (lines 76-77) overwrites them with the received global model, so PFLlib's personalized "
            'model is the global one (its client weights equal its global weights exactly here), not theta. '
            "fedpersonal predicts with the client's last theta (the paper's). The global weights agree."
        ),
    ),
    'fedala': PfllibMethod(
        'serverala',
        'FedALA',
        args=lambda c: {'eta': c.fedala_eta, 'rand_percent': c.fedala_rand_percent, 'layer_idx': c.fedala_layer_idx},
        explanation=(
            'PFLlib system/flcore/servers/serverala.py:74 send_models calls clientala.py:56 local_initialization, '
            "i.e. utils/ALA.py's adaptive_local_aggregation, which learns W one more epoch (ALA.py:146) before the "
            "round's evaluation, so PFLlib evaluates each client at a start with W learned further; fedpersonal "
            "evaluates the start with the client's current W, not learned further (pfl_benchmark_methods' fedala "
            "row). The global weights and the clients' trained local models agree (the harness prints them)."
        ),
    ),
    'fedbabu': PfllibMethod(
        'serverbabu', 'FedBABU', head_split=True, args=lambda c: {'fine_tuning_epochs': c.finetune_epochs}
    ),
    'fedrod': PfllibMethod('serverrod', 'FedROD', head_split=True, client_model='model,head'),
    'apfl': PfllibMethod(
        'serverapfl',
        'APFL',
        client_model='model_per',
        args=lambda c: {'alpha': c.apfl_alpha},
        explanation=(
            'PFLlib system/flcore/clients/clientapfl.py: train() steps the personal model v on its own loss (not on '
            "the mixture's), updates alpha with an extra +0.02*alpha term and then overwrites v with the mixture "
            "alpha*v+(1-alpha)*w; fedpersonal's APFL follows the paper (v trained on the mixed model's loss, alpha by "
            'its gradient alone, v kept).'
        ),
    ),
}


# ----------------------------------------------------------------------------------------- pure parts (tested)
def keras_to_torch(weights: Sequence[np.ndarray], flatten_chw: tuple[int, int, int] = FLATTEN_CHW) -> list[np.ndarray]:
    """Keras weights of a conv/dense stack in PyTorch's layout: conv kernels ``[h, w, in, out] -> [out, in, h, w]``,
    dense kernels transposed, the kernel of the dense layer after the flatten (``prod(flatten_chw)`` inputs) with
    its inputs reordered from Keras' flatten (row, column, channel) to PyTorch's (channel, row, column); biases
    unchanged."""
    out = []
    for w in weights:
        w = np.asarray(w)
        if w.ndim == 4:
            out.append(np.ascontiguousarray(w.transpose(3, 2, 0, 1)))
        elif w.ndim == 2:
            if flatten_chw is not None and w.shape[0] == np.prod(flatten_chw):  # The dense layer after the flatten.
                c, h, wd = flatten_chw
                w = w.reshape(h, wd, c, -1).transpose(2, 0, 1, 3).reshape(c * h * wd, -1)
            out.append(np.ascontiguousarray(w.T))
        else:
            out.append(w.copy())
    return out


def torch_to_keras(weights: Sequence[np.ndarray], flatten_chw: tuple[int, int, int] = FLATTEN_CHW) -> list[np.ndarray]:
    """The inverse of `keras_to_torch`."""
    out = []
    for w in weights:
        w = np.asarray(w)
        if w.ndim == 4:
            out.append(np.ascontiguousarray(w.transpose(2, 3, 1, 0)))
        elif w.ndim == 2:
            w = w.T
            if flatten_chw is not None and w.shape[0] == np.prod(flatten_chw):
                c, h, wd = flatten_chw
                w = w.reshape(c, h, wd, -1).transpose(1, 2, 0, 3).reshape(c * h * wd, -1)
            out.append(np.ascontiguousarray(w))
        else:
            out.append(w.copy())
    return out


def max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """The largest absolute difference of two equally shaped weight lists (raises on a shape or length mismatch)."""
    if len(a) != len(b):
        raise ValueError(f'{len(a)} weights beside {len(b)}')
    diff = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            raise ValueError(f'shapes {x.shape} and {y.shape}')
        diff = max(diff, float(np.max(np.abs(x - y))) if x.size else 0.0)
    return diff


def verdict(diff: float, explanation: str | None) -> tuple[str, str | None]:
    """``('equal', None)`` within `TOLERANCE`; else ``('explained', explanation)`` when a reason is known, or
    ``('unexplained', None)``: a suspected bug on one side. A NaN difference is never equal."""
    if diff <= TOLERANCE:  # False for NaN.
        return 'equal', None
    return ('explained', explanation) if explanation else ('unexplained', None)


def make_row(
    method: str,
    partition: str,
    rounds: int,
    diff: float,
    accuracy_fedpersonal: float,
    accuracy_pfllib: float,
    commit: str,
    explanation: str | None = None,
) -> dict[str, Any]:
    """A row of ``pfllib_crosscheck.json`` (keys `ROW_KEYS`, plus ``explanation`` when explained)."""
    kind, reason = verdict(diff, explanation)
    row = dict(
        method=method,
        partition=partition,
        mode='exact',
        rounds=int(rounds),
        max_abs_weight_diff=float(diff),
        accuracy_fedpersonal=round(float(accuracy_fedpersonal), 6),
        accuracy_pfllib=round(float(accuracy_pfllib), 6),
        verdict=kind,
        pfllib_commit=commit,
    )
    if reason:
        row['explanation'] = reason
    return row


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` with rows of the same (method, partition, mode) as a `new` one replaced, in a stable order."""
    key = lambda r: (r['method'], r['partition'], r['mode'])
    merged = {key(r): r for r in old}
    merged.update({key(r): r for r in new})
    return [merged[k] for k in sorted(merged)]


def full_weights(global_weights: Sequence[np.ndarray], local_weights: Sequence[np.ndarray], local_layers) -> list:
    """A client's whole model (`LAYERS` order, kernel then bias) from the global and the local layers' weights."""
    glob, loc, out = list(global_weights), list(local_weights), []
    for layer in LAYERS:
        source = loc if local_layers == 'all' or layer in local_layers else glob
        out += [source.pop(0), source.pop(0)]
    if glob or loc:
        raise ValueError(f'{len(glob)} global and {len(loc)} local weights left over')
    return out


def exact_train_rows(rows: int, limit: int, batch_size: int) -> int:
    """A client's rows in exact mode: at most `limit`, a multiple of two batches (no batch dropped on either side;
    Per-FedAvg's double batches full)."""
    return min(rows, limit) // (2 * batch_size) * (2 * batch_size)


# ----------------------------------------------------------------------------------------- fedpersonal side
def parse_overrides(items: Sequence[str], config: Any) -> dict[str, Any]:
    """``['fedprox_mu=1.0', ...]`` as config values, each of its field's current type."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition('=')
        if not sep or not hasattr(config, name):
            raise ValueError(f'an override is name=value of a config field, got {item!r}')
        out[name] = type(getattr(config, name))(value)
    return out


def run_fedpersonal(
    method: str,
    partition: str,
    clients: int,
    train_rows: int,
    rounds: int,
    data_dir: str | None,
    overrides: Sequence[str] = (),
):
    """Trains `method` on the reduced partition; returns the config, the clients' arrays in training order, the
    initial and final weights (Keras layout) and the accuracies."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from fedpersonal.core import client_plan  # pylint: disable=g-import-not-at-top
    from fedpersonal.data import pfllib  # pylint: disable=g-import-not-at-top
    from fedpersonal.models import image_classifiers  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import pfl_benchmark  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import pfl_benchmark_evaluation as evaluation  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks.pfl_benchmark_methods import METHOD_SPECS  # pylint: disable=g-import-not-at-top

    config = PflBenchmarkConfig(
        partition=partition, configurations=(method,), seeds=(0,), data_dir=data_dir, state_store='memory'
    )
    config = dataclasses.replace(config, **parse_overrides(overrides, config))
    tf.random.set_seed(config.seed)
    full = pfl_benchmark.load_data(config)
    part = full.partition
    keep = [exact_train_rows(r.size, train_rows, config.batch_size) for r in part.train[:clients]]
    if min(keep) < 2 * config.batch_size:
        raise ValueError(f'a client of the first {clients} has fewer than {2 * config.batch_size} train rows: {keep}')
    reduced = pfllib.PfllibPartition(
        [r[:k] for r, k in zip(part.train, keep)], list(part.test[:clients]), part.label_counts[:clients], part.settings
    )
    data = pfllib.PfllibImageData(full.name, full.x, full.y, reduced, full.num_classes)
    config = dataclasses.replace(config, num_clients=clients)
    benchmark = evaluation.Benchmark(config, data)
    spec = METHOD_SPECS[method]
    initial = image_classifiers.fedavg_cnn(data.x.shape[1:], data.num_classes, seed=config.seed).get_weights()
    plan, phased_model = pfl_benchmark.method_parts(benchmark, method)
    process = pfl_benchmark.build_method_process(benchmark, method, plan, phased_model)
    ids = benchmark.client_ids
    state = process.initialize()
    start = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    global_layers = LAYERS if phased_model is not None else [x for x in LAYERS if x not in spec.local_layers]
    shared = [w for layer, i in zip(LAYERS, range(0, 8, 2)) if layer in global_layers for w in initial[i : i + 2]]
    if max_abs_diff(start, shared) != 0.0:  # The exported weights are the ones fedpersonal starts from.
        raise AssertionError('the process does not start from fedavg_cnn(seed) weights')
    private = [process.initial_private_state() for _ in ids] if plan.stateful else None
    started = time.time()
    for _ in range(rounds):
        datasets = [benchmark.train_dataset(benchmark.train[c]) for c in ids]
        out = process.run_round(state, datasets, private, client_ids=ids)
        state = out.state
        if plan.stateful:
            private = list(out.private_states)
    seconds = time.time() - started
    weights = process.get_model_weights(state)
    per_client: dict[str, Any] = {}
    original = evaluation._accuracies  # pylint: disable=protected-access

    def capture(result):
        per_client['accuracy'] = np.asarray(result['per_client']['accuracy'], np.float64).tolist()
        return original(result)

    evaluation._accuracies = capture  # pylint: disable=protected-access
    try:
        evaluate = evaluation.make_evaluation(
            benchmark, plan, spec.local_layers, finetune=spec.finetune, adapts=spec.adapts, phased_model=phased_model
        )
        metrics = evaluate(weights, private) if plan.stateful else evaluate(weights)
    finally:
        evaluation._accuracies = original  # pylint: disable=protected-access
    global_trainable = [np.asarray(w) for w in weights.trainable]
    clients_weights, trained_local = [], []
    for p in private or [None] * len(ids):
        if p is not None and plan.local_aggregation is not None:  # FedALA: v, the trained local model (then W).
            trained_local.append([np.asarray(w) for w in list(p.trainable)[: len(global_trainable)]])
        if p is None:
            clients_weights.append(global_trainable)
            continue
        own = client_plan.personalized_weights(plan, weights, p)
        if phased_model is not None:  # FedRoD: the whole global model, then the personal head.
            clients_weights.append(global_trainable + [np.asarray(w) for w in own.trainable])
        elif plan.personal or plan.initial_alpha is not None or plan.local_aggregation is not None:
            clients_weights.append([np.asarray(w) for w in own.trainable])
        else:
            clients_weights.append(full_weights(global_trainable, own.trainable, spec.local_layers))
    ala_starts = None
    if plan.local_aggregation is not None:  # FedALA: the start of W's slice at each client's k-th aggregation.
        from fedpersonal.core import local_aggregation  # pylint: disable=g-import-not-at-top

        ala_starts = [
            [
                int(local_aggregation.slice_bounds(plan.local_aggregation, tf.constant(n, tf.int64), k)[0])
                for k in range(rounds + 1)
            ]
            for n in keep
        ]
    xs = [data.x[rows] for rows in benchmark.train_rows]
    ys = [data.y[rows] for rows in benchmark.train_rows]
    test_rows = data.partition.test
    return dict(
        config=config,
        initial=initial,
        train=(xs, ys),
        test=([data.x[r] for r in test_rows], [data.y[r] for r in test_rows]),
        global_weights=global_trainable,
        global_layers=list(global_layers),  # FedRoD: the whole model (its generic head) is global.
        clients=clients_weights,
        accuracy=float(metrics['accuracy']),
        client_accuracy=per_client.get('accuracy'),
        train_rows=keep,
        full_partition=(full.y, part.train, part.test),
        ala_starts=ala_starts,
        trained_local=trained_local,
        seconds=seconds,
    )


# ----------------------------------------------------------------------------------------- PFLlib side
_PFLLIB_DIR = flags.DEFINE_string('pfllib_dir', None, 'A checkout of github.com/TsingZ0/PFLlib (never copied here).')
_METHODS = flags.DEFINE_list('methods', list(METHODS), f'Methods, of {list(METHODS)}.')
_PARTITIONS = flags.DEFINE_list('partitions', ['pathological', 'dirichlet'], 'Partitions (pathological, dirichlet).')
_EXACT_ROUNDS = flags.DEFINE_integer('exact_rounds', 2, 'Rounds of exact mode.')
_EXACT_CLIENTS = flags.DEFINE_integer('exact_clients', 4, 'Exact mode: the first N clients of the partition.')
_EXACT_TRAIN_ROWS = flags.DEFINE_integer(
    'exact_train_rows', 100, "Exact mode: each client's first train rows (down to a multiple of two batches)."
)
_OVERRIDES = flags.DEFINE_list(
    'overrides',
    [],
    "Config values of both sides instead of the benchmark's defaults, e.g. fedprox_mu=1.0 (a stronger check of a "
    'term whose default is small); the rows do not record them, so they need a --crosscheck_output of their own.',
)
_DATA_DIR = flags.DEFINE_string('data_dir', None, "Fashion-MNIST's IDX files (default: the Debian package's).")
_PFLLIB_VENV = flags.DEFINE_string(
    'pfllib_venv', os.path.expanduser('~/.cache/fedpersonal-benchmarks/pfllib-d832e76'), "PFLlib's virtual environment."
)
_PFLLIB_REQUIREMENTS = flags.DEFINE_string(
    'pfllib_requirements',
    os.path.join(_REPO, 'benchmarks', 'requirements', 'pfllib-d832e76.txt'),
    'Requirements file installed into --pfllib_venv.',
)
_CROSSCHECK_OUTPUT = flags.DEFINE_string(
    'crosscheck_output', os.path.join(_REPO, 'docs', 'results', 'pfllib_crosscheck.json'), 'The rows (merged).'
)


def pfllib_python() -> str:
    """The PFLlib venv's Python, built on first use with `peer_speed`'s builder."""
    return peer_speed._venv_python(  # pylint: disable=protected-access
        _PFLLIB_VENV.value, 'torch, sklearn, h5py, matplotlib, ujson, PIL', ['-r', _PFLLIB_REQUIREMENTS.value]
    )


PFLLIB_PARTITIONS = {'pathological': 'pat', 'dirichlet': 'dir'}


def check_partition(partition: str, labels: np.ndarray, train: list, test: list, work_dir: str) -> int:
    """Draws PFLlib's own partition of `labels` (its dataset_utils, in the PFLlib venv) and raises unless every
    client's train and test rows equal fedpersonal's (`train`, `test`: index arrays in PFLlib's saved order).
    Returns the clients compared."""
    path = os.path.join(work_dir, f'labels_{partition}.npy')
    np.save(path, labels.astype(np.int64))
    result = os.path.join(work_dir, f'partition_{partition}.npz')
    cmd = [pfllib_python(), os.path.join(_HERE, 'pfllib_crosscheck_row.py'), f'--pfllib_dir={_PFLLIB_DIR.value}']
    cmd += [f'--partition_labels={path}', f'--partition={PFLLIB_PARTITIONS[partition]}', f'--result={result}']
    done = subprocess.run(cmd, capture_output=True, text=True, env=peer_speed._env(1))  # pylint: disable=protected-access
    if done.returncode:
        raise RuntimeError(f"PFLlib's partition failed: {done.stderr[-3000:]}")
    with np.load(result) as z:
        for c in range(len(train)):
            for split, ours in (('train', train[c]), ('test', test[c])):
                if not np.array_equal(z[f'{split}_{c}'], ours):
                    raise AssertionError(f"{partition}: client {c}'s {split} rows differ from PFLlib's partition")
    return len(train)


def run_pfllib(method: str, ours: dict[str, Any], rounds: int, work_dir: str) -> dict[str, Any]:
    """PFLlib's run of `method` on `ours`' clients, order and initial weights; its result with weights in Keras'
    layout."""
    spec = METHODS[method]
    config = ours['config']
    xs, ys = ours['train']
    txs, tys = ours['test']
    arrays: dict[str, np.ndarray] = {}
    for c in range(len(xs)):
        arrays[f'train_x_{c}'] = np.ascontiguousarray(xs[c].transpose(0, 3, 1, 2), np.float32)
        arrays[f'train_y_{c}'] = ys[c].astype(np.int64)
        arrays[f'test_x_{c}'] = np.ascontiguousarray(txs[c].transpose(0, 3, 1, 2), np.float32)
        arrays[f'test_y_{c}'] = tys[c].astype(np.int64)
    torch_weights = keras_to_torch(ours['initial'])
    arrays.update({f'w{i}': w for i, w in enumerate(torch_weights)})
    args = dict(
        batch_size=config.batch_size,
        local_learning_rate=config.client_learning_rate,
        local_epochs=config.client_epochs,
        **spec.args(config),
    )
    run_spec = dict(
        num_clients=len(xs),
        rounds=rounds,
        num_weights=len(torch_weights),
        head_split=spec.head_split,
        server_module=spec.server_module,
        server_class=spec.server_class,
        client_model=spec.client_model,
        args=args,
        ala_starts=ours['ala_starts'],
    )
    workload = os.path.join(work_dir, f'{method}.npz')
    np.savez(workload, spec=json.dumps(run_spec), **arrays)
    result = os.path.join(work_dir, f'{method}.json')
    log = os.path.join(work_dir, f'{method}.log')
    cmd = [pfllib_python(), os.path.join(_HERE, 'pfllib_crosscheck_row.py'), f'--workload={workload}']
    cmd += [f'--pfllib_dir={_PFLLIB_DIR.value}', f'--result={result}']
    with open(log, 'w') as out:
        rc = subprocess.run(cmd, stdout=out, stderr=out, env=peer_speed._env(1)).returncode  # pylint: disable=protected-access
    if rc or not os.path.exists(result):
        with open(log, errors='replace') as f:
            raise RuntimeError(f'PFLlib row exited with {rc}: {f.read()[-3000:]}')
    with open(result) as f:
        row = json.load(f)
    with np.load(result + '.npz') as z:
        num_global = len([k for k in z.files if k.startswith('global_')])  # FedPer's server: the base; LG: the head.
        row['global_weights'] = torch_to_keras([z[f'global_{i}'] for i in range(num_global)])
        count = lambda c: len([k for k in z.files if k.startswith(f'client{c}_')])  # FedRoD: 8 + its own head.
        row['clients'] = [torch_to_keras([z[f'client{c}_{i}'] for i in range(count(c))]) for c in range(len(xs))]
        row['before'] = [torch_to_keras([z[f'before{c}_{i}'] for i in range(8)]) for c in range(len(xs))]
    return row


def compare(method: str, partition: str, ours: dict[str, Any], theirs: dict[str, Any], rounds: int, commit: str):
    """The row, and details printed beside it."""
    glob = ours['global_weights']
    their_global = theirs['global_weights']
    if len(their_global) == 2 * len(LAYERS):  # PFLlib's server holds a whole model: its global layers compared.
        their_global = [
            w for layer, pair in zip(LAYERS, zip(their_global[::2], their_global[1::2]))
            if layer in ours['global_layers'] for w in pair
        ]  # fmt: skip
    diffs = {'global': max_abs_diff(glob, their_global)}
    for c, (a, b) in enumerate(zip(ours['clients'], theirs['clients'])):
        diffs[f'client{c}'] = max_abs_diff(a, b)
    diff = max(diffs.values()) if not any(np.isnan(list(diffs.values()))) else float('nan')
    if ours['trained_local']:  # FedALA: the clients' trained local models, before either side's next start.
        detail_local = [max_abs_diff(a, b) for a, b in zip(ours['trained_local'], theirs['before'])]
    else:
        detail_local = None
    their_clients = [k / n for k, n in zip(theirs['client_correct'], theirs['client_test'])]
    detail = dict(
        diffs=diffs,
        client_accuracy_fedpersonal=ours['client_accuracy'],
        client_accuracy_pfllib=dict(zip(theirs['client_ids'], their_clients)),
        accuracies_by_round_pfllib=theirs['accuracies_by_round'],
        train_rows=ours['train_rows'],
        trained_local_model_diffs=detail_local,
    )
    row = make_row(
        method, partition, rounds, diff, ours['accuracy'], theirs['accuracy'], commit, METHODS[method].explanation
    )
    return row, detail


def main(argv: Sequence[str]) -> None:
    del argv
    if not _PFLLIB_DIR.value:
        raise app.UsageError('--pfllib_dir is required (a checkout of github.com/TsingZ0/PFLlib).')
    default_output = os.path.join(_REPO, 'docs', 'results', 'pfllib_crosscheck.json')
    if _OVERRIDES.value and os.path.abspath(_CROSSCHECK_OUTPUT.value) == default_output:
        raise app.UsageError('--overrides: rows of other values than the defaults go to another --crosscheck_output.')
    commit = subprocess.run(
        ['git', '-C', _PFLLIB_DIR.value, 'rev-parse', 'HEAD'], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = []
    checked: dict[str, int] = {}
    work_dir = tempfile.mkdtemp(prefix='pfllib_crosscheck_')
    for partition in _PARTITIONS.value:
        for method in _METHODS.value:
            if method not in METHODS:
                raise app.UsageError(f'unknown method {method!r}; known: {list(METHODS)}')
            started = time.time()
            ours = run_fedpersonal(
                method,
                partition,
                _EXACT_CLIENTS.value,
                _EXACT_TRAIN_ROWS.value,
                _EXACT_ROUNDS.value,
                _DATA_DIR.value,
                _OVERRIDES.value,
            )
            if partition not in checked:  # Raises unless PFLlib's own code draws the same partition.
                checked[partition] = check_partition(partition, *ours['full_partition'], work_dir)
                print(f"{partition}: PFLlib's dataset_utils draws the same {checked[partition]} clients", flush=True)
            theirs = run_pfllib(method, ours, _EXACT_ROUNDS.value, work_dir)
            row, detail = compare(method, partition, ours, theirs, _EXACT_ROUNDS.value, commit)
            print(json.dumps(row), flush=True)
            print(f'  details: {json.dumps(detail)}  ({time.time() - started:.0f} s)', flush=True)
            rows.append(row)
            old = []
            if os.path.exists(_CROSSCHECK_OUTPUT.value):
                with open(_CROSSCHECK_OUTPUT.value) as f:
                    old = json.load(f)
            with open(_CROSSCHECK_OUTPUT.value, 'w') as f:
                json.dump(merge_rows(old, [row]), f, indent=1)
                f.write('\n')


if __name__ == '__main__':
    # Keras imported inside absl's app.run builds fedavg_cnn's Sequential wrong (graph tensors, no layer metadata):
    # TensorFlow and the model module are imported first.
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    from fedpersonal.models import image_classifiers  # noqa: F401  pylint: disable=g-import-not-at-top

    app.run(main)
