"""The async replayer: sends a workload's requests on schedule and timestamps every streamed token.

Open loop with sessions: a request is sent at its arrival offset, but never before its session's
previous turn has ended plus the recorded think time. A turn's history carries the token ids the server
generated for the session's earlier answers, so its prompt cache is hit as in production. Every request
has its own deadline, because a server can keep answering its health check while requests hang.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import gc
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence

import httpx

from tuner.engines.base import Engine, parse_prometheus_text
from tuner.faults import crash_point
from tuner.http import tls_context
from tuner.models import ReplayRequest, RequestRecord, RequestStatus, ServerTimings
from tuner.redact import redact
from tuner.streaming_http import StreamError, StreamingClient, StreamingResponse

__all__ = [
    "replay",
    "replay_client",
    "replay_sessions",
    "scrape_prometheus",
    "send_request",
    "sessions_in_order",
    "with_answers",
]

_START_LEAD_S = 0.05
_DRAIN_S = 1.0
_WAKE_EARLY_S = 0.0015
_START_LEAD_PER_SESSION_S = 20e-6  # creating a session's task takes a few microseconds
# A session's task is made this long before its first request is due (its prompts, where they are made
# as they are read, with it): long enough for any session's synthesis, short enough to hold few at once.
_SESSION_LEAD_S = 0.5


async def replay(
    requests: Sequence[ReplayRequest],
    *,
    engine: Engine,
    base_url: str,
    request_timeout_s: float,
) -> list[RequestRecord]:
    """Replays `requests` against `base_url`; returns one record per request, in arrival order."""
    return await replay_sessions(
        sessions_in_order(requests), engine=engine, base_url=base_url, request_timeout_s=request_timeout_s
    )


def sessions_in_order(requests: Iterable[ReplayRequest]) -> list[list[ReplayRequest]]:
    """The requests grouped by session, each session's turns in order, sessions by their first arrival."""
    sessions: dict[str, list[ReplayRequest]] = defaultdict(list)
    for request in requests:
        sessions[request.session].append(request)
    ordered = [sorted(turns, key=lambda r: (r.turn, r.offset_s)) for turns in sessions.values()]
    return sorted(ordered, key=lambda turns: turns[0].offset_s)


async def replay_sessions(
    sessions: Iterable[Sequence[ReplayRequest]],
    *,
    engine: Engine,
    base_url: str,
    request_timeout_s: float,
) -> list[RequestRecord]:
    """Replays sessions (each in turn order, sessions by their first arrival) against `base_url`; returns
    one record per request, in the order they were sent. `sessions` may be made as it is read (a round's
    prompts synthesized a session at a time): a session is taken `_SESSION_LEAD_S` before its first
    request is due, so a long round holds only the sessions under way, never all its prompts at once."""
    records: list[RequestRecord] = []
    async with replay_client(engine, base_url, request_timeout_s) as client:
        # A collector pass over everything the process holds takes tens of milliseconds: the schedule would
        # slip by that much. The replay's own garbage is freed as it goes (reference counts), so it waits.
        gc.collect()
        gc.freeze()
        gc.disable()
        # Sessions given all at once are made already: the clock leaves time to start those due at once.
        at_once = (
            sum(1 for t in sessions if t and t[0].offset_s < _SESSION_LEAD_S) if isinstance(sessions, Sequence) else 0
        )
        started = time.perf_counter() + _START_LEAD_S + at_once * _START_LEAD_PER_SESSION_S

        async def run_session(turns: Sequence[ReplayRequest]) -> None:
            previous_end: float | None = None
            answers: dict[str, list[int]] = {}
            for request in turns:
                due = request.offset_s
                if previous_end is not None:
                    due = max(due, previous_end + request.think_s)
                delay = due - (time.perf_counter() - started)
                if delay > _WAKE_EARLY_S:
                    await asyncio.sleep(delay - _WAKE_EARLY_S)
                # The loop's timers wake up to a millisecond late (epoll waits in whole milliseconds): the
                # last stretch is waited for by yielding, so a send leaves on time, not up to 1 ms after.
                # It costs CPU: about the rate times 1.5 ms a second (a quarter of a core at 300 requests/s,
                # nothing to speak of at a few), spent running whatever else is ready meanwhile.
                while time.perf_counter() - started < due:
                    await asyncio.sleep(0)
                record, answers[request.request_id] = await send_request(
                    client, engine, with_answers(request, answers), started, request_timeout_s, due_s=due
                )
                records.append(record)
                crash_point("mid-replay")
                previous_end = record.end_s

        try:
            async with asyncio.TaskGroup() as group:
                for turns in sessions:  # a lazily made session is synthesized here, ahead of its time
                    if not turns:
                        continue
                    delay = turns[0].offset_s - _SESSION_LEAD_S - (time.perf_counter() - started)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    group.create_task(run_session(turns))
                    if time.perf_counter() >= started:
                        # Sends that fell due while this session was made go first, before the next is made.
                        await asyncio.sleep(0)
        finally:
            gc.enable()
            gc.unfreeze()
    return sorted(records, key=lambda r: r.send_s)


