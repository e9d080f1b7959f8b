"""Pure functions from request records to the metrics defined in docs/metrics.md.

Nothing here does I/O or looks at a clock, so every metric can be checked on a hand-made timeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.config import SloSpec
from tuner.models import RequestRecord, RequestStatus, TaskTimeline

# A tg_3s sample counts as "during a long prefill" if its interval lies inside the window up to this
# much, since log timestamps and the window's ends come from different log lines.
_SERVER_WINDOW_TOLERANCE_S = 0.1

__all__ = [
    "METRICS",
    "engine_metrics",
    "MetricInfo",
    "OverlapWindow",
    "PrefillStep",
    "SwitchCost",
    "compute_metrics",
    "fell_behind",
    "long_prefill_windows",
    "lora_metrics",
    "lora_switch_cost",
    "send_lag",
    "join_server_tasks",
    "server_metrics",
    "stall_samples",
    "switch_cost",
    "tokens_between",
]


@dataclass(frozen=True, kw_only=True)
class MetricInfo:
    name: str
    unit: str
    better: str  # "higher" or "lower"
    description: str


METRICS: dict[str, MetricInfo] = {
    info.name: info
    for info in (
        MetricInfo(name="ttft_p50_s", unit="s", better="lower", description="Time to first token, median."),
        MetricInfo(name="ttft_p95_s", unit="s", better="lower", description="Time to first token, 95th percentile."),
        MetricInfo(name="ttft_p99_s", unit="s", better="lower", description="Time to first token, 99th percentile."),
        MetricInfo(name="itl_p95_s", unit="s", better="lower", description="Gap between streamed tokens, p95."),
        MetricInfo(name="itl_max_s", unit="s", better="lower", description="Longest gap between streamed tokens."),
        MetricInfo(
            name="decode_tok_s",
            unit="tok/s",
            better="higher",
            description="Per-user decode speed, median over requests.",
        ),
        MetricInfo(
            name="stall_tok_s",
            unit="tok/s",
            better="higher",
            description="A stream's decode speed while another request's long prompt is prefilled, "
            "median over overlap windows.",
        ),
        MetricInfo(
            name="unstalled_tok_s",
            unit="tok/s",
            better="higher",
            description="The same streams' decode speed outside long-prefill windows.",
        ),
        MetricInfo(
            name="prefill_tok_s",
            unit="tok/s",
            better="higher",
            description="New prompt tokens per second of prompt eval, long prompts only.",
        ),
        MetricInfo(
            name="output_tok_s",
            unit="tok/s",
            better="higher",
            description="Output tokens received per second of the measurement window.",
        ),
        MetricInfo(
            name="wait_p95_s",
            unit="s",
            better="lower",
            description="Time to first token minus the server's prompt time, p95: queueing and any wait before "
            "prefill, which the server's prompt timings do not show.",
        ),
        MetricInfo(
            name="client_prefill_tok_s",
            unit="tok/s",
            better="higher",
            description="New prompt tokens over time to first token, long prompts: the client's own measure of "
            "prefill speed, below prefill_tok_s by any wait before prefill.",
        ),
        MetricInfo(
            name="wait_behind_long_prefill_share",
            unit="",
            better="lower",
            description="Share of all time waited before prefill during which another request's long prompt "
            "was being prefilled.",
        ),
        MetricInfo(
            name="server_stall_tok_s",
            unit="tok/s",
            better="higher",
            description="The server's tg_3s samples of slots whose whole interval lay inside another slot's long "
            "prefill, median.",
        ),
        MetricInfo(
            name="server_wait_max_s",
            unit="s",
            better="lower",
            description="Longest time a task held its slot without being computed (server log).",
        ),
        MetricInfo(
            name="server_prefix_reuse_share",
            unit="",
            better="higher",
            description="Share of tasks given a slot that already held a shared prefix (llama-server's LCP "
            "similarity) rather than the least recently used slot.",
        ),
        MetricInfo(
            name="server_prompt_cache_evictions",
            unit="",
            better="lower",
            description="Host-RAM prompt cache entries evicted during the round (--cache-ram too small).",
        ),
        MetricInfo(
            name="stall_agreement",
            unit="",
            better="higher",
            description="Server-side over client-side stall speed: near 1 when both instruments see the same stall.",
        ),
        MetricInfo(
            name="server_joined_share",
            unit="",
            better="higher",
            description="Share of the round's requests matched to a task in the server's log by prompt and output "
            "token counts: how much of the round the server-side figures cover.",
        ),
        MetricInfo(
            name="lora_wait_p95_s",
            unit="s",
            better="lower",
            description="Wait before prefill of the requests that waited while a request with another LoRA "
            "setting ran, p95: llama-server cannot batch slots whose adapters or scales differ, and this wait "
            "is in no server timing.",
        ),
        MetricInfo(
            name="lora_wait_share",
            unit="",
            better="lower",
            description="Of all time requests waited before their prefill began, the share spent while a "
            "request with another LoRA setting was running.",
        ),
        MetricInfo(
            name="lora_switch_ms",
            unit="ms",
            better="lower",
            description="Extra prefill time right after a change of LoRA setting, against prefills of about "
            "the same length right after the same setting (none shared its steps with another prompt), median; "
            "never negative, missing where the round has no such pair.",
        ),
        MetricInfo(
            name="prompt_token_ratio",
            unit="",
            better="higher",
            description="The server's count of each prompt over the length the replay meant, median: 1 for "
            "token-id prompts; for text prompts (Ollama), how close one word per token came.",
        ),
        MetricInfo(name="failures", unit="", better="lower", description="Requests that failed."),
        MetricInfo(
            name="rejected",
            unit="",
            better="lower",
            description="Requests the server refused with HTTP 503 (a full queue: Ollama's OLLAMA_MAX_QUEUE, "
            "vLLM's --max-num-queued-reqs); also counted in failures.",
        ),
        MetricInfo(
            name="send_lag_p99_s",
            unit="s",
            better="lower",
            description="How late the load generator sent requests against the workload's schedule, p99: "
            "past 10 ms the round is reported as having fallen behind (the server saw less load than the trace).",
        ),
        MetricInfo(
            name="send_lag_max_s",
            unit="s",
            better="lower",
            description="The latest send against the schedule.",
        ),
        MetricInfo(
            name="gpu_memory_peak_mib",
            unit="MiB",
            better="lower",
            description="Most GPU memory in use (all GPUs) during the round, sampled with nvidia-smi every 0.5 s.",
        ),
        MetricInfo(
            name="predicted_memory_mib",
            unit="MiB",
            better="lower",
            description="What the memory pre-check predicted (weights plus KV cache), to compare with the peak.",
        ),
        MetricInfo(
            name="slo_pass",
            unit="",
            better="higher",
            description="1 if the round held the line (TTFT p95, per-user decode speed, no failures), 0 if not; "
            "missing when the round had too few requests to tell.",
        ),
    )
}


@dataclass(frozen=True, kw_only=True)
class OverlapWindow:
    """The time a long prompt was being prefilled."""

    request_id: str
    start_s: float
    end_s: float
    new_tokens: int


def engine_metrics(engine_metrics: Mapping[str, MetricInfo]) -> dict[str, MetricInfo]:
    """Every metric a study on an engine can score: the common ones and the engine's own (its counters)."""
    return {**METRICS, **engine_metrics}


