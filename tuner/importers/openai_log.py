"""OpenAI-style request logs (JSONL), as API gateways and proxies keep them. One request per line:

    {"timestamp": "2026-11-02T09:15:02.120Z", "request": {"model": "m", "messages": [...]},
     "response": {"choices": [{"message": {"role": "assistant", "content": "..."}}],
                  "usage": {"prompt_tokens": 812, "completion_tokens": 164}},
     "duration_ms": 5230, "tag": "support"}

`timestamp` may also be `created`/`time` and a number (Unix seconds, or milliseconds); `request` may be
`body`; `duration_ms`/`duration_s` and `tag` are optional. Sessions, history and shared system prompts
are rebuilt from the messages as `tuner record` does; the text itself is hashed and dropped.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, read_lines
from tuner.workloads import Trace
from tuner.workloads.observed import ObservedRequest, build_trace, hash_chain, request_shape

__all__ = ["OpenAILogImporter", "OpenAILogOptions"]


class OpenAILogOptions(StrictModel):
    tag: str = Field(default="chat", description="Tag of requests whose line has none.")


@IMPORTERS.register("openai-log")
class OpenAILogImporter:
    description = IMPORTER_FORMATS["openai-log"]
    options_model = OpenAILogOptions

    def read(self, path: Path, options: OpenAILogOptions, *, name: str) -> Trace:
        salt = secrets.token_hex(16)
        observed = []
        for number, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            try:
                observed.append(_observe(json.loads(line), salt, options.tag))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            except _Unreadable as exc:
                raise WorkloadError(f"{path}:{number}: {exc}") from None
        return build_trace(observed, name=name, description=f"imported from {path.name}")


class _Unreadable(Exception):
    pass


def _observe(entry: Any, salt: str, default_tag: str) -> ObservedRequest:
    if not isinstance(entry, dict):
        raise _Unreadable("expected a JSON object")
    arrival = _time(entry)
    request = entry.get("request", entry.get("body"))
    response = entry.get("response")
    if not isinstance(request, dict) or not isinstance(response, dict):
        raise _Unreadable("needs a `request` object and a `response` object")
    usage = response.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        raise _Unreadable("response.usage.prompt_tokens is missing; token counts come from the server's usage")
    shape = request_shape(salt, request)
    chain = shape.chain
    answer = _answer(response)
    duration = entry.get("duration_s")
    if duration is None and isinstance(entry.get("duration_ms"), int | float):
        duration = entry["duration_ms"] / 1000.0
    return ObservedRequest(
        arrival_s=arrival,
        end_s=arrival + float(duration) if isinstance(duration, int | float) else None,
        prompt_tokens=usage["prompt_tokens"],
        output_tokens=int(usage.get("completion_tokens") or 1),
        chain=chain,
        answer_chain=hash_chain(chain[-1], [f"assistant\x1f{answer}"])[0] if answer is not None else None,
        system_messages=shape.system_messages,
        system_share=shape.system_share,
        tag=str(entry.get("tag") or default_tag),
    )


def _time(entry: dict[str, Any]) -> float:
    value = next((entry[k] for k in ("timestamp", "created", "time") if k in entry), None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / 1000.0 if value > 1e11 else float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise _Unreadable("needs a `timestamp` (ISO 8601, or Unix seconds or milliseconds)")


def _answer(response: dict[str, Any]) -> str | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else choices[0].get("text")
    return content if isinstance(content, str) else None
