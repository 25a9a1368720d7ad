"""fedpersonal's benchmark methods beside PFLlib's own server and client classes, on PFLlib's partition (issue 65).

  python benchmarks/pfllib_crosscheck.py --pfllib_dir ~/.cache/fedpersonal-benchmarks/PFLlib \
      [--methods fedavg,fedprox,...] [--partitions pathological,dirichlet] [--exact_rounds 2] [--exact_clients 4] \
      [--exact_train_rows 100] [--pfllib_venv DIR] [--data_dir DIR] [--overrides fedprox_mu=1.0,...] \
      [--mode exact|statistical] [--statistical_rounds 8] [--seeds 0,1] [--parallel_sides] \
      [--crosscheck_output docs/results/pfllib_crosscheck.json]

(PFLlib's checkout, outside the repository: ``git clone https://github.com/TsingZ0/PFLlib``; rows record its
``git rev-parse HEAD``.)

Exact mode (``--mode exact``, the default): for each method and partition, both libraries train the same clients from the
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
  benchmark's fixed one (``epoch_order='fixed'``: each client's rows permuted by the seed, the same order every
  epoch).
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
FedRoD, APFL, SCAFFOLD, MOON, FedDBE, FedAMP), each with fedpersonal's hyperparameters on both sides (e.g. PFLlib's
FedProx ``mu`` = the config's ``fedprox_mu``; FedAMP's ``alphaK``, ``sigma``, ``lamda`` = ``fedamp_alpha``,
``fedamp_sigma``, ``fedamp_lamda``; ``--overrides`` sets other values on both sides). FedAMP has no global model
(fedpersonal's server keeps a table of the clients' models, PFLlib's ``serveramp.py`` never aggregates): its clients'
own models are compared. Not here: FedBN (no benchmark row: the CNN has no batch normalization). The
verdict is on the weights alone: FedBABU's accuracies differ with equal weights because fedpersonal fine-tunes
before every evaluation and PFLlib only once after training (``serverbabu.py``). With 100 train rows and 2 rounds
the accuracies are coarse (on the pathological partition FedAvg, FedProx, Per-FedAvg and FedALA give the same
per-client accuracies although their weights differ), so equal weights, not accuracies, are the check.

Statistical mode (``--mode statistical``): no shared trajectory; each library trains as it does, and the curves are
compared. For each seed of ``--seeds`` and method: every one of the 20 clients with all its train and test rows
(the partition checked against PFLlib's own code as above), ``--statistical_rounds`` rounds, both sides from the
same initial weights (``fedavg_cnn(seed)``, exported to PFLlib: one source of variance less), the same
hyperparameters (the config's, mapped as in exact mode). fedpersonal's order is the benchmark's (``epoch_order``:
by default a new one every round, drawn from the seed and the round; ``--overrides epoch_order=fixed``: the seed's,
every round; the row records which); PFLlib keeps its own ``DataLoader(shuffle=True)`` (a new order every
epoch) and its own FedALA slice starts, its torch, ``random`` and numpy seeded with the seed after the clients are
built (``clientbase.py:18`` seeds torch with 0 in every client's ``__init__``). Each side evaluates after every
round as it does: fedpersonal the benchmark's evaluation, PFLlib its server's ``evaluate()`` (the same
test-metrics calls exact mode records). ``--parallel_sides`` runs PFLlib's process beside fedpersonal's (one thread
each). The verdict is on the final accuracies (`statistical_verdict`): ``equal`` when the means over seeds differ
by no more than the larger range over seeds of either side; with a single seed on a side, by no more than 1
percentage point (a one-seed rule, which says nothing of the seeds' spread); else ``explained`` (a reason checked
in PFLlib's code, ``statistical_explanation``) or ``unexplained``.

Row (``--output``, one per method and partition, replacing earlier rows of the same method, partition and mode):
``method``, ``partition``, ``mode`` (``exact``), ``rounds``, ``max_abs_weight_diff`` (the largest difference of the
global weights and of every client's predicting weights after the rounds; FedAMP's: the clients' alone,
`weight_diffs`), ``accuracy_fedpersonal`` and
``accuracy_pfllib`` (test accuracy over all clients' test rows after the rounds, as each library evaluates),
``verdict`` (`verdict`: ``equal`` within 1e-3; else ``explained`` with ``explanation``, PFLlib's file:line and why
the two differ; ``unexplained`` is a difference nobody has explained: a suspected bug), ``pfllib_commit``.
Statistical rows (``mode`` ``statistical``): ``max_abs_weight_diff`` is null (no shared weight trajectory), the
accuracies are the final ones of the mean curves over seeds, the verdict as above; then ``curve_fedpersonal`` and
``curve_pfllib`` (mean accuracy after rounds 1..rounds), ``max_curve_gap``, the seeds and each seed's curves,
``verdict_rule`` and ``verdict_bound``, each side's hyperparameters (fedpersonal's config fields, PFLlib's args)
and ``seconds_per_round`` (medians: fedpersonal's training and evaluation; PFLlib's whole round, its evaluation
included; with parallel sides both shared the 2 cores).
"""