def _new_prompt_tokens(record: RequestRecord) -> int:
    """Prompt tokens the server computed: its own count, unless that count includes cached tokens (Ollama);
    then the prompt's length, whose new part the replay made fresh for the round."""
    timings = record.timings
    if timings is not None and timings.prompt_n > 0 and not timings.prompt_n_includes_cached:
        return timings.prompt_n
    return record.prompt_tokens


def long_prefill_windows(records: Sequence[RequestRecord], *, long_prompt_tokens: int) -> list[OverlapWindow]:
    """Prefill windows of requests with at least `long_prompt_tokens` new prompt tokens.

    A window ends at the request's first token. It starts where the server says prefill started
    (first token minus `prompt_ms`), or at the send time when the server gave no timings.
    """
    windows = []
    for record in records:
        first = record.first_token_s
        if first is None or _new_prompt_tokens(record) < long_prompt_tokens:
            continue
        if record.timings is not None and record.timings.prompt_ms > 0:
            start = max(record.send_s, first - record.timings.prompt_ms / 1000.0)
        else:
            start = record.send_s
        windows.append(
            OverlapWindow(
                request_id=record.request_id, start_s=start, end_s=first, new_tokens=_new_prompt_tokens(record)
            )
        )
    return windows


def tokens_between(token_s: Sequence[float], start: float, end: float) -> float:
    """Decode progress between two instants, in tokens.

    Progress is the cumulative token count interpolated linearly between arrivals, so a window that
    falls inside one long gap gets that gap's rate instead of 0 or 1 whole token: counting whole
    tokens would make a 7 s stall read 0 tok/s in one round and 0.14 in the next.
    """
    times = np.asarray(token_s, dtype=float)
    counts = np.arange(len(times), dtype=float)
    return float(np.interp(end, times, counts) - np.interp(start, times, counts))


