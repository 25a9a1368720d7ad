"""Seconds per HPFL cross-silo round on one core, on the silo engine's two threads and on two engine workers.

  python benchmarks/silo_workers.py [--rounds 5] [--output FILE]

The round: the fast-simulation table's HPFL workload (`simulation_workloads.hpfl_setup`: HPFL with both
aggregations on ASSISTments a0910, 40 silos, every silo every round, configs/hpfl_assist.flags) on the silo engine
(each silo one compiled program, the server step over every silo's upload, then each silo's post-aggregation
phase). Every row starts from the same state and runs ``--rounds`` rounds once untimed (programs compiled, data
materialized), then the same rounds again, timed (median); ``max_abs_diff_vs_local``: the final global weights and
every silo's private state against ``silo_local_1core``'s.

* ``silo_local_1core``: `process.run_round` in this process, every thread on core 0 (one TensorFlow thread);
* ``silo_local_2cores``: the same on both cores (the silo engine runs one silo per core at a time);
* ``silo_workers_2``: inside `fedpersonal.runtime.engine_workers.EngineWorkers` with two Ray workers on cores 0 and
  1, one TensorFlow thread each (each trains its contiguous share of the silos; the server step here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from typing import Any

import numpy as np
from absl import flags

_BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
_OUTPUT = flags.DEFINE_string('output', 'docs/results/silo_workers.json', 'JSON file written.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per row (after the same rounds once untimed).')


def _pin(cores: set[int]) -> None:
    """Every thread of this process (TensorFlow's pools included) on `cores`."""
    for tid in os.listdir('/proc/self/task'):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cores)


def _setup():
    sys.path.insert(0, _BENCHMARKS)
    import simulation_workloads

    return simulation_workloads.hpfl_setup()


def recipe():
    """What every engine worker builds (module-level, so that Ray pickles it by reference): the workload's
    process on the engine and its silos by id."""
    from fedpersonal.runtime import engine_workers

    setup = _setup()
    return engine_workers.WorkerSetup(setup.build_fedpersonal('engine')[0], setup.dataset_fn)


def _run(setup, rounds: int, workers=None) -> dict:
    import tensorflow as tf

    ids = list(setup.client_ids)
    initial = [setup.initial_private_state(i) for i in ids]
    process, seconds, timings = setup.build_fedpersonal('engine')[0], [], []
    for timed in (False, True):
        state, states = process.initialize(), initial
        for r in range(rounds):
            started = time.perf_counter()
            output = process.run_round(state, [setup.dataset_fn(i) for i in ids], states, client_ids=ids)
            state, states = output.state, output.private_states
            if timed:
                seconds.append(time.perf_counter() - started)
                if workers is not None:
                    timings.append(workers.last_timings)
                print(f'  round {r}: {seconds[-1]:.3f} s', flush=True)
    flat = [np.asarray(v) for v in tf.nest.flatten((state.global_model_weights, states))]
    row: dict[str, Any] = dict(seconds_per_round=float(np.median(seconds)), seconds=seconds, values=flat)
    if timings:
        keys = ('clients_s', 'server_s', 'update_s')
        medians = {k: float(np.median([t[k] for t in timings])) for k in keys}
        row['timings'] = dict(medians, slowest_share_s=float(np.median([max(t['shares_s']) for t in timings])))
    return row


def main(argv):
    del argv
    from fedpersonal import runtime
    from fedpersonal.runtime import engine_workers

    setup, rows = _setup(), {}
    for name, cores in (('silo_local_1core', {0}), ('silo_local_2cores', {0, 1})):
        print(name, flush=True)
        _pin(cores)
        with runtime.LocalRuntime():
            rows[name] = dict(workers=0, **_run(setup, _ROUNDS.value))
    _pin({0})
    print('silo_workers_2', flush=True)
    with runtime.LocalRuntime(), engine_workers.EngineWorkers(recipe, workers=2, cores=[0, 1]) as workers:
        rows['silo_workers_2'] = dict(workers=2, **_run(setup, _ROUNDS.value, workers))
    reference = rows['silo_local_1core']['values']
    for row in rows.values():
        values = row.pop('values')
        row['max_abs_diff_vs_local'] = float(max(np.max(np.abs(a - b), initial=0.0) for a, b in zip(values, reference)))
        row['throughput_vs_1core'] = rows['silo_local_1core']['seconds_per_round'] / row['seconds_per_round']
    rows_out = [dict(name=name, **row) for name, row in rows.items()]
    result = dict(
        command='python benchmarks/silo_workers.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]),
        workload=(
            'hpfl (simulation_workloads.hpfl_setup): ASSISTments a0910, 40 silos, every silo every round; one '
            'TensorFlow thread per process'
        ),
        machine=f'{os.cpu_count()} cores',
        rows=rows_out,
    )
    os.makedirs(os.path.dirname(_OUTPUT.value) or '.', exist_ok=True)
    with open(_OUTPUT.value, 'w') as f:
        json.dump(result, f, indent=1)
    print('| row | workers | s/round | throughput vs 1 core | max abs diff vs local |')
    print('|---|---:|---:|---:|---:|')
    for r in rows_out:
        print(
            f'| {r["name"]} | {r["workers"]} | {r["seconds_per_round"]:.3f} | {r["throughput_vs_1core"]:.2f} | '
            f'{r["max_abs_diff_vs_local"]:.2e} |'
        )


if __name__ == '__main__':
    os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')
    os.environ.setdefault('TF_NUM_INTEROP_THREADS', '1')
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    main(flags.FLAGS(sys.argv))
