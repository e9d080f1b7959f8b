"""The simulated server's HTTP bodies, as llama-server writes and reads them: a request's prompt (token ids,
text through a stand-in tokenizer, or chat messages) and `lora` field read, the stream's chunks and the
final answer (`/completion`'s or the OpenAI routes'), `/slots`, `/lora-adapters`, `/props` and `/metrics`.
Pure functions of the model's state; the HTTP front (`server.py`) sends them."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner.sim.inputs import SimSettings
from tuner.sim.slots import SimTask

if TYPE_CHECKING:
    from tuner.sim.model import SimulatedLlamaServer

__all__ = [
    "final_answer",
    "integer",
    "lora_adapters_listed",
    "metrics_text",
    "props",
    "request_lora",
    "request_prompt",
    "slots_listed",
    "stream_chunk",
    "text_tokens",
]

_VOCABULARY = 49152  # SmolLM2's


def integer(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    return value


def text_tokens(text: str) -> list[int]:
    """A stand-in tokenizer: about four characters a token, stable across runs."""
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)] or [""]
    return [100 + zlib.crc32(piece.encode()) % 29900 for piece in pieces]


def request_prompt(payload: Mapping[str, Any], *, chat: bool) -> list[int]:
    if chat:
        messages = payload.get("messages") or []
        text = "".join(f"<|{m.get('role', '')}|>{m.get('content', '')}" for m in messages if isinstance(m, dict))
        return text_tokens(text)
    prompt = payload.get("prompt", "")
    if isinstance(prompt, list):
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _VOCABULARY for t in prompt):
            raise ValueError(f"prompt: token ids must be integers from 0 to {_VOCABULARY - 1}")
        return list(prompt) or [1]
    if not isinstance(prompt, str):
        raise ValueError("prompt must be a string or a list of token ids")
    return text_tokens(prompt)


def request_lora(field: object, *, adapters: int) -> list[tuple[int, float]] | None:
    """A request's `lora`: [{"id": N, "scale": S}, ...] naming loaded adapters (ids below `adapters`), or
    None (the global scales)."""
    if field is None:
        return None
    if not isinstance(field, list) or not all(isinstance(item, dict) for item in field):
        raise ValueError('lora must be a list of {"id": N, "scale": S}')
    pairs = []
    for item in field:
        adapter, scale = item.get("id"), item.get("scale")
        if not isinstance(adapter, int) or isinstance(adapter, bool):
            raise ValueError("lora: each id must be an integer")
        if not isinstance(scale, int | float) or isinstance(scale, bool) or not math.isfinite(scale):
            raise ValueError("lora: each scale must be a number")
        if not 0 <= adapter < adapters:
            raise ValueError(f"lora: invalid adapter id {adapter}")
        pairs.append((adapter, float(scale)))
    return pairs


def stream_chunk(task: SimTask, token: int, sent: int, *, chat: bool) -> dict[str, Any]:
    """The streamed chunk of one token, the `sent`-th."""
    if chat:
        return {
            "choices": [{"finish_reason": None, "index": 0, "delta": {"content": f" t{token}"}}],
            "object": "chat.completion.chunk",
            "id": f"chatcmpl-{task.id}",
        }
    return {
        "index": 0,
        "content": f" t{token}",
        "tokens": [token],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": sent,
        "tokens_evaluated": len(task.prompt),
    }


def final_answer(
    task: SimTask, timings: dict[str, float | int], *, chat: bool, payload: Mapping[str, Any], streamed: bool = False
) -> Any:
    """The answer whole, or after a stream its last chunk (a list of them for a chat stream)."""
    stop_type = "limit"
    if not chat:
        final: dict[str, Any] = {
            "index": 0,
            "content": "" if streamed else "".join(f" t{t}" for t in task.generated),
            "tokens": [] if streamed else (list(task.generated) if payload.get("return_tokens") else []),
            "id_slot": task.slot if task.slot is not None else -1,
            "stop": True,
            "model": "simulated",
            "tokens_predicted": len(task.generated),
            "tokens_evaluated": len(task.prompt),
            "stop_type": stop_type,
            "truncated": task.truncated,
            "tokens_cached": task.n_past + max(0, len(task.generated) - 1),
            "timings": timings,
        }
        return final
    usage = {
        "completion_tokens": len(task.generated),
        "prompt_tokens": len(task.prompt),
        "total_tokens": len(task.prompt) + len(task.generated),
        "prompt_tokens_details": {"cached_tokens": task.n_cached},
    }
    if not streamed:
        return {
            "choices": [
                {
                    "finish_reason": "length",
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(f" t{t}" for t in task.generated)},
                }
            ],
            "object": "chat.completion",
            "usage": usage,
            "timings": timings,
        }
    parts: list[Any] = [
        {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}
    ]
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        parts.append({"choices": [], "object": "chat.completion.chunk", "usage": usage, "timings": timings})
    return parts


def slots_listed(model: SimulatedLlamaServer) -> list[dict[str, Any]]:
    """`/slots`."""
    out = []
    for slot in model.slots:
        task = slot.task
        out.append(
            {
                "id": slot.id,
                "n_ctx": model.settings.n_ctx_slot,
                "speculative": False,
                "is_processing": task is not None,
                "id_task": task.id if task else -1,
                "n_prompt_tokens": len(task.prompt) if task else 0,
                "n_prompt_tokens_processed": (task.n_past - task.n_cached) if task else 0,
                "n_prompt_tokens_cache": task.n_cached if task else 0,
                "next_token": [
                    {
                        "has_next_token": task is not None,
                        "has_new_line": False,
                        "n_remain": (task.n_predict - len(task.generated)) if task else -1,
                        "n_decoded": len(task.generated) if task else 0,
                    }
                ],
            }
        )
    return out


def lora_adapters_listed(settings: SimSettings) -> list[dict[str, Any]]:
    """`GET /lora-adapters`."""
    return [
        {"id": i, "path": p, "scale": s, "task_name": "", "prompt_prefix": ""}
        for i, (p, s) in enumerate(zip(settings.lora_adapters, settings.lora_scales, strict=True))
    ]


def props(settings: SimSettings) -> dict[str, Any]:
    """`/props`."""
    return {"total_slots": settings.n_parallel, "model_path": "simulated", "build_info": "simulated"}


def metrics_text(model: SimulatedLlamaServer, speed: float) -> str:
    """`/metrics`, the model's counters with its seconds on the wall clock (`speed` times the model's)."""
    c = model.counters
    processing = sum(1 for s in model.slots if s.task is not None)
    rows = [
        ("counter", "prompt_tokens_total", c.prompt_tokens),
        ("counter", "prompt_tokens_cached_total", c.prompt_tokens_cached),
        ("counter", "prompt_seconds_total", c.prompt_seconds / speed),
        ("counter", "tokens_predicted_total", c.tokens_predicted),
        ("counter", "tokens_predicted_seconds_total", c.tokens_predicted_seconds / speed),
        ("counter", "n_decode_total", c.n_decode),
        ("counter", "n_tokens_max", c.n_tokens_max),
        ("gauge", "n_busy_slots_per_decode", c.busy_slots_sum / c.n_decode if c.n_decode else 0),
        ("gauge", "requests_processing", processing),
        ("gauge", "requests_deferred", len(model.queue)),
    ]
    lines = []
    for kind, name, value in rows:
        lines += [f"# HELP llamacpp:{name} {name}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    return "\n".join(lines) + "\n"
