"""A full FURL round (TFF computation + client state store) at 1K vs 1M registered clients.

  python benchmarks/furl_round_scaling.py [--sizes 1000,1000000] [--rounds 30] [--clients_per_round 10]

Complements `benchmarks/client_state_scaling.py` (the store alone): here each
configuration runs, in a fresh process, the whole FURL loop that
`fedpersonal.program.run_learning_process` runs: sample k of the N registered
clients, read their private states (user embedding, dim 32) from a durable
SQLite store, run `build_furl(..., simulation=...).run_round` (the engine, or the per-client path on TFF's local runtime; the FURL model with a
private user embedding, 16 examples per client), write the states back and commit
(fsync) with the round. Reports the median / p90 round time (after 3 warm-up
rounds), the time spent in the store, and peak RSS (VmHWM, including TFF).

Writes `docs/results/furl_round_scaling.json` and the `furl_round_scaling`
section of `docs/RESULTS.md`.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIM = 32


def _vm(field: str) -> float:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def run_child(config: dict) -> dict:
    sys.path.insert(0, _REPO)
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from fedpersonal import client_state  # pylint: disable=g-import-not-at-top
    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top
    from fedpersonal.algorithms import furl  # pylint: disable=g-import-not-at-top
    from fedpersonal.models import furl_models  # pylint: disable=g-import-not-at-top
    from fedpersonal.program import training_loop  # pylint: disable=g-import-not-at-top

    n, k, rounds, features = config['n'], config['k'], config['rounds'], 8
    model_fn = furl_models.furl_model_fn(
        char_vocab_size=1,
        max_chars=0,
        num_features=features,
        num_classes=2,
        personalization='private',
        user_embedding_dim=_DIM,
        mlp_units=(16,),
    )
    rng = np.random.default_rng(0)

    def client_dataset(client_id: str) -> tf.data.Dataset:
        x = rng.normal(size=[16, features]).astype(np.float32)
        elements = {
            'user_id': np.zeros([16], np.int64),
            'chars': np.zeros([16, 0], np.int32),
            'features': x,
            'label': (x[:, 0] > 0).astype(np.int64),
        }
        return furl_models.batch_dataset(tf.data.Dataset.from_tensor_slices(elements), batch_size=8)

    with runtime.LocalRuntime():
        process = furl.build_furl(model_fn, loss_fn=furl_models.loss_fn, simulation=config['simulation'])
        private_type = process.private_state_type
        spec = [(tuple(t.shape), t.dtype) for t in list(private_type.trainable) + list(private_type.non_trainable)]
        default = client_state.seeded_uniform_default(spec, scale=0.05, seed=0)
        path = os.path.join(config['work_dir'], f'furl_states_{n}.sqlite')
        for suffix in ('', '-wal', '-shm'):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        ids = [f'user{i:07d}' for i in range(n)]
        with client_state.SqliteClientStateStore(path, spec, default) as store:
            started = time.perf_counter()
            store.register(ids)
            register_seconds = time.perf_counter() - started
            del ids
            state = process.initialize()
            round_times, store_times = [], []
            for round_num in range(1, rounds + 1):
                sampled = [f'user{i:07d}' for i in rng.choice(n, size=k, replace=False)]
                datasets = [client_dataset(c) for c in sampled]
                started = time.perf_counter()
                states = [training_loop.to_model_weights(s, private_type) for s in store.get(sampled)]
                in_store = time.perf_counter() - started
                result = process.run_round(state, datasets, states, client_ids=sampled)
                state = result.state
                store_started = time.perf_counter()
                store.put(sampled, [training_loop.from_model_weights(p) for p in result.private_states], round_num)
                store.commit(round_num)
                in_store += time.perf_counter() - store_started
                if round_num > 3:
                    round_times.append(time.perf_counter() - started)
                    store_times.append(in_store)
            assert len(store) == n
    ordered = sorted(round_times)
    return {
        'name': f'FURL round ({config["simulation"]}), SQLite store, N={n:,} registered, k={k}',
        'simulation': config['simulation'],
        'registered_clients': n,
        'clients_per_round': k,
        'rounds_timed': len(round_times),
        'seconds_per_round': statistics.median(round_times),
        'seconds_per_round_p90': ordered[int(round(0.9 * (len(ordered) - 1)))],
        'store_seconds_per_round': statistics.median(store_times),
        'register_seconds': register_seconds,
        'peak_rss_mb': _vm('VmHWM'),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', default='1000,1000000')
    parser.add_argument('--rounds', type=int, default=30)
    parser.add_argument('--clients_per_round', type=int, default=10)
    parser.add_argument('--simulations', default='engine,per_client', help='Comma list: engine, per_client.')
    parser.add_argument('--work_dir', default=None)
    parser.add_argument('--results_json', default='docs/results/furl_round_scaling.json')
    parser.add_argument('--results_md', default='docs/RESULTS.md')
    parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return
    command = 'python benchmarks/furl_round_scaling.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:])
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='furl_round_scaling_')
    rows = []
    for simulation, n in ((m, int(s)) for m in args.simulations.split(',') for s in args.sizes.split(',')):
        config = {
            'n': n,
            'k': args.clients_per_round,
            'rounds': args.rounds,
            'work_dir': work_dir,
            'simulation': simulation,
        }
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), '--child', json.dumps(config)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, 'PYTHONPATH': _REPO},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    sys.path.insert(0, _REPO)
    from fedpersonal.program import outputs  # pylint: disable=g-import-not-at-top

    outputs.write_json(args.results_json, {'command': command, 'rows': rows})
    lines = [
        '| simulation | registered clients | round, median (s) | p90 (s) | of which store get+put+commit (ms) | '
        'register N (s) | peak RSS (MB) |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    for r in rows:
        lines.append(
            f'| {r["simulation"]} | {r["registered_clients"]:,} | {r["seconds_per_round"]:.3f} | {r["seconds_per_round_p90"]:.3f} | '
            f'{1000 * r["store_seconds_per_round"]:.2f} | {r["register_seconds"]:.1f} | '
            f'{r["peak_rss_mb"]:.0f} |'
        )
    section = '\n'.join(
        [
            '## FURL: a full round at 1K vs 1M registered clients',
            '',
            f'Command: `{command}`',
            '',
            f'Each size in a fresh process: k={args.clients_per_round} sampled clients per round, private user embedding '
            f'dim {_DIM} in a durable SQLite store (get, `build_furl(...).run_round`, put, fsynced '
            f'commit), {args.rounds} rounds, the first 3 not timed. Shared 2-core machine (other jobs were running).',
            '',
            *lines,
            '',
            f'Machine-readable: `{args.results_json}`.',
        ]
    )
    outputs.replace_marked_section(args.results_md, 'furl_round_scaling', section)
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
