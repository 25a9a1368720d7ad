"""Seconds per FedRecon MovieLens round on one core, on engine workers (one core each) and on TFF's workers; and a
stateful round (FURL) on one core and on two engine workers.

  python benchmarks/multi_worker.py [--rounds 5] [--engine_passes 4] [--blocks 3] [--paired_passes 10] [--clients_per_round 100] [--tff_workers 1,2]
      [--submit_fit_workers 1,2,4,8] [--workloads mf,furl] [--furl_clients_per_round 100] [--output FILE]

The round is `simulation_workloads.mf_setup`'s (the reference's MovieLens-shaped MF FedRecon round, dim 50, 3,700
items, 50 + 10 SGD steps of batch 5) with ``--clients_per_round`` clients and ``--group_size`` clients per engine
group. This process is pinned to core 0 with one TensorFlow thread (so is every process below: one core, one
compute thread). Every row starts from the same initial weights and runs the same seeded client samples: the
rounds once untimed (every sampled client's data materialized where it is trained, the programs compiled), then
the same rounds again from the initial state, timed (median; the engine rows ``--engine_passes`` times, so that the
model's millisecond terms are medians over that many rounds). The three MF engine rows run in turn ``--blocks``
times, with ``host_2_processes`` (new workers each time), each row's median over all its blocks' rounds, so that a shared host's drifting load
falls on every row alike. ``max_abs_diff_vs_local``: final server weights against ``engine_local_1core``'s.

* ``engine_local_1core``: `process.run_round` in this process (the engine's groups XLA-compiled, one core);
* ``engine_workers_1`` / ``engine_workers_2``: the same inside `fedpersonal.runtime.engine_workers.EngineWorkers`
  with one Ray worker on core 1 / two on cores 0 and 1 (each loads its clients by id and runs its share's groups
  compiled as locally; the round one Ray compiled graph, the partials merged by a tree on the workers, the server
  step here);
* ``host_2_processes``: the alternative without workers: two processes that never communicate, on cores 0 and
  1, each the local engine on one worker's share of every round, rounds started together (a barrier); a round is
  the slower half (each half also runs its own server step). ``engine_workers_2``'s
  ``throughput_vs_host_2_processes`` is its throughput against this;
* ``engine_workers_2_paired``: the rounds of ``engine_workers_2`` and ``engine_local_1core`` in pairs, back to
  back (``--paired_passes`` passes; the local round on cores 0 and 1 in turn): its ``throughput_vs_1core`` is the
  median of the pairs' ratios, which a host's load drifting over minutes does not move as it moves the other rows'
  medians (rows timed minutes apart);
* ``engine_workers_2_balanced_paired``: the same rounds a third time in each pair (the order rotating), on the same
  workers with balanced shares (`EngineWorkers.balance`, `fedpersonal.runtime.balance`: a worker measured faster
  gets more whole groups); also ``throughput_vs_equal_shares_paired`` (against ``engine_workers_2_paired``'s
  round of the same pair) and each round's ``groups_per_worker``;
* ``..._core1_loaded`` (``--loaded_core_paired``): both paired rows again with a busy loop on core 1 beside worker
  1, a worker about half as fast as the other (as on a slower machine): what balanced shares are for (the local
  rounds on core 1 are slowed too: read ``throughput_vs_equal_shares_paired``);
* ``tff_local``: `process.next` in TFF's local runtime (its worker_binary: the groups without XLA);
* ``tff_workers_N``: `process.run_round` inside `fedpersonal.runtime.DistributedRuntime` on N TFF workers
  (`scripts/start_workers.sh`), worker k pinned to core k mod 2.

``furl_engine_local_1core`` / ``furl_engine_workers_2``: FURL's round (`simulation_workloads.furl_setup`: the FURL
task's ASSISTments configuration, ``--furl_clients_per_round`` of its users in groups of ``--group_size``), a
stateful process: every client's private
state (its user embedding) goes to the worker that trains it and comes back to this process's store each round;
``max_abs_diff_vs_local`` then also covers every private state the rounds produced.

``model``: the engine workers' round as per-worker compute plus fixed costs, measured in the engine-worker rows
(`EngineWorkers.last_timings`: the workers' own share seconds, the driver's sending, the rest; see
`multi_worker_model.model`), predicting 100 workers and 10,000 clients per round against linear scaling of one
core; ``model.paired``: the same prediction with c and one core's seconds from each pair of
``engine_workers_2_paired`` (`multi_worker_model.paired_model`), the
median over the pairs and its quartiles; ``model.paired_balanced``: the same from the balanced rounds.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import multi_worker_model
import numpy as np
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUTPUT = flags.DEFINE_string('output', 'docs/results/multi_worker.json', 'JSON file written.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per row (after the same rounds once untimed).')
_ENGINE_PASSES = flags.DEFINE_integer(
    'engine_passes', 4, 'Timed passes over the rounds of the engine rows (medians over more rounds; same weights).'
)
_BLOCKS = flags.DEFINE_integer(
    'blocks', 3, 'Times the three engine rows run in turn (each row: its rounds untimed, then --engine_passes timed).'
)
_PAIRED_PASSES = flags.DEFINE_integer(
    'paired_passes', 10, 'Timed passes over the rounds of engine_workers_2_paired (0: no such row).'
)
_CLIENTS = flags.DEFINE_integer('clients_per_round', 100, 'Clients per round (of 1,000).')
_GROUP_SIZE = flags.DEFINE_integer('group_size', 25, 'Clients per engine group.')
_TFF_WORKERS = flags.DEFINE_list('tff_workers', ['1', '2'], "Worker counts of the TFF-worker rows ('' for none).")
_BASE_PORT = flags.DEFINE_integer('base_port', 18200, 'First port of the loopback TFF workers.')
_FURL_CLIENTS = flags.DEFINE_integer('furl_clients_per_round', 100, "Clients per FURL round (of ASSISTments' users).")
_SUBMIT_FIT = flags.DEFINE_list(
    'submit_fit_workers',
    ['1', '2', '4', '8'],
    "Worker counts whose driver's sending gives the model's d as a fitted slope ('' for none: d by difference).",
)
_LOADED = flags.DEFINE_bool(
    'loaded_core_paired',
    True,
    'The paired rows again with a busy loop on core 1 beside worker 1 (a worker half as fast): balanced shares.',
)
_WORKLOADS = flags.DEFINE_list('workloads', ['mf', 'furl'], 'Workloads: mf (every row, the model), furl (stateful).')


def _workloads():
    """`benchmarks/simulation_workloads` (imported from this directory, also in workers and spawned processes)."""
    sys.path.insert(0, os.path.join(_REPO, 'benchmarks'))
    import simulation_workloads

    return simulation_workloads


def _setup(workload: str = 'mf'):
    if workload == 'furl':
        setup = _workloads().furl_setup(group_size=_GROUP_SIZE.value)
        return dataclasses.replace(setup, clients_per_round=_FURL_CLIENTS.value)
    return _setup_for(_CLIENTS.value, _GROUP_SIZE.value)


def _setup_for(clients: int, group_size: int):
    """The MF workload with `clients` clients per round in engine groups of `group_size`."""
    return dataclasses.replace(_workloads().mf_setup(group_size=group_size), clients_per_round=clients)


def _recipe(clients: int, group_size: int, workload: str = 'mf'):
    """What every engine worker builds (module-level, so that Ray pickles it by reference)."""
    from fedpersonal.runtime import engine_workers

    del clients
    workloads = _workloads()
    setup = (workloads.furl_setup if workload == 'furl' else workloads.mf_setup)(group_size=group_size)
    process, _ = setup.build_fedpersonal('engine')
    return engine_workers.WorkerSetup(process, setup.dataset_fn)


def _start_tff_workers(n: int, port: int) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [os.path.join(_REPO, 'scripts', 'start_workers.sh'), str(n), str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    if not line.startswith('workers: '):
        raise RuntimeError(f'scripts/start_workers.sh {n} {port} did not start: {line!r}')
    children = subprocess.run(['pgrep', '-P', str(proc.pid)], capture_output=True, text=True).stdout.split()
    for k, pid in enumerate(int(c) for c in children):  # Worker k on core k mod 2, one process per core.
        subprocess.run(['taskset', '-a', '-p', '-c', str(k % 2), str(pid)], capture_output=True, check=False)
    return proc, line.split(': ', 1)[1].strip().split(',')


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def _run(setup, rounds: int, use_next: bool, workers=None, passes: int = 1) -> dict:
    import tensorflow as tf

    from fedpersonal.core import process as process_lib

    process, _ = setup.build_fedpersonal('engine')
    seconds, timings = [], []
    private: dict = {}  # A stateful process's private states by client id (this process's store).
    # The rounds once untimed (data materialized, programs compiled), then timed `passes` times from the start.
    for timed in (False, *[True] * passes):
        state, private = process.initialize(), {}
        for r in range(rounds):
            ids = setup.sample(r)
            datasets = process_lib.LazyDatasets(ids, setup.dataset_fn)
            states = [private.get(c) or process.initial_private_state() for c in ids] if process.stateful else None
            if use_next:
                data = process.backend.pack(datasets, client_ids=ids)
                t = time.perf_counter()
                state = process.next(state, data).state
            else:
                t = time.perf_counter()
                output = process.run_round(state, datasets, states, client_ids=ids)
                state = output.state
                if process.stateful:
                    private.update(zip(ids, output.private_states))
            if timed:
                seconds.append(time.perf_counter() - t)
                if workers is not None:
                    timings.append(workers.last_timings)
                print(f'  round {r}: {seconds[-1]:.4f} s', flush=True)
    weights = [np.asarray(w) for w in tf.nest.flatten(process.get_model_weights(state).trainable)]
    for c in sorted(private):  # Every private state the last pass left, in client order.
        weights += [np.asarray(w) for w in tf.nest.flatten(private[c])]
    return dict(seconds=seconds, weights=weights, round_timings=timings)


def _half(core: int, part: int, clients: int, group_size: int, rounds: int, passes: int, barrier, results) -> None:
    """One of ``host_2_processes``' two processes (spawned): the local engine on core `core`, on worker `part`'s
    share of each round's clients (`engine_workers.shares`, as ``engine_workers_2`` splits them); every round starts
    at a barrier with the other process, so the pair's round is its slower half, as the workers' round is."""
    os.sched_setaffinity(0, {core})
    os.environ['TF_NUM_INTRAOP_THREADS'] = os.environ['TF_NUM_INTEROP_THREADS'] = '1'
    sys.path.insert(0, _REPO)
    from fedpersonal import runtime
    from fedpersonal.core import process as process_lib
    from fedpersonal.runtime import engine_workers

    setup = _setup_for(clients, group_size)
    seconds = []
    with runtime.LocalRuntime():
        process, _ = setup.build_fedpersonal('engine')
        for timed in (False, *[True] * passes):
            state = process.initialize()
            for r in range(rounds):
                ids = setup.sample(r)
                a, b = engine_workers.shares(ids, 2, group_size)[part]
                datasets = process_lib.LazyDatasets(ids[a:b], setup.dataset_fn)
                barrier.wait()
                t = time.perf_counter()
                state = process.run_round(state, datasets, None, client_ids=ids[a:b]).state
                if timed:
                    seconds.append(time.perf_counter() - t)
    results.put((part, seconds))


def _host_two_processes(rounds: int, passes: int) -> dict:
    """``host_2_processes``: two processes on this host's two cores that never communicate (each the local engine
    on one worker's share, rounds in step). Its seconds per round are each round's slower half."""
    import multiprocessing

    context = multiprocessing.get_context('spawn')  # TensorFlow's threads do not survive a fork.
    barrier, results = context.Barrier(2), context.Queue()
    args = (_CLIENTS.value, _GROUP_SIZE.value, rounds, passes, barrier, results)
    procs = [context.Process(target=_half, args=(core, core, *args)) for core in (0, 1)]
    for proc in procs:
        proc.start()
    halves = dict(results.get() for _ in procs)
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise RuntimeError(f'host_2_processes: process {procs.index(proc)} exited with {proc.exitcode}')
    return dict(seconds=[max(a, b) for a, b in zip(halves[0], halves[1])], halves_s=[halves[0], halves[1]])


def _run_paired(setup, rounds: int, passes: int, workers, suffix: str = '') -> dict:
    """``engine_workers_2_paired`` and ``engine_workers_2_balanced_paired``: each round once locally, once on the two
    workers of the enclosing `EngineWorkers` block with equal shares and once with balanced shares
    (`EngineWorkers.balance`), back to back (the order rotates), the local one on cores 0 and 1 in turn. Within a
    second of each other, the three see the same load of the host, which drifts by tens of percent over minutes."""
    import tensorflow as tf

    from fedpersonal.core import process as process_lib
    from fedpersonal.runtime.worker_actor import pin_to_core

    names = ('local', 'workers', 'balanced')
    processes = {name: setup.build_fedpersonal('engine')[0] for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cores: list[int] = []
    timings: dict[str, list[dict]] = dict(workers=[], balanced=[])  # `last_timings`, for the model's c.

    def timed_round(name: str, state, datasets, ids):
        process = processes[name]
        if name == 'local':  # Outside the workers' block: a fresh context, where no `EngineWorkers` is active.
            pin_to_core(len(cores) % 2)
            started = time.perf_counter()
            state = contextvars.Context().run(process.run_round, state, datasets, None, client_ids=ids).state
            elapsed = time.perf_counter() - started
            pin_to_core(0)
            return state, elapsed
        workers.balance = name == 'balanced'
        started = time.perf_counter()
        state = process.run_round(state, datasets, None, client_ids=ids).state
        elapsed = time.perf_counter() - started
        workers.balance = False
        return state, elapsed

    step = 0  # The order rotates round by round (also through the untimed pass).
    for timed in (False, *[True] * passes):
        states = {name: processes[name].initialize() for name in names}
        for r in range(rounds):
            ids = setup.sample(r)
            datasets = process_lib.LazyDatasets(ids, setup.dataset_fn)
            step += 1
            for name in names[step % 3 :] + names[: step % 3]:
                states[name], elapsed = timed_round(name, states[name], datasets, ids)
                if timed:
                    seconds[name].append(elapsed)
                    if name != 'local':
                        timings[name].append(workers.last_timings)
            if timed:
                cores.append(len(cores) % 2)
    weights = {
        name: [np.asarray(w) for w in tf.nest.flatten(p.get_model_weights(states[name]).trainable)]
        for name, p in processes.items()
    }

    def row(name: str) -> dict:
        ratios = [a / b for a, b in zip(seconds['local'], seconds[name])]
        extra = {}
        if name == 'balanced':
            extra['groups_per_worker'] = [t['groups'] for t in timings[name]]
            extra['throughput_vs_equal_shares_paired'] = float(
                np.median([a / b for a, b in zip(seconds['workers'], seconds[name])])
            )
        return dict(
            seconds_per_round=float(np.median(seconds[name])),
            seconds=seconds[name],
            local_seconds=seconds['local'],
            local_core=cores,
            local_seconds_per_round_by_core=[
                float(np.median([t for t, c in zip(seconds['local'], cores) if c == k])) for k in (0, 1)
            ],
            paired_ratios=ratios,
            paired_ratio_quartiles=[float(q) for q in np.percentile(ratios, [25, 50, 75])],
            round_timings=timings[name],
            max_abs_diff_vs_paired_local=float(
                max(np.max(np.abs(a - b)) for a, b in zip(weights[name], weights['local']))
            ),
            weights=weights[name],
            **extra,
        )

    return {
        f'engine_workers_2_paired{suffix}': row('workers'),
        f'engine_workers_2_balanced_paired{suffix}': row('balanced'),
    }


def _summary(runs: list[dict]) -> dict:
    """One row from one or more `_run`s of it (the last run's weights; medians over every timed round)."""
    seconds = [t for run in runs for t in run['seconds']]
    timings = [t for run in runs for t in run['round_timings']]
    row = dict(seconds_per_round=float(np.median(seconds)), seconds=seconds, weights=runs[-1]['weights'])
    if timings:
        row['timings'] = {
            key: float(np.median([np.max(t[key]) if np.size(t[key]) else 0.0 for t in timings]))
            for key in (
                'round_s',
                'submit_s',
                'shares_s',
                'wait_s',
                'finish_s',
                'start_delays_s',
                'merges_s',
                'transport_s',
            )
            if all(key in t for t in timings)
        }
        # The faster worker's share: with the slower one's, how evenly whole groups shared the round's work.
        row['timings']['fastest_share_s'] = float(np.median([np.min(t['shares_s']) for t in timings]))
    return row


def _send_per_client(weights) -> float:
    """The driver's sending per client id: Ray's serializer (what the compiled graph's input write runs) on a
    round's message with 10,000 ids less with 1,000, per extra id (medians of 20)."""
    import ray

    context = ray._private.worker.global_worker.get_serialization_context()

    def cost(n: int) -> float:
        ids, times = [f'{i:06d}' for i in range(n)], []
        for _ in range(20):
            started = time.perf_counter()
            context.serialize((weights, (ids, None)))
            times.append(time.perf_counter() - started)
        return float(np.median(times))

    return max(cost(10_000) - cost(1_000), 0.0) / 9_000


def _submit_fit(setup, recipe, counts: list[int]) -> dict:
    """The driver's sending (`EngineWorkers.last_timings['submit_s']`, the median over two passes of the rounds)
    with each of `counts` workers (on the two cores in turn, more workers than cores where asked: the sending is the
    driver's own work), and its least-squares slope per worker: the model's d from several worker counts instead of
    the difference of two sendings a few tens of microseconds apart."""
    from fedpersonal import runtime
    from fedpersonal.runtime import engine_workers

    submit = []
    for n in counts:
        print(f'submit_fit: {n} workers', flush=True)
        with runtime.LocalRuntime(), engine_workers.EngineWorkers(recipe, workers=n, cores=[1, 0]) as workers:
            run = _run(setup, _ROUNDS.value, use_next=False, workers=workers, passes=2)
        submit.append(float(np.median([t['submit_s'] for t in run['round_timings']])))
    slope, intercept = np.polyfit(counts, submit, 1)
    return dict(workers=counts, submit_s=submit, slope_per_worker_s=float(slope), intercept_s=float(intercept))


def main(argv):
    del argv
    os.sched_setaffinity(0, {0})  # Before TensorFlow starts its threads: this process on core 0.
    from fedpersonal import runtime
    from fedpersonal.runtime import engine_workers

    setup, rows = _setup(), {}
    if 'mf' in _WORKLOADS.value:
        recipe = functools.partial(_recipe, _CLIENTS.value, _GROUP_SIZE.value)
        runs: dict[str, list[dict]] = collections.defaultdict(list)
        send_per_client = []
        # The engine rows in turn, `--blocks` times: a shared host's load drifts over minutes, and each row then
        # sees the same drift (one row after the other once gave two workers 1.15x one core, the next run 1.64x).
        for block in range(_BLOCKS.value):
            print(f'engine_local_1core (block {block})', flush=True)
            with runtime.LocalRuntime():
                runs['engine_local_1core'].append(
                    _run(setup, _ROUNDS.value, use_next=False, passes=_ENGINE_PASSES.value)
                )
            for n, cores in ((1, [1]), (2, [0, 1])):
                print(f'engine_workers_{n} (block {block})', flush=True)
                with runtime.LocalRuntime(), engine_workers.EngineWorkers(recipe, workers=n, cores=cores) as workers:
                    runs[f'engine_workers_{n}'].append(
                        _run(setup, _ROUNDS.value, use_next=False, workers=workers, passes=_ENGINE_PASSES.value)
                    )
                    if n == 1:
                        process, _ = setup.build_fedpersonal('engine')
                        send_per_client.append(_send_per_client(process.initialize().global_model_weights))
            print(f'host_2_processes (block {block})', flush=True)
            runs['host_2_processes'].append(_host_two_processes(_ROUNDS.value, _ENGINE_PASSES.value))
        rows['engine_local_1core'] = dict(workers=0, **_summary(runs['engine_local_1core']))
        for n in (1, 2):
            rows[f'engine_workers_{n}'] = dict(workers=n, **_summary(runs[f'engine_workers_{n}']))
        rows['engine_workers_1']['send_per_client_s'] = float(np.median(send_per_client))
        if [x for x in _SUBMIT_FIT.value if x]:
            counts = [int(x) for x in _SUBMIT_FIT.value if x]
            rows['engine_workers_1']['submit_fit'] = _submit_fit(setup, recipe, counts)
        if _PAIRED_PASSES.value:
            print('engine_workers_2_paired', flush=True)
            with runtime.LocalRuntime(), engine_workers.EngineWorkers(recipe, workers=2, cores=[0, 1]) as workers:
                for name, row in _run_paired(setup, _ROUNDS.value, _PAIRED_PASSES.value, workers).items():
                    rows[name] = dict(workers=2, **row)
            if _LOADED.value:
                print('engine_workers_2_paired_core1_loaded', flush=True)
                loop = 'import os\nos.sched_setaffinity(0, {1})\nwhile True:\n    pass'
                loader = subprocess.Popen([sys.executable, '-c', loop])
                try:
                    with (
                        runtime.LocalRuntime(),
                        engine_workers.EngineWorkers(recipe, workers=2, cores=[0, 1]) as workers,
                    ):
                        paired = _run_paired(setup, _ROUNDS.value, _PAIRED_PASSES.value, workers, '_core1_loaded')
                finally:
                    loader.kill()
                    loader.wait()
                rows.update((name, dict(workers=2, **row)) for name, row in paired.items())
        host = runs['host_2_processes']
        rows['host_2_processes'] = dict(
            workers=2,
            seconds_per_round=float(np.median([t for run in host for t in run['seconds']])),
            seconds=[t for run in host for t in run['seconds']],
            halves_s=[float(np.median([t for run in host for t in run['halves_s'][k]])) for k in (0, 1)],
        )
        print('tff_local', flush=True)
        with runtime.LocalRuntime():
            rows['tff_local'] = dict(workers=0, **_summary([_run(setup, _ROUNDS.value, use_next=True)]))
        for n in [int(x) for x in _TFF_WORKERS.value if x]:
            print(f'tff_workers_{n}', flush=True)
            proc, addresses = _start_tff_workers(n, _BASE_PORT.value)
            try:
                with runtime.DistributedRuntime(addresses):
                    rows[f'tff_workers_{n}'] = dict(workers=n, **_summary([_run(setup, _ROUNDS.value, use_next=False)]))
            finally:
                _stop(proc)
    if 'furl' in _WORKLOADS.value:
        furl = _setup('furl')
        print('furl_engine_local_1core', flush=True)
        with runtime.LocalRuntime():
            rows['furl_engine_local_1core'] = dict(
                workers=0, **_summary([_run(furl, _ROUNDS.value, use_next=False, passes=_ENGINE_PASSES.value)])
            )
        print('furl_engine_workers_2', flush=True)
        recipe = functools.partial(_recipe, _CLIENTS.value, _GROUP_SIZE.value, 'furl')
        with runtime.LocalRuntime(), engine_workers.EngineWorkers(recipe, workers=2, cores=[0, 1]) as workers:
            row = _summary([_run(furl, _ROUNDS.value, use_next=False, workers=workers, passes=_ENGINE_PASSES.value)])
            rows['furl_engine_workers_2'] = dict(workers=2, **row)
    for name, row in rows.items():  # Against the local row of the same workload.
        local = rows['furl_engine_local_1core' if name.startswith('furl') else 'engine_local_1core']
        row['throughput_vs_1core'] = local['seconds_per_round'] / row['seconds_per_round']
        if 'weights' not in row:  # host_2_processes: two halves, no aggregate.
            continue
        weights, reference = row['weights'], local['weights']
        assert len(weights) == len(reference), name
        row['max_abs_diff_vs_local'] = float(max(np.max(np.abs(a - b)) for a, b in zip(weights, reference)))
    for row in rows.values():
        row.pop('weights', None)
    paired_timings = {}
    for name in [n for n in rows if '_paired' in n]:  # Their own local rounds, paired with their workers' rounds.
        rows[name]['throughput_vs_1core'] = rows[name]['paired_ratio_quartiles'][1]
        paired_timings[name] = rows[name].pop('round_timings')
    if 'host_2_processes' in rows:  # The two workers' round against two independent local processes.
        rows['engine_workers_2']['throughput_vs_host_2_processes'] = (
            rows['host_2_processes']['seconds_per_round'] / rows['engine_workers_2']['seconds_per_round']
        )
    result = dict(
        command='python benchmarks/multi_worker.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]),
        workload=(
            f'mf (simulation_workloads.mf_setup): {_CLIENTS.value} clients per round, engine groups of '
            f"{_GROUP_SIZE.value}; furl rows: simulation_workloads.furl_setup (the FURL task's ASSISTments "
            f'configuration, {_FURL_CLIENTS.value} users per round in the same groups); every process on one core with one TensorFlow thread'
        ),
        machine=f'{os.cpu_count()} cores',
        rows=[dict(name=name, **row) for name, row in rows.items()],
        model=multi_worker_model.model(rows, _CLIENTS.value) if 'engine_workers_1' in rows else None,
    )
    if result['model'] is not None and paired_timings:
        for key, name in (
            ('paired', 'engine_workers_2_paired'),
            ('paired_balanced', 'engine_workers_2_balanced_paired'),
        ):
            result['model'][key] = multi_worker_model.paired_model(
                result['model'], rows[name], paired_timings[name], _CLIENTS.value
            )
    os.makedirs(os.path.dirname(_OUTPUT.value) or '.', exist_ok=True)
    with open(_OUTPUT.value, 'w') as f:
        json.dump(result, f, indent=1)
    print('| row | workers | s/round | throughput vs 1 core | max abs diff vs local |')
    print('|---|---:|---:|---:|---:|')
    for r in result['rows']:
        print(
            f'| {r["name"]} | {r["workers"]} | {r["seconds_per_round"]:.4f} | {r["throughput_vs_1core"]:.2f} | '
            f'{r.get("max_abs_diff_vs_local", float("nan")):.2e} |'
        )
    if result['model'] is not None:
        print(json.dumps(result['model'], indent=1))


if __name__ == '__main__':
    # Flags parsed without `absl.app.run`: under `app.run` the engine's first `run_round` in this script failed with
    # "<tf.Tensor 'total:0'> is out of scope" (a Keras metric variable created in a graph by `tf.init_scope`); the
    # same calls with the flags parsed directly pass. Not yet understood (the experiment binaries are not affected).
    os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')
    os.environ.setdefault('TF_NUM_INTEROP_THREADS', '1')
    main(flags.FLAGS(sys.argv))
