"""Metrics on hand-made timelines, where the right answer can be worked out by hand."""

from __future__ import annotations

import pytest

from tuner.metrics import compute_metrics, long_prefill_windows, stall_samples
from tuner.models import RequestRecord, RequestStatus, ServerTimings


def stream(
    request_id: str,
    send: float,
    tokens: list[float],
    *,
    prompt: int = 100,
    timings: ServerTimings | None = None,
    status: RequestStatus = RequestStatus.OK,
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session=request_id,
        tag="chat",
        prompt_tokens=prompt,
        output_tokens_requested=len(tokens),
        send_s=send,
        token_s=tuple(tokens),
        end_s=(tokens[-1] if tokens else send) + 0.01,
        status=status,
        timings=timings,
    )


def evenly(start: float, end: float, rate: float) -> list[float]:
    count = round((end - start) * rate)
    return [start + i / rate for i in range(count + 1)]


def test_stall_speed_is_the_decode_rate_inside_the_long_prefill_window() -> None:
    # A stream decodes at 10 tok/s, slows to 1 tok/s while a 2,000-token prompt is prefilled from
    # t=5 to t=15, then recovers to 10 tok/s.
    tokens = evenly(1.0, 5.0, 10) + evenly(6.0, 15.0, 1) + evenly(15.1, 18.0, 10)
    chat = stream("chat", 0.5, tokens)
    long = stream("long", 4.0, [15.0, 15.05], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=10_000.0))
    metrics = compute_metrics([chat, long], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["stall_tok_s"] == pytest.approx(1.0, rel=0.05)
    assert metrics["unstalled_tok_s"] == pytest.approx(10.0, rel=0.1)
    assert metrics["prefill_tok_s"] == pytest.approx(200.0)


def test_prefill_window_starts_where_the_server_says_prefill_started() -> None:
    long = stream("long", 2.0, [12.0], prompt=3000, timings=ServerTimings(prompt_n=3000, prompt_ms=6_000.0))
    (window,) = long_prefill_windows([long], long_prompt_tokens=1000)
    # 4 s of the 10 s between send and first token were a wait, not prefill.
    assert (window.start_s, window.end_s) == (6.0, 12.0)


def test_without_server_timings_the_window_starts_at_send() -> None:
    long = stream("long", 2.0, [12.0], prompt=3000)
    (window,) = long_prefill_windows([long], long_prompt_tokens=1000)
    assert window.start_s == 2.0


def test_a_stream_stuck_in_one_gap_during_the_prefill_gets_the_gaps_rate_not_zero() -> None:
    # No token arrives in the window, but the stream is not dead: it moved 1 token in 10 s.
    chat = stream("chat", 0.0, [*evenly(0.5, 3.0, 10), 13.0, 13.1])
    long = stream("long", 3.0, [12.9], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=9_000.0))
    inside, _ = stall_samples([chat, long], long_prefill_windows([long], long_prompt_tokens=1000), min_overlap_s=0.5)
    assert inside == [pytest.approx(0.1)]


def test_short_prompts_open_no_stall_window_and_stall_is_none_not_zero() -> None:
    chat = stream("chat", 0.0, evenly(0.5, 3.0, 10))
    other = stream("other", 1.0, evenly(1.5, 3.0, 10), prompt=500)
    metrics = compute_metrics([chat, other], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["stall_tok_s"] is None
    assert metrics["prefill_tok_s"] is None


def test_ttft_percentiles_include_queueing_and_failures_are_counted() -> None:
    records = [stream(f"r{i}", 0.0, [float(i + 1), float(i + 2)]) for i in range(20)]
    records.append(stream("failed", 0.0, [], status=RequestStatus.TIMEOUT))
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["ttft_p50_s"] == pytest.approx(10.5)
    assert metrics["ttft_p95_s"] == pytest.approx(19.05)
    assert metrics["failures"] == 1.0


def test_itl_max_is_the_longest_gap_and_decode_speed_excludes_queueing() -> None:
    chat = stream("chat", 0.0, [5.0, 5.1, 5.2, 8.2, 8.3])
    metrics = compute_metrics([chat], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["itl_max_s"] == pytest.approx(3.0)
    assert metrics["decode_tok_s"] == pytest.approx(4 / 3.3)


def test_windows_shorter_than_the_minimum_overlap_are_ignored() -> None:
    chat = stream("chat", 0.0, evenly(0.0, 5.0, 10))
    long = stream("long", 4.7, [5.0], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=300.0))
    inside, _ = stall_samples([chat, long], long_prefill_windows([long], long_prompt_tokens=1000), min_overlap_s=0.5)
    assert inside == []


def test_the_slo_line_needs_enough_requests_no_failures_fast_first_tokens_and_fast_streams() -> None:
    fast = [stream(f"r{i}", 0.0, evenly(0.5, 2.0, 20)) for i in range(20)]
    assert compute_metrics(fast, long_prompt_tokens=1000, min_overlap_s=0.5)["slo_pass"] == 1.0
    slow_first_token = [*fast[:18], *(stream(f"s{i}", 0.0, evenly(3.0, 4.0, 20)) for i in range(2))]
    assert compute_metrics(slow_first_token, long_prompt_tokens=1000, min_overlap_s=0.5)["slo_pass"] == 0.0
    failed = [*fast, stream("x", 0.0, [], status=RequestStatus.TIMEOUT)]
    assert compute_metrics(failed, long_prompt_tokens=1000, min_overlap_s=0.5)["slo_pass"] == 0.0
    slow_stream = [*fast[:19], stream("slow", 0.0, evenly(0.5, 10.0, 5))]
    metrics = compute_metrics(slow_stream, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["slo_pass"] == 1.0  # the median user still decodes at 20 tok/s
    assert compute_metrics(fast[:5], long_prompt_tokens=1000, min_overlap_s=0.5)["slo_pass"] is None


def test_client_prefill_speed_is_new_tokens_over_time_to_first_token() -> None:
    long = stream("long", 1.0, [11.0, 11.1], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=9_500.0))
    metrics = compute_metrics([long], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["client_prefill_tok_s"] == pytest.approx(200.0)
    assert metrics["prefill_tok_s"] == pytest.approx(2000 / 9.5)


def test_the_wait_behind_a_long_prefill_is_told_apart_from_other_waits() -> None:
    # "long" is prefilled from 2 to 12. "queued" waits from 4 to 14 (its prompt takes 1 s, first token
    # at 15): 8 of its 10 s of waiting fall inside the long prefill.
    long = stream("long", 2.0, [12.0, 12.1], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=10_000.0))
    queued = stream("queued", 4.0, [15.0, 15.1], prompt=100, timings=ServerTimings(prompt_n=100, prompt_ms=1_000.0))
    metrics = compute_metrics([long, queued], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["wait_behind_long_prefill_share"] == pytest.approx(0.8)
    assert metrics["wait_p95_s"] == pytest.approx(10.0 * 0.95, rel=0.01)
