"""The trace summary as it was computed before it moved to columns (version 0.1.0 of serve-tuner), one
request object at a time: the reference the column code is checked against on traces with sessions,
shared prefixes and ties."""

from __future__ import annotations

import itertools
import math
from typing import Any

TraceRequest = Any


class _Trace:
    def __init__(self, requests: list[Any]) -> None:
        self.requests = requests


def _send_intervals(
    trace: _Trace, *, prefill_tok_s: float, decode_tok_s: float
) -> tuple[list[tuple[float, float, TraceRequest]], str]:
    """Each request's [start, end) as the replay would send it, and how the durations were obtained."""
    requests = trace.requests
    if all(r.duration_s is not None for r in requests):
        return [(r.offset_s, r.offset_s + (r.duration_s or 0.0), r) for r in requests], "recorded durations"
    timed: list[tuple[float, float, TraceRequest]] = []
    session_end: dict[str, float] = {}
    for request in sorted(requests, key=lambda r: (r.session, r.turn, r.offset_s)):
        start = request.offset_s
        if request.session in session_end:
            start = max(start, session_end[request.session] + request.think_s)
        took = request.prompt.new_tokens / prefill_tok_s + request.output_tokens / decode_tok_s
        timed.append((start, start + took, request))
        session_end[request.session] = start + took
    return timed, f"estimated: each request alone at {prefill_tok_s:g} prefill and {decode_tok_s:g} decode tok/s"


def concurrency_profile(
    trace: _Trace, *, prefill_tok_s: float = 1000.0, decode_tok_s: float = 30.0, buckets: int = 60
) -> dict[str, Any]:
    timed, _basis = _send_intervals(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    intervals = sorted((start, end) for start, end, _ in timed)
    first = intervals[0][0]
    span = max(max(e for _, e in intervals) - first, 1e-9)
    bucket_s = span / buckets
    # Ends sort before starts at the same instant: a turn that starts as another ends is not overlap.
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peaks, arrivals = [0] * buckets, [0] * buckets
    level, area, previous, next_event = 0, 0.0, first, 0

    def advance(until: float, *, inclusive: bool, index: int) -> int:
        """Applies the events up to `until`; returns the most requests in flight meanwhile."""
        nonlocal level, area, previous, next_event
        peak = level
        while next_event < len(events):
            at, step = events[next_event]
            if at > until or (at == until and not inclusive):
                break
            area += level * (at - previous)
            previous, level = at, level + step
            peak = max(peak, level)
            arrivals[index] += step > 0
            next_event += 1
        return peak

    for index in range(buckets):
        advance(first + index * bucket_s, inclusive=True, index=index)  # events right on the boundary
        last = index == buckets - 1
        peaks[index] = advance(math.inf if last else first + (index + 1) * bucket_s, inclusive=False, index=index)
    return {"in_flight_peak": peaks, "arrivals": arrivals, "mean": area / span, "intervals": intervals}


def _reused_tokens(timed: list[tuple[float, float, TraceRequest]]) -> tuple[int, int]:
    """Shared-prefix and history tokens that a request sent earlier computed, assuming nothing is ever
    evicted. A prefix block counts only behind blocks that count too (a cache matches a prompt from its
    start); history counts up to what the session's previous turn held: its history, its new tokens and
    its answer. Requests sent at the same instant compute a block side by side, neither reuses it."""
    computed_blocks: set[str] = set()
    previous_turn: dict[str, TraceRequest] = {}
    prefix_reused = history_reused = 0
    ordered = sorted(timed, key=lambda t: (t[0], t[2].session, t[2].turn))
    for _, group in itertools.groupby(ordered, key=lambda t: t[0]):  # sorted: one pass, not one a request
        same_instant = [t[2] for t in group]
        for request in same_instant:
            for block in request.prompt.shared_prefix:
                if block.block not in computed_blocks:
                    break
                prefix_reused += block.tokens
            earlier = previous_turn.get(request.session)
            if earlier is not None:
                held = earlier.prompt.history_tokens + earlier.prompt.new_tokens + earlier.output_tokens
                history_reused += min(request.prompt.history_tokens, held)
        for request in same_instant:
            computed_blocks.update(block.block for block in request.prompt.shared_prefix)
            previous_turn[request.session] = request
    return prefix_reused, history_reused


def reference_summary(requests: list[Any]) -> dict[str, Any]:
    trace = _Trace(requests)
    timed, _ = _send_intervals(trace, prefill_tok_s=1000.0, decode_tok_s=30.0)
    prefix, history = _reused_tokens(timed)
    return {"prefix": prefix, "history": history, **concurrency_profile(trace)}