from __future__ import annotations

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
from pfllib_crosscheck_lib import _REPO  # noqa: E402
from pfllib_crosscheck_lib import METHODS  # noqa: E402
from pfllib_crosscheck_lib import config_fields  # noqa: E402
from pfllib_crosscheck_lib import keras_to_torch  # noqa: E402
from pfllib_crosscheck_lib import make_row  # noqa: E402
from pfllib_crosscheck_lib import make_statistical_row  # noqa: E402
from pfllib_crosscheck_lib import max_abs_diff  # noqa: E402
from pfllib_crosscheck_lib import merge_rows  # noqa: E402
from pfllib_crosscheck_lib import method_options  # noqa: E402
from pfllib_crosscheck_lib import run_fedpersonal  # noqa: E402
from pfllib_crosscheck_lib import torch_to_keras  # noqa: E402
from pfllib_crosscheck_lib import weight_diffs  # noqa: E402

# ----------------------------------------------------------------------------------------- PFLlib side
_PFLLIB_DIR = flags.DEFINE_string('pfllib_dir', None, 'A checkout of github.com/TsingZ0/PFLlib (never copied here).')
_METHODS = flags.DEFINE_list('methods', list(METHODS), f'Methods, of {list(METHODS)}.')
_PARTITIONS = flags.DEFINE_list('partitions', ['pathological', 'dirichlet'], 'Partitions (pathological, dirichlet).')
_MODE = flags.DEFINE_enum('mode', 'exact', ['exact', 'statistical'], 'Exact or statistical mode (the docstring).')
_STATISTICAL_ROUNDS = flags.DEFINE_integer('statistical_rounds', 8, 'Rounds of statistical mode.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Statistical mode: seeds, each run by both sides (a row: all seeds).')
_PARALLEL = flags.DEFINE_bool(
    'parallel_sides', False, "Statistical mode: PFLlib's side runs beside fedpersonal's (one thread each)."
)
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


def pfllib_args(method: str, config: Any) -> dict[str, Any]:
    """PFLlib's ``args`` of `method` set to fedpersonal's config values."""
    return dict(
        batch_size=config.batch_size,
        local_learning_rate=config.client_learning_rate,
        local_epochs=config.client_epochs,
        **METHODS[method].args(config),
    )


def launch_pfllib(method: str, arrays: dict[str, np.ndarray], run_spec: dict[str, Any], work_dir: str, tag: str = ''):
    """Writes the workload and starts the row script in PFLlib's venv; `wait_pfllib` reads its result."""
    name = f'{method}{tag}'
    workload = os.path.join(work_dir, f'{name}.npz')
    np.savez(workload, spec=json.dumps(run_spec), **arrays)
    result = os.path.join(work_dir, f'{name}.json')
    log = os.path.join(work_dir, f'{name}.log')
    cmd = [pfllib_python(), os.path.join(_HERE, 'pfllib_crosscheck_row.py'), f'--workload={workload}']
    cmd += [f'--pfllib_dir={_PFLLIB_DIR.value}', f'--result={result}']
    out = open(log, 'w')  # noqa: SIM115  Closed by wait_pfllib.  pylint: disable=consider-using-with
    env = peer_speed._env(1)  # pylint: disable=protected-access
    return subprocess.Popen(cmd, stdout=out, stderr=out, env=env), out, workload, result, log


