#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing (.venv, the server build, the model), run a
# demo tuning study against a local server, restore it, print the leaderboard.
#   ./scripts/demo.sh            llama-server: the n_batch that keeps streams moving beside a long prefill
#   ./scripts/demo.sh ollama     Ollama: why five users are slow at OLLAMA_NUM_PARALLEL=1, and what fixes it
# Extra arguments go to `tuner run`, e.g. ./scripts/demo.sh --set budget.trials=3
set -euo pipefail
cd "$(dirname "$0")/.."
study=studies/stall-demo.toml
setup=(setup)
if [ "${1:-}" = "ollama" ]; then
  shift
  study=studies/ollama-five-users.toml
  setup=(setup --ollama)  # builds Ollama from its pinned Go module once (a few minutes), and the model
fi
source scripts/bootstrap.sh base  # (a name: sourced without one, it would read this script's own arguments)
.venv/bin/tuner "${setup[@]}"
exec .venv/bin/tuner run "$study" "$@"
