"""Closed-loop users against a server: each sends its next request as soon as its previous answer is in.

Seed 004's method: the load runs until every user has its first answer and `warm_up_s` has passed since the
level began; the requests sent in the next `window_s` are the level's; the load goes on until each request
sent before the window's end has ended (the last ones served beside as many users as the first, every token
that arrived inside the window counted); then the users stop and what they have in flight is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.engines.base import Engine
from tuner.loadgen import replay_client, send_request
from tuner.models import ReplayRequest, RequestRecord

__all__ = ["LevelRun", "run_closed_loop"]

# How often the window's end checks whether its requests have all ended: a few ms late costs nothing,
# the users keep the load on meanwhile.
_DRAIN_POLL_S = 0.05
# After a failed request a user waits this long before its next: a server that refuses at once would
# otherwise be asked thousands of times a second.
_AFTER_FAILURE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class LevelRun:
    records: list[RequestRecord]  # every request that ended, warm-up and drain included, by send time
    window: tuple[float, float]  # the measured window on the records' clock
    elapsed_s: float  # the level's length: warm-up, window and drain


async def run_closed_loop(
    users: int,
    next_request: Callable[[int], ReplayRequest],
    *,
    engine: Engine,
    base_url: str,
    warm_up_s: float,
    window_s: float,
    request_timeout_s: float,
) -> LevelRun:
    """`users` closed-loop users, user u sending `next_request(u)` in turn, through warm-up, window and drain."""
    records: list[RequestRecord] = []
    in_flight: dict[int, float] = {}  # user -> when its request was sent
    first_answers = 0
    all_answered = asyncio.Event()
    failures: list[BaseException] = []
    async with replay_client(engine, base_url, request_timeout_s) as client:
        started = time.perf_counter()

        async def user(index: int) -> None:
            nonlocal first_answers
            answered = False
            try:
                while True:
                    request = next_request(index)
                    send_s = time.perf_counter() - started
                    in_flight[index] = send_s
                    record, _ = await send_request(client, engine, request, started, request_timeout_s, due_s=send_s)
                    del in_flight[index]
                    records.append(record)
                    if not answered:  # a failed request is an answer too: a failing server must not hang the level
                        answered = True
                        first_answers += 1
                        if first_answers == users:
                            all_answered.set()
                    if not record.ok:
                        await asyncio.sleep(_AFTER_FAILURE_S)
            except Exception as exc:  # a bug of ours: the level stops with it instead of waiting forever
                failures.append(exc)
                all_answered.set()
                raise

        tasks = [asyncio.create_task(user(u)) for u in range(users)]
        try:
            await all_answered.wait()
            if failures:
                raise failures[0]
            await asyncio.sleep(max(0.0, warm_up_s - (time.perf_counter() - started)))
            window_start = time.perf_counter() - started
            await asyncio.sleep(window_s)
            window_end = time.perf_counter() - started
            # Every request sent before the window's end, its warm-up ones too: their tokens inside it count.
            while any(sent < window_end for sent in in_flight.values()) and not failures:
                await asyncio.sleep(_DRAIN_POLL_S)
            if failures:
                raise failures[0]
            elapsed_s = time.perf_counter() - started
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    return LevelRun(
        records=sorted(records, key=lambda r: r.send_s), window=(window_start, window_end), elapsed_s=elapsed_s
    )
