#!/usr/bin/env bash
# Starts N TFF executor services (TFF 0.87's C++ worker_binary) on this machine and prints their addresses.
#
#   scripts/start_workers.sh N [BASE_PORT]      # ports BASE_PORT .. BASE_PORT+N-1 (default 8000)
#
# Prints one line "workers: host:port,host:port,..." (pass it to a binary's --workers) once every worker listens,
# then waits. Ctrl-C, SIGTERM or the end of this script's shell stops every worker it started (nothing is left
# running). The workers listen on all interfaces: on several machines, run this once per machine (N=1) and give
# the driver every machine's host:port. Uses the project's .venv (scripts/env.sh), or $FP_PYTHON's TFF.
set -euo pipefail
N="${1:?usage: scripts/start_workers.sh N [BASE_PORT]}"
BASE="${2:-8000}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "start_workers.sh: N must be a positive integer, got '$N'" >&2; exit 2; }
[[ "$BASE" =~ ^[0-9]+$ ]] && (( BASE > 0 && BASE + N - 1 < 65536 )) || {
  echo "start_workers.sh: BASE_PORT must be a port number with room for $N workers, got '$BASE'" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
# The worker binary inside the installed TFF wheel, found without importing TFF (~10 s).
BIN="$("$PY" -c 'import importlib.util, os; s = importlib.util.find_spec("tensorflow_federated"); print(os.path.join(s.submodule_search_locations[0], "data", "worker_binary"))')"
[ -x "$BIN" ] || { echo "start_workers.sh: no TFF worker_binary at $BIN (run: source scripts/env.sh)" >&2; exit 1; }

pids=()
stop() { trap - EXIT INT TERM; for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
         sleep 0.5; for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
addresses=()
for ((i = 0; i < N; i++)); do
  port=$((BASE + i))
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "start_workers.sh: port $port is already in use" >&2; exit 1
  fi
  # The allocator setting of fedpersonal.runtime.execution_context.WORKER_ENVIRONMENT (large buffers returned to
  # the kernel when freed; a value set by the caller is kept).
  MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1048576}" \
    TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" "$BIN" --port="$port" &
  pids+=($!)
  addresses+=("$(hostname -f 2>/dev/null || hostname):$port")
done
for ((i = 0; i < N; i++)); do  # Wait until each one listens (or died).
  port=$((BASE + i))
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "start_workers.sh: the worker on port $port exited" >&2; exit 1; }
    sleep 0.1
  done
done
loopback=(); for ((i = 0; i < N; i++)); do loopback+=("localhost:$((BASE + i))"); done
echo "workers: $(IFS=,; echo "${loopback[*]}")"
echo "(from other machines: $(IFS=,; echo "${addresses[*]}"))"
wait