def stall_samples(
    records: Sequence[RequestRecord], windows: Sequence[OverlapWindow], *, min_overlap_s: float
) -> tuple[list[float], list[float]]:
    """Decode speeds of streams inside long-prefill windows, and of the same streams outside them.

    A stream is measured from its first token to its last. Inside: for every (stream, window) pair
    overlapping at least `min_overlap_s`, the stream's progress during the overlap over its length.
    Outside: per stream, its progress in decode time not covered by any window over that time.
    """
    inside: list[float] = []
    outside: list[float] = []
    for record in records:
        if not record.ok or len(record.token_s) < 2:
            continue
        first, last = record.token_s[0], record.token_s[-1]
        covered: list[tuple[float, float]] = []
        for window in windows:
            if window.request_id == record.request_id:
                continue
            start, end = max(first, window.start_s), min(last, window.end_s)
            if end - start >= min_overlap_s:
                inside.append(tokens_between(record.token_s, start, end) / (end - start))
            if end > start:
                covered.append((start, end))
        free_time, free_tokens = _outside(record.token_s, first, last, covered)
        if covered and free_time >= min_overlap_s:
            outside.append(free_tokens / free_time)
    return inside, outside


def _outside(
    token_s: Sequence[float], first: float, last: float, covered: list[tuple[float, float]]
) -> tuple[float, float]:
    merged: list[list[float]] = []
    for start, end in sorted(covered):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    covered_time = sum(end - start for start, end in merged)
    covered_tokens = sum(tokens_between(token_s, start, end) for start, end in merged)
    # Tokens after the first one are what the decode produced in (first, last].
    return (last - first) - covered_time, (len(token_s) - 1) - covered_tokens


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def compute_metrics(
    records: Sequence[RequestRecord], *, long_prompt_tokens: int, min_overlap_s: float, slo: SloSpec | None = None
) -> dict[str, float | None]:
    """All per-round metrics; a metric with no data (no long prompts, say) is None, never 0."""
    ok = [r for r in records if r.ok]
    ttft = [r.token_s[0] - r.send_s for r in ok]
    gaps = [b - a for r in ok for a, b in zip(r.token_s, r.token_s[1:], strict=False)]
    decode = [
        (len(r.token_s) - 1) / (r.token_s[-1] - r.token_s[0])
        for r in ok
        if len(r.token_s) >= 2 and r.token_s[-1] > r.token_s[0]
    ]
    windows = long_prefill_windows(ok, long_prompt_tokens=long_prompt_tokens)
    inside, outside = stall_samples(ok, windows, min_overlap_s=min_overlap_s)
    long_timed = [
        r
        for r in ok
        if r.timings is not None and r.timings.prompt_ms > 0 and _new_prompt_tokens(r) >= long_prompt_tokens
    ]
    prefill_ms = sum(r.timings.prompt_ms for r in long_timed if r.timings is not None)
    prefill = sum(_new_prompt_tokens(r) for r in long_timed) / (prefill_ms / 1000.0) if long_timed else None
    waits = [max(0.0, (r.token_s[0] - r.send_s) - r.timings.prompt_ms / 1000.0) for r in ok if r.timings is not None]
    long_ok = [r for r in ok if _new_prompt_tokens(r) >= long_prompt_tokens]
    long_ttft = sum(r.token_s[0] - r.send_s for r in long_ok)
    client_prefill = sum(_new_prompt_tokens(r) for r in long_ok) / long_ttft if long_ttft > 0 else None
    span = (max(r.end_s for r in records) - min(r.send_s for r in records)) if records else 0.0
    metrics = {
        "ttft_p50_s": _percentile(ttft, 50),
        "ttft_p95_s": _percentile(ttft, 95),
        "ttft_p99_s": _percentile(ttft, 99),
        "itl_p95_s": _percentile(gaps, 95),
        "itl_max_s": max(gaps) if gaps else None,
        "decode_tok_s": _median(decode),
        "stall_tok_s": _median(inside),
        "unstalled_tok_s": _median(outside),
        "prefill_tok_s": prefill,
        "output_tok_s": sum(len(r.token_s) for r in ok) / span if span > 0 else None,
        "wait_p95_s": _percentile(waits, 95),
        "client_prefill_tok_s": client_prefill,
        "wait_behind_long_prefill_share": _wait_share_behind(ok, windows),
        **lora_metrics(ok),
        "prompt_token_ratio": _prompt_token_ratio(ok),
        "failures": float(len(records) - len(ok)),
        "rejected": float(sum(1 for r in records if r.status is RequestStatus.REJECTED)),
        **send_lag(records),
    }
    metrics["slo_pass"] = _slo_pass(metrics, len(records), slo or SloSpec())
    return metrics


