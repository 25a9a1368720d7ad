#!/usr/bin/env bash
# The test suite: creates the environment on first use (scripts/env.sh), lints, formats and type-checks
# (scripts/lint.sh: ruff check, ruff format --check, mypy fedpersonal), checks the BUILD files, runs pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
bash scripts/lint.sh
if [ -x scripts/check_build.sh ]; then bash scripts/check_build.sh; fi
python -m pytest tests -q -p no:warnings --durations=15 "$@"
