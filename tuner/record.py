"""`tuner record`: a transparent proxy that writes the traffic's shape as a trace.

It sits between an application and its server and passes every byte of a response on as soon as it
arrives, streaming included. Of each completion request (the OpenAI routes, llama-server's `/completion`
and Ollama's native `/api/chat` and `/api/generate`) it keeps only shape: arrival and end times, token
counts from the server's answer, a salted hash chain of the messages (from which sessions, history and
shared system prompts are rebuilt), LoRA use and a tag from a request header. Message text, headers and
API keys are never stored. The trace is rewritten atomically every few seconds and at the end, so an
interrupted recording leaves the last complete trace, never a torn file.

When a streaming chat client did not ask for usage, the proxy asks the server for it and removes that
extra chunk from what the client receives, so the client sees the stream it would have seen directly.
Ollama's native answers carry their counts in their final object, so they pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import h11
import httpx

from tuner.errors import ConfigError, OutputError
from tuner.files import check_writable, write_atomic
from tuner.workloads import LoraUse, dump_trace
from tuner.workloads.observed import (
    ObservedRequest,
    RequestShape,
    build_trace,
    hash_chain,
    message_text,
    request_shape,
)

__all__ = ["Recorder", "RecorderOptions"]

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "content-encoding",
}
# Which API a recorded request speaks: the OpenAI routes (and llama-server's /completion), or Ollama's own.
_Api = Literal["openai", "ollama-chat", "ollama-generate"]
_CHAT_PATHS = {"/v1/chat/completions", "/chat/completions"}
_COMPLETION_PATHS = {"/v1/completions", "/completions", "/completion"}
_OLLAMA_PATHS: dict[str, _Api] = {"/api/chat": "ollama-chat", "/api/generate": "ollama-generate"}
_MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class RecorderOptions:
    upstream: str
    out: Path
    name: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    tag_header: str = "x-tuner-tag"
    checkpoint_s: float = 5.0
    max_requests: int | None = None
    keep_content: bool = False  # also write each request's messages or prompt (off: shape only)


@dataclass(kw_only=True)
class _Exchange:
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


class Recorder:
    def __init__(self, options: RecorderOptions, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not options.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream {options.upstream!r} is not a URL; pass e.g. http://127.0.0.1:8080")
        self.options = options
        self._salt = secrets.token_hex(16)
        self._client = httpx.AsyncClient(
            base_url=options.upstream.rstrip("/"), timeout=httpx.Timeout(None, connect=10.0), transport=transport
        )
        self._observed: list[ObservedRequest] = []
        self._written = 0
        self._system_tokens: dict[str, int | None] = {}
        self._tokenize_works = True
        self._lora_names: dict[int, str] | None = None
        self._done = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._write_failure: OutputError | None = None
        self.on_request: Callable[[ObservedRequest, int], None] | None = None

    @property
    def recorded(self) -> int:
        return len(self._observed)

    async def run(self, *, ready: Callable[[int], None] | None = None, duration_s: float | None = None) -> int:
        """Serves until cancelled, `duration_s` has passed or `max_requests` were recorded; writes the
        trace and returns how many requests it holds. `--out` is checked before anything listens: a
        recording that cannot be saved is refused before the application is pointed at the proxy."""
        self._check_out()
        try:
            server = await asyncio.start_server(
                self._serve_connection, self.options.listen_host, self.options.listen_port
            )
        except (OSError, OverflowError) as exc:
            where = f"{self.options.listen_host}:{self.options.listen_port}"
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"cannot listen on {where}: {reason}; pick another --listen") from None
        port = int(server.sockets[0].getsockname()[1])
        checkpoints = asyncio.create_task(self._checkpoint_loop())
        try:
            if ready is not None:
                ready(port)
            async with server:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), duration_s)
        finally:
            checkpoints.cancel()
            await asyncio.shield(self._finish())
        if self._write_failure is not None:
            raise self._write_failure
        return len(self._observed)

    def _check_out(self) -> None:
        out = self.options.out
        try:
            check_writable(out)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ConfigError(
                    f"--out {out}: no space left on its disk; free some space there or pass --out on another disk"
                ) from None
            raise ConfigError(
                f"--out {out} cannot be written: {exc.strerror or exc}; pass a path in a directory you can write"
            ) from None

    async def _finish(self) -> None:
        try:
            await self.write()
        finally:
            await self._client.aclose()

    async def write(self) -> None:
        """Writes the trace of everything recorded so far, atomically; nothing when nothing was recorded."""
        async with self._write_lock:
            if not self._observed or self._written == len(self._observed):
                return
            count = len(self._observed)
            trace = build_trace(self._observed, name=self.options.name, description="recorded by tuner record")
            text = dump_trace(trace).encode()
            try:
                # Message text is the users' own: a trace that keeps it is readable by its owner only.
                await asyncio.to_thread(write_atomic, self.options.out, text, private=self.options.keep_content)
            except OSError as exc:
                raise self._output_error(exc, count) from None
            self._written = count

    def _output_error(self, exc: OSError, count: int) -> OutputError:
        out = self.options.out
        kept = f"{out} holds the last checkpoint ({self._written} requests)" if self._written else "nothing was written"
        lost = f"; the {count - self._written} requests recorded since are lost"
        if exc.errno == errno.ENOSPC:
            return OutputError(
                f"no space left on the disk of {out}; {kept}{lost}: free some space or record to another disk"
            )
        return OutputError(f"cannot write {out}: {exc.strerror or exc}; {kept}{lost}")

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.checkpoint_s)
            try:
                await self.write()
            except OutputError as failure:
                # Stop rather than go on proxying traffic whose recording can no longer be saved.
                self._write_failure = failure
                self._done.set()
                return

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _next_event(connection, reader)
                if not isinstance(request, h11.Request):
                    break
                body = bytearray()
                while True:
                    event = await _next_event(connection, reader)
                    if isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > _MAX_BODY:
                            raise h11.RemoteProtocolError("request body too large")
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                await self._proxy(connection, writer, request, bytes(body))
                if connection.our_state is h11.MUST_CLOSE or connection.their_state is not h11.DONE:
                    break
                connection.start_next_cycle()
        except (h11.ProtocolError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _proxy(
        self, connection: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        arrival = time.time()
        path = request.target.decode("latin-1")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        exchange, body, hide_usage = self._start_exchange(path.split("?")[0], headers, body, arrival)
        upstream_headers = [(k, v) for k, v in headers.items() if k not in _HOP_BY_HOP and k != self.options.tag_header]
        upstream_headers.append(("accept-encoding", "identity"))
        try:
            upstream = self._client.build_request(request.method.decode(), path, headers=upstream_headers, content=body)
            response = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            await _send_error(writer, connection, f"upstream {self.options.upstream} unreachable: {type(exc).__name__}")
            return
        try:
            response_headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP]
            await _send(writer, connection, h11.Response(status_code=response.status_code, headers=response_headers))
            streaming = "text/event-stream" in response.headers.get("content-type", "")
            pending = b""
            whole = bytearray()
            async for chunk in response.aiter_raw():
                if exchange is not None and exchange.api != "openai":
                    # Ollama's answer (NDJSON when streamed, one JSON object when not) is passed on as it
                    # comes and read a line at a time behind it: nothing in it is changed or held back.
                    await _send(writer, connection, h11.Data(data=chunk))
                    whole += chunk
                    if b"\n" in chunk:
                        for line in _complete_lines(whole):
                            self._read_ollama_line(exchange, line)
                    continue
                if not streaming or exchange is None:
                    if exchange is not None:
                        whole += chunk
                    await _send(writer, connection, h11.Data(data=chunk))
                    continue
                pending += chunk
                events, pending = _split_events(pending)
                passed = b"".join(event for event in events if not self._read_event(exchange, event, hide_usage))
                if passed:
                    await _send(writer, connection, h11.Data(data=passed))
            if pending:
                await _send(writer, connection, h11.Data(data=pending))
            await _send(writer, connection, h11.EndOfMessage())
            if exchange is not None and response.status_code == 200:
                if exchange.api != "openai":
                    self._read_ollama_line(exchange, bytes(whole))  # a body without a final newline
                elif not streaming:
                    self._read_body(exchange, bytes(whole))
                if exchange.answered:
                    await self._finish_exchange(exchange, time.time())
        finally:
            await response.aclose()

    def _start_exchange(
        self, path: str, headers: Mapping[str, str], body: bytes, arrival: float
    ) -> tuple[_Exchange | None, bytes, bool]:
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
        if api == "ollama-generate":
            shape = _generate_shape(self._salt, payload)
        else:
            shape = request_shape(self._salt, payload, chat=chat)
        lora = payload.get("lora") if api == "openai" else None  # Ollama has no adapters per request
        lora_ids = tuple(
            (int(item["id"]), float(item.get("scale", 1.0)))
            for item in (lora if isinstance(lora, list) else [])
            if isinstance(item, dict) and isinstance(item.get("id"), int) and float(item.get("scale", 1.0)) != 0.0
        )
        default_tag = "chat" if chat else "completion"
        exchange = _Exchange(
            arrival_s=arrival,
            api=api,
            chain=shape.chain,
            system_messages=shape.system_messages,
            system_share=shape.system_share,
            system_text=shape.system_text,
            lora_ids=lora_ids,
            tag=headers.get(self.options.tag_header, default_tag)[:64] or default_tag,
            content=_content(payload, chat=chat) if self.options.keep_content else None,
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

    def _read_event(self, exchange: _Exchange, event: bytes, hide_usage: bool) -> bool:
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
        self._read_chunk(exchange, chunk)
        return hide_usage and chunk.get("choices") == [] and "usage" in chunk

    def _read_body(self, exchange: _Exchange, body: bytes) -> None:
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
            chunk = json.loads(body)
            if isinstance(chunk, dict):
                self._read_chunk(exchange, chunk)

    def _read_ollama_line(self, exchange: _Exchange, line: bytes) -> None:
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
            exchange.answer_chain = hash_chain(self._salt, [_context_link(context)])[0]

    @staticmethod
    def _read_chunk(exchange: _Exchange, chunk: Mapping[str, Any]) -> None:
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

    async def _finish_exchange(self, exchange: _Exchange, end: float) -> None:
        answer = "".join(exchange.answer)
        if exchange.api == "ollama-generate":
            answer_chain = exchange.answer_chain  # the next turn sends the returned `context`, not the answer
        else:
            start = exchange.chain[-1] if exchange.chain else self._salt
            answer_chain = hash_chain(start, [f"assistant\x1f{answer}"])[0]
        system_tokens = await self._count_system_tokens(exchange)
        lora = [LoraUse(adapter=await self._lora_name(index), scale=scale) for index, scale in exchange.lora_ids]
        observed = ObservedRequest(
            arrival_s=exchange.arrival_s,
            end_s=end,
            prompt_tokens=exchange.prompt_tokens or 0,
            output_tokens=exchange.output_tokens or exchange.chunks_with_output,
            chain=exchange.chain,
            answer_chain=answer_chain,
            system_messages=exchange.system_messages,
            system_tokens=system_tokens,
            system_share=exchange.system_share,
            lora=tuple(lora),
            tag=exchange.tag,
            content=exchange.content,
        )
        self._observed.append(observed)
        if self.on_request is not None:
            self.on_request(observed, len(self._observed))
        if self.options.max_requests is not None and len(self._observed) >= self.options.max_requests:
            self._done.set()

    async def _count_system_tokens(self, exchange: _Exchange) -> int | None:
        """Tokens of the system prompt, counted once per prompt by the server's /tokenize when it has one."""
        if exchange.system_text is None or not exchange.chain:
            return None
        key = exchange.chain[exchange.system_messages - 1]
        if key not in self._system_tokens:
            self._system_tokens[key] = None
            if self._tokenize_works:
                try:
                    answer = await self._client.post("/tokenize", json={"content": exchange.system_text}, timeout=10)
                    tokens = answer.json().get("tokens") if answer.status_code == 200 else None
                    if isinstance(tokens, list):
                        self._system_tokens[key] = len(tokens)
                    else:
                        self._tokenize_works = False
                except (httpx.HTTPError, ValueError):
                    self._tokenize_works = False
        return self._system_tokens[key]

    async def _lora_name(self, adapter_id: int) -> str:
        """The adapter's file name (as llama-server's /lora-adapters lists it), or adapter-<id>."""
        if self._lora_names is None:
            self._lora_names = {}
            with contextlib.suppress(httpx.HTTPError, ValueError, TypeError, KeyError):
                answer = await self._client.get("/lora-adapters", timeout=10)
                for item in answer.json() if answer.status_code == 200 else []:
                    stem = Path(str(item["path"])).name.removesuffix(".gguf")
                    self._lora_names[int(item["id"])] = stem or f"adapter-{item['id']}"
        return self._lora_names.get(adapter_id, f"adapter-{adapter_id}")


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


