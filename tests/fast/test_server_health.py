"""`tuner run --check` asks the operator's running server for its health: a server still loading its model
(HTTP 503, as llama-server answers from binding its port until the model is in memory) is waited for, a
bounded time; any other answer is final at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.support import free_port
from tuner.deployers.base import health_answer


@asynccontextmanager
async def scripted_server(statuses: list[int]) -> AsyncIterator[tuple[str, list[str]]]:
    """A stand-in that answers each GET with the next status of `statuses` (the last one from then on)
    and records the request lines it received."""
    received: list[str] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        received.append(head.decode().splitlines()[0])
        status = statuses[min(len(received), len(statuses)) - 1]
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/health", received


async def _ask(statuses: list[int], *, loading_wait_s: float) -> tuple[str | None, float, list[str]]:
    async with scripted_server(statuses) as (url, received):
        # The bound fails a wait that never ends instead of hanging the suite (a bound, not a speed check).
        asked = health_answer(url, loading_wait_s=loading_wait_s, poll_s=0.01)
        problem, waited = await asyncio.wait_for(asked, timeout=loading_wait_s + 30)
    return problem, waited, received


def test_a_server_loading_its_model_is_waited_for_until_it_answers_200() -> None:
    problem, _, received = asyncio.run(_ask([503, 503, 200], loading_wait_s=30))
    assert problem is None
    assert received == ["GET /health HTTP/1.1"] * 3


def test_a_server_that_stays_at_503_is_not_ready_once_the_wait_is_over() -> None:
    # A wait many polls long: the first answer alone took 0.2 s on a 2-core machine under a busy loop per core.
    problem, waited, received = asyncio.run(_ask([503], loading_wait_s=2.0))
    assert problem == "HTTP 503"
    assert waited >= 2.0 and len(received) >= 2


def test_any_other_answer_is_final_at_once() -> None:
    problem, _, received = asyncio.run(_ask([404, 200], loading_wait_s=30))
    assert problem == "HTTP 404" and len(received) == 1


def test_nothing_listening_is_named_without_waiting() -> None:
    url = f"http://127.0.0.1:{free_port()}/health"
    problem, waited = asyncio.run(health_answer(url, loading_wait_s=30))
    assert problem == "ConnectError" and waited < 30
