"""Seconds per federated evaluation, per-client TFF computation against the engine, on identical work, in one run.

  python benchmarks/evaluation_speed.py --data_dir=DIR_WITH_ML100K_u.data [--calls 3] [--output FILE]

Workloads (each evaluates every client of a split with the weights after `initialize()`, seeded):

* ``mf_recon``: ReconEval of the FedRecon Table 1 configuration (`configs/movielens_100k_table1.flags`) on MovieLens
  100K's validation users (the evaluation the Table 1 runs do every 20 rounds);
* ``furl_private``: FURL's private-state evaluation (`configs/furl_assistments.flags`) of all ASSISTments students
  on their validation responses, each with its own private state (the seeded default here).

Rows ``per_client`` (``simulation='per_client'``: one TFF client computation per client) and ``engine`` (the
default), each through `fedpersonal.evaluation.evaluate_clients` as the tasks call it. ``first_call_s``: the
first evaluation (the engine packs every client's data and traces its group program then); ``seconds``: the median
of ``--calls`` later evaluations; ``max_abs_diff_vs_per_client``: the largest difference of the aggregate metrics.
Writes ``--output`` (``command``, ``machine``, ``rows`` with ``name``, ``workload``, ``clients``, ``seconds``,
``first_call_s``, ``speedup_vs_per_client``, ``max_abs_diff_vs_per_client``, ``metrics``).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import simulation_workloads  # A sibling module: this file runs as a script, with benchmarks/ on sys.path.
from absl import app
from absl import flags

_CALLS = flags.DEFINE_integer('calls', 3, 'Timed evaluations per row, after the first.')
_WORKLOADS = flags.DEFINE_list('workloads', ['mf_recon', 'furl_private'], 'Workloads to run.')
_OUTPUT = flags.DEFINE_string('output', 'docs/results/evaluation_speed.json', 'JSON file written.')


def mf_recon(simulation: str) -> tuple[Callable[[], Any], int]:
    """The Table 1 ReconEval of the validation users: ``(evaluate, clients)``."""
    from fedpersonal.tasks import movielens_mf

    config = simulation_workloads.flagfile_config(
        movielens_mf.MovieLensMFConfig,
        'movielens_100k_table1.flags',
        f'--data_dir={simulation_workloads.DATA_DIR.value}',
        f'--simulation={simulation}',
    )
    prepared = movielens_mf.load_data(config)
    task = movielens_mf.MovieLensMFTask(config, prepared)
    process = task.build_fed_recon()
    weights = process.get_model_weights(process.initialize())
    evaluate = lambda: task.evaluate('recon', weights, prepared.user_val, task.personal_dataset_fn)['metrics']
    return evaluate, len(prepared.user_val.client_ids)


def furl_private(simulation: str) -> tuple[Callable[[], Any], int]:
    """FURL's private-state evaluation of every ASSISTments student: ``(evaluate, clients)``."""
    from fedpersonal import evaluation
    from fedpersonal.algorithms import furl
    from fedpersonal.tasks import furl_personalization

    config = dataclasses.replace(simulation_workloads.furl_config(), simulation=simulation)
    data = furl_personalization.load_data(config)
    task = furl_personalization.FurlTask(config, data)
    model_fn = task.model_fn('private')
    process = furl.build_furl(model_fn, loss_fn=task.loss_fn, metrics_fn=task.metrics_fn, simulation='per_client')
    evaluate_fn = evaluation.build_private_state_eval(
        model_fn, loss_fn=task.loss_fn, metrics_fn=task.metrics_fn, simulation=simulation
    )
    weights = process.get_model_weights(process.initialize())
    states = [process.initial_private_state()] * len(data.client_ids)
    return (lambda: task.evaluate(evaluate_fn, weights, 'eval', states)), len(data.client_ids)


WORKLOADS = {'mf_recon': mf_recon, 'furl_private': furl_private}


def run_row(workload: str, simulation: str, calls: int) -> dict[str, Any]:
    from fedpersonal import runtime

    with runtime.LocalRuntime():
        evaluate, clients = WORKLOADS[workload](simulation)
        started = time.perf_counter()
        metrics = evaluate()
        first = time.perf_counter() - started
        seconds = []
        for _ in range(calls):
            started = time.perf_counter()
            metrics = evaluate()
            seconds.append(time.perf_counter() - started)
    return dict(
        name=simulation,
        workload=workload,
        clients=clients,
        first_call_s=first,
        seconds=statistics.median(seconds),
        call_seconds=seconds,
        metrics={k: float(v) for k, v in metrics.items()},
    )


def main(argv: list[str]) -> None:
    del argv
    from fedpersonal import program

    rows = []
    for workload in _WORKLOADS.value:
        if workload == 'mf_recon' and not simulation_workloads.DATA_DIR.value:
            print('mf_recon skipped: give --data_dir (MovieLens 100K u.data)', flush=True)
            continue
        pair = {s: run_row(workload, s, _CALLS.value) for s in ('per_client', 'engine')}
        for row in pair.values():
            row['speedup_vs_per_client'] = pair['per_client']['seconds'] / row['seconds']
            row['max_abs_diff_vs_per_client'] = max(
                abs(row['metrics'][k] - pair['per_client']['metrics'][k]) for k in pair['per_client']['metrics']
            )
            rows.append(row)
            print(
                f'{workload:13s} {row["name"]:10s} clients {row["clients"]:5d}  {row["seconds"]:8.3f} s '
                f'(first {row["first_call_s"]:.1f} s)  {row["speedup_vs_per_client"]:6.1f}x  '
                f'diff {row["max_abs_diff_vs_per_client"]:.1e}',
                flush=True,
            )
    program.write_json(
        _OUTPUT.value,
        {
            'command': program.command_line('benchmarks/evaluation_speed.py', sys.argv[1:]),
            'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
            'rows': rows,
        },
    )


if __name__ == '__main__':
    app.run(main)
