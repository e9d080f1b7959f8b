"""The trace format (JSONL, version 1): a header line, then one request per line.

    {"format": "serve-tuner-trace", "version": 1, "name": "stall", "description": "..."}
    {"id": "chat-1.1", "offset_s": 42.0, "session": "chat-1", "turn": 1, "think_s": 8.5,
     "prompt": {"shared_prefix": [{"block": "system", "tokens": 64}], "history_tokens": 480, "new_tokens": 90},
     "output_tokens": 300, "lora": [{"adapter": "support", "scale": 1.0}], "tag": "chat"}

Only shapes are stored (token counts, block ids, timings), never message text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, model_validator

from tuner.catalog import MAX_PROMPT_TOKENS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.files import special_file

__all__ = [
    "MAX_PROMPT_TOKENS",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "PrefixBlock",
    "PromptShape",
    "LoraUse",
    "Trace",
    "TraceHeader",
    "TraceRequest",
    "dump_trace",
    "load_trace",
]

TRACE_FORMAT: Literal["serve-tuner-trace"] = "serve-tuner-trace"
TRACE_VERSION = 1

# The token limit lives in tuner/catalog.py, where the command line checks it without loading pydantic.
_MAX_TOKENS = MAX_PROMPT_TOKENS
# A trace spans at most a year of arrivals.
_MAX_OFFSET_S = 366 * 86_400.0


class TraceHeader(StrictModel):
    format: Literal["serve-tuner-trace"]
    version: int
    name: str
    description: str = ""


class PrefixBlock(StrictModel):
    """A run of tokens shared by every request that names the same block id (a system prompt)."""

    block: str
    tokens: int = Field(gt=0, le=_MAX_TOKENS)


class PromptShape(StrictModel):
    """A prompt in the order the server sees it: shared prefix blocks, then session history, then new tokens."""

    shared_prefix: list[PrefixBlock] = Field(default_factory=list)
    history_tokens: int = Field(
        default=0,
        ge=0,
        le=_MAX_TOKENS,
        description="The session's earlier turns (their prompts and answers) repeated in this prompt: what the "
        "server can reuse from the cache of the slot that served the previous turn.",
    )
    new_tokens: int = Field(
        ge=0, le=_MAX_TOKENS, description="Tokens no other request has: the part that must be prefilled."
    )

    @property
    def prefix_tokens(self) -> int:
        return sum(b.tokens for b in self.shared_prefix)

    @property
    def total_tokens(self) -> int:
        return self.prefix_tokens + self.history_tokens + self.new_tokens


class LoraUse(StrictModel):
    """One adapter applied to a request, by the name the study's engine options map to a file."""

    adapter: str = Field(min_length=1)
    scale: float = 1.0


class TraceRequest(StrictModel):
    id: str
    offset_s: float = Field(ge=0, le=_MAX_OFFSET_S, description="Arrival time from the start of the trace.")
    session: str
    turn: int = Field(default=0, ge=0)
    think_s: float = Field(
        default=0.0, ge=0, le=_MAX_OFFSET_S, description="Pause after the session's previous turn ended."
    )
    prompt: PromptShape
    output_tokens: int = Field(gt=0, le=_MAX_TOKENS)
    lora: list[LoraUse] = Field(default_factory=list, description="Adapters applied; empty: none.")
    tag: str = "chat"
    duration_s: float | None = Field(
        default=None, ge=0, description="How long the request took when recorded; shown, never replayed."
    )
    content: dict[str, Any] | None = Field(
        default=None,
        description="The request's messages or prompt, only when recorded with --keep-content; kept for the "
        "user, never replayed (the replay synthesizes prompts of the recorded shape).",
    )

    @model_validator(mode="after")
    def _has_prompt(self) -> TraceRequest:
        if self.prompt.total_tokens == 0:
            raise ValueError("a prompt needs at least one token")
        return self


class Trace(StrictModel):
    header: TraceHeader
    requests: list[TraceRequest]


def load_trace(path: Path) -> Trace:
    """Reads a trace; every problem is reported with the file and line number. Values are not coerced
    (`"new_tokens": "90"` is refused), and NaN or infinite numbers are refused."""
    special = special_file(path)
    if special is not None:
        raise WorkloadError(f"{path} is {special}, not a trace file; check workload.path")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"{path}: workload file not found; check workload.path") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path} is a directory; name the trace file (JSONL) in it") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    if b"\x00" in raw:
        raise WorkloadError(f"{path}: is a binary file, not a trace (JSONL text); check workload.path")
    try:
        text = raw.decode("utf-8-sig")  # a BOM before the header is harmless here
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(f"{path}:{line}: not UTF-8 text; a trace is JSONL written by serve-tuner") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not numbered:
        raise WorkloadError(f"{path}: empty; expected a header line and requests")
    header_no, header_line = numbered[0]
    header = _parse_line(path, header_no, header_line, TraceHeader)
    if header.version != TRACE_VERSION:
        raise WorkloadError(
            f"{path}:{header_no}: trace version {header.version} is not supported (this tool reads version "
            f"{TRACE_VERSION}); convert the file or upgrade serve-tuner"
        )
    requests = [_parse_line(path, no, line, TraceRequest) for no, line in numbered[1:]]
    if not requests:
        raise WorkloadError(f"{path}: has a header but no requests")
    seen: set[str] = set()
    for request in requests:
        if request.id in seen:
            raise WorkloadError(f"{path}: request id {request.id!r} appears twice; ids must be unique")
        seen.add(request.id)
    return Trace(header=header, requests=sorted(requests, key=lambda r: r.offset_s))


ModelT = TypeVar("ModelT", bound=StrictModel)


def _parse_line(path: Path, number: int, line: str, model: type[ModelT]) -> ModelT:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise WorkloadError(f"{path}:{number}: nested too deeply to be a trace line") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}:{number}: expected a JSON object")
    try:
        return model.model_validate_json(line, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(line)"
        problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        shown = "" if first["type"] in ("extra_forbidden", "missing") else f" (got {first.get('input')!r:.60})"
        raise WorkloadError(f"{path}:{number}: {where}: {problem}{shown}") from None


def dump_trace(trace: Trace) -> str:
    """The trace as JSONL text: the header line, then one request per line."""
    lines = [trace.header.model_dump_json(exclude_defaults=False)]
    lines += [request.model_dump_json(exclude_defaults=True) for request in trace.requests]
    return "\n".join(lines) + "\n"
