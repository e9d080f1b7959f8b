"""What `tuner record` learns of one completion request while it passes through: the API it speaks, the
shape of its prompt (a salted hash chain of its messages, the system prompt's share), its LoRA use and
tag, and from the answer (SSE events, one JSON body, or Ollama's NDJSON) its token counts and the text
that the next turn sends back. Nothing here touches a socket."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.workloads.observed import RequestShape, hash_chain, message_text, request_shape

__all__ = [
    "Exchange",
    "complete_lines",
    "read_body",
    "read_chunk",
    "read_event",
    "read_ollama_line",
    "split_events",
    "start_exchange",
]

# Which API a recorded request speaks: the OpenAI routes (and llama-server's /completion), or Ollama's own.
_Api = Literal["openai", "ollama-chat", "ollama-generate"]
_CHAT_PATHS = {"/v1/chat/completions", "/chat/completions"}
_COMPLETION_PATHS = {"/v1/completions", "/completions", "/completion"}
_OLLAMA_PATHS: dict[str, _Api] = {"/api/chat": "ollama-chat", "/api/generate": "ollama-generate"}


@dataclass(kw_only=True)
class Exchange:
    """What the proxy learns of one completion request while passing it through."""

    arrival_s: float
    api: _Api
    chain: tuple[str, ...]
    system_messages: int
    system_share: float
    system_text: str | None
    lora_ids: tuple[tuple[int, float], ...]
    tag: str
    content: dict[str, Any] | None = None
    answer: list[str] = field(default_factory=list)
    chunks_with_output: int = 0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    # Ollama's answer counts once its final object (`done: true`) came: a failure met mid-answer sends an
    # error object in its place, with the status still 200.
    answered: bool = True
    answer_chain: str | None = None  # /api/generate: the hash of the `context` its final object returned


def start_exchange(
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    arrival: float,
    *,
    salt: str,
    tag_header: str,
    keep_content: bool,
) -> tuple[Exchange | None, bytes, bool]:
    """What a request says, if it is a completion (else None), the body to send upstream (asking for usage
    where a streaming client did not) and whether to hide that usage chunk from the client."""
    api: _Api | None = "openai" if path in _CHAT_PATHS | _COMPLETION_PATHS else _OLLAMA_PATHS.get(path)
    if api is None:
        return None, body, False
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, body, False
    if not isinstance(payload, dict):
        return None, body, False
    chat = path in _CHAT_PATHS or api == "ollama-chat"
    shape = _generate_shape(salt, payload) if api == "ollama-generate" else request_shape(salt, payload, chat=chat)
    lora = payload.get("lora") if api == "openai" else None  # Ollama has no adapters per request
    lora_ids = tuple(
        (int(item["id"]), float(item.get("scale", 1.0)))
        for item in (lora if isinstance(lora, list) else [])
        if isinstance(item, dict) and isinstance(item.get("id"), int) and float(item.get("scale", 1.0)) != 0.0
    )
    default_tag = "chat" if chat else "completion"
    exchange = Exchange(
        arrival_s=arrival,
        api=api,
        chain=shape.chain,
        system_messages=shape.system_messages,
        system_share=shape.system_share,
        system_text=shape.system_text,
        lora_ids=lora_ids,
        tag=headers.get(tag_header, default_tag)[:64] or default_tag,
        content=_content(payload, chat=chat) if keep_content else None,
        answered=api == "openai",
    )
    hide_usage = False
    if payload.get("stream") and path in _CHAT_PATHS | {"/v1/completions", "/completions"}:
        options = payload.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            body = json.dumps(payload).encode()
            hide_usage = True
    return exchange, body, hide_usage


def read_event(exchange: Exchange, event: bytes, hide_usage: bool) -> bool:
    """Learns what an SSE event says; True when it is the usage chunk the client did not ask for."""
    data = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return False
    try:
        chunk = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    if not isinstance(chunk, dict):
        return False
    read_chunk(exchange, chunk)
    return hide_usage and chunk.get("choices") == [] and "usage" in chunk


def read_body(exchange: Exchange, body: bytes) -> None:
    with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
        chunk = json.loads(body)
        if isinstance(chunk, dict):
            read_chunk(exchange, chunk)


def read_ollama_line(exchange: Exchange, line: bytes, *, salt: str) -> None:
    """Learns what one object of Ollama's answer says: a piece of it, or the final one with the counts."""
    try:
        chunk = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return
    if not isinstance(chunk, dict):
        return
    message = chunk.get("message") if exchange.api == "ollama-chat" else chunk
    if isinstance(message, dict):
        piece = message.get("content" if exchange.api == "ollama-chat" else "response")
        thinking = message.get("thinking")
        if isinstance(piece, str) and piece:
            exchange.answer.append(piece)  # the next turn sends back the answer, not the thinking
        if (isinstance(piece, str) and piece) or (isinstance(thinking, str) and thinking):
            exchange.chunks_with_output += 1
    if chunk.get("done") is not True:
        return
    exchange.answered = True
    exchange.prompt_tokens = _int(chunk.get("prompt_eval_count"), exchange.prompt_tokens)
    exchange.output_tokens = _int(chunk.get("eval_count"), exchange.output_tokens)
    context = chunk.get("context")
    if exchange.api == "ollama-generate" and isinstance(context, list) and context:
        exchange.answer_chain = hash_chain(salt, [_context_link(context)])[0]


