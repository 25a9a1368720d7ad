"""Seconds per simulated round of every algorithm, per-client path against engine, on identical work, in one run.

  python benchmarks/simulation_speed.py [--quick] [--rounds 10]
      [--workloads mf,mf_table1,nwp,furl,hpfl,feddva,peers,first_touch] [--rows tff,per_client,engine,limit]
      [--data_dir DIR_WITH_ML100K_u.data] [--output FILE] [--warmup 1]

Rows: ``tff`` (TFF 0.87's own ``tff.learning.algorithms.build_fed_recon``, same model, split and optimizers; MF
workloads), ``per_client`` and ``engine`` (the workload's fedpersonal builder with ``simulation=...``; per_client
leaves the argument out if the builder does not take it: ``simulation_arg``), ``limit`` (MF workloads: one
hand-written XLA-compiled function per round, ``../shared/reference/limit_fedrecon_mf.py`` on the same data, split
batches, initial weights). The workloads and their FLOP counts are in `simulation_workloads.py`.

Each row runs in its own process from the same initial weights: ``--warmup`` untimed rounds (the first compiles;
the engine runs the strategy of its default ``engine_strategy='auto'``, recorded as the row's ``engine_strategy``),
then ``--rounds`` timed rounds on the same seeded client samples. ``seconds_per_round``: median timed round, ``process.run_round(state,
datasets[, private states], client_ids=ids)`` (fedpersonal: packs, then its fastest round) or ``next`` (TFF);
building the clients' lazy tf.data pipelines is not timed, and the engine rows materialize every sampled client's
data once before round 0 (``prepare_s``, as the limit prepares its arrays). ``compile_s``: build + initialize +
first round - ``seconds_per_round`` (without the one-off ``prepare_s``). ``peak_rss_mb``: the row process'
``ru_maxrss`` + its TFF ``worker_binary``'s VmHWM (TFF computations run there), also given apart.
``max_abs_diff_vs_per_client``: final server weights vs the per-client row's (``max_abs_weight``: the row's largest
weight, for scale). ``compute_bound_s``: the round's analytic FLOPs / a float32 matmul's measured FLOP rate. A
stateful process (FURL, HPFL, FedDVA) carries each client's private state between rounds (a dict by client id,
starting from ``process.initial_private_state()`` or the workload's first state) into ``process.run_round``; its
timed round includes them.

``--quick`` (2 timed rounds of ``QUICK_WORKLOADS``: ``mf`` and the cheapest other workload, ``furl``, unless
``--workloads``) takes ~4 minutes on 2 cores. Writes ``--output`` (``command``, ``machine``, ``flop_rate_gflops``,
``rows``, ``skipped``, ``mf_engine_vs_limit``) and prints a Markdown table; rows not run this time (other workloads,
or other rows of a workload under ``--rows``) are kept from the file (each with the ``earlier_run`` that measured it),
so ``--workloads=peers`` adds or refreshes those rows alone. ``machine`` names the CPU model, its widest instruction
set (``cpu_isa``) and oneDNN's settings (``ONEDNN_MAX_CPU_ISA``, ``TF_ENABLE_ONEDNN_OPTS``: set them to emulate
another kind of machine). ``mf_engine_vs_limit`` keeps one entry per such kind of machine: the ``mf`` engine row's
s/round over the limit's, e.g. from ``--workloads=mf --rows=engine,limit`` run once as is and once under
``ONEDNN_MAX_CPU_ISA=AVX2``.

The ``peers`` workload (issue 43 item 5) runs `benchmarks/peer_speed.py` with `PEER_ARGS` (one intra-op thread
for TensorFlow and PyTorch alike; ``--peer_args`` replaces them): FedAvg rounds of the engine beside pfl-research
(PyTorch, in its own virtual environment) and TFF on identical work; its rows ``dense_fedavg_engine``, ``dense_fedavg_pfl``,
``dense_fedavg_tff``, ``pfl_benchmark_cnn_engine``, ``pfl_benchmark_cnn_pfl``, ``pfl_benchmark_cnn_tff`` carry
``seconds_per_round``, ``speedup_vs_pfl``, ``speedup_vs_tff``, ``compute_bound_s`` and
``max_abs_diff_vs_per_client`` (vs TFF's per-client FedAvg) where defined, and the peer run's details.

The ``first_touch`` workload (issue 63) runs `benchmarks/peer_speed.py` with `FIRST_TOUCH_ARGS` (its
``--workloads=first_touch``, one thread and each framework's default threads; ``--first_touch_args`` replaces them,
one string split as a shell would): FedAvg rounds whose clients are all new every round (100 of 100,000 registered,
each client's data made from its id when sampled) on the engine (``engine_first_touch``: packing inside the round;
``engine_prepacked``: every sampled client packed before round 0), pfl-research (``pfl_first_touch``) and FedJAX
0.0.17 (``fedjax_first_touch``, in its own virtual environment), each row with ``s_per_round``, ``peak_rss_mb``,
``threads``, ``registered_clients`` and ``final_accuracy`` (the same held-out evaluation of every row's final
weights), and ``engine_first_touch@1000000`` for the engine's memory with 1,000,000 registered clients.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import simulation_workloads  # A sibling module: this file runs as a script, with benchmarks/ on sys.path.
from absl import app
from absl import flags
from simulation_workloads import QUICK_WORKLOADS
from simulation_workloads import WORKLOADS
from simulation_workloads import Setup
from simulation_workloads import Workload

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUTPUT = flags.DEFINE_string('output', 'docs/results/simulation_speed.json', 'JSON file written.')
_QUICK = flags.DEFINE_bool('quick', False, 'Quick run: 2 timed rounds, workloads mf and furl (unless --workloads).')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Timed rounds per row, after the warm-up rounds (default 10; quick 2).')
_WARMUP = flags.DEFINE_integer('warmup', 1, 'Untimed rounds first, in every row (the first compiles).')
_WORKLOADS = flags.DEFINE_list(
    'workloads', None, 'Workloads to run (default: all, peers and first_touch; quick: mf, furl).'
)
_ROWS = flags.DEFINE_list('rows', None, 'Rows to run (default: every row of each workload).')
_ROW_TIMEOUT = flags.DEFINE_integer('row_timeout', 1800, 'Seconds before a row process is stopped.')
_ROW = flags.DEFINE_string('_row', None, 'Internal: run this row in this process.')
_WORKLOAD = flags.DEFINE_string('_workload', None, 'Internal: workload of --_row.')
_RESULT = flags.DEFINE_string('_result', None, 'Internal: JSON file --_row writes (weights next to it, .npz).')

PEERS = 'peers'
FIRST_TOUCH = 'first_touch'
# Every round's 100 clients new among 100,000 registered (and engine_first_touch's memory at 1,000,000): one thread
# and each framework's default threads, 3 processes of 10 timed rounds per row.
FIRST_TOUCH_ARGS = ('--workloads=first_touch', '--threads=1,default', '--warmup=2', '--rounds=10', '--repeats=3')
# As docs/RESULTS.md's peer table was measured: 1 thread each (a shared 2-core machine), 3 dense and 2 CNN processes.
PEER_ARGS = ('--threads=1', '--warmup=4', '--repeats=3', '--cnn_repeats=2')
_PEER_ARGS = flags.DEFINE_list(
    'peer_args', list(PEER_ARGS), 'Arguments of benchmarks/peer_speed.py for the peers workload (default: pinned).'
)

_FIRST_TOUCH_ARGS = flags.DEFINE_string(
    'first_touch_args',
    ' '.join(FIRST_TOUCH_ARGS),
    'Arguments of benchmarks/peer_speed.py for the first_touch workload, split as a shell would (default: pinned).',
)

ROW_DESCRIPTIONS = {
    'tff': 'TFF 0.87 tff.learning.algorithms.build_fed_recon',
    'per_client': "fedpersonal build_fed_recon / build_furl(simulation='per_client')",
    'engine': "fedpersonal build_fed_recon / build_furl(simulation='engine')",
    'limit': 'hand-written single XLA-compiled round function',
}


# ------------------------------------------------------------------------------------------ row processes
def _worker_peak_mb() -> float:
    from fedpersonal import runtime

    total = 0.0
    for pid in set(runtime.running_workers()) | set(runtime.worker_pids_of_this_process()):
        try:
            with open(f'/proc/{pid}/status') as f:
                total += next(int(line.split()[1]) for line in f if line.startswith('VmHWM:')) / 1024
        except (OSError, StopIteration):
            pass
    return total


def _run_rounds(setup: Setup, rounds: int, start: Callable[[], Any], step: Callable[[Any, list[str]], Any]):
    """start() -> state; then `--warmup` + `rounds` timed rounds of step(state, ids) -> (state, seconds, pack s)."""
    t0 = time.perf_counter()
    state = start()
    info: dict[str, Any] = dict(build_s=time.perf_counter() - t0, round_seconds=[], pack_seconds=[])
    for r in range(_WARMUP.value + rounds):
        state, seconds, pack_s = step(state, setup.sample(r))
        if r == 0:
            info['first_round_s'] = seconds
        if r >= _WARMUP.value:
            info['round_seconds'].append(seconds)
            info['pack_seconds'].append(pack_s)
        print(f'round {r}: {seconds:.4f} s (pack {pack_s:.4f} s)', flush=True)
    info['pack_s'] = float(np.median(info.pop('pack_seconds')))
    return state, info


def _row_process(setup: Setup, rounds: int, build: Callable[[], tuple[Any, dict]]):
    """A TFF-runtime row: build() -> (process, info). Times `run_round` (fedpersonal) or `next` (TFF).

    A stateful process's private states are kept by client id between rounds (`initial_private_state()` before a
    client's first round) and go into `run_round` with the round's datasets.
    """
    from fedpersonal import runtime

    with runtime.LocalRuntime():
        holder: dict[str, Any] = {}
        private: dict[str, Any] = {}

        def start():
            holder['process'], holder['info'] = build()
            process = holder['process']
            if getattr(process, 'simulation', 'per_client') == 'engine':
                # Each sampled client's data is materialized once per run (as the limit row prepares its arrays):
                # timed apart as prepare_s, not per round.
                t = time.perf_counter()
                clients = sorted({c for r in range(_WARMUP.value + rounds) for c in setup.sample(r)})
                process.backend.pack([setup.dataset_fn(c) for c in clients], client_ids=clients)
                holder['info']['prepare_s'] = time.perf_counter() - t
            return process.initialize()

        def step(state, ids):
            datasets = [setup.dataset_fn(c) for c in ids]  # Lazy tf.data pipelines, built outside the timer.
            process = holder['process']
            run_round = getattr(process, 'run_round', None)  # fedpersonal: packs, then its fastest round.
            if run_round is None:  # TFF's own LearningProcess.
                t = time.perf_counter()
                state = process.next(state, datasets).state
                return state, time.perf_counter() - t, 0.0
            if not process.stateful:
                t = time.perf_counter()
                state = run_round(state, datasets, client_ids=ids).state
                return state, time.perf_counter() - t, 0.0
            if 'initial' not in holder:
                holder['initial'] = process.initial_private_state()
            first = setup.initial_private_state or (lambda c: holder['initial'])
            states = [private[c] if c in private else first(c) for c in ids]
            t = time.perf_counter()
            output = run_round(state, datasets, states, client_ids=ids)
            seconds = time.perf_counter() - t
            private.update(zip(ids, output.private_states))
            return output.state, seconds, 0.0

        state, info = _run_rounds(setup, rounds, start, step)
        info.update(
            holder['info'],
            has_pack=hasattr(getattr(holder['process'], 'backend', None), 'pack'),
            peak_rss_mb_worker=_worker_peak_mb(),
        )
        if getattr(holder['process'], 'engine_strategy', None) is not None:
            info['engine_strategy'] = holder['process'].engine_strategy
        return holder['process'].get_model_weights(state), info


def _row_limit(setup: Setup, rounds: int):
    import tensorflow as tf

    limit, prepare_s = setup.build_limit(), []

    def start():  # Each sampled client's split and step arrays, prepared once before round 0 (prepare_s).
        t = time.perf_counter()
        for c in {c for r in range(_WARMUP.value + rounds) for c in setup.sample(r)}:
            limit.client_arrays(c)
        prepare_s.append(time.perf_counter() - t)
        return tuple(tf.constant(w) for w in limit.initial_weights())

    def step(weights, ids):
        t = time.perf_counter()
        packed = limit.pack(ids)
        pack_s = time.perf_counter() - t
        items = limit.round(weights, packed).numpy()
        return (tf.constant(items), weights[1]), time.perf_counter() - t, pack_s

    weights, info = _run_rounds(setup, rounds, start, step)
    info.update(peak_rss_mb_worker=0.0, prepare_s=prepare_s[0])
    return [weights[0].numpy()], info


ROW_RUNNERS = {
    'tff': lambda setup, rounds: _row_process(setup, rounds, lambda: (setup.build_tff(), {})),
    'per_client': lambda setup, rounds: _row_process(setup, rounds, lambda: setup.build_fedpersonal('per_client')),
    'engine': lambda setup, rounds: _row_process(setup, rounds, lambda: setup.build_fedpersonal('engine')),
    'limit': _row_limit,
}


def run_row(row: str, workload: str, rounds: int, result_path: str) -> None:
    """The row process: runs one row, writes its result JSON and its final server weights (.npz)."""
    result: dict[str, Any] = {'name': row, 'workload': workload}
    try:
        import tensorflow as tf

        setup = WORKLOADS[workload].setup()
        weights, info = ROW_RUNNERS[row](setup, rounds)
        flat = tf.nest.flatten(getattr(weights, 'trainable', weights))
        np.savez(result_path + '.npz', *[np.asarray(w) for w in flat])
        spr = float(np.median(info['round_seconds']))
        python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux.
        result.update(info, seconds_per_round=spr, rounds=rounds, clients_per_round=setup.clients_per_round)
        result.update(
            compile_s=max(0.0, info['build_s'] - info.get('prepare_s', 0.0) + info['first_round_s'] - spr),
            peak_rss_mb=python_mb + info['peak_rss_mb_worker'],
            peak_rss_mb_python=python_mb,
            weights=result_path + '.npz',
        )
        if setup.round_flops is not None:
            result['round_flops'] = float(
                np.mean([setup.round_flops(setup.sample(r)) for r in range(_WARMUP.value, _WARMUP.value + rounds)])
            )
    except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()
        result['error'] = f'{type(e).__name__}: {e}'.strip()[:2000]
    with open(result_path, 'w') as f:
        json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------------------------- the parent
def measure_flop_rate() -> float:
    """GFLOP/s of a 2048^2 float32 matmul (best of 5, TensorFlow's default threads)."""
    import tensorflow as tf

    n = 2048
    a, b = tf.random.uniform([n, n]), tf.random.uniform([n, n])
    tf.matmul(a, b).numpy()
    times = []
    for _ in range(5):
        times.append(time.perf_counter())
        tf.matmul(a, b).numpy()
        times[-1] = time.perf_counter() - times[-1]
    return 2.0 * n**3 / min(times) / 1e9


def _spawn(row: str, workload: str, rounds: int, work_dir: str) -> dict[str, Any]:
    result, log = (os.path.join(work_dir, f'{workload}.{row}.{ext}') for ext in ('json', 'log'))
    cmd = [sys.executable, os.path.abspath(__file__), f'--_row={row}', f'--_workload={workload}', f'--_result={result}']
    cmd += [f'--rounds={rounds}', f'--warmup={_WARMUP.value}'] + (
        [f'--data_dir={simulation_workloads.DATA_DIR.value}'] if simulation_workloads.DATA_DIR.value else []
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get('TF_CPP_MIN_LOG_LEVEL', '2'))
    started = time.time()
    with open(log, 'w') as out:  # A file, never a pipe: TFF's worker keeps inherited descriptors open.
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=out, cwd=_REPO, env=env, timeout=_ROW_TIMEOUT.value).returncode
        except subprocess.TimeoutExpired:
            rc = 'timeout'
    if os.path.exists(result):
        with open(result) as f:
            out_row = json.load(f)
    else:
        with open(log, errors='replace') as f:
            tail = f.read()[-1500:]
        out_row = {'name': row, 'workload': workload, 'error': f'row process exited with {rc}; log tail: {tail}'}
    out_row.update(description=ROW_DESCRIPTIONS[row], wall_s=time.time() - started)
    return out_row


