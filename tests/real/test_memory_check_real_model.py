"""The memory check reads the real model's GGUF header (SmolLM2, fetched by `tuner setup`): its KV cache
size per token, and what fits a budget before any restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.real_parts import need_real_part
from tuner.config import PluginSpec
from tuner.engines import create_engine


@pytest.mark.real_part("llama-server")
def test_the_memory_check_reads_the_real_models_header(tmp_path: Path) -> None:
    from tuner import assets
    from tuner.engines.memory import gguf_kv_shape, kv_bytes_per_token

    model = assets.find_model()
    if model is None:
        need_real_part(
            "llama-server", "the SmolLM2 model is not fetched (`tuner setup`); its GGUF header is the test input"
        )
    # SmolLM2-135M: 30 layers, 3 KV heads of 64: 2 x 30 x 3 x 64 x 2 bytes per token at f16.
    assert kv_bytes_per_token(gguf_kv_shape(model)) == 23040
    llama = create_engine(
        PluginSpec.model_validate(
            {
                "kind": "llama-server",
                "binary": "/bin/true",
                "model": str(model),
                "port": 18080,
                "memory_budget_gib": 0.5,
            }
        )
    )
    assert llama.memory_need({"ctx_size": 1000}) == model.stat().st_size + 1000 * 23040
    assert llama.memory_check({"ctx_size": 8192}) is None
    reason = llama.memory_check({"ctx_size": 32768})
    assert reason is not None and "over the 0.5 GiB budget" in reason
