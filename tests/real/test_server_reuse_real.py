"""A reused llama-server with its host-RAM prompt cache on (its default), for real.

llama-server keeps prompts in each slot and, when a slot is given to another prompt, in the host-RAM prompt
cache (`cache_ram`), which no endpoint empties; it restores a cached prompt by its tokens alone, whatever
adapter setting computed it. These tests check, on the real server, what `tuner.server_reuse.Servers.deploy`
rests on: a reused server's round, its slots cleared and its prompts a variant, finds in the cache what it
finds on a server started for it (and the same prompts again would not); and a probe is computed under its
own adapter setting whatever the server cached.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tuner.engines import Engine

pytestmark = pytest.mark.real_server

STYLE = (("style", 1.0),)

# Four users who share a system prompt, each in a conversation of two turns, one request at a time (each
# starts after the one before has ended): which slot a request gets, and so what it finds cached, does
# not depend on timing. With two slots, each user displaces an earlier one, whom the host-RAM cache keeps.
_TRACE = [
    {"format": "serve-tuner-trace", "version": 1, "name": "reuse"},
    *(
        {
            "id": f"u{user}-t{turn}",
            "offset_s": 0.0,
            "session": f"u{user}",
            "turn": turn,
            "prompt": {
                "shared_prefix": [{"block": "system", "tokens": 96}],
                "history_tokens": 0 if turn == 0 else 96 + 48,
                "new_tokens": 48,
            },
            "output_tokens": 8 if turn == 0 else 4,
        }
        for user in range(4)
        for turn in range(2)
    ),
]


def _engine(lora_adapter: str | None = None) -> Engine:
    from tuner.config import PluginSpec
    from tuner.engines import create_engine

    # Two slots and one thread: with one per core, a core busy with other work stalls every barrier.
    spec: dict[str, object] = {"kind": "llama-server", "settings": {"n_parallel": 2, "threads": 1}}
    if lora_adapter is not None:
        spec["lora_adapters"] = {"style": lora_adapter}
    return create_engine(PluginSpec.model_validate(spec))


@asynccontextmanager
async def _server(engine: Engine, log_path: Path) -> AsyncIterator[str]:
    from tuner.deployers import ProcessDeployer
    from tuner.deployers.process import ProcessOptions
    from tuner.transports import LocalTransport

    async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
        deployment = await deployer.apply(engine.launch_spec({}), log_path=str(log_path))
        yield deployment.base_url


@pytest.mark.measures
def test_a_reused_llama_server_with_its_prompt_cache_on_serves_a_round_as_a_restarted_one(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    from tuner.loadgen import replay, sessions_in_order
    from tuner.models import ReplayRequest
    from tuner.workloads import load_trace, synthesize_requests

    trace_path = tmp_path / "reuse.jsonl"
    trace_path.write_text("".join(json.dumps(line) + "\n" for line in _TRACE))
    trace = load_trace(trace_path)
    engine = _engine()

    def sessions(variant: int) -> list[list[ReplayRequest]]:
        return sessions_in_order(
            synthesize_requests(trace, token_range=engine.prompt_token_range(), seed=0, round_index=0, variant=variant)
        )

    async def cached(base_url: str, sessions: list[list[ReplayRequest]]) -> list[int]:
        found = []
        for session in sessions:  # one after another; a session's turns are sent one after the other
            records = await replay(session, engine=engine, base_url=base_url, request_timeout_s=120)
            assert all(r.ok and r.timings is not None for r in records), [r.error for r in records]
            found += [r.timings.cache_n for r in records if r.timings is not None]
        return found

    flush = [[request] for request in engine.flush_requests(2)]

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        async with _server(engine, tmp_path / "fresh.log") as base_url:
            fresh = await cached(base_url, sessions(0))
        async with _server(engine, tmp_path / "reused.log") as base_url:
            await cached(base_url, sessions(0))
            await cached(base_url, flush)
            reused = await cached(base_url, sessions(1))
            await cached(base_url, flush)
            same_again = await cached(base_url, sessions(0))
        return fresh, reused, same_again

    fresh, reused, same_again = asyncio.run(scenario())
    # The round's own sharing (the system prompt, each user's history) is found either way...
    assert sum(fresh) > 0, fresh
    assert reused == fresh, (reused, fresh)
    # ...and the same prompts again, their slots cleared, would be served from the host-RAM cache.
    assert sum(same_again) > sum(fresh) + 96, (same_again, fresh)


def test_a_probe_is_answered_under_its_own_adapter_setting_whatever_the_prompt_cache_holds(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    # The LoRA answer check asks each probe under the recorded adapter setting, then under the trial's. A
    # request without adapters takes over a slot's cached prompt whatever adapter setting computed it (the
    # server clears a slot's cache only for a request that names adapters), so each probe is computed
    # afresh: asked without adapters after the adapter's answers, it answers as it did before them.
    from tuner import assets
    from tuner.gate import ask_probes

    engine = _engine(str(assets.ensure_test_lora(log=False)))

    async def scenario() -> list[list[tuple[int, ...]]]:
        async with _server(engine, tmp_path / "server.log") as base_url:
            return [
                await ask_probes(engine, base_url, tokens=24, timeout_s=120, lora=lora, together=False)
                for lora in ((), STYLE, ())
            ]

    without, with_style, without_again = asyncio.run(scenario())
    assert with_style != without  # the adapter changes answers: the check below can tell them apart
    assert without_again == without, (without_again, without, with_style)
