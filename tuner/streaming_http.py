"""HTTP/1.1 for the replay's streamed answers, on asyncio's own streams.

A server streams an answer a token at a time, each token its own network write: at 300 requests/s of
64-token answers the replay reads about 20,000 of them a second on one core. Through httpx each read
passes its transport, connection-pool, h11 and anyio layers, about 50 microseconds; the replay then
fell seconds behind its schedule (bench/replay_rate.py). Here a read is a buffered `StreamReader`
call. Only what the replay needs: one request at a time per connection, kept alive and reused,
`Content-Length`, chunked and read-to-close bodies, TLS by the base URL's scheme. Everything else
(health checks, counter scrapes, the recorder) stays on httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["StreamError", "StreamingClient", "StreamingResponse"]

_HEAD_LIMIT = 64 * 1024  # a response head larger than this is not a server's answer
_READ = 64 * 1024


class StreamError(Exception):
    """The connection failed or the server's response was not HTTP/1.1 as sent; the message says which."""


class StreamingResponse:
    def __init__(self, status_code: int, headers: dict[str, str], reader: asyncio.StreamReader, framing: str) -> None:
        self.status_code = status_code
        self.headers = headers
        self._reader = reader
        self._framing = framing
        self._body: AsyncIterator[bytes] | None = None
        self.complete = False  # the whole body was read: the connection can carry the next request

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, one generator for the response: a second call goes on where the first
        stopped. No layer above it: at 20,000 streamed tokens a second, each layer of async iteration is a
        few percent of a core."""
        if self._body is None:
            if self._framing == "chunked":
                self._body = _chunked(self._reader, self)
            elif self._framing == "empty":
                self._body = _empty(self)
            elif self._framing.startswith("sized "):
                self._body = _sized(self._reader, int(self._framing.removeprefix("sized ")), self)
            else:
                self._body = _to_close(self._reader, self)
        return self._body

    async def aread(self) -> bytes:
        return b"".join([data async for data in self.aiter_bytes()])


class StreamingClient:
    """Connections to one server, reused one request at a time."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http or https URL: {base_url}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        host_header = self._host if parts.port is None else f"{self._host}:{self._port}"
        if ":" in self._host:  # an IPv6 literal
            host_header = f"[{self._host}]" if parts.port is None else f"[{self._host}]:{self._port}"
        fixed = {"Host": host_header, "User-Agent": "serve-tuner", "Accept": "*/*", **headers}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                return await asyncio.open_connection(self._host, self._port, ssl=self._tls, limit=_HEAD_LIMIT)
        except TimeoutError:
            raise StreamError(
                f"could not connect to {self._host}:{self._port} within {self._connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise StreamError(f"ConnectError: {exc.strerror or exc}") from None

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, json_body: Any) -> AsyncIterator[StreamingResponse]:
        """Sends the request and gives its response, whose body is read as it arrives. The connection goes
        back to the pool only if the body was read to its end; otherwise (an error, a timeout, a body left
        unread) it is closed, so no later request reads what is left of this one."""
        body = json.dumps(json_body, separators=(",", ":")).encode()
        request = (
            f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        reader, writer, response = await self._send(request)
        keep = False
        try:
            yield response
            keep = response.complete and response.headers.get("connection", "").lower() != "close"
        finally:
            if keep:
                self._idle.append((reader, writer))
            else:
                writer.close()

    async def _send(self, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, StreamingResponse]:
        # A kept-alive connection the server closed meanwhile fails before any byte of an answer: that
        # request is sent once more, on a new connection (nothing of it reached the server's handler).
        while True:
            reused = bool(self._idle)
            reader, writer = self._idle.pop() if reused else await self._connect()
            try:
                writer.write(request)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                writer.close()
                if reused and not exc.partial:
                    continue
                raise StreamError("RemoteProtocolError: the server closed the connection before answering") from None
            except asyncio.LimitOverrunError:
                writer.close()
                raise StreamError(f"RemoteProtocolError: a response head over {_HEAD_LIMIT} bytes") from None
            except (OSError, ConnectionError) as exc:
                writer.close()
                if reused:
                    continue
                raise StreamError(f"{type(exc).__name__}: {exc}") from None
            except BaseException:
                writer.close()
                raise
            return reader, writer, _response(head, reader, writer)


def _response(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> StreamingResponse:
    try:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, code, *_ = status_line.split(" ", 2)
        status = int(code)
    except ValueError:
        writer.close()
        raise StreamError(f"RemoteProtocolError: not an HTTP response: {head[:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    if status in (204, 304) or 100 <= status < 200:
        return StreamingResponse(status, headers, reader, "empty")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return StreamingResponse(status, headers, reader, "chunked")
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
            if length < 0:
                raise ValueError(length)
        except ValueError:
            writer.close()
            raise StreamError(f"RemoteProtocolError: Content-Length {headers['content-length']!r}") from None
        return StreamingResponse(status, headers, reader, f"sized {length}")
    headers["connection"] = "close"  # the body ends where the connection does
    return StreamingResponse(status, headers, reader, "to close")


async def _chunked(reader: asyncio.StreamReader, response: StreamingResponse) -> AsyncIterator[bytes]:
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
                    pass
                response.complete = True
                return
            # In pieces: a chunk's size is the server's word, and a huge one must not be buffered whole.
            left = size
            while left > 0:
                data = await reader.read(min(left, _READ))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data
            if await reader.readexactly(2) != b"\r\n":
                raise ValueError("a chunk not followed by CRLF")
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        raise StreamError("RemoteProtocolError: the server closed the connection mid-answer") from None
    except (ValueError, asyncio.LimitOverrunError):
        raise StreamError("RemoteProtocolError: a malformed chunk in the answer") from None


async def _empty(response: StreamingResponse) -> AsyncIterator[bytes]:
    response.complete = True
    return
    yield b""  # an async generator that yields nothing


async def _sized(reader: asyncio.StreamReader, length: int, response: StreamingResponse) -> AsyncIterator[bytes]:
    left = length
    try:
        while left > 0:
            data = await reader.read(min(left, _READ))
            if not data:
                raise StreamError(f"RemoteProtocolError: the answer ended {left} bytes short of its length")
            left -= len(data)
            yield data
        response.complete = True
    except (ConnectionError, OSError):
        raise StreamError("RemoteProtocolError: the server closed the connection mid-answer") from None


async def _to_close(reader: asyncio.StreamReader, response: StreamingResponse) -> AsyncIterator[bytes]:
    try:
        while data := await reader.read(_READ):
            yield data
        response.complete = True
    except (ConnectionError, OSError):
        raise StreamError("RemoteProtocolError: the server closed the connection mid-answer") from None
