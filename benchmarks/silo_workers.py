"""Seconds per HPFL cross-silo round on one core, on the silo engine's two threads and on two engine workers.

  python benchmarks/silo_workers.py [--rounds 5] [--silos 8] [--users_per_silo 200] [--output FILE]

The round: HPFL (`hpfl.build_method('hpfl')`, the silo engine: each silo one compiled program, the server step over
every silo's upload, then each silo's post-aggregation phase) on generated user-modeling silos
(`generate_user_modeling`, ``--silos`` silos of ``--users_per_silo`` users, 20-60 records each), Adam 0.02, two local
epochs, batch 64. Every row starts from the same state and runs ``--rounds`` rounds once untimed (programs compiled,
data materialized), then the same rounds again, timed (median); ``max_abs_diff_vs_local``: the final global weights
and every silo's private state against ``silo_local_1core``'s.

* ``silo_local_1core``: `process.run_round` in this process, pinned to core 0 (one TensorFlow thread);
* ``silo_local_2cores``: the same on both cores (the silo engine runs one silo per core at a time);
* ``silo_workers_2``: inside `fedpersonal.runtime.engine_workers.EngineWorkers` with two Ray workers, on cores 0 and
  1, one TensorFlow thread each (each trains its share of the silos; the server step here).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
import time
from typing import Any

import numpy as np
from absl import flags

_OUTPUT = flags.DEFINE_string('output', 'docs/results/silo_workers.json', 'JSON file written.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per row (after the same rounds once untimed).')
_SILOS = flags.DEFINE_integer('silos', 8, 'Silos (every silo every round).')
_USERS = flags.DEFINE_integer('users_per_silo', 200, 'Users per silo.')


def _pin(cores: set[int]) -> None:
    """Every thread of this process (TensorFlow's pools included) on `cores`."""
    for tid in os.listdir('/proc/self/task'):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cores)


def _data(silos: int, users: int):
    from fedpersonal.data import synthetic_user_modeling
    from fedpersonal.data import user_modeling

    return user_modeling.validate(
        synthetic_user_modeling.generate_user_modeling(num_clients=silos, users_per_client=users, seed=0)
    )


def recipe(silos: int, users: int):
    """What every engine worker (and this process) builds: the HPFL process and the silos by id."""
    import tensorflow as tf
    import tensorflow_federated as tff

    from fedpersonal.algorithms import hpfl
    from fedpersonal.models import gum
    from fedpersonal.runtime import engine_workers

    tf.random.set_seed(0)  # The silos' shuffles draw their seeds from it: the same in every process.
    data = _data(silos, users)
    config = gum.GumConfig.for_data(data, hidden_dim=16)
    process = hpfl.build_method(
        'hpfl',
        config,
        client_optimizer=tff.learning.optimizers.build_adam(0.02),
        client_epochs=2,
        accuracy_threshold=0.5,
        max_clients=silos,
        simulation='engine',
    )
    client_data = hpfl.federated_data(data, config, batch_size=64)
    by_id = dict(zip([s.client_id for s in data.silos], client_data))
    return engine_workers.WorkerSetup(process, by_id.__getitem__)


def _run(setup, rounds: int, workers=None) -> dict:
    import tensorflow as tf

    from fedpersonal.algorithms import hpfl
    from fedpersonal.models import gum

    data = _data(_SILOS.value, _USERS.value)
    initial = hpfl.initial_client_states(data, gum.GumConfig.for_data(data, hidden_dim=16))
    ids = [s.client_id for s in data.silos]
    process, seconds, timings = setup.process, [], []
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

    build = functools.partial(recipe, _SILOS.value, _USERS.value)
    rows = {}
    for name, cores in (('silo_local_1core', {0}), ('silo_local_2cores', {0, 1})):
        print(name, flush=True)
        _pin(cores)
        with runtime.LocalRuntime():
            rows[name] = dict(workers=0, **_run(build(), _ROUNDS.value))
    _pin({0})
    print('silo_workers_2', flush=True)
    with runtime.LocalRuntime(), engine_workers.EngineWorkers(build, workers=2, cores=[0, 1]) as workers:
        rows['silo_workers_2'] = dict(workers=2, **_run(build(), _ROUNDS.value, workers))
    reference = rows['silo_local_1core']['values']
    for row in rows.values():
        values = row.pop('values')
        row['max_abs_diff_vs_local'] = float(max(np.max(np.abs(a - b), initial=0.0) for a, b in zip(values, reference)))
        row['throughput_vs_1core'] = rows['silo_local_1core']['seconds_per_round'] / row['seconds_per_round']
    rows_out = [dict(name=name, **row) for name, row in rows.items()]
    result = dict(
        command='python benchmarks/silo_workers.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]),
        workload=(
            f'HPFL (silo engine) on {_SILOS.value} generated silos of {_USERS.value} users; TensorFlow one thread per '
            'process'
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
