"""Probe (issue 44): the engine's XLA group programs on `tf.distribute.Server` workers, per round, vs local.

  python benchmarks/distributed_candidates_tfdist.py [--rounds 60] [--clients_multiple 1] [--base_port 18700]

Workload: `simulation_workloads.mf_setup(group_size=25)` (FedRecon MF, 100 clients per round in 4 groups of 25;
``--clients_multiple m``: 100 m clients, 4 m groups). The driver is pinned to core 0 (it re-executes itself under
``taskset -c 0``); it starts two TF worker servers, task 0 on core 1 and task 1 on core 0, each with one
intra-/inter-op thread, each knowing only its own address (a sparse ``ClusterSpec``: the driver's
`experimental_connect_to_cluster` sends the full cluster). Each worker's engine is built under its device scope
(the group work captures the model's variables); the group data are made resident on the workers once. Rows,
interleaved round by round in one loop (the machine's background load hits every row alike); each returns the
share's partial aggregate (sum weight * update, sum weight, metric sums) fetched to the driver:

* ``local``: the groups' work in the driver (1 core, core 0);
* ``w1``: all groups on worker 0 (core 1), one remote call per group, then a remote partial; ``w2``: half the
  groups on each worker, driven from two threads;
* ``w1_fused`` (``w1_fused_core0``: on worker 1): one remote call per worker and round (its groups' work and the
  partial in one function, the resident groups passed as arguments); ``w2_fused``: two threads; ``w2_async``: the
  two calls enqueued from one thread in async eager mode;
* ``w1_bound`` / ``w2_bound_async``: as fused, the resident groups captured by the function (only the weights
  are arguments); ``w2_tree``: the weights sent to worker 0 only and worker 1's partial merged on worker 0;
* ``w1_nojit`` / ``local_nojit``: as ``w1`` / ``local`` with the engine built on its no-XLA model path (the
  workers also dump the HLO modules they compile, ``XLA_FLAGS=--xla_dump_to``: proof of XLA on the worker);
* ``transfer_only``: a worker's fixed cost, the weights in and an update's worth of tensors out.

Also: first-call (trace + compile) times, a trivial remote function's round trip, CPU seconds per round of each
process, and each row's max abs diff of the summed weighted update (and of the mean update) against local's.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(port: int, task: int) -> None:
    import tensorflow as tf

    # Only its own address: the driver's connect_to_cluster sends the full cluster with each context.
    spec = tf.train.ClusterSpec({'worker': {task: f'localhost:{port}'}})
    server = tf.distribute.Server(spec, job_name='worker', task_index=task, protocol='grpc', start=True)
    print('ready', flush=True)
    server.join()


def _driver(rounds: int, base_port: int, clients_multiple: int) -> dict:
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS='1', TF_NUM_INTEROP_THREADS='1', TF_CPP_MIN_LOG_LEVEL='2')
    ports = [base_port, base_port + 1]
    cores = [1, 0]
    dump = f'/tmp/tfdist_xla_{os.getpid()}'
    procs = [
        subprocess.Popen(
            ['taskset', '-c', str(core), sys.executable, __file__, '--worker', str(port), '--task', str(task)],
            env=dict(env, XLA_FLAGS=f'--xla_dump_to={dump}/w{task}'),  # Proof of compilation on the worker.
            stdout=subprocess.PIPE,
            text=True,
        )
        for task, (port, core) in enumerate(zip(ports, cores))
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == 'ready'
        out = _measure(rounds, ports, [p.pid for p in procs], clients_multiple)
        out['xla_modules_dumped_per_worker'] = [
            sorted({f.split('.')[0] for f in os.listdir(f'{dump}/w{t}') if f.startswith('module_')})
            if os.path.isdir(f'{dump}/w{t}')
            else []
            for t in range(len(procs))
        ]
        return out
    finally:
        subprocess.run(['rm', '-rf', dump], check=False)
        for p in procs:
            p.kill()
            p.wait()


def _cpu(pid: int) -> float:
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _measure(rounds: int, ports: list[int], pids: list[int], clients_multiple: int) -> dict:
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # Before any tensor exists: set_server_def resets the eager context (tensors of the old one become invalid).
    t = time.perf_counter()
    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec({'worker': [f'localhost:{p}' for p in ports]}), job_name='localhost'
    )
    connect_s = time.perf_counter() - t
    devices = [f'/job:worker/replica:0/task:{i}/device:CPU:0' for i in range(len(ports))]

    sys.path.insert(0, os.path.join(_REPO, 'benchmarks'))
    import simulation_workloads

    from fedpersonal.simulation import functional
    from fedpersonal.simulation import packing

    setup = simulation_workloads.mf_setup(group_size=25)
    process, _ = setup.build_fedpersonal('engine')
    runner = process.backend.round_runner
    ids = setup.sample(0)
    ids += [c for c in setup.client_ids if c not in set(ids)][: (clients_multiple - 1) * len(ids)]
    groups = process.backend.pack([setup.dataset_fn(c) for c in ids], client_ids=ids)
    state = process.initialize()
    name = runner.choice.next()
    work_name, parts = runner._runs[name]
    assert parts == 1, name
    work = runner._works[work_name]

    def build(device, xla):
        # The group work captures the model's variables (created when the engine is built): a worker's copy must
        # be built under its device scope, else the call fails accessing a resource on /job:localhost.
        saved = functional._NO_XLA_LAYERS
        functional._NO_XLA_LAYERS = saved if xla else (object,)  # xla=False: the engine's own no-XLA model path.
        try:
            with tf.device(device):
                built, _ = setup.build_fedpersonal('engine')
        finally:
            functional._NO_XLA_LAYERS = saved
        built_runner = built.backend.round_runner
        assert built_runner.choice.next() == name, (built_runner.choice.next(), name)
        return built_runner._works[work_name]

    work_nojit = build('/job:localhost/replica:0/task:0/device:CPU:0', False)
    t = time.perf_counter()
    remote_works = [(build(d, True), build(d, False)) for d in devices]
    build_remote_s = time.perf_counter() - t
    weights = state.global_model_weights
    model_weights = type(weights)(
        trainable=[tf.convert_to_tensor(w) for w in weights.trainable],
        non_trainable=[tf.convert_to_tensor(w) for w in weights.non_trainable],
    )
    local_groups = [packing.as_tensors(g) for g in groups]

    @tf.function
    def partial(outputs):
        # One worker's share: sum weight * update, sum weight, metric sums (as GroupRoundRunner combines them).
        results = [r for r, _ in outputs]
        ws = [tf.cast(r.update_weight, tf.float32) for r in results]
        updates = [tf.add_n([r.update[k] * w for r, w in zip(results, ws)]) for k in range(len(results[0].update))]
        metrics = tf.nest.map_structure(lambda *m: tf.add_n(list(m)), *[m for _, m in outputs])
        return updates, tf.add_n(ws), metrics

    def fetch(x):
        return tf.nest.map_structure(lambda t: t.numpy(), x)

    def on(i, jit, group_idx, resident):
        fn = remote_works[i][0 if jit else 1]
        with tf.device(devices[i]):
            mw = tf.nest.map_structure(tf.identity, model_weights)  # The weights sent once per worker per round.
            return partial([fn(mw, resident[g]) for g in group_idx])

    def run_local(fn):
        return fetch(partial([fn(model_weights, g) for g in local_groups]))

    def resident_on(device):
        with tf.device(device):
            return [tf.nest.map_structure(tf.identity, g) for g in local_groups]

    n = len(groups)
    halves = [list(range(n // 2)), list(range(n // 2, n))]
    t = time.perf_counter()
    resident = [resident_on(d) for d in devices]
    place_s = time.perf_counter() - t

    # One remote call per worker per round: its groups' work and its partial aggregate in one function.
    shares = [tf.function(lambda mw, gs, w=w: partial([w(mw, g) for g in gs])) for w, _ in remote_works]

    def fused(i, group_idx):
        with tf.device(devices[i]):
            return shares[i](model_weights, [resident[i][g] for g in group_idx])

    # As `shares`, with the worker's resident groups captured by the function instead of passed as arguments:
    # the driver then flattens only the weights per call (the argument handling cost grows with the groups).
    def bind(i, group_idx):
        held = [resident[i][g] for g in group_idx]
        work_i = remote_works[i][0]
        return tf.function(lambda mw: partial([work_i(mw, g) for g in held]))

    bound = {(0, 'all'): bind(0, range(n)), **{(i, 'half'): bind(i, halves[i]) for i in range(2)}}

    def run_bound(which):
        keys = [(0, 'all')] if which == 1 else [(0, 'half'), (1, 'half')]
        with context.execution_mode(context.ASYNC):
            out = []
            for i, part in keys:
                with tf.device(devices[i]):
                    out.append(bound[(i, part)](model_weights))
            out = [fetch(o) for o in out]
        return out[0] if len(out) == 1 else tf.nest.map_structure(lambda x, y: x + y, *out)

    add = tf.function(lambda a, b: tf.nest.map_structure(tf.add, a, b))

    def run_w2_tree():
        # The weights sent to worker 0 only, forwarded to worker 1 by the runtime; worker 1's partial merged on
        # worker 0; the driver fetches one partial (its traffic: one model in, one model out).
        with context.execution_mode(context.ASYNC):
            with tf.device(devices[0]):
                mw0 = tf.nest.map_structure(tf.identity, model_weights)
            with tf.device(devices[1]):
                part1 = bound[(1, 'half')](mw0)
            with tf.device(devices[0]):
                part0 = bound[(0, 'half')](mw0)
                merged = add(part0, part1)
            return fetch(merged)

    def run_w1_fused(i=0):
        return fetch(fused(i, range(n)))

    @tf.function
    def transfer(mw):  # A worker's fixed cost per round: the weights in, an update's worth of tensors out.
        return [t * 2.0 for t in mw.trainable], tf.constant(1.0)

    def run_transfer():
        with tf.device(devices[0]):
            return fetch(transfer(model_weights))

    def run_w2_fused():
        out = [None, None]

        def go(i):
            out[i] = fetch(fused(i, halves[i]))

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return tf.nest.map_structure(lambda x, y: x + y, *out)

    def run_w2_async():
        # Both workers' calls enqueued from this thread (async eager), then fetched.
        with context.execution_mode(context.ASYNC):
            out = [fused(i, halves[i]) for i in range(2)]
            out = [fetch(o) for o in out]
        return tf.nest.map_structure(lambda x, y: x + y, *out)

    def run_w1(jit):
        return fetch(on(0, jit, range(n), resident[0]))

    def run_w2(jit):
        out = [None, None]

        def go(i):
            out[i] = fetch(on(i, jit, halves[i], resident[i]))

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        a, b = out
        return tf.nest.map_structure(lambda x, y: x + y, a, b)

    # Trivial remote round trip.
    with tf.device(devices[0]):
        x = tf.constant(1.0)
    trivial = tf.function(lambda v: v + 1.0)
    trips = []
    for _ in range(30):
        t = time.perf_counter()
        with tf.device(devices[0]):
            trivial(x).numpy()
        trips.append(time.perf_counter() - t)
    local_x = tf.constant(1.0)
    local_trips = []
    for _ in range(30):
        t = time.perf_counter()
        trivial(local_x).numpy()
        local_trips.append(time.perf_counter() - t)

    load_start = os.getloadavg()
    rows: dict[str, Callable[[], Any]] = {
        'local': lambda: run_local(work),
        'w1': lambda: run_w1(True),
        'w2': lambda: run_w2(True),
        'w1_fused': run_w1_fused,
        'w1_fused_core0': lambda: run_w1_fused(1),
        'w2_fused': run_w2_fused,
        'w2_async': run_w2_async,
        'w1_bound': lambda: run_bound(1),
        'w2_bound_async': lambda: run_bound(2),
        'w2_tree': run_w2_tree,
        'w1_nojit': lambda: run_w1(False),
        'local_nojit': lambda: run_local(work_nojit),
    }
    extra: dict[str, Callable[[], Any]] = {'transfer_only': run_transfer}
    first: dict[str, float] = {}
    times: dict[str, list[float]] = {k: [] for k in [*rows, *extra]}
    results: dict[str, Any] = {}
    cpu = {k: [0.0] * (len(pids) + 1) for k in rows}  # CPU seconds over the timed rounds: workers..., driver.
    for k, f in rows.items():
        t = time.perf_counter()
        results[k] = f()
        first[k] = time.perf_counter() - t
    rows_and_extra = {**rows, **extra}
    for f in rows.values():  # Second (warm-up) call: the remote side may still instantiate on its first use.
        f()
    slow = {'w1_nojit', 'local_nojit'}  # ~0.4 s a round: a few rounds suffice.
    cpu.update({k: [0.0] * (len(pids) + 1) for k in extra})
    run_transfer()
    for r in range(rounds):
        for k, f in rows_and_extra.items():
            if k in slow and r >= 5:
                continue
            c0 = [_cpu(p) for p in pids] + [time.process_time()]
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
            c1 = [_cpu(p) for p in pids] + [time.process_time()]
            cpu[k] = [a + (y - x) for a, x, y in zip(cpu[k], c0, c1)]
    cpu = {k: [c / len(times[k]) for c in v] for k, v in cpu.items()}

    def mean_update(r):
        updates, weight, _ = r
        return [np.asarray(u) / np.asarray(weight) for u in updates]

    def diff(a, b):
        return max(
            float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))
        )

    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        'strategy': name,
        'clients_per_round': len(ids),
        'groups': n,
        'connect_s': connect_s,
        'build_engine_per_worker_s': build_remote_s / 2 / len(devices),
        'place_group_data_s': place_s,
        'trivial_remote_roundtrip_ms_median': 1e3 * statistics.median(trips[5:]),
        'trivial_local_call_ms_median': 1e3 * statistics.median(local_trips[5:]),
        'first_call_s': first,
        'seconds_per_round_median': med,
        'seconds_per_round_all': times,
        'rounds': rounds,
        'cpu_s_per_round_workers_then_driver': cpu,
        'seconds_per_round_min': {k: min(v) for k, v in times.items()},
        'speedup_vs_local_median_of_paired_rounds': {
            k: statistics.median(a / b for a, b in zip(times['local'], v)) for k, v in times.items()
        },
        'speedup_vs_w1_fused_median_of_paired_rounds': {
            k: statistics.median(a / b for a, b in zip(times['w1_fused'], v)) for k, v in times.items()
        },
        'max_abs_diff_vs_local': {k: diff(results[k], results['local']) for k in rows},
        'max_abs_summed_weighted_update': max(float(np.max(np.abs(u))) for u in results['local'][0]),
        'max_abs_diff_mean_update_vs_local': {
            k: diff(mean_update(results[k]), mean_update(results['local'])) for k in rows
        },
        'loadavg_start_end': [load_start, os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--worker', type=int, help='Run a worker server on this port (internal).')
    parser.add_argument('--task', type=int, default=0)
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--clients_multiple', type=int, default=1, help='Clients per round: this times 100.')
    parser.add_argument('--base_port', type=int, default=18700)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.task)
        return
    if os.sched_getaffinity(0) != {0}:
        os.execvp('taskset', ['taskset', '-c', '0', sys.executable, *sys.argv])
    print(json.dumps(_driver(args.rounds, args.base_port, args.clients_multiple), indent=1))


if __name__ == '__main__':
    main()
