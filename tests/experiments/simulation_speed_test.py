"""benchmarks/simulation_speed.py's bookkeeping (no timing): which rows of an earlier report a run keeps, and the
MF round's engine/limit ratio kept per kind of machine.

The script defines absl flags when imported, so it is imported in a fresh interpreter, not in the test session.
"""

import os
import subprocess
import sys

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'benchmarks')

_SCRIPT = r"""
import doctest, json, os, sys, tempfile
sys.argv = ['simulation_speed']
import simulation_speed as speed

assert doctest.testmod(speed).failed == 0

intel = dict(cpu_model='Xeon', cpu_isa='AVX512_CORE', onednn_max_cpu_isa='default', tf_enable_onednn_opts='default',
             commit='a')
emulated = dict(intel, onednn_max_cpu_isa='AVX2')
earlier = dict(
    command='earlier', machine=dict(intel, commit='old'),
    rows=[dict(workload='mf', name='tff', seconds_per_round=4.0),
          dict(workload='mf', name='engine', seconds_per_round=0.05),
          dict(workload='nwp', name='engine', seconds_per_round=0.1),
          dict(workload='peers', name='dense_fedavg_engine', seconds_per_round=0.07)],
    workloads={'mf': 'MF', 'nwp': 'NWP'}, skipped=[],
    mf_engine_vs_limit=[dict(emulated, engine_over_limit=5.0), dict(intel, engine_over_limit=9.0)],
)
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, 'speed.json')
    with open(path, 'w') as f:
        json.dump(earlier, f)
    # This run measured mf's engine and limit rows (--workloads=mf --rows=engine,limit).
    rows, workloads, skipped, entries = speed._earlier(path, ['mf'], {('mf', 'engine'), ('mf', 'limit')})
kept = [(r['workload'], r['name']) for r in rows]
assert kept == [('mf', 'tff'), ('nwp', 'engine'), ('peers', 'dense_fedavg_engine')], kept
assert all(r['earlier_run'] == dict(command='earlier', commit='old') for r in rows)
assert workloads == {'nwp': 'NWP'}, workloads

now = [dict(workload='mf', name='engine', seconds_per_round=0.03, rounds=10),
       dict(workload='mf', name='limit', seconds_per_round=0.02, rounds=10)]
merged = speed.mf_vs_limit(now + rows, intel, entries)
by_isa = {e['onednn_max_cpu_isa']: e['engine_over_limit'] for e in merged}
assert by_isa == {'AVX2': 5.0, 'default': 1.5}, by_isa  # The emulated entry kept, this machine's replaced.
# A run without both MF rows adds nothing; rows read back from the file never make an entry.
assert speed.mf_vs_limit(now[:1], intel, entries) == entries
assert speed.mf_vs_limit([dict(r, earlier_run={}) for r in now], intel, entries) == entries
assert speed._cpu_isa({'avx', 'avx2', 'fma'}) == 'AVX2' and speed._cpu_isa({'sse4_1'}) == 'SSE41'
print('ok')
"""


def test_earlier_rows_and_the_mf_ratio_per_kind_of_machine():
    done = subprocess.run(
        [sys.executable, '-c', _SCRIPT], cwd=_BENCHMARKS, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith('ok'), done.stderr[-3000:]