def _load(path: str) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f'arr_{i}'] for i in range(len(z.files))]


def finish_workload(rows: list[dict[str, Any]], workload: Workload, gflops: float) -> None:
    """Adds speedups, weight differences and the compute bound to one workload's rows (in place)."""
    ok = {r['name']: r for r in rows if 'error' not in r}
    base = ok.get(workload.baseline)
    reference = _load(ok['per_client']['weights']) if 'per_client' in ok else None
    flops = next((r['round_flops'] for r in ok.values() if 'round_flops' in r), None)
    for r in ok.values():
        r[f'speedup_vs_{workload.baseline}'] = base['seconds_per_round'] / r['seconds_per_round'] if base else None
        own = _load(r.pop('weights'))
        r['max_abs_weight'] = max(float(np.max(np.abs(w))) for w in own)
        same = reference is not None and [w.shape for w in own] == [w.shape for w in reference]
        diffs = [float(np.max(np.abs(a - b.astype(np.float64)))) for a, b in zip(own, reference or [])]
        r['max_abs_diff_vs_per_client'] = max(diffs) if same else reference and 'weight shapes differ'
        r['compute_bound_s'] = flops / (gflops * 1e9) if flops is not None else None


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else ('-' if value is None else str(value))


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        '| workload | row | s/round | speedup | compile s | pack s | peak RSS MB | max diff vs per-client | bound s |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        if 'error' in r:
            lines.append(f'| {r["workload"]} | {r["name"]} | error: {r["error"].splitlines()[0][:120]} |||||||')
            continue
        speedup = r.get('speedup_vs_tff', r.get('speedup_vs_per_client'))
        lines.append(
            f'| {r["workload"]} | {r["name"]} | {_fmt(r.get("seconds_per_round", r.get("s_per_round")), ".4f")} | {_fmt(speedup, ".1f")}{"x" if speedup else ""} | '
            f'{_fmt(r.get("compile_s"), ".1f")} | {_fmt(r.get("pack_s"), ".4f")} | {_fmt(r.get("peak_rss_mb"), ".0f")} | '
            f'{_fmt(r.get("max_abs_diff_vs_per_client"), ".2e")} | {_fmt(r.get("compute_bound_s"), ".2e")} |'
        )
    return '\n'.join(lines)


