"""How the client state stores scale with the number of registered clients.

  python benchmarks/client_state_scaling.py [--sizes 1000,1000000] [--clients_per_round 10,100] \
      [--rounds 200] [--dim 32] [--rounds_per_commit 1] [--work_dir DIR]

For each store (in-memory, SQLite on disk under --work_dir), each number N of
registered clients and each number k of clients per round, a fresh subprocess
(so memory numbers are per configuration) registers N clients with a FURL-style
seeded random user embedding (--dim floats: 32; a personal copy of a model is
larger, e.g. Ditto's of MovieLens matrix factorization, 1628 x 50 + 50), then
runs --rounds rounds of: get the states of k random clients, update them, put
them back (timed: get + put), and every --rounds_per_commit rounds (a
checkpoint) commit (timed separately; an fsync for SQLite). It
reports the registration time, the median and p90 seconds per round, the median
commit time, the process's peak RSS (VmHWM) and the store's size on disk.

The subprocess imports `fedpersonal.client_state` without running
`fedpersonal/__init__.py`, which imports TensorFlow Federated (hundreds of MB of
RSS that have nothing to do with the store); the store needs numpy and the
standard library only.

Writes `docs/results/client_state_scaling.json` and replaces the
`client_state_scaling` section of `docs/ENGINE.md`.
"""

import argparse
import collections.abc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _proc_status_mb(field: str) -> float:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024  # kB -> MiB
    raise KeyError(field)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class _ClientIds(collections.abc.Sequence):
    """The ids `user0000000`, `user0000001`, ... made on demand, so the benchmark's own id list does not
    count in the store's memory (the in-memory store keeps its own keys; SQLite keeps them on disk)."""

    def __init__(self, n: int):
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        if not -self._n <= index < self._n:
            raise IndexError(index)
        return f'user{index % self._n:07d}'


def run_child(config: dict) -> dict:
    """One configuration, in this (fresh) process."""
    import types  # pylint: disable=g-import-not-at-top

    pkg = types.ModuleType('fedpersonal')
    pkg.__path__ = [os.path.join(_REPO, 'fedpersonal')]
    sys.modules['fedpersonal'] = pkg  # Skip fedpersonal/__init__.py (imports TFF); see the module docstring.
    import numpy as np  # pylint: disable=g-import-not-at-top

    from fedpersonal import client_state  # pylint: disable=g-import-not-at-top

    n, k, rounds = config['n'], config['k'], config['rounds']
    spec = [((config['dim'],), np.float32)]
    default_fn = client_state.seeded_uniform_default(spec, scale=0.1, seed=config['seed'])
    baseline_rss = _proc_status_mb('VmRSS')
    path = None
    if config['store'] == 'sqlite':
        path = os.path.join(config['work_dir'], f'states_{n}_{k}.db')
        for suffix in ('', '-wal', '-shm'):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        store = client_state.SqliteClientStateStore(path, spec, default_fn)
    else:
        store = client_state.InMemoryClientStateStore(spec, default_fn)

    ids = _ClientIds(n)
    started, started_cpu = time.perf_counter(), time.process_time()
    store.register(ids)
    register_seconds = time.perf_counter() - started
    register_cpu_seconds = time.process_time() - started_cpu
    assert len(store) == n

    rng = np.random.default_rng(config['seed'])
    round_times, commit_times = [], []
    for round_num in range(1, rounds + 1):
        sampled = [ids[i] for i in rng.choice(n, size=k, replace=False)]
        started = time.perf_counter()
        states = store.get(sampled)
        get_seconds = time.perf_counter() - started
        updated = [[s[0] + np.float32(0.01)] for s in states]  # Stands in for local training (not timed).
        started = time.perf_counter()
        store.put(sampled, updated, round_num)
        round_times.append(get_seconds + time.perf_counter() - started)
        if round_num % config['rounds_per_commit'] == 0 or round_num == rounds:
            started = time.perf_counter()
            store.commit(round_num)
            commit_times.append(time.perf_counter() - started)
    assert len(store) == n and store.committed_round() == rounds
    peak_rss = _proc_status_mb('VmHWM')
    store.close()
    disk_mb = None
    if path is not None:
        disk_mb = sum(os.path.getsize(path + s) for s in ('', '-wal', '-shm') if os.path.exists(path + s)) / 2**20
    return {
        'name': f'{config["store"]} N={n} k={k}' + (f' dim={config["dim"]}' if config['dim'] != 32 else ''),
        'store': config['store'],
        'registered_clients': n,
        'clients_per_round': k,
        'rounds': rounds,
        'dim': config['dim'],
        'rounds_per_commit': config['rounds_per_commit'],
        'seconds_per_round': statistics.median(round_times),
        'seconds_per_round_p90': _percentile(round_times, 0.9),
        'commit_seconds': statistics.median(commit_times),
        'register_seconds': register_seconds,
        'register_cpu_seconds': register_cpu_seconds,
        'peak_rss_mb': peak_rss,
        'baseline_rss_mb': baseline_rss,
        'disk_mb': disk_mb,
    }


def _fmt(value, scale=1.0, digits=2):
    return '–' if value is None else f'{value * scale:,.{digits}f}'


