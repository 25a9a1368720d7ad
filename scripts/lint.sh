#!/usr/bin/env bash
# Lint, format check and type check (configuration: pyproject.toml; versions pinned in requirements/test.txt):
#   ruff check .            pycodestyle, pyflakes, isort, bugbear, pyupgrade, simplify, comprehensions
#   ruff format --check .   the formatter's output (single quotes, 120 columns) must equal the sources
#   mypy fedpersonal        type check of the package (third-party modules without stubs are Any)
# Every step runs even when an earlier one fails; the script exits non-zero if any failed and names them.
# Fix most findings with `ruff check --fix .` and `ruff format .`; `ruff check .` (without the concise output
# format used here) shows each finding in context.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh

failed=()
run() {
  local name="$1"; shift
  echo "[lint] $name"
  local start=$SECONDS
  if "$@"; then
    echo "[lint] $name: OK ($((SECONDS - start)) s)"
  else
    echo "[lint] $name: FAILED ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
}

run 'ruff check' ruff check --output-format=concise .
run 'ruff format --check' ruff format --check --output-format=concise .
run 'mypy fedpersonal' mypy fedpersonal

if [ "${#failed[@]}" -gt 0 ]; then
  printf '[lint] FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo '[lint] all OK'
