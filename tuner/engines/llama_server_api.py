"""llama-server's HTTP API as the replay and the probes speak it: `/completion` bodies with token-id
prompts, the streamed chunks read back, the probes' answers, `/props` and the `/metrics` counters of a
round. Pure functions; the engine (`llama_server.py`) holds what they need of its options."""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.engines.base import StreamEvent
from tuner.models import ReplayRequest, ServerTimings

__all__ = [
    "completion_body",
    "flush_requests",
    "lora_field",
    "parse_probe_answer",
    "parse_stream_line",
    "parse_version",
    "probe_body",
    "round_counters",
]

# A partial chunk as this build sends it (keys in this order), read without a JSON parser; anything else
# goes through the parser (docs/architecture.md, "The llama-server engine").
_PARTIAL_CHUNK = re.compile(
    r'data: ?\{"index":\d+,"content":"(?:[^"\\]|\\.)*","tokens":\[([\d,]*)\],"stop":false,"id_slot":-?\d+,'
    r'"tokens_predicted":(\d+),"tokens_evaluated":\d+\}\s*$'
)

# One event per streamed token: the C scanner without json.loads' wrapper takes half the time.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed names it oddly


def lora_field(adapters: Sequence[str], lora: tuple[tuple[str, float], ...]) -> list[dict[str, object]]:
    """A request's `lora`: each adapter by its id, its place among the engine's `lora_adapters`."""
    ids = {name: index for index, name in enumerate(adapters)}
    return [{"id": ids[name], "scale": scale} for name, scale in lora]


def completion_body(request: ReplayRequest, adapters: Sequence[str]) -> dict[str, object]:
    """A replayed request: exactly its prompt's token ids and exactly its output's length."""
    body: dict[str, object] = {
        "prompt": list(request.prompt_token_ids),
        "n_predict": request.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": True,
        "temperature": 0.0,
    }
    if request.lora is not None:
        body["lora"] = lora_field(adapters, request.lora)
    return body


def probe_body(
    prompt: str, *, tokens: int, adapters: Sequence[str], lora: tuple[tuple[str, float], ...] | None = None
) -> dict[str, object]:
    """A correctness probe: greedy, not streamed, its answer's token ids returned."""
    body: dict[str, object] = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "stream": False,
        # Computed afresh: a cached state of this prompt may come from another adapter setting.
        "cache_prompt": False,
        "return_tokens": True,
    }
    if lora is not None:
        body["lora"] = lora_field(adapters, lora)
    return body


def parse_probe_answer(body: Mapping[str, Any]) -> tuple[int, ...]:
    tokens = body.get("tokens")
    return tuple(int(t) for t in tokens) if isinstance(tokens, list) else ()


def parse_version(body: Mapping[str, Any]) -> str | None:
    build = body.get("build_info")  # "b11434-abcdef0"; the startup log does not say it at -lv 3
    return build if isinstance(build, str) and build else None


def flush_requests(slots: int, token_range: tuple[int, int]) -> list[ReplayRequest]:
    """One short request per slot, each of token ids no synthesized round starts with in the same place
    (docs/architecture.md, "The llama-server engine")."""
    low, high = token_range
    requests = []
    for index in range(slots):
        first = low + (16 * (index + 1)) % max(16, high - low - 16)
        requests.append(
            ReplayRequest(
                request_id=f"slot-flush-{index}",
                session=f"slot-flush-{index}",
                offset_s=0.0,
                prompt_token_ids=tuple(range(first, first + 16)),
                output_tokens=1,
                tag="slot-flush",
            )
        )
    return requests


def round_counters(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
    def delta(name: str) -> float | None:
        key = f"llamacpp:{name}"
        return after[key] - before.get(key, 0.0) if key in after else None

    decodes, prompt, predicted = (
        delta("n_decode_total"),
        delta("prompt_tokens_total"),
        delta("tokens_predicted_total"),
    )
    per_decode = (prompt + predicted) / decodes if decodes and prompt is not None and predicted is not None else None
    return {"server_decode_calls": decodes, "server_tokens_per_decode": per_decode}


def parse_stream_line(line: str) -> StreamEvent | None:
    if not line.startswith("data:"):
        return None
    partial = _PARTIAL_CHUNK.match(line)
    if partial is not None:
        ids = tuple(map(int, partial[1].split(","))) if partial[1] else ()
        return StreamEvent(tokens=len(ids), tokens_so_far=int(partial[2]), token_ids=ids)
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        chunk, end = _scan_json(payload, 0)
    except (StopIteration, json.JSONDecodeError):
        end = -1
    if end != len(payload) or not isinstance(chunk, dict):
        return StreamEvent(error=f"unreadable stream chunk: {payload[:80]}")
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        return StreamEvent(error=str(message), done=True)
    tokens = chunk.get("tokens")
    ids = tuple(tokens) if isinstance(tokens, list) else ()
    count = len(ids) if isinstance(tokens, list) else (1 if chunk.get("content") else 0)
    so_far = chunk.get("tokens_predicted")
    so_far = so_far if isinstance(so_far, int) else None
    if not chunk.get("stop"):
        return StreamEvent(tokens=count, tokens_so_far=so_far, token_ids=ids)
    timings = chunk.get("timings") or {}
    return StreamEvent(
        tokens=count,
        tokens_so_far=so_far,
        token_ids=ids,
        done=True,
        timings=ServerTimings(
            cache_n=int(timings.get("cache_n", 0)),
            prompt_n=int(timings.get("prompt_n", 0)),
            prompt_ms=float(timings.get("prompt_ms", 0.0)),
            predicted_n=int(timings.get("predicted_n", 0)),
            predicted_ms=float(timings.get("predicted_ms", 0.0)),
        ),
        extra={"stop_type": chunk.get("stop_type"), "id_slot": chunk.get("id_slot")},
    )
