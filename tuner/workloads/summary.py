"""What a trace will replay, in numbers: counts, arrival rate, in-flight concurrency over time, length
distributions, prefix and history reuse, LoRA mix.

A trace stores when requests arrive, not how long the server took (that is what a trial measures), so
concurrency uses the recorded durations when every request has one, and otherwise estimates each
request's time as if it were served alone at the given prefill and decode speeds, sessions kept in
order. The estimate is the concurrency the traffic offers, before any server slows it down.

Reuse counts only tokens an earlier request computed: a shared-prefix block the first time it is named
is prefilled like any other token, and so is a session's history that no earlier turn in the trace
produced (a session recorded mid-way). "Earlier" is by the time a request is sent (as for concurrency),
and the count assumes a cache that keeps everything it ever computed; a real server's cache is bounded
(slots, `cache_ram`), so what it reuses can be less, never more.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tuner.workloads.trace import Trace, TraceRequest

__all__ = ["Concurrency", "Distribution", "TraceSummary", "concurrency_profile", "summarize_trace"]


@dataclass(frozen=True, kw_only=True)
class Distribution:
    mean: float
    p50: float
    p95: float
    max: float
    total: int


@dataclass(frozen=True, kw_only=True)
class Concurrency:
    basis: str  # how request durations were obtained
    bucket_s: float
    in_flight_peak: list[int]  # most requests in flight during each bucket
    arrivals: list[int]  # requests arriving in each bucket
    peak: int
    mean: float  # time-weighted over the span
    intervals: list[tuple[float, float]]  # each request's [start, end), for plots


@dataclass(frozen=True, kw_only=True)
class TraceSummary:
    name: str
    description: str
    requests: int
    sessions: int
    span_s: float
    arrivals_per_min: float | None
    prompt_tokens: Distribution
    new_tokens: Distribution
    output_tokens: Distribution
    prefix_reuse: float  # shared-prefix tokens an earlier request computed / all prompt tokens
    history_reuse: float  # history tokens an earlier turn of the session computed / all prompt tokens
    long_prompts: int
    tags: dict[str, int]
    lora: dict[str, int]  # adapter set ("none" for none) -> requests
    concurrency: Concurrency


def _distribution(values: list[int]) -> Distribution:
    data = np.asarray(values, dtype=float)
    return Distribution(
        mean=float(data.mean()),
        p50=float(np.percentile(data, 50)),
        p95=float(np.percentile(data, 95)),
        max=float(data.max()),
        total=int(data.sum()),
    )


def _send_intervals(
    trace: Trace, *, prefill_tok_s: float, decode_tok_s: float
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
    trace: Trace, *, prefill_tok_s: float = 1000.0, decode_tok_s: float = 30.0, buckets: int = 60
) -> Concurrency:
    timed, basis = _send_intervals(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
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
    return Concurrency(
        basis=basis,
        bucket_s=bucket_s,
        in_flight_peak=peaks,
        arrivals=arrivals,
        peak=max(peaks),
        mean=area / span,
        intervals=intervals,
    )


def summarize_trace(
    trace: Trace, *, long_prompt_tokens: int = 1000, prefill_tok_s: float = 1000.0, decode_tok_s: float = 30.0
) -> TraceSummary:
    requests = trace.requests
    concurrency = concurrency_profile(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    # A session's turn is sent after the previous one ended plus think time, which can be long after its
    # offset: the span and rate count the times requests are actually sent.
    starts = [start for start, _ in concurrency.intervals]
    span = max(starts) - min(starts)
    prompt = _distribution([r.prompt.total_tokens for r in requests])
    timed, _ = _send_intervals(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    prefix_reused, history_reused = _reused_tokens(timed)
    return TraceSummary(
        name=trace.header.name,
        description=trace.header.description,
        requests=len(requests),
        sessions=len({r.session for r in requests}),
        span_s=span,
        arrivals_per_min=(len(requests) - 1) / span * 60 if span > 0 else None,
        prompt_tokens=prompt,
        new_tokens=_distribution([r.prompt.new_tokens for r in requests]),
        output_tokens=_distribution([r.output_tokens for r in requests]),
        prefix_reuse=prefix_reused / prompt.total,
        history_reuse=history_reused / prompt.total,
        long_prompts=sum(1 for r in requests if r.prompt.new_tokens >= long_prompt_tokens),
        tags=dict(Counter(r.tag for r in requests).most_common()),
        lora=dict(Counter(_lora_label(r) for r in requests).most_common()),
        concurrency=concurrency,
    )


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


def _lora_label(request: TraceRequest) -> str:
    if not request.lora:
        return "none"
    return "+".join(f"{use.adapter}" + (f"@{use.scale:g}" if use.scale != 1.0 else "") for use in request.lora)
