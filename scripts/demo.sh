#!/usr/bin/env bash
# The main job: Federated Reconstruction on the generated MovieLens-like default; prints the results table.
# Creates the environment on first use (scripts/env.sh). Extra arguments are passed to the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
exec python experiments/movielens_mf.py --flagfile=configs/movielens_demo.flags --output_dir=output/demo "$@"
