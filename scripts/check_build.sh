#!/usr/bin/env bash
# Checks the Bazel BUILD files: first statically (tools/check_build.py, stdlib only, < 1 s), then, when Bazel
# is available, with real offline builds: `bazel build //fedpersonal/...`, then `bazel build //...`.
#
# Bazel step:
# * runs when `bazel` is on PATH, or when FEDPERSONAL_BAZEL_INSTALL=1 and `apt-get install -y bazel-bootstrap`
#   (Debian's Bazel 4.2.3; ~38 MB to download when OpenJDK 17 is already installed) succeeds; otherwise it is
#   skipped, saying why;
# * builds //fedpersonal/... (every py_library) as is; then //... (py_binary and py_test too): as shipped,
#   Bazel 4.2.3 downloads @rules_cc and @rules_java to resolve their toolchains (and @remote_coverage_tools for
#   py_test), so that second build points those repositories at small local stand-ins (written below);
# * the repository has no WORKSPACE file, so the BUILD files and sources are copied into a workspace under
#   $FEDPERSONAL_BAZEL_DIR (default /tmp/fedpersonal-bazel), which also holds Bazel's output base; nothing is
#   written to the work tree or $HOME. The Bazel server is shut down at the end.
# Environment: FEDPERSONAL_BAZEL=0 skips the Bazel step; FEDPERSONAL_BAZEL_INSTALL=1 allows the apt install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"
  elif command -v python3 >/dev/null 2>&1; then PYTHON=python3
  else PYTHON=python; fi
fi

echo "[check_build] static check: $PYTHON tools/check_build.py"
"$PYTHON" tools/check_build.py

skip() { echo "[check_build] SKIPPED the Bazel build: $*"; exit 0; }

if [ "${FEDPERSONAL_BAZEL:-1}" = 0 ]; then
  skip "FEDPERSONAL_BAZEL=0."
fi
if ! command -v bazel >/dev/null 2>&1; then
  if [ "${FEDPERSONAL_BAZEL_INSTALL:-0}" != 1 ]; then
    skip "bazel is not on PATH (set FEDPERSONAL_BAZEL_INSTALL=1 to apt-get install bazel-bootstrap)."
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    skip "bazel is not on PATH and apt-get is not available to install bazel-bootstrap."
  fi
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "[check_build] installing bazel-bootstrap (apt-get)"
  start=$SECONDS
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bazel-bootstrap; } \
      >/tmp/fedpersonal-bazel-apt.log 2>&1; then
    tail -n 20 /tmp/fedpersonal-bazel-apt.log
    skip "apt-get install bazel-bootstrap failed (log: /tmp/fedpersonal-bazel-apt.log)."
  fi
  echo "[check_build] installed bazel-bootstrap in $((SECONDS - start)) s"
  command -v bazel >/dev/null 2>&1 || skip "bazel-bootstrap installed, but bazel is not on PATH."
fi

BAZEL_DIR="${FEDPERSONAL_BAZEL_DIR:-/tmp/fedpersonal-bazel}"
WS="$BAZEL_DIR/workspace"
STARTUP=(--output_user_root="$BAZEL_DIR/user_root" --output_base="$BAZEL_DIR/output_base" --max_idle_secs=60)

# A fresh copy of the BUILD files and Python sources (the output base, and so the cache, survives).
rm -rf "$WS"
mkdir -p "$WS"
tar -cf - --exclude=__pycache__ --exclude='*.pyc' BUILD fedpersonal experiments tests tools | tar -xf - -C "$WS"
echo 'workspace(name = "fedpersonal")' > "$WS/WORKSPACE"

# Stand-ins for the repositories that Bazel 4.2.3 downloads to resolve the toolchains of py_binary and py_test
# (@rules_cc, @rules_java) and for their coverage tools (@remote_coverage_tools): the native rules re-exported,
# and coverage stubs that fail if ever run. Nothing is compiled with them; they make analysis work offline.
STAND_INS="$BAZEL_DIR/stand_ins"
rm -rf "$STAND_INS"
mkdir -p "$STAND_INS/rules_cc/cc" "$STAND_INS/rules_java/java" "$STAND_INS/remote_coverage_tools"
for repo in rules_cc rules_java remote_coverage_tools; do
  echo "workspace(name = \"$repo\")" > "$STAND_INS/$repo/WORKSPACE"
  echo 'package(default_visibility = ["//visibility:public"])' > "$STAND_INS/$repo/BUILD"
done
cp "$STAND_INS/rules_cc/BUILD" "$STAND_INS/rules_cc/cc/BUILD"
cp "$STAND_INS/rules_java/BUILD" "$STAND_INS/rules_java/java/BUILD"
echo 'alias(name = "toolchain_type", actual = "@bazel_tools//tools/cpp:toolchain_type")' >> "$STAND_INS/rules_cc/cc/BUILD"
for rule in cc_binary cc_library cc_proto_library cc_test cc_toolchain cc_toolchain_suite objc_library; do
  echo "$rule = native.$rule"
done > "$STAND_INS/rules_cc/cc/defs.bzl"
for rule in java_binary java_import java_library java_proto_library java_runtime java_test java_toolchain; do
  echo "$rule = native.$rule"
done > "$STAND_INS/rules_java/java/defs.bzl"
printf '#!/bin/sh\necho "coverage tools are not available offline" >&2\nexit 1\n' > "$STAND_INS/remote_coverage_tools/missing.sh"
chmod +x "$STAND_INS/remote_coverage_tools/missing.sh"
for tool in coverage_report_generator lcov_merger Main; do
  echo "sh_binary(name = \"$tool\", srcs = [\"missing.sh\"])"
done >> "$STAND_INS/remote_coverage_tools/BUILD"
OVERRIDES=()
for repo in rules_cc rules_java remote_coverage_tools; do
  OVERRIDES+=(--override_repository="$repo=$STAND_INS/$repo")
done

cd "$WS"
FLAGS=(--noshow_progress --color=no --curses=no)
start=$SECONDS
status=0
step="bazel build //fedpersonal/... (every py_library, no stand-ins)"
echo "[check_build] $step; offline, workspace $WS"
bazel "${STARTUP[@]}" build "${FLAGS[@]}" //fedpersonal/... || status=$?
if [ "$status" = 0 ]; then
  step="bazel build //... (every target incl. py_binary/py_test: analysis and runfiles, with stand-ins)"
  echo "[check_build] $step"
  bazel "${STARTUP[@]}" build "${FLAGS[@]}" "${OVERRIDES[@]}" //... || status=$?
fi
bazel "${STARTUP[@]}" shutdown >/dev/null 2>&1 || true
if [ "$status" != 0 ]; then
  echo "[check_build] FAILED: $step exited with $status"
  exit "$status"
fi
echo "[check_build] Bazel OK in $((SECONDS - start)) s"
