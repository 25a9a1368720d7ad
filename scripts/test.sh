#!/usr/bin/env bash
# The test suite: creates the environment on first use (scripts/env.sh), lints, formats and type-checks
# (scripts/lint.sh: ruff check, ruff format --check, mypy fedpersonal), checks the BUILD files, runs pytest.
# pytest runs one worker process per core plus one (pytest-xdist; FP_TEST_WORKERS overrides, 0 runs in this process):
# with one per core the cores idle about a fifth of the time (user CPU 42.8 of 52.2 core-minutes) while tests wait on
# process starts (binaries, notebook kernels, Ray and TFF workers), which the extra worker fills. On 2026-12-06
# (Intel, 2 cores, nothing else running): in the tree at 16ea668 pytest took 26.1 min with 2 workers, 23.5 min with 3;
# `CI=true bash .ci/run` from clean clones 36.5 min with 2 (f1f616a; pytest 30.5) and 35.8 min with 3 (e70f98e; pytest
# 30.0, the SSE41 pass 4.1), on a slower hour (user CPU 61 min); on 2026-11-26 829 s with 3 against 916 s with 2. At 2
# cores no scheduling gets pytest under user CPU / 2 (21.4 min in the tree): the time is mostly TF and TFF tracing and
# the process starts of binaries and Ray workers (3.4 s to import TF and TFF), not rounds: above the 20 minutes issue
# 62 asks for.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
# Fashion-MNIST, which the PFLlib benchmark's data tests read (else they skip): Debian's dataset-fashion-mnist,
# installed on request (CI: FEDPERSONAL_DATA_INSTALL=1) where apt-get can.
FASHION_MNIST=/usr/share/datasets/fashion-mnist
if [ "${FEDPERSONAL_DATA_INSTALL:-0}" = 1 ] && [ ! -d "$FASHION_MNIST" ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "[test] installing dataset-fashion-mnist (apt-get)"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist; } \
    >/tmp/fedpersonal-data-apt.log 2>&1 || echo "[test] apt-get failed (/tmp/fedpersonal-data-apt.log): its tests skip"
fi
bash scripts/lint.sh
if [ -x scripts/check_build.sh ]; then bash scripts/check_build.sh; fi
# The cores this process may use, counted before OMP_NUM_THREADS=1 below (GNU nproc reports OMP_NUM_THREADS).
WORKERS="${FP_TEST_WORKERS:-$(($(OMP_NUM_THREADS='' OMP_THREAD_LIMIT='' nproc) + 1))}"
if [ "${FP_TEST_WORKERS:-auto}" != 0 ]; then
  # One compute thread per process (TF, TFF's worker_binary, OpenBLAS): with a pytest worker per core, the default
  # thread pools oversubscribe the cores and spin against each other (a numpy ALS fit took 45 s instead of 1 s, and
  # a subset of the TF tests ran 174 s instead of 134 s).
  # (Inter-op threads stay at their default: a single one can deadlock graphs with blocking ops; it gained nothing.)
  export TF_NUM_INTRAOP_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
fi
echo "[test] pytest workers: $WORKERS"
python -m pytest tests -q -rs -p no:warnings --durations=15 -n "$WORKERS" "$@"
# The numeric equivalences (marked `numeric`: engine vs per-client, workers vs local, against TFF or a plain loop)
# again with oneDNN's SSE4.1 kernels, which neither kind of machine the project runs on picks by itself (AVX-512
# or AVX2): a bound tuned to one machine's last bits fails here, not on a user's machine (tests/tolerances.py).
# FP_NUMERIC_ISA overrides the setting (e.g. AVX2); FP_NUMERIC_ISA=none skips this pass, saying so.
if [ "${FP_NUMERIC_ISA:-SSE41}" = none ]; then
  echo "[test] FP_NUMERIC_ISA=none: the numeric tests' second instruction set is skipped"
elif [ "$#" = 0 ]; then
  ONEDNN_MAX_CPU_ISA="${FP_NUMERIC_ISA:-SSE41}" \
    python -m pytest tests -q -rs -p no:warnings --durations=5 -m numeric -n "$WORKERS"
fi
