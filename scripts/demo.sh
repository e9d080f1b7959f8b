#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing (.venv, llama-server, the model), run the
# demo tuning study against a local llama-server, restore it, print the leaderboard.
# Extra arguments go to `tuner run`, e.g. ./scripts/demo.sh --set budget.trials=3
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh base  # (a name: sourced without one, it would read this script's own arguments)
.venv/bin/tuner setup
exec .venv/bin/tuner run studies/stall-demo.toml "$@"
