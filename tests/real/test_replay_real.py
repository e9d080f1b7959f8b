"""Replay against the real llama-server: what the server's prompt cache sees is what production shows it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tuner.config import PluginSpec
from tuner.deployers import ProcessDeployer
from tuner.deployers.process import ProcessOptions
from tuner.engines import create_engine
from tuner.loadgen import replay
from tuner.models import RequestRecord
from tuner.transports import LocalTransport
from tuner.workloads import load_trace, synthesize_requests

HEADER = '{"format": "serve-tuner-trace", "version": 1, "name": "history"}\n'
TURNS = (
    '{"id": "a0", "offset_s": 0, "session": "a", "turn": 0, "prompt": {"shared_prefix": [{"block": "sys",'
    ' "tokens": 32}], "new_tokens": 200}, "output_tokens": 24}\n'
    '{"id": "a1", "offset_s": 0, "session": "a", "turn": 1, "prompt": {"shared_prefix": [{"block": "sys",'
    ' "tokens": 32}], "history_tokens": 224, "new_tokens": 16}, "output_tokens": 4}\n'
)


def replay_trace(tmp_path: Path, text: str, *, splice_answers: bool) -> list[RequestRecord]:
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    engine = create_engine(
        # One server thread: beside other tests, a busy core would stall every barrier of two.
        PluginSpec.model_validate({"kind": "llama-server", "settings": {"n_parallel": 2, "threads": 1}})
    )
    requests = synthesize_requests(load_trace(path), token_range=engine.prompt_token_range(), seed=3, round_index=0)
    if not splice_answers:
        requests = [r.model_copy(update={"answer_spans": ()}) for r in requests]

    async def scenario() -> list[RequestRecord]:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            deployment = await deployer.apply(engine.launch_spec({}), log_path=str(tmp_path / "server.log"))
            return await replay(requests, engine=engine, base_url=deployment.base_url, request_timeout_s=120)

    return asyncio.run(scenario())


def test_a_later_turn_reuses_the_whole_conversation_from_the_cache_answer_included(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    spliced = {r.request_id: r for r in replay_trace(tmp_path, HEADER + TURNS, splice_answers=True)}
    placeholder = {r.request_id: r for r in replay_trace(tmp_path, HEADER + TURNS, splice_answers=False)}
    for records in (spliced, placeholder):
        assert all(r.ok for r in records.values())
        assert records["a1"].prompt_tokens == 272
    # The slot holds turn 0's prompt and its answer but the last sampled token: 232 + 24 - 1 = 255.
    with_answer = spliced["a1"].timings
    without_answer = placeholder["a1"].timings
    assert with_answer is not None and without_answer is not None
    assert with_answer.cache_n >= 250, with_answer
    assert without_answer.cache_n <= 232 < with_answer.cache_n