# The load generator keeps its sends within 2 ms at p99 (docs/benchmarks.md); a round whose p99 is past
# this fell behind its schedule: its requests arrived later and more spread out than the trace's.
FELL_BEHIND_S = 0.010


def send_lag(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """How late the load generator sent the round's requests against their schedule (send_s - due_s):
    p99 and max. None for records without a schedule (made before 0.2, or by the simulator's clock)."""
    lags = [max(0.0, r.send_s - r.due_s) for r in records if r.due_s is not None]
    return {"send_lag_p99_s": _percentile(lags, 99), "send_lag_max_s": max(lags) if lags else None}


def fell_behind(records: Sequence[RequestRecord]) -> str | None:
    """What to tell the user when the load generator could not keep the round's schedule; else None."""
    lags = [r.send_s - r.due_s for r in records if r.due_s is not None]
    late = sum(1 for lag in lags if lag > FELL_BEHIND_S)
    if not lags or late <= len(lags) // 100:
        return None
    return (
        f"the load generator fell behind the workload's schedule: {late} of {len(lags)} requests were sent more "
        f"than {FELL_BEHIND_S * 1000:.0f} ms late (the latest by {max(lags):.3f} s), so the server saw less load "
        "than the trace holds; run serve-tuner on a less busy machine, or replay the trace less compressed "
        "(a larger workload.time_scale)"
    )


def _wait_share_behind(records: Sequence[RequestRecord], windows: Sequence[OverlapWindow]) -> float | None:
    """Of all time requests waited before their prefill began, the share spent while another request's
    long prompt was being prefilled: the wait that a smaller n_batch or another slot count can shorten."""
    total = behind = 0.0
    for record in records:
        if record.timings is None or not record.token_s:
            continue
        wait_end = record.token_s[0] - record.timings.prompt_ms / 1000.0
        if wait_end <= record.send_s:
            continue
        total += wait_end - record.send_s
        spans = sorted(
            (max(record.send_s, w.start_s), min(wait_end, w.end_s))
            for w in windows
            if w.request_id != record.request_id
        )
        covered_until = record.send_s
        for span_start, span_end in spans:
            start = max(span_start, covered_until)
            if span_end > start:
                behind += span_end - start
                covered_until = span_end
    return behind / total if total > 0 else None


def _prompt_token_ratio(records: Sequence[RequestRecord]) -> float | None:
    """The server's count of each prompt over the length the replay meant, median: 1 with token-id
    prompts; for text prompts (Ollama) it tells how close one word per token came."""
    ratios = []
    for record in records:
        timings = record.timings
        if timings is None or record.prompt_tokens == 0 or timings.prompt_n == 0:
            continue
        counted = timings.prompt_n if timings.prompt_n_includes_cached else timings.prompt_n + timings.cache_n
        ratios.append(counted / record.prompt_tokens)
    return _median(ratios)


def lora_metrics(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """The wait that different LoRA settings cause, and the cost of switching; None without a mix."""
    settings = {r.lora for r in records}
    empty: dict[str, float | None] = {"lora_wait_p95_s": None, "lora_wait_share": None, "lora_switch_ms": None}
    if len(settings) < 2 or not any(settings):
        return empty
    waited = [
        (r, r.send_s, r.token_s[0] - r.timings.prompt_ms / 1000.0)
        for r in records
        if r.timings is not None and r.token_s
    ]
    blocked_waits: list[float] = []
    total = behind = 0.0
    for record, wait_start, wait_end in waited:
        if wait_end <= wait_start:
            continue
        total += wait_end - wait_start
        others = sorted((max(wait_start, o.send_s), min(wait_end, o.end_s)) for o in records if o.lora != record.lora)
        covered_until, overlap = wait_start, 0.0
        for span_start, span_end in others:
            start = max(span_start, covered_until)
            if span_end > start:
                overlap += span_end - start
                covered_until = span_end
        behind += overlap
        if overlap > 0:
            blocked_waits.append(wait_end - wait_start)
    return {
        "lora_wait_p95_s": _percentile(blocked_waits, 95),
        "lora_wait_share": behind / total if total > 0 else None,
        "lora_switch_ms": lora_switch_cost(records).ms,
    }


@dataclass(frozen=True, kw_only=True)
class PrefillStep:
    """One request's prefill, as the LoRA switch cost sees it."""

    prompt_n: int  # prompt tokens computed
    prompt_ms: float
    after_switch: bool | None  # the adapter setting changed right before it; False: it did not; None: unknown
    shared: bool  # another request's prefill overlapped it, so its steps carried other prompts too


@dataclass(frozen=True, kw_only=True)
class SwitchCost:
    """The extra time of the first step after a change of adapter setting, measured as the source case
    study measured it: prefills right after a switch against prefills of about the same length right
    after the same setting, each with no other prompt in its steps. Never negative: `ms` is None, with
    the reason, where the data cannot give it, and 0 where switched prefills were no slower."""

    ms: float | None
    reason: str | None
    switches: int
    compared: int  # switched prefills that had a steady prefill of a similar length to compare with
    steady: int


# Prefills compared for the switch cost differ in length by at most this share: a step's fixed cost makes a
# short prompt's per-token time longer, so per-token times from other lengths would read as a switch cost.
SWITCH_COMPARABLE_LENGTH = 0.25


def switch_cost(steps: Sequence[PrefillStep]) -> SwitchCost:
    """The median over switched prefills of (their time minus the time a steady prefill of the same
    length took, from steady prefills within 25% of its length), clamped at 0."""
    switches = sum(1 for s in steps if s.after_switch is True)
    alone = [s for s in steps if not s.shared and s.prompt_n > 0 and s.prompt_ms > 0]
    switched = [s for s in alone if s.after_switch is True]
    steady = [s for s in alone if s.after_switch is False]

    def absent(reason: str, compared: int = 0) -> SwitchCost:
        return SwitchCost(ms=None, reason=reason, switches=switches, compared=compared, steady=len(steady))

    if switches == 0:
        return absent("the adapter setting never changed")
    if not switched:
        return absent("every prefill after a change of adapter setting shared its steps with another prompt")
    if not steady:
        return absent("no prefill ran right after one with the same adapter setting, to compare with")
    costs = []
    for step in switched:
        per_token = [
            s.prompt_ms / s.prompt_n
            for s in steady
            if abs(s.prompt_n - step.prompt_n) <= SWITCH_COMPARABLE_LENGTH * step.prompt_n
        ]
        if per_token:
            costs.append(step.prompt_ms - step.prompt_n * float(np.median(per_token)))
    if not costs:
        return absent(
            f"no steady prefill within {SWITCH_COMPARABLE_LENGTH:.0%} of the length of a switched one, to compare with"
        )
    return SwitchCost(
        ms=max(0.0, float(np.median(costs))), reason=None, switches=switches, compared=len(costs), steady=len(steady)
    )


# Two instants closer than this on the client's clock are the same moment of the server's loop.
_SAME_MOMENT_S = 0.001


def lora_switch_cost(records: Sequence[RequestRecord]) -> SwitchCost:
    """The switch cost from a round's records: a request's prefill began after a switch when the setting
    the server ran just before (the requests computing then, or else the last one to finish) was not its own."""
    timed = [
        (r, r.token_s[0] - r.timings.prompt_ms / 1000.0)
        for r in records
        if r.ok and r.timings is not None and r.timings.prompt_n > 0 and r.token_s
    ]
    steps = []
    for record, start in timed:
        computing = [o for o, o_start in timed if o is not record and o_start < start - _SAME_MOMENT_S < o.token_s[-1]]
        ended = [o for o, _ in timed if o is not record and o.token_s[-1] <= start + _SAME_MOMENT_S]
        after_switch: bool | None = None
        if computing:
            after_switch = record.lora not in {o.lora for o in computing}
        elif ended:
            after_switch = max(ended, key=lambda o: o.token_s[-1]).lora != record.lora
        shared = any(o is not record and o_start < record.token_s[0] and start < o.token_s[0] for o, o_start in timed)
        assert record.timings is not None
        steps.append(
            PrefillStep(
                prompt_n=record.timings.prompt_n,
                prompt_ms=record.timings.prompt_ms,
                after_switch=after_switch,
                shared=shared,
            )
        )
    return switch_cost(steps)


def _slo_pass(metrics: dict[str, float | None], requests: int, slo: SloSpec) -> float | None:
    if requests < slo.min_requests:
        return None
    ttft, decode = metrics["ttft_p95_s"], metrics["decode_tok_s"]
    held = (
        metrics["failures"] == 0
        and ttft is not None
        and ttft <= slo.ttft_p95_s
        and decode is not None
        and decode >= slo.decode_tok_s
    )
    return 1.0 if held else 0.0


def server_metrics(
    tasks: Sequence[TaskTimeline], *, long_prompt_tokens: int, min_overlap_s: float
) -> dict[str, float | None]:
    """The server's own view of a round, from its log: stall speed and the longest wait in a slot.

    A `tg_3s` sample covers the time since the slot's previous sample; the first sample of a task has
    no known start and is left out. A sample counts when its interval lies inside another task's long
    prefill window, so the server-side stall speed is comparable to the client's `stall_tok_s`.
    """
    windows = [
        (task.task, window)
        for task in tasks
        if (window := task.prefill_window_s) is not None and (task.prompt_n or 0) >= long_prompt_tokens
    ]
    inside: list[float] = []
    for task in tasks:
        for previous, sample in zip(task.rate_samples, task.rate_samples[1:], strict=False):
            start, end = previous.at_s, sample.at_s
            if end - start < min_overlap_s:
                continue
            if any(
                other != task.task
                and start >= window_start - _SERVER_WINDOW_TOLERANCE_S
                and end <= window_end + _SERVER_WINDOW_TOLERANCE_S
                for other, (window_start, window_end) in windows
            ):
                inside.append(sample.tg_3s)
    waits = [w for task in tasks if (w := task.wait_before_prefill_s) is not None]
    selected = [t.slot_selection for t in tasks if t.slot_selection is not None]
    return {
        "server_stall_tok_s": _median(inside),
        "server_wait_max_s": max(waits) if waits else None,
        "server_prefix_reuse_share": selected.count("LCP") / len(selected) if selected else None,
        "server_prompt_cache_evictions": float(sum(t.prompt_cache_evictions for t in tasks)),
    }


def join_server_tasks(
    records: Sequence[RequestRecord], tasks: Sequence[TaskTimeline]
) -> list[tuple[RequestRecord, TaskTimeline]]:
    """Pairs each request with the server task that served it.

    A task is identified by its prompt length (cached part included) and its number of generated
    tokens; requests are taken in send order and tasks in launch order, so equal shapes pair up in
    the order they ran.
    """
    unmatched = list(tasks)
    pairs = []
    for record in sorted(records, key=lambda r: r.send_s):
        for index, task in enumerate(unmatched):
            if task.prompt_tokens == record.prompt_tokens and task.eval_n == len(record.token_s):
                pairs.append((record, unmatched.pop(index)))
                break
    return pairs
