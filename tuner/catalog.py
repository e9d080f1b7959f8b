"""What the command line names and checks before it loads any plugin: every registry's kinds, the
importers' one-line descriptions, a trace's token limit, and the drop-in `tuner apply` writes (which the
morning report names without loading the deployers).

The plugins behind these names import pydantic, httpx, asyncssh, numpy, pandas or scipy, seconds on a
small machine; `tuner --help`, a command's `--help`, `tuner kinds` and a mistyped flag need only the
names. So they live here, importing nothing, and tests/fast/test_startup.py checks them against the
registries: a plugin registered without its name here fails that test.
"""

from __future__ import annotations

__all__ = [
    "CAPACITY_SHAPES",
    "DEPLOYER_KINDS",
    "ENGINE_KINDS",
    "GENERATOR_KINDS",
    "IMPORTER_FORMATS",
    "MAX_PROMPT_TOKENS",
    "SYSTEMD_APPLIED_DROP_IN",
    "TRANSPORT_KINDS",
    "SIM_SPEED_RANGE",
    "SIMULATED_KNOBS",
]

# Sorted, as `Registry.kinds()` lists them.
TRANSPORT_KINDS = ("local", "ssh")
DEPLOYER_KINDS = ("container", "process", "systemd")
ENGINE_KINDS = ("llama-server", "ollama", "vllm")
GENERATOR_KINDS = ("agent", "chat", "stall", "summarize")
# `tuner capacity`'s request shapes (config's `CapacitySpec.shape`, the capacity package's `SHAPES`).
CAPACITY_SHAPES = ("workload", "summary")

# Each importer's `description`, which its class takes from here.
IMPORTER_FORMATS = {
    "azure": "Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens",
    "llama-server-log": "llama-server's log, plain or as journalctl prints it (default verbosity is enough)",
    "mooncake": "Mooncake-style JSONL: timestamp (ms), input_length, output_length, hash_ids",
    "openai-log": "OpenAI-style request logs (JSONL): timestamp, request, response with usage",
}

# No model's context holds ten million tokens: a count above it is a unit mistake, and replaying it would
# synthesize a prompt that size. The trace format enforces it; `workload synth --long-tokens` checks it
# while parsing the command line.
MAX_PROMPT_TOKENS = 10_000_000

# The drop-in `tuner apply` writes under /etc/systemd/system/UNIT.d (the systemd deployer's APPLIED_NAME): it
# sorts before the trials' drop-in under /run, so later trials still win over it.
SYSTEMD_APPLIED_DROP_IN = "zz-tuner-applied.conf"

# How many times faster than real time the simulated llama-server may run (its --sim-speed).
SIM_SPEED_RANGE = (0.01, 1000.0)

# The llama-server knobs the simulated server models: what a prediction (`diagnose --predict`, a study's
# `search.predicted_from`) varies; the diagnose study names the log for a prediction when it tunes one.
SIMULATED_KNOBS = ("n_batch", "n_ubatch", "n_parallel", "kv_unified", "cache_ram")
