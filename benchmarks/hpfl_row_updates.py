"""Cost of one HPFL local epoch with dense vs lazy table updates, as the padded item table grows.

  python benchmarks/hpfl_row_updates.py [--max_items 2000,10745,100000] [--records 8000] [--batch_size 512] \
      [--assist_dir ../shared/data/assist-a0910]

Every HPFL client's private tables are padded to the largest silo (`fedpersonal.models.gum`), so a small silo pays
for the largest one's table size in every optimizer step when the optimizer steps the full tables
(``row_updates='dense'``). ``'lazy'`` gathers the rows a batch touches, steps them and scatters them back
(`fedpersonal.algorithms.hpfl.local_training`). For each padded item-table size this times one local epoch of a
silo with ``--records`` training records over 300 users and 2,000 items (K = 110 attributes, h = 16, the ASSIST
shape) with Adam and with SGD, in a `tf.function` (median of --repeats runs after one warm-up), and reports the
largest difference between the dense and lazy results (0 for SGD, where lazy is exact). With --assist_dir it also
times whole HPFL rounds on the 40 ASSIST silos (configs/hpfl_assist.flags: batch 512, Adam lr 0.03, p = 0.6) in
the TFF runtime: the median of rounds 2..--assist_rounds (round 1 includes tracing) for each mode.

Writes `docs/results/hpfl_row_updates.json` and replaces the `hpfl_row_updates` section of `docs/ENGINE.md`.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.algorithms import hpfl
from fedpersonal.data import hpfl_assistments
from fedpersonal.models import gum

_K, _USERS, _ITEMS = 110, 300, 2000


def _time_epoch(weights, dataset, attributes, optimizer, config, mode: str, repeats: int):
    train = tf.function(lambda: hpfl.local_training(weights, dataset, attributes, optimizer, config, row_updates=mode))
    result = train()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = train()
        tf.nest.map_structure(lambda t: t.numpy(), result)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def _assist_rounds(assist_dir: str, num_rounds: int) -> list[dict]:
    data = hpfl_assistments.load_assist_silos(assist_dir, num_clients=40)
    config = gum.GumConfig.for_data(data, hidden_dim=16)
    client_data = hpfl.federated_data(data, config, batch_size=512)
    rows = []
    for mode in hpfl.ROW_UPDATES:
        process = hpfl.build_hpfl(
            config,
            client_optimizer=tff.learning.optimizers.build_adam(0.03),
            accuracy_threshold=0.6,
            max_clients=len(data.silos),
            row_updates=mode,
        )
        state, states = process.initialize(), hpfl.initial_client_states(data, config)
        seconds = []
        for _ in range(num_rounds):
            started = time.perf_counter()
            out = process.next(state, client_data, states)
            seconds.append(time.perf_counter() - started)
            state, states = out.state, out.private_states
        rows.append(
            {
                'name': f'HPFL round, ASSIST 40 silos, {mode}',
                'row_updates': mode,
                'max_items': config.max_items,
                'seconds_per_round': statistics.median(seconds[1:]),
                'first_round_seconds': seconds[0],
                'validation_loss': float(out.metrics['client_work']['validation_loss']),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--max_items', default='2000,10745,100000')
    parser.add_argument('--records', type=int, default=8000)
    parser.add_argument('--batch_size', type=int, default=512)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--assist_dir', default=None, help='ASSIST a0910 dir: also time whole HPFL rounds.')
    parser.add_argument('--assist_rounds', type=int, default=3)
    parser.add_argument('--results_dir', default='docs/results')
    parser.add_argument('--results_md', default='docs/ENGINE.md')
    args = parser.parse_args()
    sizes = [int(s) for s in args.max_items.split(',')]
    if min(sizes) < _ITEMS:
        parser.error(f'--max_items must all be >= {_ITEMS} (the silo uses {_ITEMS} items).')

    rng = np.random.default_rng(0)
    records = dict(
        user=rng.integers(0, _USERS, args.records),
        item=rng.integers(0, _ITEMS, args.records),
        label=rng.integers(0, 2, args.records).astype(np.float32),
    )
    dataset = tf.data.Dataset.from_tensor_slices(records).batch(args.batch_size)
    optimizers = {
        'adam (lr 0.03)': tff.learning.optimizers.build_adam(0.03),
        'sgd (lr 0.5)': tff.learning.optimizers.build_sgdm(0.5),
    }
    load_before = os.getloadavg()[0]
    rows = []
    for max_items in sizes:
        config = gum.GumConfig(num_attributes=_K, max_users=_USERS, max_items=max_items, hidden_dim=16)
        attributes = np.zeros([max_items, _K], np.float32)
        attributes[np.arange(max_items), rng.integers(0, _K, max_items)] = 1.0
        attributes = tf.constant(attributes)
        weights = tf.nest.map_structure(tf.constant, gum.initial_weights(config))
        for name, optimizer in optimizers.items():
            dense_s, dense = _time_epoch(weights, dataset, attributes, optimizer, config, 'dense', args.repeats)
            lazy_s, lazy = _time_epoch(weights, dataset, attributes, optimizer, config, 'lazy', args.repeats)
            difference = max(
                float(np.max(np.abs(a - b))) for a, b in zip(tf.nest.flatten(dense[0]), tf.nest.flatten(lazy[0]))
            )
            steps = -(-args.records // args.batch_size)
            rows.append(
                {
                    'name': f'{name}, {max_items} items',
                    'optimizer': name.split()[0],
                    'max_items': max_items,
                    'steps': steps,
                    'dense_seconds_per_epoch': dense_s,
                    'lazy_seconds_per_epoch': lazy_s,
                    'speedup': dense_s / lazy_s,
                    'max_abs_difference': difference,
                }
            )
            print(rows[-1], flush=True)
    round_rows = []
    if args.assist_dir:
        with runtime.LocalRuntime():
            round_rows = _assist_rounds(args.assist_dir, max(args.assist_rounds, 2))
    load_after = os.getloadavg()[0]

    command = program.command_line('benchmarks/hpfl_row_updates.py', sys.argv[1:])
    program.write_json(
        os.path.join(args.results_dir, 'hpfl_row_updates.json'),
        {'command': command, 'dataset': 'generated silo (ASSIST shape)', 'rows': rows + round_rows},
    )
    lines = [
        '## HPFL: dense vs lazy table updates in local training',
        '',
        f'Command: `{command.strip()}`',
        '',
        f'One local epoch of a silo with {args.records:,} training records ({_USERS} users, {_ITEMS:,} items, '
        f'K = {_K}, h = 16, batch {args.batch_size}: {rows[0]["steps"]} steps) whose item tables are padded to '
        f'`max_items` rows; median of {args.repeats} runs; 1-minute load average {load_before:.1f} before, '
        f'{load_after:.1f} after (2 cores). Max |dense - lazy| over all weights after the epoch.',
        '',
        '| optimizer | max_items | dense s/epoch | lazy s/epoch | speedup | max abs difference |',
        '|---|---|---|---|---|---|',
    ]
    for row in rows:
        lines.append(
            f'| {row["optimizer"]} | {row["max_items"]:,} | {row["dense_seconds_per_epoch"]:.3f} | '
            f'{row["lazy_seconds_per_epoch"]:.3f} | {row["speedup"]:.2f}x | {row["max_abs_difference"]:.2g} |'
        )
    if round_rows:
        lines += [
            '',
            f'Whole HPFL rounds on the 40 ASSIST silos (tables padded to {round_rows[0]["max_items"]:,} '
            'items; batch 512, Adam lr 0.03; median of rounds 2+):',
            '',
            '| row updates | s/round | first round (with tracing) | validation loss after the last round |',
            '|---|---|---|---|',
        ]
        lines += [
            f'| {r["row_updates"]} | {r["seconds_per_round"]:.2f} | {r["first_round_seconds"]:.1f} | '
            f'{r["validation_loss"]:.4f} |'
            for r in round_rows
        ]
    lines += ['', 'Machine-readable: `docs/results/hpfl_row_updates.json`.']
    program.replace_marked_section(args.results_md, 'hpfl_row_updates', '\n'.join(lines))


if __name__ == '__main__':
    main()