def wait_pfllib(handle) -> dict[str, Any]:
    """The row script's JSON result (raises with its log's end if it failed)."""
    proc, out, workload, result, log = handle
    rc = proc.wait()
    out.close()
    os.remove(workload)
    if rc or not os.path.exists(result):
        with open(log, errors='replace') as f:
            raise RuntimeError(f'PFLlib row exited with {rc}: {f.read()[-3000:]}')
    with open(result) as f:
        return json.load(f)


def client_arrays(xs, ys, txs, tys) -> dict[str, np.ndarray]:
    """The clients' rows in PyTorch's layout (NCHW), as the workload holds them."""
    arrays: dict[str, np.ndarray] = {}
    for c in range(len(xs)):
        arrays[f'train_x_{c}'] = np.ascontiguousarray(xs[c].transpose(0, 3, 1, 2), np.float32)
        arrays[f'train_y_{c}'] = ys[c].astype(np.int64)
        arrays[f'test_x_{c}'] = np.ascontiguousarray(txs[c].transpose(0, 3, 1, 2), np.float32)
        arrays[f'test_y_{c}'] = tys[c].astype(np.int64)
    return arrays


def _pfllib_inputs(
    method: str, rows: tuple[Any, Any, Any, Any], initial: Any, config: Any, rounds: int, **extra: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays PFLlib's row script reads (the clients' train and test rows `rows`, the `initial` Keras weights in
    PyTorch's layout) and its run spec (the method's PFLlib classes, `config`'s hyperparameters, `extra`)."""
    spec = METHODS[method]
    arrays = client_arrays(*rows)
    torch_weights = keras_to_torch(initial)
    arrays.update({f'w{i}': w for i, w in enumerate(torch_weights)})
    run_spec = dict(
        num_clients=len(rows[0]),
        rounds=rounds,
        num_weights=len(torch_weights),
        head_split=spec.head_split,
        server_module=spec.server_module,
        server_class=spec.server_class,
        client_model=spec.client_model,
        args=pfllib_args(method, config),
        **extra,
    )
    return arrays, run_spec


def run_pfllib(method: str, ours: dict[str, Any], rounds: int, work_dir: str) -> dict[str, Any]:
    """PFLlib's run of `method` on `ours`' clients, order and initial weights; its result with weights in Keras'
    layout."""
    xs, ys = ours['train']
    arrays, run_spec = _pfllib_inputs(
        method, (xs, ys, *ours['test']), ours['initial'], ours['config'], rounds, ala_starts=ours['ala_starts']
    )
    handle = launch_pfllib(method, arrays, run_spec, work_dir)
    row = wait_pfllib(handle)
    result = handle[3]
    with np.load(result + '.npz') as z:
        num_global = len([k for k in z.files if k.startswith('global_')])  # FedPer's server: the base; LG: the head.
        row['global_weights'] = torch_to_keras([z[f'global_{i}'] for i in range(num_global)])
        count = lambda c: len([k for k in z.files if k.startswith(f'client{c}_')])  # FedRoD: 8 + its own head.
        row['clients'] = [torch_to_keras([z[f'client{c}_{i}'] for i in range(count(c))]) for c in range(len(xs))]
        row['before'] = [torch_to_keras([z[f'before{c}_{i}'] for i in range(8)]) for c in range(len(xs))]
    return row


def launch_statistical(method: str, ready: dict[str, Any], rounds: int, seed: int, work_dir: str):
    """Starts PFLlib's statistical run of `method`: every client's full rows in PFLlib's partition order, the same
    Keras initial weights, fedpersonal's hyperparameters, PFLlib's own shuffling seeded by `seed`."""
    x, y = ready['pooled']
    train, test = ready['partition_rows']
    rows = ([x[r] for r in train], [y[r] for r in train], [x[r] for r in test], [y[r] for r in test])
    arrays, run_spec = _pfllib_inputs(
        method,
        rows,
        ready['initial'],
        ready['config'],
        rounds,
        ala_starts=None,  # FedALA: PFLlib's own random slice starts.
        shuffle=True,
        seed=seed,
        save_weights=False,
    )
    return launch_pfllib(method, arrays, run_spec, work_dir, tag=f'_statistical_seed{seed}')


def compare(method: str, partition: str, ours: dict[str, Any], theirs: dict[str, Any], rounds: int, commit: str):
    """The row, and details printed beside it."""
    diffs = weight_diffs(  # FedAMP (no global layers): the clients' own models alone.
        ours['global_weights'], ours['global_layers'], theirs['global_weights'], ours['clients'], theirs['clients']
    )
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


def write_rows(rows: list[dict[str, Any]]) -> None:
    """Merges `rows` into ``--crosscheck_output`` (replacing rows of the same method, partition and mode)."""
    old = []
    if os.path.exists(_CROSSCHECK_OUTPUT.value):
        with open(_CROSSCHECK_OUTPUT.value) as f:
            old = json.load(f)
    with open(_CROSSCHECK_OUTPUT.value, 'w') as f:
        json.dump(merge_rows(old, rows), f, indent=1)
        f.write('\n')


def statistical_row(method: str, partition: str, commit: str, checked: dict[str, int], work_dir: str):
    """Both sides' runs of `method` for every seed of ``--seeds``; the row."""
    rounds = _STATISTICAL_ROUNDS.value
    curves_ours, curves_theirs, seconds = {}, {}, dict(fedpersonal_train=[], fedpersonal_eval=[], pfllib=[])
    hyper_ours = hyper_theirs = None
    for seed in [int(x) for x in _SEEDS.value]:
        handle: list = []

        def on_ready(ready, seed=seed, handle=handle):
            if partition not in checked:  # Raises unless PFLlib's own code draws the same partition.
                checked[partition] = check_partition(partition, *ready['full_partition'], work_dir)
                print(f"{partition}: PFLlib's dataset_utils draws the same {checked[partition]} clients", flush=True)
            if _PARALLEL.value:
                handle.append(launch_statistical(method, ready, rounds, seed, work_dir))
            else:
                handle.append(ready)

        started = time.time()
        ours = run_fedpersonal(
            method, partition, None, None, rounds, _DATA_DIR.value, _OVERRIDES.value, seed, True, on_ready
        )
        print(f'fedpersonal {method} seed {seed}: {ours["curve"]} ({time.time() - started:.0f} s)', flush=True)
        if not _PARALLEL.value:
            ready = handle.pop()
            handle.append(launch_statistical(method, ready, rounds, seed, work_dir))
        started = time.time()
        theirs = wait_pfllib(handle[0])
        print(f'PFLlib {method} seed {seed}: {theirs["curve"]} (waited {time.time() - started:.0f} s)', flush=True)
        curves_ours[seed], curves_theirs[seed] = ours['curve'], theirs['curve'][1:]  # [0]: before training.
        seconds['fedpersonal_train'] += ours['round_seconds']
        seconds['fedpersonal_eval'] += ours['eval_seconds']
        seconds['pfllib'] += theirs['round_seconds']
        config = ours['config']
        hyper_theirs = pfllib_args(method, config)
        hyper_ours = dict(
            batch_size=config.batch_size,
            client_learning_rate=config.client_learning_rate,
            client_epochs=config.client_epochs,
            epoch_order=config.epoch_order,
        )
        hyper_ours.update(config_fields(METHODS[method].args, config))
        hyper_ours.update(method_options(method, config))
    per_round = {k: float(np.median(v)) for k, v in seconds.items()}
    per_round['parallel_sides'] = float(_PARALLEL.value)
    row = make_statistical_row(
        method,
        partition,
        rounds,
        curves_ours,
        curves_theirs,
        hyper_ours,
        hyper_theirs,
        commit,
        METHODS[method].statistical_explanation,
        per_round,
    )
    print(json.dumps(row), flush=True)
    return row


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
    if _MODE.value == 'statistical':
        for partition in _PARTITIONS.value:
            for method in _METHODS.value:
                if method not in METHODS:
                    raise app.UsageError(f'unknown method {method!r}; known: {list(METHODS)}')
                write_rows([statistical_row(method, partition, commit, checked, work_dir)])
        return
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
            write_rows([row])


if __name__ == '__main__':
    # Keras imported inside absl's app.run builds fedavg_cnn's Sequential wrong (graph tensors, no layer metadata):
    # TensorFlow and the model module are imported first.
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    from fedpersonal.models import image_classifiers  # noqa: F401  pylint: disable=g-import-not-at-top

    app.run(main)
