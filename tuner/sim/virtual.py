"""A replay against the simulated server on the model's own clock: no sockets, no waiting.

It follows the load generator's rules (`tuner.loadgen`): a session's turn is sent at its arrival offset
but never before its previous turn ended plus the think time, and a turn's history carries the answers
the server gave. What comes out is what the load generator would have recorded, and the server's log
text, so the study's own metrics and log parser read it unchanged.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.engines.base import Engine
from tuner.loadgen import with_answers
from tuner.models import ReplayRequest, RequestRecord, RequestStatus, ServerTimings
from tuner.sim.model import SimTask, SimulatedLlamaServer, format_log_line

__all__ = ["VirtualRound", "format_log_line", "replay_virtual"]


@dataclass(frozen=True, kw_only=True)
class VirtualRound:
    records: list[RequestRecord]
    ended_s: float  # the server's clock when the last request ended


def _lora_ids(engine: Engine, request: ReplayRequest) -> list[tuple[int, float]] | None:
    body = engine.build_request(request).json or {}
    field = body.get("lora")
    if not isinstance(field, list):
        return None
    return [(int(item["id"]), float(item["scale"])) for item in field]


def replay_virtual(
    requests: Sequence[ReplayRequest],
    server: SimulatedLlamaServer,
    *,
    engine: Engine,
    start_s: float,
    request_timeout_s: float,
    next_turn: Callable[[str, float], ReplayRequest | None] | None = None,
) -> VirtualRound:
    """Replays `requests` from the server's time `start_s`; records are on the replay's clock (0 = start).
    `next_turn(session, ended_s)`, asked when a session's last turn so far has ended, gives its next turn (sent
    after its think time) or None: closed-loop users whose requests are made as they go."""
    sessions: dict[str, list[ReplayRequest]] = defaultdict(list)
    for request in requests:
        sessions[request.session].append(request)
    for turns in sessions.values():
        turns.sort(key=lambda r: (r.turn, r.offset_s))
    answers: dict[str, list[int]] = {}
    records: list[RequestRecord] = []
    order = itertools.count()
    due: list[tuple[float, int, str, int]] = []  # (time, tie-break, session, turn index)
    for name, turns in sessions.items():
        heapq.heappush(due, (start_s + turns[0].offset_s, next(order), name, 0))
    running: dict[int, tuple[SimTask, ReplayRequest, str, int, float]] = {}
    now = start_s
    while due or running:
        while due and due[0][0] <= now:
            at, _, name, index = heapq.heappop(due)
            request = with_answers(sessions[name][index], answers)
            task = server.submit(
                request.prompt_token_ids, request.output_tokens, now=at, lora=_lora_ids(engine, request)
            )
            running[task.id] = (task, request, name, index, at)
        for task_id in [t for t, (task, *_rest) in running.items() if task.done]:
            task, request, name, index, sent = running.pop(task_id)
            end = task.finished_s if task.finished_s is not None else now
            records.append(_record(task, request, sent=sent, end=end, start_s=start_s, server=server))
            answers[request.request_id] = list(task.generated)
            turns = sessions[name]
            if index + 1 == len(turns) and next_turn is not None:
                more = next_turn(name, end - start_s)
                if more is not None:
                    turns.append(more)
            if index + 1 < len(turns):
                following = turns[index + 1]
                heapq.heappush(
                    due, (max(start_s + following.offset_s, end + following.think_s), next(order), name, index + 1)
                )
        for task, *_rest, sent in list(running.values()):
            if not task.done and now - sent > request_timeout_s:
                server.cancel(task, now=now)
                task.error = f"no complete answer within {request_timeout_s:g} s"
        if not running and not due:
            break
        horizon = due[0][0] if due else None
        if server.busy:
            stepped = server.step(now, horizon_s=horizon if horizon is not None else float("inf"))
            now = stepped if stepped is not None and stepped > now else (horizon if horizon is not None else now)
        elif horizon is not None:
            now = max(now, horizon)
    records.sort(key=lambda r: r.send_s)
    return VirtualRound(records=records, ended_s=now)


def _record(
    task: SimTask, request: ReplayRequest, *, sent: float, end: float, start_s: float, server: SimulatedLlamaServer
) -> RequestRecord:
    status, http_status, error, timings = RequestStatus.OK, 200, None, None
    if task.error is not None and not task.generated:
        if "exceeds the available context size" in task.error:
            status, http_status = RequestStatus.HTTP_ERROR, 400
            body = {"error": {"code": 400, "message": task.error, "type": "exceed_context_size_error"}}
            error = f"HTTP 400: {json.dumps(body)}"[:300]
        else:
            status, error = RequestStatus.TIMEOUT, task.error
    elif task.error is not None:
        status, error = RequestStatus.TIMEOUT, task.error
    else:
        raw = server.timings(task)
        timings = ServerTimings(
            cache_n=int(raw["cache_n"]),
            prompt_n=int(raw["prompt_n"]),
            prompt_ms=float(raw["prompt_ms"]),
            predicted_n=int(raw["predicted_n"]),
            predicted_ms=float(raw["predicted_ms"]),
        )
    return RequestRecord(
        request_id=request.request_id,
        session=request.session,
        tag=request.tag,
        prompt_tokens=request.prompt_tokens,
        output_tokens_requested=request.output_tokens,
        lora=tuple(sorted(request.lora or ())),
        send_s=sent - start_s,
        token_s=tuple(t - start_s for t in task.token_s) if status is RequestStatus.OK else (),
        end_s=end - start_s,
        status=status,
        http_status=http_status,
        error=error,
        timings=timings,
    )