def markdown_table(rows: list[dict]) -> str:
    lines = [
        '| configuration | register N, wall (CPU) s | round get+put, median (ms) | p90 (ms) | commit, median (ms) '
        '| peak RSS (MB) | on disk (MB) |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    for r in rows:
        lines.append(
            f'| {r["name"]} | {_fmt(r["register_seconds"])} ({_fmt(r["register_cpu_seconds"])}) '
            f'| {_fmt(r["seconds_per_round"], 1e3, 3)} '
            f'| {_fmt(r["seconds_per_round_p90"], 1e3, 3)} | {_fmt(r["commit_seconds"], 1e3, 3)} '
            f'| {_fmt(r["peak_rss_mb"], digits=0)} | {_fmt(r["disk_mb"], digits=1)} |'
        )
    return '\n'.join(lines)


def interpretation(rows: list[dict]) -> str:
    """One sentence made of the measured numbers (so it stays true when the benchmark is re-run)."""
    by = {(r['store'], r['registered_clients'], r['clients_per_round']): r for r in rows}
    sizes = sorted({r['registered_clients'] for r in rows})
    lo, hi, k = sizes[0], sizes[-1], min(r['clients_per_round'] for r in rows)
    need = [(store, n, k) for store in ('sqlite', 'in_memory') for n in (lo, hi)]
    if lo == hi or not all(key in by for key in need):
        return ''
    sql_lo, sql_hi, mem_lo, mem_hi = (by[key] for key in need)
    ms = lambda r: f'{r["seconds_per_round"] * 1e3:.2f}'  # pylint: disable=unnecessary-lambda-assignment
    return (
        f'From {lo:,} to {hi:,} registered clients (k={k}), the median get+put round goes from {ms(sql_lo)} to '
        f'{ms(sql_hi)} ms with SQLite and from {ms(mem_lo)} to {ms(mem_hi)} ms in memory (indexed lookups, '
        f'no scans), while peak RSS grows by {round(mem_hi["peak_rss_mb"] - mem_lo["peak_rss_mb"]):d} MB for '
        f'the in-memory store and by {round(sql_hi["peak_rss_mb"] - sql_lo["peak_rss_mb"]):d} MB for SQLite, which '
        f'keeps '
        f"the states on disk ({sql_hi['disk_mb']:.0f} MB); SQLite's fsynced commit adds "
        f'~{sql_hi["commit_seconds"] * 1e3:.1f} ms per round.'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--sizes', default='1000,1000000', help='Registered clients N (comma-separated).')
    parser.add_argument('--clients_per_round', default='10,100', help='Clients per round k (comma-separated).')
    parser.add_argument('--stores', default='in_memory,sqlite', help='Stores to measure (comma-separated).')
    parser.add_argument('--rounds', type=int, default=200, help='Rounds per configuration.')
    parser.add_argument('--dim', type=int, default=32, help='Floats in a client state.')
    parser.add_argument('--rounds_per_commit', type=int, default=1, help='Rounds between commits (checkpoints).')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--work_dir', default=None, help='Directory for the SQLite files (default: a temp dir, removed afterwards).'
    )
    parser.add_argument('--results_json', default=os.path.join(_REPO, 'docs/results/client_state_scaling.json'))
    parser.add_argument(
        '--results_md',
        default=os.path.join(_REPO, 'docs/ENGINE.md'),
        help='Markdown file whose client_state_scaling section is replaced ("" to skip).',
    )
    parser.add_argument('--child', default=None, help=argparse.SUPPRESS)  # JSON config of one configuration.
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0

    command = ' '.join(['python benchmarks/client_state_scaling.py'] + [shlex.quote(a) for a in sys.argv[1:]])
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='client_state_scaling_')
    os.makedirs(work_dir, exist_ok=True)
    load_before = os.getloadavg()
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(',')):
            for store in args.stores.split(','):
                for k in (int(s) for s in args.clients_per_round.split(',')):
                    config = dict(
                        store=store,
                        n=n,
                        k=k,
                        rounds=args.rounds,
                        seed=args.seed,
                        work_dir=work_dir,
                        dim=args.dim,
                        rounds_per_commit=args.rounds_per_commit,
                    )
                    env = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1', MKL_NUM_THREADS='1')
                    out = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), '--child', json.dumps(config)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    if out.returncode:
                        print(out.stderr, file=sys.stderr)
                        raise RuntimeError(f'configuration {config} failed (exit code {out.returncode})')
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    rows.append(row)
                    print(
                        f'{row["name"]}: register {row["register_seconds"]:.2f} s, round '
                        f'{row["seconds_per_round"] * 1e3:.3f} ms, peak RSS {row["peak_rss_mb"]:.0f} MB',
                        flush=True,
                    )
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    load_after = os.getloadavg()

    machine = (
        f'{os.cpu_count()} CPU cores, shared: 1-minute load average {load_before[0]:.1f} before and '
        f'{load_after[0]:.1f} after the run (one configuration at a time, single-threaded)'
    )
    results = {'command': command, 'dataset': f'synthetic states, dim {args.dim}', 'machine': machine, 'rows': rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.results_json)), exist_ok=True)
    with open(args.results_json, 'w') as f:
        json.dump(results, f, indent=2)
        f.write('\n')
    table = markdown_table(rows)
    print(table)
    if args.results_md:
        section = '\n'.join(
            [
                '## Client state store scaling',
                '',
                f'`{command}`',
                '',
                f'Synthetic FURL-style states (one float32 user embedding of dim {args.dim} per client, seeded uniform '
                f'init), {args.rounds} rounds per configuration of get + put for k random clients, a commit every '
                f'{args.rounds_per_commit} round(s); '
                'each configuration in a fresh process (peak RSS = VmHWM, including ~'
                f'{statistics.median(r["baseline_rss_mb"] for r in rows):.0f} MB of Python + numpy). {machine}: wall times '
                'include waiting for a core; the CPU seconds of registration show the work itself.',
                '',
                table,
                '',
                interpretation(rows),
            ]
        )
        from fedpersonal.program import outputs  # pylint: disable=g-import-not-at-top  (parent only: imports TFF)

        outputs.replace_marked_section(args.results_md, 'client_state_scaling', section)
    return 0


if __name__ == '__main__':
    sys.exit(main())