def read_chunk(exchange: Exchange, chunk: Mapping[str, Any]) -> None:
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or choice.get("message") or {}).get("content") or choice.get("text")
        if isinstance(piece, str) and piece:
            exchange.answer.append(piece)
            exchange.chunks_with_output += 1
    if isinstance(chunk.get("content"), str) and chunk["content"]:  # llama-server's /completion
        exchange.answer.append(chunk["content"])
        exchange.chunks_with_output += 1
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        exchange.prompt_tokens = _int(usage.get("prompt_tokens"), exchange.prompt_tokens)
        exchange.output_tokens = _int(usage.get("completion_tokens"), exchange.output_tokens)
    exchange.prompt_tokens = _int(chunk.get("tokens_evaluated"), exchange.prompt_tokens)
    if chunk.get("stop") is True:
        exchange.output_tokens = _int(chunk.get("tokens_predicted"), exchange.output_tokens)


def _content(payload: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    if chat:
        return {"messages": payload.get("messages")}
    system = payload.get("system")  # Ollama's /api/generate: the system prompt is beside the prompt
    return {"prompt": payload.get("prompt"), **({"system": system} if system else {})}


def _generate_shape(salt: str, payload: Mapping[str, Any]) -> RequestShape:
    """The hash chain of an Ollama /api/generate request: its deprecated `context` (an earlier prompt and
    answer as token ids, which Ollama puts first), its `system` and its prompt, each hashed as the
    message it becomes. The system prompt is a shared prefix only when it leads the prompt; after a
    `context`, the earlier turn's prefix is the one the prompt begins with."""
    links: list[str] = []
    context = payload.get("context")
    if isinstance(context, list) and context:
        links.append(_context_link(context))
    system = payload.get("system")
    leading_system = isinstance(system, str) and bool(system) and not links
    if isinstance(system, str) and system:
        links.append(message_text({"role": "system", "content": system}))
    links.append(message_text({"role": "user", "content": payload.get("prompt"), "images": payload.get("images")}))
    return RequestShape(
        chain=hash_chain(salt, links),
        system_messages=1 if leading_system else 0,
        system_share=len(links[0]) / sum(len(link) for link in links) if leading_system else 0.0,
        system_text=str(system) if leading_system else None,
    )


def _context_link(context: list[Any]) -> str:
    """The link of Ollama's `context`: the same whether it was returned or is sent back as the next turn's."""
    return f"context\x1f{json.dumps(context)}"


def _int(value: object, fallback: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else fallback


def complete_lines(buffer: bytearray) -> list[bytes]:
    """Takes the complete NDJSON lines out of `buffer`, leaving the incomplete rest in it."""
    cut = buffer.rfind(b"\n")
    if cut < 0:
        return []
    lines = bytes(buffer[:cut]).splitlines()
    del buffer[: cut + 1]
    return lines


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank-line terminator) and the incomplete rest."""
    events: list[bytes] = []
    while True:
        cut = min((i for i in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if i >= 0), default=-1)
        if cut < 0:
            return events, buffer
        end = cut + (4 if buffer[cut : cut + 4] == b"\r\n\r\n" else 2)
        events.append(buffer[:end])
        buffer = buffer[end:]