def _complete_lines(buffer: bytearray) -> list[bytes]:
    """Takes the complete NDJSON lines out of `buffer`, leaving the incomplete rest in it."""
    cut = buffer.rfind(b"\n")
    if cut < 0:
        return []
    lines = bytes(buffer[:cut]).splitlines()
    del buffer[: cut + 1]
    return lines


def _split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank-line terminator) and the incomplete rest."""
    events: list[bytes] = []
    while True:
        cut = min((i for i in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if i >= 0), default=-1)
        if cut < 0:
            return events, buffer
        end = cut + (4 if buffer[cut : cut + 4] == b"\r\n\r\n" else 2)
        events.append(buffer[:end])
        buffer = buffer[end:]


async def _send(writer: asyncio.StreamWriter, connection: h11.Connection, event: h11.Event) -> None:
    data = connection.send(event)
    if data:
        writer.write(data)
        await writer.drain()


async def _send_error(writer: asyncio.StreamWriter, connection: h11.Connection, message: str) -> None:
    """A 502 in the OpenAI error shape, so that the application sees why."""
    body = json.dumps({"error": {"message": message, "type": "bad_gateway", "code": 502}}).encode()
    await _send(writer, connection, h11.Response(status_code=502, headers=[("content-type", "application/json")]))
    await _send(writer, connection, h11.Data(data=body))
    await _send(writer, connection, h11.EndOfMessage())


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event | None:
    """The client's next HTTP event; None once it closed the connection."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(65536))
            continue
        if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Event)
        return event
