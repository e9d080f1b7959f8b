"""Logs for the diagnose tests, written by the simulated llama-server on its own clock (tuner/sim): the same
log lines as the real server's, made in milliseconds, with the records its client would have measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.config import PluginSpec
from tuner.engines import create_engine
from tuner.models import ReplayRequest, RequestRecord
from tuner.sim.model import NoiseModel, SimSettings, SimulatedLlamaServer, format_log_line, load_cost_model
from tuner.sim.virtual import replay_virtual

STYLE = (("style", 1.0),)


@dataclass(frozen=True)
class SimLog:
    lines: list[str]
    records: list[RequestRecord]


def simulated_log(
    requests: Sequence[ReplayRequest], *, lora: bool = False, verbosity: int = 3, **settings: int | bool
) -> SimLog:
    options: dict[str, object] = {"kind": "llama-server", "binary": "simulated"}
    if lora:
        options["lora_adapters"] = {"style": "auto"}
    engine = create_engine(PluginSpec.model_validate(options))
    defaults: dict[str, int | bool] = {"n_parallel": 4, "ctx_size": 32768, "kv_unified": False}
    sim = SimSettings(
        **{**defaults, **settings},  # type: ignore[arg-type]
        verbosity=verbosity,
        lora_adapters=("style.gguf",) if lora else (),
        lora_scales=(0.0,) if lora else (),
    )
    lines: list[str] = []
    server = SimulatedLlamaServer(
        sim,
        cost=load_cost_model(),
        noise=NoiseModel(),
        seed=0,
        log=lambda at, line: lines.append(format_log_line(at, line)),
    )
    done = replay_virtual(requests, server, engine=engine, start_s=1.0, request_timeout_s=3600)
    return SimLog(lines=lines, records=done.records)


def request(
    request_id: str, offset: float, prompt: int, output: int, *, lora: tuple[tuple[str, float], ...] | None = None
) -> ReplayRequest:
    base = 1000 + 7919 * (sum(map(ord, request_id)) % 97)
    return ReplayRequest(
        request_id=request_id,
        session=request_id,
        offset_s=offset,
        prompt_token_ids=tuple((base + i) % 40000 + 10 for i in range(prompt)),
        output_tokens=output,
        lora=lora,
    )


def stall_requests(prompt: int = 2500) -> list[ReplayRequest]:
    """Two streams past 100 tokens when a long prompt arrives."""
    return [
        request("chat-1", 0.0, 40, 420),
        request("chat-2", 0.2, 40, 420),
        request("long-1", 5.0, prompt, 4),
    ]


def lora_requests(pairs: int = 4) -> list[ReplayRequest]:
    """Pairs of users arriving together, one with the adapter and one without (workloads/lora-mix.jsonl)."""
    out = []
    for i in range(pairs):
        out.append(request(f"styled-{i}", 3.0 * i, 250, 48, lora=STYLE))
        out.append(request(f"plain-{i}", 3.0 * i + 0.05, 250, 48))
    return out
