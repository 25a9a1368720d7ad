"""Seconds per FedRecon MovieLens round on TFF's multi-worker runtime: 1, 2 and 4 loopback workers against local.

  python benchmarks/multi_worker.py [--rounds 5] [--workers 1,2,4] [--group_size 25] [--output FILE]

The round is `simulation_workloads.mf_setup`'s (the reference's MovieLens-shaped MF FedRecon round: 100 clients,
dim 50, 3,700 items, 50 + 10 SGD steps of batch 5), on the fast simulation engine with ``--group_size`` clients per
group (100 / 25 = 4 groups: every worker gets a share). Rows, each from the same initial weights on the same
seeded client samples (every sampled client's data materialized once before round 0, not timed; 1 warm-up
round, then ``--rounds`` timed, median):

* ``local_engine``: `process.run_round` in the local runtime, the default path (groups XLA-compiled in the driver);
* ``local_tff``: `process.next` in TFF's local runtime (one local worker_binary; the groups run in TFF's runtime,
  no XLA), the reference of the distributed rows (``max_abs_diff_vs_local``: final server weights);
* ``workers_N``: `process.run_round` inside `fedpersonal.runtime.DistributedRuntime` on N workers started by
  ``scripts/start_workers.sh N`` on this machine (the round's groups split over them, partial aggregates merged).

Writes ``--output`` (``rows``: ``name``, ``workers``, ``seconds_per_round``, ``first_round_s``,
``max_abs_diff_vs_local``; ``model``: a fit of the distributed rows, below) and prints a Markdown table.

The model (``model``, `_model`): 100 workers with 10,000 clients per round from the measured one-worker round
time and the measured cost of each extra worker. On this 2-core machine every loopback worker shares the same two
cores, so adding workers cannot speed a round up here; the model assumes one machine per worker.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUTPUT = flags.DEFINE_string('output', 'docs/results/multi_worker.json', 'JSON file written.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per row, after 1 warm-up round.')
_WORKERS = flags.DEFINE_list('workers', ['1', '2', '4'], 'Worker counts of the distributed rows.')
_GROUP_SIZE = flags.DEFINE_integer('group_size', 25, 'Clients per engine group (groups are what is distributed).')
_BASE_PORT = flags.DEFINE_integer('base_port', 18200, 'First port of the loopback workers.')


def _start_workers(n: int, port: int) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [os.path.join(_REPO, 'scripts', 'start_workers.sh'), str(n), str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    if not line.startswith('workers: '):
        raise RuntimeError(f'scripts/start_workers.sh {n} {port} did not start: {line!r}')
    return proc, line.split(': ', 1)[1].strip().split(',')


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def _run(setup, rounds: int, use_next: bool) -> dict:
    import tensorflow as tf

    process, _ = setup.build_fedpersonal('engine')
    # Every sampled client's data materialized once before round 0 (as simulation_speed.py's engine rows).
    clients = sorted({c for r in range(rounds + 1) for c in setup.sample(r)})
    process.backend.pack([setup.dataset_fn(c) for c in clients], client_ids=clients)
    t0 = time.perf_counter()
    state = process.initialize()
    seconds = []
    for r in range(rounds + 1):
        ids = setup.sample(r)
        datasets = [setup.dataset_fn(c) for c in ids]
        if use_next:
            data = process.backend.pack(datasets, client_ids=ids)
            t = time.perf_counter()
            state = process.next(state, data).state
        else:
            t = time.perf_counter()
            state = process.run_round(state, datasets, client_ids=ids).state
        seconds.append(time.perf_counter() - t)
        if r == 0:
            first = time.perf_counter() - t0
        print(f'  round {r}: {seconds[-1]:.3f} s', flush=True)
    weights = [np.asarray(w) for w in tf.nest.flatten(process.get_model_weights(state).trainable)]
    return dict(seconds_per_round=float(np.median(seconds[1:])), first_round_s=float(first), weights=weights)


def _model(rows: list[dict]) -> dict:
    """t(W, N) ~= t1 * (N / W) / 100 + h * (W - 1): each of W workers runs N / W clients at the measured one-worker
    rate (t1 for 100 clients, its fixed costs included: an overestimate for large shares), and every extra worker
    adds h, the slope of the 1/2/4-worker rows (its share's RPCs and one more partial aggregate merged in the
    driver, in order; measured on one machine, so it includes the workers' contention for its 2 cores)."""
    by = {r['workers']: r['seconds_per_round'] for r in rows if r['workers'] > 0}
    w = np.array(sorted(by), float)
    h = float(np.polyfit(w, [by[k] for k in sorted(by)], 1)[0]) if len(w) > 1 else 0.0
    t1 = by.get(1, min(by.values()))
    local = {r['name']: r['seconds_per_round'] for r in rows}
    return dict(
        formula='t(W, N) = t1 * (N / W) / 100 + h * (W - 1)',
        t1_one_worker_100_clients_s=t1,
        h_per_extra_worker_s=h,
        predicted_100_workers_10000_clients_s=t1 + h * 99,
        predicted_1_worker_10000_clients_s=100 * t1,
        local_engine_10000_clients_s=100 * local.get('local_engine', float('nan')),
    )


def main(argv):
    del argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import simulation_workloads

    from fedpersonal import runtime

    setup = simulation_workloads.mf_setup(group_size=_GROUP_SIZE.value)
    rows = []
    print('local_engine', flush=True)
    with runtime.LocalRuntime():
        rows.append(dict(name='local_engine', workers=0, **_run(setup, _ROUNDS.value, use_next=False)))
    print('local_tff', flush=True)
    with runtime.LocalRuntime():
        rows.append(dict(name='local_tff', workers=0, **_run(setup, _ROUNDS.value, use_next=True)))
    for n in [int(x) for x in _WORKERS.value]:
        print(f'workers_{n}', flush=True)
        proc, addresses = _start_workers(n, _BASE_PORT.value)
        try:
            with runtime.DistributedRuntime(addresses):
                rows.append(dict(name=f'workers_{n}', workers=n, **_run(setup, _ROUNDS.value, use_next=False)))
        finally:
            _stop(proc)
    reference = rows[1]['weights']
    for row in rows:
        weights = row.pop('weights')
        row['max_abs_diff_vs_local'] = float(max(np.max(np.abs(a - b)) for a, b in zip(weights, reference)))
    result = dict(
        command='python benchmarks/multi_worker.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]),
        workload=f'mf (simulation_workloads.mf_setup): 100 clients per round, engine groups of {_GROUP_SIZE.value}',
        machine=f'{os.cpu_count()} cores',
        rows=rows,
        model=_model(rows),
    )
    os.makedirs(os.path.dirname(_OUTPUT.value) or '.', exist_ok=True)
    with open(_OUTPUT.value, 'w') as f:
        json.dump(result, f, indent=1)
    print('| row | workers | s/round | first round s | max abs diff vs local |')
    print('|---|---:|---:|---:|---:|')
    for r in rows:
        print(
            f'| {r["name"]} | {r["workers"]} | {r["seconds_per_round"]:.3f} | {r["first_round_s"]:.1f} | '
            f'{r["max_abs_diff_vs_local"]:.2e} |'
        )
    print(json.dumps(result['model'], indent=1))


if __name__ == '__main__':
    # Flags parsed without `absl.app.run`: under `app.run` the engine's first `run_round` in this script failed with
    # "<tf.Tensor 'total:0'> is out of scope" (a Keras metric variable created in a graph by `tf.init_scope`); the
    # same calls with the flags parsed directly pass. Not yet understood (the experiment binaries are not affected).
    main(flags.FLAGS(sys.argv))
