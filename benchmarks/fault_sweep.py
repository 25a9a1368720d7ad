"""Fault sweep: every kill point of `fedpersonal.faults`, for FedRecon (MovieLens) and FURL (SQLite client states).

For each point and algorithm, the tiny run of tests/program/crash_safety_test.py is killed with SIGKILL at that
point (the hit given below: a round after a checkpoint, so the restart has work to redo), restarted with the same
command until it finishes, and its results.json files, metrics.csv and client state store are compared with an
uninterrupted run's (timings aside). Writes docs/results/fault_sweep.json: rows ``point``, ``algorithm``, ``hit``,
``killed`` (the run died at the point), ``identical`` and ``seconds``.

    PYTHONPATH=. python benchmarks/fault_sweep.py [--points=round,metrics] [--algorithms=furl]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fedpersonal import faults  # noqa: E402
from fedpersonal.program import outputs  # noqa: E402
from tests.program import crash_safety_test as crash  # noqa: E402

# Hits of each point in the tiny runs (4 rounds, checkpoints after rounds 2 and 4, evaluations after rounds 2 and
# 4): the last one of the run, or the one in round 3 (after the first checkpoint).
HITS = {
    'round': 3,
    'evaluation': 2,
    'metrics': 3,
    'checkpoint_write': 2,
    'checkpoint_staged': 2,
    'client_state_commit': 2,
    'checkpoint_committed': 2,
    'json': 1,
    'results': 2,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--points', default=','.join(faults.POINTS))
    parser.add_argument('--algorithms', default='fedrecon,furl')
    parser.add_argument('--output', default=os.path.join(ROOT, 'docs', 'results', 'fault_sweep.json'))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithms.split(','):
            straight = os.path.join(tmp, f'{algorithm}_straight')
            assert crash.run_binary(algorithm, straight).returncode == 0
            expected = crash.outcome(algorithm, straight)
            for point in args.points.split(','):
                if point == 'client_state_commit' and algorithm != 'furl':
                    continue  # FedRecon keeps no client states.
                out = os.path.join(tmp, f'{algorithm}_{point}')
                started = time.time()
                first = crash.run_binary(algorithm, out, f'{point}:{HITS[point]}')
                killed = first.returncode == -signal.SIGKILL
                final = crash.run_binary(algorithm, out)
                try:
                    identical = final.returncode == 0 and crash.outcome(algorithm, out) == expected
                except AssertionError as error:  # A torn or duplicated row, a leftover, a lost client state.
                    print(f'{algorithm} {point}: {error}', flush=True)
                    identical = False
                row = {
                    'point': point,
                    'algorithm': algorithm,
                    'hit': HITS[point],
                    'killed': killed,
                    'identical': identical,
                    'seconds': round(time.time() - started, 1),
                }
                print(row, flush=True)
                rows.append(row)
                outputs.write_json(args.output, {'rows': rows})
    print(f'{sum(r["identical"] for r in rows)} of {len(rows)} identical; written to {args.output}')


if __name__ == '__main__':
    main()
