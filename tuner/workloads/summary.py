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

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tuner.workloads.trace import Float64Array, Trace

__all__ = ["Concurrency", "Distribution", "TraceSummary", "concurrency_profile", "summarize_trace"]

_CHUNK = 65_536


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
    starts: Float64Array  # each request's [start, end), in the trace's order, for plots
    ends: Float64Array


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


def _distribution(values: npt.NDArray[Any]) -> Distribution:
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
) -> tuple[Float64Array, Float64Array, str]:
    """Each request's start and end as the replay would send it (columns, in the trace's order), and how
    the durations were obtained."""
    offsets, durations = trace.offset_s, trace.duration_s
    if not np.isnan(durations).any():
        return offsets.copy(), offsets + durations, "recorded durations"
    took = trace.new_tokens / prefill_tok_s + trace.output_tokens / decode_tok_s
    starts = offsets.copy()
    # A session's turns in order; a turn waits for the previous one's end plus its think time. Only
    # sessions of more than one request need it (an imported Azure or Mooncake request is a session of
    # its own), walked a chunk at a time as plain floats: numpy's per-element access is slow, and lists of
    # a million floats would take more memory than the trace.
    codes = trace.session_codes
    _, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
    rows = np.flatnonzero(counts[inverse] > 1)
    order = rows[np.lexsort((offsets[rows], trace.turn[rows], codes[rows]))]
    previous_session: int | None = None
    previous_end = 0.0
    for chunk in np.array_split(order, max(1, len(order) // _CHUNK)):
        sessions, offset_list = codes[chunk].tolist(), offsets[chunk].tolist()
        think, took_list = trace.think_s[chunk].tolist(), took[chunk].tolist()
        chunk_starts = []
        for session, offset, pause, duration in zip(sessions, offset_list, think, took_list, strict=True):
            start = max(offset, previous_end + pause) if session == previous_session else offset
            chunk_starts.append(start)
            previous_session, previous_end = session, start + duration
        starts[chunk] = chunk_starts
    basis = f"estimated: each request alone at {prefill_tok_s:g} prefill and {decode_tok_s:g} decode tok/s"
    return starts, starts + took, basis


def concurrency_profile(
    trace: Trace, *, prefill_tok_s: float = 1000.0, decode_tok_s: float = 30.0, buckets: int = 60
) -> Concurrency:
    starts, ends, basis = _send_intervals(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    return _profile(starts, ends, basis=basis, buckets=buckets)


def _profile(starts: Float64Array, ends: Float64Array, *, basis: str, buckets: int) -> Concurrency:
    first = float(starts.min())
    span = max(float(ends.max()) - first, 1e-9)
    bucket_s = span / buckets
    # Ends sort before starts at the same instant (a turn that starts as another ends is not overlap): they
    # come first, and the sort is stable. One byte a step, four a level: a million requests' events fit.
    times = np.concatenate((ends, starts))
    steps = np.concatenate((np.full(len(ends), -1, dtype=np.int8), np.ones(len(starts), dtype=np.int8)))
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    del order
    levels = np.cumsum(steps, dtype=np.int32)  # in flight just after each event
    area = float(np.dot(levels - steps, np.diff(times, prepend=first)))
    boundaries = [first + index * bucket_s for index in range(buckets + 1)]
    peaks, arrivals = [0] * buckets, [0] * buckets
    for index in range(buckets):
        last = index == buckets - 1
        # Events right on a bucket's start belong to it; the level after them is where its peak starts.
        on_start = int(np.searchsorted(times, boundaries[index], side="left"))
        after_start = int(np.searchsorted(times, boundaries[index], side="right"))
        end = len(times) if last else int(np.searchsorted(times, boundaries[index + 1], side="left"))
        entering = int(levels[after_start - 1]) if after_start > 0 else 0
        inside = levels[after_start:end]
        peaks[index] = max(entering, int(inside.max())) if len(inside) else entering
        arrivals[index] = int(np.count_nonzero(steps[on_start:end] > 0))
    return Concurrency(
        basis=basis,
        bucket_s=bucket_s,
        in_flight_peak=peaks,
        arrivals=arrivals,
        peak=max(peaks),
        mean=area / span,
        starts=starts,
        ends=ends,
    )


def summarize_trace(
    trace: Trace, *, long_prompt_tokens: int = 1000, prefill_tok_s: float = 1000.0, decode_tok_s: float = 30.0
) -> TraceSummary:
    starts, ends, basis = _send_intervals(trace, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    concurrency = _profile(starts, ends, basis=basis, buckets=60)
    # A session's turn is sent after the previous one ended plus think time, which can be long after its
    # offset: the span and rate count the times requests are actually sent.
    span = float(starts.max() - starts.min())
    prefix = trace.prefix_tokens
    prompt_total = prefix + trace.history_tokens + trace.new_tokens
    prompt = _distribution(prompt_total)
    prefix_reused, history_reused = _reused_tokens(trace, starts)
    count = len(trace)
    return TraceSummary(
        name=trace.header.name,
        description=trace.header.description,
        requests=count,
        sessions=len(np.unique(trace.session_codes)),
        span_s=span,
        arrivals_per_min=(count - 1) / span * 60 if span > 0 else None,
        prompt_tokens=prompt,
        new_tokens=_distribution(trace.new_tokens),
        output_tokens=_distribution(trace.output_tokens),
        prefix_reuse=prefix_reused / prompt.total,
        history_reuse=history_reused / prompt.total,
        long_prompts=int(np.count_nonzero(trace.new_tokens >= long_prompt_tokens)),
        tags=_counts(trace.tag_codes, trace.tags),
        lora={_lora_label(uses): count for uses, count in sorted(trace.lora_mix().items(), key=lambda u: -u[1])},
        concurrency=concurrency,
    )


def _counts(codes: npt.NDArray[np.integer[Any]], labels: list[str]) -> dict[str, int]:
    """Requests per label, most first; ties in the order of the label's first request."""
    values, first, counts = np.unique(codes, return_index=True, return_counts=True)
    ranked = sorted(zip(counts.tolist(), first.tolist(), values.tolist(), strict=True), key=lambda c: (-c[0], c[1]))
    merged: dict[str, int] = {}
    for count, _, code in ranked:
        merged[labels[code]] = merged.get(labels[code], 0) + count
    return merged


def _reused_tokens(trace: Trace, starts: Float64Array) -> tuple[int, int]:
    """Shared-prefix and history tokens that a request sent earlier computed, assuming nothing is ever
    evicted. A prefix block counts only behind blocks that count too (a cache matches a prompt from its
    start); history counts up to what the session's previous turn held: its history, its new tokens and
    its answer. Requests sent at the same instant compute a block side by side, neither reuses it.
    Computed on the columns: a million requests name tens of millions of blocks."""
    block_start, blocks = trace.prefix_columns()
    lengths = np.diff(block_start)
    prefix_reused = 0
    # A million requests name tens of millions of blocks: the blocks are walked a chunk of requests at a
    # time, so that no array is as long as all of them.
    chunks = [rows for rows in np.array_split(np.arange(len(trace)), max(1, len(trace) // _CHUNK)) if len(rows)]
    if len(blocks):
        # A block is computed from the first instant a request names it; it is reused where it is named later.
        first_named = np.full(int(blocks.max()) + 1, np.inf)
        for rows in chunks:
            lo, hi = block_start[rows[0]], block_start[rows[-1] + 1]
            np.minimum.at(first_named, blocks[lo:hi], np.repeat(starts[rows], lengths[rows]))
        for rows in chunks:
            lo, hi = int(block_start[rows[0]]), int(block_start[rows[-1] + 1])
            reused = first_named[blocks[lo:hi]] < np.repeat(starts[rows], lengths[rows])
            # Only the leading run of reused blocks of each prompt counts: none after its first miss.
            misses = np.cumsum(~reused, dtype=np.int32)
            misses_before_row = np.concatenate(([0], misses))[block_start[rows] - lo]
            leading = misses == np.repeat(misses_before_row, lengths[rows])
            prefix_reused += int(trace.use_tokens(lo, hi)[leading & reused].sum(dtype=np.int64))
    # History: the session's latest turn sent at an earlier instant, by (send time, turn).
    codes, turns = trace.session_codes, trace.turn
    order = np.lexsort((turns, starts, codes))
    ordered_codes, ordered_starts = codes[order], starts[order]
    same_instant_as_previous = np.concatenate(
        ([False], (ordered_codes[1:] == ordered_codes[:-1]) & (ordered_starts[1:] == ordered_starts[:-1]))
    )
    # The first position of each run of one session at one instant, then the position before it.
    run_first = np.maximum.accumulate(np.where(same_instant_as_previous, 0, np.arange(len(order))))
    previous = run_first - 1
    has_previous = previous >= 0
    has_previous[has_previous] = ordered_codes[previous[has_previous]] == ordered_codes[has_previous]
    held = (trace.history_tokens + trace.new_tokens + trace.output_tokens)[order]
    history = trace.history_tokens[order]
    history_reused = int(np.minimum(history[has_previous], held[previous[has_previous]]).sum(dtype=np.int64))
    return prefix_reused, history_reused


def _lora_label(uses: tuple[tuple[str, float], ...]) -> str:
    if not uses:
        return "none"
    return "+".join(f"{adapter}" + (f"@{scale:g}" if scale != 1.0 else "") for adapter, scale in uses)
