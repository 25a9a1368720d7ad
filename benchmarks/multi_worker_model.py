"""The engine workers' round as per-worker compute plus fixed costs (`benchmarks/multi_worker.py`'s ``model``),
from the benchmark's rows: the prediction for 100 workers and 10,000 clients per round against linear scaling."""

from __future__ import annotations

import math

import numpy as np


def predict(w: int, n: int, *, c: float, s: float, d: float, m: float, f: float, g: float) -> float:
    """`model`'s formula: seconds per round on `w` workers with `n` clients."""
    return c * n / w + s * n + w * d + math.ceil(math.log2(w)) * m + f + g


def model(rows: dict, clients: int) -> dict:
    """t(W, N) = c * N / W + s * N + W * d + ceil(log2 W) * m + f + g, from the engine-worker rows' median
    timings: c the workers' compute seconds per client (the two-worker row's slower share / its size); s the
    driver's sending per client (`multi_worker._send_per_client`); d the driver's cost per extra worker: the slope of its
    sending over ``--submit_fit_workers`` worker counts (`multi_worker._submit_fit`), else (and as ``d_by_difference_s``) the
    two-worker row's sending less the one-worker row's; m one level of the merge tree (two partials sent to a worker and added),
    measured on the workers' clock: from the later of the two partials being ready to the merged one being ready
    (`EngineWorkers.last_timings['merges_s']`); f the server step; g the rest of a round (the one-worker row: its
    sending less s * N, the share's start after the graph's input was written, Ray's transport of the partial to
    the driver). ``merge_level_by_difference_s``: m as earlier runs estimated it, the rest of the two-worker round
    less the rest of the one-worker round (which also holds the later start of the worker beside the driver on
    this host's core 0); ``predicted_2_workers_s`` less the measured row is what the model leaves out at W = 2.
    ``..._alone``: the same with c as a worker alone on its machine computes (the one-worker row's share per
    client), without what two busy cores of this host cost each other (``host_2_processes``).
    A stateless process's round reads one output, whatever W (a stateful one's also reads each worker's private
    states: W more reads, not in this model). Linear scaling: one core's seconds for N clients / W."""
    one, two = rows['engine_workers_1']['timings'], rows['engine_workers_2']['timings']
    rest = lambda t: max(t['round_s'] - t['shares_s'] - t['submit_s'] - t['finish_s'], 0.0)
    c = two['shares_s'] / (clients / 2)
    s = rows['engine_workers_1']['send_per_client_s']
    d_by_difference = max(two['submit_s'] - one['submit_s'], 0.0)
    fit = rows['engine_workers_1'].get('submit_fit')
    d = max(fit['slope_per_worker_s'], 0.0) if fit else d_by_difference
    by_difference, f = max(rest(two) - rest(one), 0.0), two['finish_s']
    m = two['merges_s']
    g = rest(one) + max(one['submit_s'] - s * clients, 0.0)
    at = lambda w, n, c=c: predict(w, n, c=c, s=s, d=d, m=m, f=f, g=g)
    one_core_per_client = rows['engine_local_1core']['seconds_per_round'] / clients
    predicted, linear = at(100, 10_000), one_core_per_client * 10_000 / 100
    # A worker alone on its machine: c as the one-worker row's share (no second busy core beside it).
    c_alone = one['shares_s'] / clients
    alone = at(100, 10_000, c_alone)
    return dict(
        formula='t(W, N) = c * N / W + s * N + W * d + ceil(log2 W) * m + f + g',
        c_per_client_s=c,
        s_send_per_client_s=s,
        d_per_worker_s=d,
        d_by_difference_s=d_by_difference,
        m_merge_level_s=m,
        merge_level_by_difference_s=by_difference,
        f_server_step_s=f,
        g_rest_s=g,
        predicted_2_workers_s=at(2, clients),
        measured_2_workers_s=rows['engine_workers_2']['seconds_per_round'],
        predicted_100_workers_10000_clients_s=predicted,
        linear_100_workers_10000_clients_s=linear,
        ratio_to_linear=predicted / linear,
        c_alone_per_client_s=c_alone,
        predicted_100_workers_10000_clients_alone_s=alone,
        ratio_to_linear_alone=alone / linear,
        one_core_10000_clients_s=one_core_per_client * 10_000,
    )


def paired_model(model: dict, paired: dict, timings: list[dict], clients: int) -> dict:
    """`model`'s prediction with c and the one-core seconds of each pair of a paired row (``engine_workers_2_paired``
    or its balanced twin: the same round on one core and on the two workers, back to back), the merge level and the server step of its workers'
    rounds, the other terms as `model`'s: the ratio to linear per pair, and its median and quartiles. The rows'
    medians take c and one core from blocks minutes apart, whose load moves each by tens of percent."""
    merges = [np.max(t['merges_s']) for t in timings if np.size(t.get('merges_s', []))]  # As `_summary`'s.
    m = float(np.median(merges)) if merges else model['m_merge_level_s']
    f = float(np.median([t['finish_s'] for t in timings]))
    terms = dict(s=model['s_send_per_client_s'], d=model['d_per_worker_s'], m=m, f=f, g=model['g_rest_s'])
    c = [max(t['shares_s']) / (clients / 2) for t in timings]  # The slower worker's share, per client.
    predicted = [predict(100, 10_000, c=ci, **terms) for ci in c]
    linear = [local / clients * 10_000 / 100 for local in paired['local_seconds']]
    ratios = [p / li for p, li in zip(predicted, linear)]
    return dict(
        c_per_client_s=float(np.median(c)),
        m_merge_level_s=m,
        f_server_step_s=f,
        linear_100_workers_10000_clients_s=float(np.median(linear)),
        predicted_100_workers_10000_clients_s=float(np.median(predicted)),
        ratio_to_linear=float(np.median(ratios)),
        ratio_to_linear_quartiles=[float(q) for q in np.percentile(ratios, [25, 50, 75])],
        c_over_one_core_per_client=float(np.median([ci / (li / 100) for ci, li in zip(c, linear)])),
    )
