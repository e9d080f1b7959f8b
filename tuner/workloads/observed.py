"""Rebuilds sessions and shared prefixes from what was observed of each request, without its text.

The recorder and the request-log importer see messages; they keep only a salted hash chain of them
(`hash_chain`): entry i identifies the conversation up to message i. A request whose messages begin
with an earlier request's conversation *plus that request's answer* is the next turn of the same
session; the tokens of that earlier conversation are its history. Leading system messages are a
shared prefix block, identified by their hash. Token counts come from the server's answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.workloads.trace import Trace
from tuner.workloads.trace_format import (
    TRACE_FORMAT,
    TRACE_VERSION,
    LoraUse,
    PrefixBlock,
    PromptShape,
    TraceHeader,
    TraceRequest,
)

__all__ = ["ObservedRequest", "RequestShape", "build_trace", "hash_chain", "message_text", "request_shape"]


def message_text(message: Mapping[str, Any]) -> str:
    """The part of a chat message that identifies it: role, content (text or parts), tool calls and
    Ollama's `images` (its messages carry them beside the text, not in content parts)."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    text = f"{message.get('role', '')}\x1f{text}"
    for extra in ("tool_calls", "images"):
        if message.get(extra):
            text += f"\x1f{json.dumps(message[extra], sort_keys=True)}"
    return text


def hash_chain(salt: str, texts: Iterable[str]) -> tuple[str, ...]:
    """Entry i hashes texts[0..i]; a salt per recording keeps known prompts from being looked up."""
    chain: list[str] = []
    previous = salt
    for text in texts:
        previous = hashlib.sha256(f"{previous}\x1e{text}".encode()).hexdigest()
        chain.append(previous)
    return tuple(chain)


@dataclass(frozen=True, kw_only=True)
class RequestShape:
    """What a request body says about its prompt, without keeping its text."""

    chain: tuple[str, ...]
    system_messages: int  # leading system (or developer) messages: the shared prefix
    system_share: float  # their share of the prompt's characters
    system_text: str | None  # to count their tokens with the server; never stored


def request_shape(salt: str, body: Mapping[str, Any], *, chat: bool = True) -> RequestShape:
    """The hash chain of a chat request's messages and its leading system messages; a completion
    request's prompt is one link with no shared prefix."""
    messages = body.get("messages") if chat else None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return RequestShape(
            chain=hash_chain(salt, [json.dumps(body.get("prompt"))]),
            system_messages=0,
            system_share=0.0,
            system_text=None,
        )
    texts = [message_text(m) for m in messages]
    system = 0
    while system < len(messages) and messages[system].get("role") in ("system", "developer"):
        system += 1
    return RequestShape(
        chain=hash_chain(salt, texts),
        system_messages=system,
        system_share=sum(len(t) for t in texts[:system]) / max(1, sum(len(t) for t in texts)),
        system_text="\n".join(str(m.get("content", "")) for m in messages[:system]) if system else None,
    )


@dataclass(frozen=True, kw_only=True)
class ObservedRequest:
    """One request as the recorder or an importer saw it; `chain` covers its messages, `answer_chain`
    the same messages followed by the answer it got (what the next turn would start with)."""

    arrival_s: float
    end_s: float | None = None
    prompt_tokens: int
    output_tokens: int
    chain: tuple[str, ...]
    answer_chain: str | None = None
    system_messages: int = 0  # leading messages that form the shared prefix
    system_tokens: int | None = None  # their tokens, when the server could count them
    system_share: float = 0.0  # their share of the prompt's characters, for an estimate otherwise
    lora: tuple[LoraUse, ...] = ()
    tag: str = "chat"
    content: dict[str, Any] | None = None  # messages or prompt, only when the user keeps content


def build_trace(observed: Sequence[ObservedRequest], *, name: str, description: str = "") -> Trace:
    """A trace with sessions, turns, think times, history and shared prefix blocks rebuilt."""
    ordered = sorted(observed, key=lambda o: o.arrival_s)
    start = ordered[0].arrival_s if ordered else 0.0
    by_answer: dict[str, tuple[ObservedRequest, TraceRequest]] = {}
    sessions = 0
    requests: list[TraceRequest] = []
    block_tokens: dict[str, int] = {}  # an estimated block keeps its first size, so that it stays one block
    for index, seen in enumerate(ordered):
        previous = _previous_turn(seen, by_answer)
        prefix = _prefix(seen)
        if prefix is None and previous is not None and previous[1].prompt.shared_prefix:
            # A next turn's prompt begins with the earlier turn's, so with its prefix too, also where the
            # request does not repeat the system prompt first (Ollama's `context` comes before it).
            prefix = previous[1].prompt.shared_prefix[0]
        if prefix is not None:
            size = min(block_tokens.setdefault(prefix.block, prefix.tokens), seen.prompt_tokens)
            prefix = prefix.model_copy(update={"tokens": size})
        prefix_tokens = prefix.tokens if prefix else 0
        if previous is None:
            sessions += 1
            session, turn, history, think = f"s{sessions}", 0, 0, 0.0
        else:
            earlier, earlier_request = previous
            session, turn = earlier_request.session, earlier_request.turn + 1
            # The earlier turn began with the same system messages, so its prompt held the same prefix.
            history = earlier.prompt_tokens + earlier.output_tokens - prefix_tokens
            history = max(0, min(history, seen.prompt_tokens - prefix_tokens))
            think = max(0.0, seen.arrival_s - earlier.end_s) if earlier.end_s is not None else 0.0
        new = max(0, seen.prompt_tokens - prefix_tokens - history)
        if prefix_tokens + history + new == 0:
            new = 1
        request = TraceRequest(
            id=f"r{index}",
            offset_s=round(seen.arrival_s - start, 6),
            session=session,
            turn=turn,
            think_s=round(think, 6),
            prompt=PromptShape(
                shared_prefix=[prefix] if prefix else [],
                history_tokens=history,
                new_tokens=new,
            ),
            output_tokens=max(1, seen.output_tokens),
            lora=list(seen.lora),
            tag=seen.tag,
            duration_s=round(seen.end_s - seen.arrival_s, 6) if seen.end_s is not None else None,
            content=seen.content,
        )
        requests.append(request)
        if seen.answer_chain is not None:
            by_answer[seen.answer_chain] = (seen, request)
    header = TraceHeader(format=TRACE_FORMAT, version=TRACE_VERSION, name=name, description=description)
    return Trace(header=header, requests=requests)


def _prefix(seen: ObservedRequest) -> PrefixBlock | None:
    if seen.system_messages == 0 or not seen.chain:
        return None
    tokens = seen.system_tokens
    if tokens is None:
        tokens = round(seen.prompt_tokens * seen.system_share)
    tokens = min(tokens, seen.prompt_tokens)
    if tokens <= 0:
        return None
    return PrefixBlock(block=f"sys-{seen.chain[seen.system_messages - 1][:12]}", tokens=tokens)


def _previous_turn(
    seen: ObservedRequest, by_answer: Mapping[str, tuple[ObservedRequest, TraceRequest]]
) -> tuple[ObservedRequest, TraceRequest] | None:
    """The latest earlier request whose conversation and answer this request's messages begin with."""
    for entry in reversed(seen.chain[:-1]):
        if entry in by_answer:
            return by_answer[entry]
    return None