_ISA_LEVELS = (('avx512f', 'AVX512_CORE'), ('avx2', 'AVX2'), ('avx', 'AVX'), ('sse4_1', 'SSE41'))


def _cpu_isa(flags: set[str]) -> str:
    """The widest vector instruction set among the CPU's `flags` (/proc/cpuinfo's), as oneDNN names its levels."""
    return next((isa for flag, isa in _ISA_LEVELS if flag in flags), 'unknown')


def _machine() -> dict[str, Any]:
    with open('/proc/cpuinfo') as f:
        lines = f.read().splitlines()
    model = next((line.split(':', 1)[1].strip() for line in lines if line.startswith('model name')), '')
    flags = next((set(line.split(':', 1)[1].split()) for line in lines if line.startswith('flags')), set())
    versions = {p: importlib.metadata.version(p) for p in ('tensorflow', 'tensorflow-federated', 'numpy')}
    git = lambda *a: subprocess.run(['git', *a], cwd=_REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(git('status', '--porcelain', '--untracked-files=no'))  # Uncommitted changes were measured too.
    return dict(
        cpus=os.cpu_count(),
        cpu_model=model,
        cpu_isa=_cpu_isa(flags),
        # oneDNN picks its kernels by instruction set; these emulate another machine (README, Reproducibility).
        onednn_max_cpu_isa=os.environ.get('ONEDNN_MAX_CPU_ISA', 'default'),
        tf_enable_onednn_opts=os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default'),
        platform=platform.platform(),
        commit=git('rev-parse', 'HEAD'),
        commit_dirty=dirty,
        **versions,
    )


def run_peers(work_dir: str, workload: str = PEERS) -> list[dict[str, Any]]:
    """The ``peers`` (``first_touch``) workload's rows: `benchmarks/peer_speed.py` with `PEER_ARGS`
    (`FIRST_TOUCH_ARGS`), each row with its run's details."""
    args = _PEER_ARGS.value if workload == PEERS else shlex.split(_FIRST_TOUCH_ARGS.value)
    output = os.path.join(work_dir, f'{workload}.json')
    cmd = [sys.executable, os.path.join(_REPO, 'benchmarks', 'peer_speed.py'), *args, f'--output={output}']
    subprocess.run(cmd, cwd=_REPO, check=True)
    with open(output) as f:
        report = json.load(f)
    keys = ('command', 'threads', 'flop_rate_gflops', 'warmup', 'load_average_before', 'load_average_after', 'wall_s')
    run = {k: report[k] for k in keys} | {'workloads': report['workloads']}
    return [dict(row, workload=workload, peer_run=run) for row in report['rows']]


def _earlier(
    path: str, names: list[str], measured: set[tuple[str, str]]
) -> tuple[list[dict[str, Any]], dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows, workload descriptions and skips of `path` (an earlier report) of workloads not in `names`, and the
    rows of workloads in `names` that this run did not measure (`measured`: (workload, row) pairs; ``--rows``);
    each row names the run that measured it (``earlier_run``). Also the earlier `MF_VS_LIMIT` entries."""
    if not os.path.exists(path):
        return [], {}, [], []
    with open(path) as f:
        earlier = json.load(f)
    run = dict(command=earlier.get('command'), commit=earlier.get('machine', {}).get('commit'))
    kept = lambda workload: workload not in names
    rows = [
        dict(r, earlier_run=r.get('earlier_run', run))
        for r in earlier.get('rows', [])
        if kept(r['workload']) or (r['workload'] in WORKLOADS and (r['workload'], r.get('name')) not in measured)
    ]
    workloads = {w: d for w, d in earlier.get('workloads', {}).items() if kept(w)}
    skipped = [s for s in earlier.get('skipped', []) if kept(s['workload'])]
    return rows, workloads, skipped, earlier.get(MF_VS_LIMIT, [])


MF_VS_LIMIT = 'mf_engine_vs_limit'  # The MF round against the hand-written limit, one entry per kind of machine.
_MACHINE_KIND = ('cpu_model', 'cpu_isa', 'onednn_max_cpu_isa', 'tf_enable_onednn_opts')


def mf_vs_limit(
    rows: list[dict[str, Any]], machine: dict[str, Any], earlier: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`earlier`'s entries with this run's, if it measured the ``mf`` workload's engine and limit rows: the engine's
    s/round over the limit's on this kind of machine (CPU model, instruction set, oneDNN's settings), replacing an
    earlier entry of the same kind.

    >>> machine = dict(cpu_model='x', cpu_isa='AVX2', onednn_max_cpu_isa='default', tf_enable_onednn_opts='default',
    ...                commit='c')
    >>> rows = [dict(workload='mf', name='engine', seconds_per_round=0.03),
    ...         dict(workload='mf', name='limit', seconds_per_round=0.01)]
    >>> [e['engine_over_limit'] for e in mf_vs_limit(rows, machine, [dict(machine, engine_over_limit=9.0)])]
    [3.0]
    """
    by_name = {r['name']: r for r in rows if r.get('workload') == 'mf' and 'error' not in r and 'earlier_run' not in r}
    if 'engine' not in by_name or 'limit' not in by_name:
        return earlier
    engine, limit = by_name['engine']['seconds_per_round'], by_name['limit']['seconds_per_round']
    entry = {k: machine[k] for k in _MACHINE_KIND} | dict(
        commit=machine['commit'],
        date=time.strftime('%Y-%m-%d'),
        rounds=by_name['engine'].get('rounds'),
        engine_s=engine,
        limit_s=limit,
        engine_over_limit=engine / limit,
    )
    same = lambda e: all(e.get(k) == entry[k] for k in _MACHINE_KIND)
    return [e for e in earlier if not same(e)] + [entry]


def main() -> None:
    rounds = _ROUNDS.value or (2 if _QUICK.value else 10)
    if _ROW.value:
        return run_row(_ROW.value, _WORKLOAD.value, rounds, _RESULT.value)
    names = _WORKLOADS.value or (list(QUICK_WORKLOADS) if _QUICK.value else [*WORKLOADS, PEERS, FIRST_TOUCH])
    unknown = [w for w in names if w not in WORKLOADS and w not in (PEERS, FIRST_TOUCH)]
    unknown += [r for r in _ROWS.value or [] if r not in ROW_RUNNERS]
    if unknown:
        known = [*WORKLOADS, PEERS, FIRST_TOUCH]
        sys.exit(f'unknown workloads/rows {unknown}; workloads: {known}, rows: {list(ROW_RUNNERS)}')
    started, load_before = time.time(), os.getloadavg()
    gflops = measure_flop_rate()
    print(f'float32 matmul: {gflops:.1f} GFLOP/s', flush=True)
    rows, skipped = [], []
    with tempfile.TemporaryDirectory(prefix='simulation_speed_') as work_dir:
        for name in names:
            if name in (PEERS, FIRST_TOUCH):
                args = _PEER_ARGS.value if name == PEERS else shlex.split(_FIRST_TOUCH_ARGS.value)
                print(f'[{name}] benchmarks/peer_speed.py {" ".join(args)} ...', flush=True)
                rows += run_peers(work_dir, name)
                continue
            workload = WORKLOADS[name]
            reason = workload.skip_reason()
            if reason:
                print(f'[{name}] skipped: {reason}', flush=True)
                skipped.append({'workload': name, 'reason': reason})
                continue
            workload_rows = []
            for row in [r for r in workload.rows if not _ROWS.value or r in _ROWS.value]:
                print(f'[{name}] {row} ...', flush=True)
                result = _spawn(row, name, rounds, work_dir)
                outcome = result['error'] if 'error' in result else f'{result["seconds_per_round"]:.4f} s'
                print(f'[{name}] {row}: {outcome}', flush=True)
                workload_rows.append(result)
            finish_workload(workload_rows, workload, gflops)
            rows += workload_rows
    command = 'python ' + ' '.join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], _REPO)] + sys.argv[1:])
    output = os.path.join(_REPO, _OUTPUT.value)  # Relative to the repository; an absolute path stays as is.
    measured = {(r['workload'], r['name']) for r in rows if 'name' in r}
    earlier_rows, descriptions, earlier_skipped, earlier_mf = _earlier(output, names, measured)
    machine = _machine()
    mf_entries = mf_vs_limit(rows, machine, earlier_mf)  # From this run's rows only.
    rows += earlier_rows
    report = dict(command=command, machine=machine, flop_rate_gflops=gflops, rounds=rounds, rows=rows)
    report[MF_VS_LIMIT] = mf_entries
    descriptions |= {n: WORKLOADS[n].description if n in WORKLOADS else 'benchmarks/peer_speed.py' for n in names}
    report.update(skipped=skipped + earlier_skipped, workloads=descriptions, wall_s=time.time() - started)
    report.update(load_average_before=load_before, load_average_after=os.getloadavg())
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, 'w') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    print(markdown(rows))
    print(f'wrote {output} in {report["wall_s"]:.0f} s')


if __name__ == '__main__':
    # Flags first (importing TFF takes ~10 s), and no app.run: with TensorFlow first imported inside app.run, TF
    # 2.14's Keras built the MF model's functional graph eagerly here (its Flatten layer failed on the None batch).
    app.define_help_flags()
    app.parse_flags_with_usage(sys.argv)
    main()
