"""A diagnosis of an Ollama log in Ollama's terms. Its runner writes llama-server's lines, so the analyses
find llama-server's mechanisms and name llama-server's settings; an Ollama operator has other levers
(`OLLAMA_*` variables, the model's Modelfile) and lacks some (no RAM prompt cache, no unified KV cache).
Each fix is said again with the lever Ollama 0.11 has, or that it has none (docs/engines.md, "Each
engine's knobs")."""

from __future__ import annotations

import re

from tuner.diagnose.report import Finding, Fix

__all__ = ["in_ollamas_terms"]

_N_BATCH = re.compile(r"^lower n_batch \(LLAMA_ARG_BATCH\) to about (\d+), with n_ubatch at most as large$")


def _ollamas(fix: Fix) -> Fix:
    action = fix.action
    if batch := _N_BATCH.match(action):
        action = (
            f"lower num_batch to about {batch[1]}: Ollama reads it from the model, not from a variable "
            f"(`PARAMETER num_batch {batch[1]}` in its Modelfile, then `ollama create`; its n_ubatch stays "
            "llama.cpp's 512 at most); a study tunes it as a request option every request of a trial carries"
        )
    elif "LLAMA_ARG_N_PARALLEL" in action:
        action = (
            "more slots (OLLAMA_NUM_PARALLEL, 1 by default): each slot gets its own num_ctx of KV cache, so "
            "memory grows with them"
        )
    elif "LLAMA_ARG_CACHE_RAM" in action:
        action = (
            "Ollama keeps no prompt cache in RAM beside its slots: a returning conversation is prefilled again "
            "unless its slot still holds it (more slots, OLLAMA_NUM_PARALLEL, keep more conversations)"
        )
    elif action.startswith("give slots more context (ctx_size"):
        action = "give slots more context (OLLAMA_CONTEXT_LENGTH: every one of the OLLAMA_NUM_PARALLEL slots gets it)"
    return fix if action == fix.action else fix.model_copy(update={"action": action})


def in_ollamas_terms(findings: list[Finding]) -> list[Finding]:
    """The findings with each fix's action in Ollama's terms."""
    return [finding.model_copy(update={"fixes": [_ollamas(fix) for fix in finding.fixes]}) for finding in findings]
