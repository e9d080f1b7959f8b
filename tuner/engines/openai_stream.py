"""Reading OpenAI-style completion streams (`data: {...}` chunks, `data: [DONE]`), as vLLM and
Ollama's `/v1` endpoints send them. With `stream_options.continuous_usage_stats` (vLLM) every chunk
carries the running `completion_tokens`, which is the exact count; otherwise each chunk with text is
one token and the final usage chunk corrects the count.
"""

from __future__ import annotations

import json
from typing import Any

from tuner.engines.base import StreamEvent
from tuner.models import ServerTimings

__all__ = ["parse_openai_sse_line", "probe_answer_units"]


def parse_openai_sse_line(line: str, *, prompt_count_includes_cached: bool) -> StreamEvent | None:
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload:
        return None
    if payload == "[DONE]":
        return StreamEvent(done=True)
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        return StreamEvent(error=f"unreadable stream chunk: {payload[:80]}")
    if not isinstance(chunk, dict):
        return StreamEvent(error=f"unreadable stream chunk: {payload[:80]}")
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        return StreamEvent(error=str(message), done=True)
    choices = chunk.get("choices") or []
    texts = sum(1 for c in choices if _text(c))
    usage = chunk.get("usage")
    so_far = usage.get("completion_tokens") if isinstance(usage, dict) else None
    so_far = so_far if isinstance(so_far, int) else None
    timings = None
    if isinstance(usage, dict) and not choices:
        prompt = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        timings = ServerTimings(
            cache_n=int(cached or 0),
            prompt_n=prompt - int(cached or 0) if cached is not None else prompt,
            prompt_n_includes_cached=cached is None and prompt_count_includes_cached,
            predicted_n=int(usage.get("completion_tokens") or 0),
        )
    return StreamEvent(tokens=texts, tokens_so_far=so_far, timings=timings)


def _text(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    text = choice.get("text") if "text" in choice else (delta or {}).get("content") if isinstance(delta, dict) else ""
    return text if isinstance(text, str) else ""


def probe_answer_units(text: str) -> tuple[int, ...]:
    """A text answer as comparable units (its characters), for engines that return no token ids."""
    return tuple(ord(c) for c in text)
