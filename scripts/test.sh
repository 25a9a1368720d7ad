#!/usr/bin/env bash
# The test suite: creates the environment on first use (scripts/env.sh), lints, formats and type-checks
# (scripts/lint.sh: ruff check, ruff format --check, mypy fedpersonal), checks the BUILD files, runs pytest.
# pytest runs one worker process per core (pytest-xdist; FP_TEST_WORKERS overrides, 0 runs in this process):
# on 2 cores the suite took 9.0 min instead of 16.6 min serially (measured 2026-11-23), as most of a test's time
# is single-threaded Python and tracing. Each worker has its own TFF runtime and checks it leaves no worker behind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
bash scripts/lint.sh
if [ -x scripts/check_build.sh ]; then bash scripts/check_build.sh; fi
python -m pytest tests -q -p no:warnings --durations=15 -n "${FP_TEST_WORKERS:-auto}" "$@"
