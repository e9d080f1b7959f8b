"""`Recorder`: the proxy of `tuner record` (the package's docstring says what it keeps): an h11 server in
front of an httpx client, passing every response on as it arrives, and the trace of what it learnt
(`exchange.py`) rewritten atomically every few seconds and at the end."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import h11
import httpx

from tuner.errors import ConfigError, OutputError
from tuner.files import check_writable, write_atomic
from tuner.record.exchange import (
    Exchange,
    complete_lines,
    read_body,
    read_event,
    read_ollama_line,
    split_events,
    start_exchange,
)
from tuner.workloads import LoraUse, dump_trace
from tuner.workloads.observed import ObservedRequest, build_trace, hash_chain

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


class Recorder:
    def __init__(
        self,
        options: RecorderOptions,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        checkpoint_due: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """`checkpoint_due` returns when the next checkpoint is due (by default `options.checkpoint_s`
        later): a test decides when one happens instead of racing a timer."""
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
        self._checkpoint_due = checkpoint_due or (lambda: asyncio.sleep(options.checkpoint_s))

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
            await self._checkpoint_due()
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
        exchange, body, hide_usage = start_exchange(
            path.split("?")[0],
            headers,
            body,
            arrival,
            salt=self._salt,
            tag_header=self.options.tag_header,
            keep_content=self.options.keep_content,
        )
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
                        for line in complete_lines(whole):
                            read_ollama_line(exchange, line, salt=self._salt)
                    continue
                if not streaming or exchange is None:
                    if exchange is not None:
                        whole += chunk
                    await _send(writer, connection, h11.Data(data=chunk))
                    continue
                pending += chunk
                events, pending = split_events(pending)
                passed = b"".join(event for event in events if not read_event(exchange, event, hide_usage))
                if passed:
                    await _send(writer, connection, h11.Data(data=passed))
            if pending:
                await _send(writer, connection, h11.Data(data=pending))
            await _send(writer, connection, h11.EndOfMessage())
            if exchange is not None and response.status_code == 200:
                if exchange.api != "openai":
                    read_ollama_line(exchange, bytes(whole), salt=self._salt)  # a body without a final newline
                elif not streaming:
                    read_body(exchange, bytes(whole))
                if exchange.answered:
                    await self._finish_exchange(exchange, time.time())
        finally:
            await response.aclose()

    async def _finish_exchange(self, exchange: Exchange, end: float) -> None:
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

    async def _count_system_tokens(self, exchange: Exchange) -> int | None:
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
