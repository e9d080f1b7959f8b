"""The replay's own HTTP/1.1 client (`tuner/streaming_http.py`) against stand-in servers that check what
they receive: each body framing a server may use, connections kept and reused, and every way a
connection can fail named, never hung on or read into the next request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from tuner.loadgen import _line_batches
from tuner.streaming_http import StreamError, StreamingClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    request_line, *lines = head.split("\r\n")
    fields = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines if line)}
    body = await reader.readexactly(int(fields["content-length"]))
    return request_line, fields, body


def run(handler: Handler, scenario: Callable[[StreamingClient], Awaitable[object]]) -> object:
    async def main() -> object:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with (
            server,
            StreamingClient(
                f"http://127.0.0.1:{port}/base", headers={"Authorization": "Bearer k"}, connect_timeout_s=5
            ) as client,
        ):
            return await scenario(client)

    return asyncio.run(main())


def test_a_request_is_sent_as_http_1_1_with_its_headers_and_json_body() -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> bytes:
        async with client.stream("POST", "/completion", json_body={"prompt": [1, 2], "stream": True}) as response:
            assert response.status_code == 200
            return await response.aread()

    assert run(handler, scenario) == b"ok"
    ((request_line, fields, body),) = seen
    assert request_line == "POST /base/completion HTTP/1.1"
    assert fields["host"].startswith("127.0.0.1:") and fields["authorization"] == "Bearer k"
    assert fields["content-type"] == "application/json"
    assert body == b'{"prompt":[1,2],"stream":true}'


def test_chunked_answers_are_read_chunk_by_chunk_and_the_connection_is_reused() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for _ in range(3):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in (b"data: 1\n\n", b"data: 2\xc3", b"\xa9\n\n"):  # a character split across two chunks
                writer.write(b"%x;ext=1\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\nTrailer: x\r\n\r\n")
            await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> list[str]:
        texts = []
        for _ in range(3):
            async with client.stream("POST", "/completion", json_body={}) as response:
                # as the replay reads it: lines decoded across chunk boundaries
                async for lines in _line_batches(response):
                    texts.extend(lines)
        return texts

    assert run(handler, scenario) == ["data: 1", "data: 2\u00e9"] * 3
    assert len(connections) == 1


def test_an_answer_read_to_the_close_ends_there_and_its_connection_is_not_reused() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\ndata: b\n\n")
        await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> list[bytes]:
        bodies = []
        for _ in range(2):
            async with client.stream("POST", "/x", json_body={}) as response:
                bodies.append(await response.aread())
        return bodies

    assert run(handler, scenario) == [b"data: a\n\ndata: b\n\n"] * 2
    assert len(connections) == 2


def test_a_kept_connection_the_server_closed_meanwhile_is_replaced_and_the_request_sent_once() -> None:
    requests: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line, _, _ = await read_request(reader)
        requests.append(request_line)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1")
        await writer.drain()
        writer.close()  # keeps no connection alive, though HTTP/1.1 lets the client think so

    async def scenario(client: StreamingClient) -> list[bytes]:
        bodies = []
        for path in ("/a", "/b"):
            async with client.stream("POST", path, json_body={}) as response:
                bodies.append(await response.aread())
        return bodies

    assert run(handler, scenario) == [b"1", b"1"]
    assert requests == ["POST /base/a HTTP/1.1", "POST /base/b HTTP/1.1"]


def test_an_answer_cut_mid_way_is_a_named_error_and_its_connection_is_dropped() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await read_request(reader)
        if len(connections) == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nda")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> tuple[str, bytes]:
        with pytest.raises(StreamError) as cut:
            async with client.stream("POST", "/x", json_body={}) as response:
                await response.aread()
        async with client.stream("POST", "/x", json_body={}) as response:
            return str(cut.value), await response.aread()

    outcome = run(handler, scenario)
    assert isinstance(outcome, tuple)
    message, second = outcome
    assert "closed the connection mid-answer" in message
    assert second == b"ok" and len(connections) == 2


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "Content-Length 'many'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "a malformed chunk"),
        (b"", "closed the connection before answering"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "Content-Length '-5'"),
        # A chunk of a terabyte is read in pieces as it comes, never buffered whole.
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\ne8d4a51000\r\nabc", "closed the connection mid-answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", "a malformed chunk"),
    ],
)
def test_what_is_not_an_http_answer_is_named(answer: bytes, named: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> str:
        with pytest.raises(StreamError) as failed:
            async with client.stream("POST", "/x", json_body={}) as response:
                await response.aread()
        return str(failed.value)

    assert named in str(run(handler, scenario))


def test_a_server_that_is_not_there_is_a_connect_error() -> None:
    async def scenario() -> str:
        async with StreamingClient("http://127.0.0.1:9", headers={}, connect_timeout_s=5) as client:
            with pytest.raises(StreamError) as refused:
                async with client.stream("POST", "/x", json_body={}):
                    pass
            return str(refused.value)

    assert asyncio.run(scenario()).startswith("ConnectError")


def test_only_http_and_https_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="not an http or https URL"):
        StreamingClient("unix:///run/llama.sock", headers={}, connect_timeout_s=1)


def test_an_answer_left_unread_closes_its_connection_so_the_next_request_reads_only_its_own() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            for number in range(2):
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(b"7\r\nfirst-%d\r\n7\r\nlater-%d\r\n0\r\n\r\n" % (number, number))
                await writer.drain()
        writer.close()

    async def scenario(client: StreamingClient) -> list[bytes]:
        firsts = []
        for _ in range(2):
            async with client.stream("POST", "/x", json_body={}) as response:
                async for data in response.aiter_bytes():
                    firsts.append(data)
                    break  # the rest of this answer stays unread
        return firsts

    assert run(handler, scenario) == [b"first-0", b"first-0"]
    assert len(connections) == 2


def test_an_answer_without_a_body_ends_at_its_head_though_the_connection_stays_open() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        await reader.read()  # keeps the connection open until the client is gone
        writer.close()

    async def scenario(client: StreamingClient) -> bytes:
        async with client.stream("POST", "/x", json_body={}) as response:
            return await response.aread()

    assert run(handler, scenario) == b""


def test_a_body_read_in_two_goes_is_read_on_from_where_the_first_stopped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        writer.write(b"5\r\nworld\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()
        writer.close()

    async def scenario(client: StreamingClient) -> tuple[bytes, bytes, bytes, bool]:
        async with client.stream("POST", "/x", json_body={}) as response:
            first = b""
            async for data in response.aiter_bytes():
                first = data
                break
            rest = await response.aread()
            again = await response.aread()
            return first, rest, again, response.complete

    assert run(handler, scenario) == (b"hello", b"world", b"", True)