def replay_client(engine: Engine, base_url: str, request_timeout_s: float) -> StreamingClient:
    """The client a replay sends its requests on. No pool limit: a request waiting for a free connection
    would be sent late, by the pool, unseen."""
    return StreamingClient(
        base_url,
        headers=engine.request_headers(),
        connect_timeout_s=min(10.0, request_timeout_s),
        tls=tls_context() if base_url.startswith("https:") else None,
    )


def with_answers(request: ReplayRequest, answers: Mapping[str, Sequence[int]]) -> ReplayRequest:
    """The request with its history's answer placeholders replaced by what the server generated.

    Only as many ids as the placeholder holds are used, and placeholders stay where an answer was
    shorter (the server withholds ids of incomplete UTF-8 characters), so the prompt length is exact.
    """
    if not request.answer_spans:
        return request
    tokens = list(request.prompt_token_ids)
    for span in request.answer_spans:
        generated = answers.get(span.request_id, ())[: span.length]
        tokens[span.start : span.start + len(generated)] = generated
    return request.model_copy(update={"prompt_token_ids": tuple(tokens)})


# One request sent on `client` and its stream read: its record (times on the clock that began at `started`)
# and the token ids the server generated. Never raises for what the server does.
async def send_request(
    client: StreamingClient,
    engine: Engine,
    request: ReplayRequest,
    started: float,
    request_timeout_s: float,
    *,
    due_s: float,
) -> tuple[RequestRecord, list[int]]:
    call = engine.build_request(request)
    send_s = time.perf_counter() - started
    token_s: list[float] = []
    generated: list[int] = []
    timings: ServerTimings | None = None
    status = RequestStatus.OK
    http_status: int | None = None
    error: str | None = None
    ended_s: float | None = None
    try:
        async with asyncio.timeout(request_timeout_s):
            async with client.stream(call.method, call.path, json_body=call.json) as response:
                http_status = response.status_code
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    status = RequestStatus.REJECTED if response.status_code == 503 else RequestStatus.HTTP_ERROR
                    error = f"HTTP {response.status_code}: {body.strip()}"
                else:
                    async with contextlib.aclosing(_line_batches(response)) as batches:
                        async for lines in batches:
                            now = time.perf_counter() - started
                            for line in lines:
                                event = engine.parse_stream_line(line)
                                if event is None:
                                    continue
                                so_far = event.tokens_so_far
                                arrived = event.tokens if so_far is None else so_far - len(token_s)
                                if arrived > 0:
                                    token_s.extend([now] * arrived)
                                if event.token_ids:
                                    generated.extend(event.token_ids)
                                if event.error is not None:
                                    status, error = RequestStatus.HTTP_ERROR, event.error
                                if event.timings is not None:
                                    timings = event.timings
                                if event.done:
                                    break
                            else:
                                continue
                            break
                        ended_s = time.perf_counter() - started
                        await _drain(batches)
    except TimeoutError:
        if ended_s is None:  # past the answer's last event, the deadline only cut the stream's end
            status, error = RequestStatus.TIMEOUT, f"no complete answer within {request_timeout_s:g} s"
    except StreamError as exc:
        status, error = RequestStatus.CONNECTION_ERROR, str(exc)[:300]
    if status is RequestStatus.OK and not token_s:
        status, error = RequestStatus.NO_OUTPUT, "the answer had no tokens"
    if error is not None:
        # The server's own words (an error body, a stream's error) may quote the key it refused; scrubbed
        # before the cut, so a key straddling it cannot leave its first half behind.
        error = redact(error)[:300]
    record = RequestRecord(
        request_id=request.request_id,
        session=request.session,
        tag=request.tag,
        prompt_tokens=request.prompt_tokens,
        output_tokens_requested=request.output_tokens,
        lora=tuple(sorted(request.lora or ())),
        send_s=send_s,
        due_s=due_s,
        token_s=tuple(token_s),
        end_s=ended_s if ended_s is not None else time.perf_counter() - started,
        status=status,
        http_status=http_status,
        error=error,
        timings=timings,
    )
    return record, generated


async def _drain(batches: AsyncGenerator[list[str]]) -> None:
    """Reads what follows an answer's last event (the stream's end), so that its connection can carry the
    next request; a server slow to end it only loses the connection, never the answer."""
    with contextlib.suppress(TimeoutError, StreamError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in batches:
                pass


async def _line_batches(response: StreamingResponse) -> AsyncGenerator[list[str]]:
    """The stream's non-empty lines, a network read at a time: one timestamp serves a whole read, and
    splitting text ourselves costs a fraction of a line iterator's per-line overhead."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    pending = ""
    async for data in response.aiter_bytes():
        pending += decode(data)
        *lines, pending = pending.split("\n")
        yield [line for line in lines if line and line != "\r"]
    pending += decode(b"", final=True)
    if pending.strip():
        yield [pending]


async def scrape_prometheus(engine: Engine, base_url: str) -> dict[str, float]:
    """The server's Prometheus series now; empty if it has no endpoint or it does not answer."""
    if engine.metrics_path is None:
        return {}
    try:
        async with httpx.AsyncClient(
            base_url=base_url, timeout=10.0, headers=engine.request_headers(), verify=tls_context()
        ) as client:
            response = await client.get(engine.metrics_path)
    except httpx.HTTPError:
        return {}
    return parse_prometheus_text(response.text) if response.status_code == 200 else {}
