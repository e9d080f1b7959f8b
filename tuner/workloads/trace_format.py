"""The trace format (JSONL, version 1): a header line, then one request per line.

    {"format": "serve-tuner-trace", "version": 1, "name": "stall", "description": "..."}
    {"id": "chat-1.1", "offset_s": 42.0, "session": "chat-1", "turn": 1, "think_s": 8.5,
     "prompt": {"shared_prefix": [{"block": "system", "tokens": 64}], "history_tokens": 480, "new_tokens": 90},
     "output_tokens": 300, "lora": [{"adapter": "support", "scale": 1.0}], "tag": "chat"}

Only shapes are stored (token counts, block ids, timings), never message text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from tuner.catalog import MAX_PROMPT_TOKENS
from tuner.config import StrictModel

__all__ = [
    "MAX_OFFSET_S",
    "MAX_PROMPT_TOKENS",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "LoraUse",
    "PrefixBlock",
    "PromptShape",
    "TraceHeader",
    "TraceRequest",
    "shape_problem",
]

TRACE_FORMAT: Literal["serve-tuner-trace"] = "serve-tuner-trace"
TRACE_VERSION = 1

# The token limit lives in tuner/catalog.py, where the command line checks it without loading pydantic.
_MAX_TOKENS = MAX_PROMPT_TOKENS
# A trace spans at most a year of arrivals.
MAX_OFFSET_S = 366 * 86_400.0


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
    offset_s: float = Field(ge=0, le=MAX_OFFSET_S, description="Arrival time from the start of the trace.")
    session: str
    turn: int = Field(default=0, ge=0, le=2**31 - 1)
    think_s: float = Field(
        default=0.0, ge=0, le=MAX_OFFSET_S, description="Pause after the session's previous turn ended."
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


def shape_problem(
    *, offset_s: float, new_tokens: int, output_tokens: int, blocks: Sequence[tuple[str, int]] = ()
) -> str | None:
    """What keeps a request of these values out of a trace (the limits `TraceRequest` holds), or None."""
    if not 0 <= offset_s <= MAX_OFFSET_S:
        return f"arrives {offset_s:g} s after the trace's first request; a trace spans at most 366 days"
    for name, value, least in (("output tokens", output_tokens, 1), ("new prompt tokens", new_tokens, 0)):
        if type(value) is not int:  # the columns hold whole numbers; checked before any is written
            return f"{value!r} {name}: a whole number"
        if not least <= value <= _MAX_TOKENS:
            return f"{value} {name}: a request has {least} to {_MAX_TOKENS:,}"
    for block, tokens in blocks:
        if type(tokens) is not int or not 1 <= tokens <= _MAX_TOKENS:
            return f"block {block} of {tokens} tokens: a block has 1 to {_MAX_TOKENS:,}"
    if new_tokens == 0 and not blocks:
        return "a prompt needs at least one token"
    return None
