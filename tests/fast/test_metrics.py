"""Metrics on hand-made timelines, where the right answer can be worked out by hand."""

from __future__ import annotations

import pytest

from tuner.metrics import compute_metrics, long_prefill_windows, stall_samples
from tuner.models import RequestRecord, RequestStatus, ServerTimings, TaskTimeline, TokenRateSample


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


# ---- pinned by mutation testing (scripts/mutmut.sh): each rule on its own ----------------------


def test_new_prompt_tokens_are_the_servers_count_of_computed_tokens_where_it_gives_one() -> None:
    from tuner.metrics import OverlapWindow

    windows = long_prefill_windows(
        [
            # 3,000 tokens long, but 2,500 came from the cache: 500 computed, no long prefill.
            stream(
                "cached", 0.0, [2.0], prompt=3000, timings=ServerTimings(prompt_n=500, cache_n=2500, prompt_ms=500.0)
            ),
            # One token computed, the rest cached: still not long.
            stream("one", 0.0, [2.0], prompt=3000, timings=ServerTimings(prompt_n=1, cache_n=2999, prompt_ms=1.0)),
            # No count from the server (0): the prompt's own length.
            stream("uncounted", 1.0, [4.0], prompt=2000, timings=ServerTimings(prompt_n=0, prompt_ms=2000.0)),
            # Ollama counts cached tokens in prompt_n: the prompt's length, not prompt_n.
            stream(
                "ollama",
                1.0,
                [5.0],
                prompt=1500,
                timings=ServerTimings(prompt_n=2500, prompt_n_includes_cached=True, prompt_ms=3000.0),
            ),
        ],
        long_prompt_tokens=1000,
    )
    assert windows == [
        OverlapWindow(request_id="uncounted", start_s=2.0, end_s=4.0, new_tokens=2000),
        OverlapWindow(request_id="ollama", start_s=2.0, end_s=5.0, new_tokens=1500),
    ]


def test_a_prompt_of_exactly_the_long_length_is_long_and_a_zero_prompt_time_means_no_timing() -> None:
    exact = stream("exact", 1.0, [5.0], prompt=1000, timings=ServerTimings(prompt_n=1000, prompt_ms=0.0))
    tiny = stream("tiny", 1.0, [5.0], prompt=1000, timings=ServerTimings(prompt_n=1000, prompt_ms=0.5))
    (from_send, from_timing) = long_prefill_windows([exact, tiny], long_prompt_tokens=1000)
    assert from_send.start_s == 1.0  # prompt_ms 0: the server gave no timing, the window starts at send
    assert from_timing.start_s == pytest.approx(5.0 - 0.0005)


def test_only_streams_that_finished_with_two_tokens_or_more_are_measured_in_order() -> None:
    long = stream("long", 0.0, [10.0], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=8000.0))
    windows = long_prefill_windows([long], long_prompt_tokens=1000)  # 2 .. 10
    failed = stream("failed", 0.0, evenly(1.0, 9.0, 10), status=RequestStatus.TIMEOUT)
    single = stream("single", 0.0, [3.0])
    pair = stream("pair", 0.0, [1.0, 11.0])  # two tokens 10 s apart: 0.1 tok/s across the window
    inside, _ = stall_samples([failed, single, pair], windows, min_overlap_s=0.5)
    assert inside == [pytest.approx(0.1)]


def test_the_overlap_runs_from_a_streams_first_token_to_its_last() -> None:
    long = stream("long", 0.0, [10.0], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=10_000.0))
    windows = long_prefill_windows([long], long_prompt_tokens=1000)  # 0 .. 10
    # Starts inside the window: 3 tokens after the first in the 5 s from its first token to t=10.
    late = stream("late", 0.0, [5.0, 9.0, 9.5, 10.0, 10.5])
    # Ends inside the window: 4 tokens after the first from t=0 .. 3.2.
    early = stream("early", 0.0, [0.0, 1.0, 2.0, 3.0, 3.2])
    inside, _ = stall_samples([late, early], windows, min_overlap_s=0.5)
    assert inside == [pytest.approx(3 / 5), pytest.approx(4 / 3.2)]


def test_a_streams_own_prefill_window_is_skipped_and_the_others_still_count() -> None:
    own = stream("own", 0.0, evenly(4.0, 8.0, 10), prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=4000.0))
    other = stream("other", 0.0, [7.0], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=2000.0))
    windows = long_prefill_windows([own, other], long_prompt_tokens=1000)
    assert [w.request_id for w in windows] == ["own", "other"]
    inside, _ = stall_samples([own], windows, min_overlap_s=0.5)
    assert inside == [pytest.approx(10.0)]  # "other"'s window, 5 .. 7, not its own 0 .. 4


def test_an_overlap_of_exactly_the_minimum_counts() -> None:
    from tuner.metrics import OverlapWindow

    chat = stream("chat", 0.0, evenly(0.0, 5.0, 10))
    window = OverlapWindow(request_id="long", start_s=2.0, end_s=2.5, new_tokens=2000)
    inside, _ = stall_samples([chat], [window], min_overlap_s=0.5)
    assert inside == [pytest.approx(10.0)]


def test_the_speed_outside_is_measured_only_for_streams_a_window_touched_and_with_enough_free_time() -> None:
    from tuner.metrics import OverlapWindow

    window = OverlapWindow(request_id="long", start_s=0.5, end_s=2.5, new_tokens=2000)
    untouched = stream("untouched", 0.0, evenly(3.0, 6.0, 10))
    # A stream ending exactly where the window starts shares an instant with it, no time.
    touching = stream("touching", 0.0, evenly(-1.0, 0.5, 10))
    # 0.5 s free before the window, exactly the minimum.
    half = stream("half", 0.0, evenly(0.0, 2.5, 10))
    _, outside = stall_samples([untouched, touching, half], [window], min_overlap_s=0.5)
    assert outside == [pytest.approx(10.0)]


def test_overlapping_windows_are_merged_before_the_speed_outside_them_is_taken() -> None:
    from tuner.metrics import OverlapWindow

    # 10 tok/s, except 1 tok/s in 2 .. 8 and in 12 .. 14; windows 2 .. 6 and 4 .. 8 overlap, 12 .. 14 apart.
    tokens = [
        *evenly(0.0, 2.0, 10),
        *evenly(3.0, 8.0, 1),
        *evenly(8.1, 12.0, 10),
        *evenly(13.0, 14.0, 1),
        *evenly(14.1, 20.0, 10),
    ]
    chat = stream("chat", 0.0, tokens)
    windows = [
        OverlapWindow(request_id="c", start_s=12.0, end_s=14.0, new_tokens=2000),
        OverlapWindow(request_id="b", start_s=4.0, end_s=8.0, new_tokens=2000),
        OverlapWindow(request_id="a", start_s=2.0, end_s=6.0, new_tokens=2000),
    ]
    inside, outside = stall_samples([chat], windows, min_overlap_s=0.5)
    assert inside == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0)]
    # Free: 20 s - 6 s - 2 s = 12 s with 20 + 40 + 60 tokens.
    assert outside == [pytest.approx(120 / 12, rel=1e-9)]


def _all_client_metrics() -> set[str]:
    from tuner.metrics import METRICS

    server_side = {name for name in METRICS if name.startswith("server_") or name == "stall_agreement"}
    return set(METRICS) - server_side - {"gpu_memory_peak_mib", "predicted_memory_mib"}


def test_every_client_metric_is_computed_under_its_documented_name() -> None:
    metrics = compute_metrics([stream("a", 0.0, [1.0, 2.0])], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert set(metrics) == _all_client_metrics()
    empty = compute_metrics([], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert set(empty) == _all_client_metrics()
    assert empty["output_tok_s"] is None and empty["itl_max_s"] is None and empty["failures"] == 0.0


def test_latency_percentiles_are_from_the_send_time_and_exact() -> None:
    records = [stream(f"r{i}", 10.0 + i, [12.0 + 2 * i, 12.5 + 2 * i + 0.1 * i]) for i in range(5)]
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    # time to first token 2, 3, 4, 5, 6 s; gaps 0.5, 0.6, 0.7, 0.8, 0.9 s
    assert metrics["ttft_p50_s"] == pytest.approx(4.0)
    assert metrics["ttft_p95_s"] == pytest.approx(5.8)
    assert metrics["ttft_p99_s"] == pytest.approx(5.96)
    assert metrics["itl_p95_s"] == pytest.approx(0.88)
    assert metrics["itl_max_s"] == pytest.approx(0.9)


def test_decode_speed_counts_two_token_streams_and_skips_streams_with_no_decode_time() -> None:
    records = [
        stream("pair", 0.0, [1.0, 1.5]),  # 2 tok/s
        stream("instant", 0.0, [1.0, 1.0]),  # both tokens at once: no decode time, left out
        stream("lagged", 0.0, [1.0, 1.0, 3.0]),  # 1 tok/s
        stream("stuck", 0.0, [1.0, 4.0, 4.0]),  # 2 tokens in 3 s
        stream("steady", 0.0, [0.0, 0.25, 0.5]),  # 4 tok/s
        stream("single", 0.0, [1.0]),
    ]
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["decode_tok_s"] == pytest.approx((1.0 + 2.0) / 2)  # the median of 2/3, 1, 2, 4


def test_prefill_speed_counts_only_long_prompts_the_server_timed() -> None:
    timed = stream("timed", 0.0, [10.0], prompt=2000, timings=ServerTimings(prompt_n=2000, prompt_ms=10_000.0))
    exact = stream("exact", 0.0, [10.0], prompt=1000, timings=ServerTimings(prompt_n=1000, prompt_ms=5000.0))
    untimed = stream("untimed", 0.0, [10.0], prompt=3000)
    zero = stream("zero", 0.0, [10.0], prompt=3000, timings=ServerTimings(prompt_n=3000, prompt_ms=0.0))
    short = stream("short", 0.0, [1.0], prompt=500, timings=ServerTimings(prompt_n=500, prompt_ms=5000.0))
    metrics = compute_metrics([timed, exact, untimed, zero, short], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["prefill_tok_s"] == pytest.approx(3000 / 15.0)
    quick = stream("quick", 0.0, [10.0], prompt=1000, timings=ServerTimings(prompt_n=1000, prompt_ms=0.5))
    metrics = compute_metrics([timed, quick], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["prefill_tok_s"] == pytest.approx(3000 / 10.0005)


def test_the_wait_before_prefill_is_never_negative_and_exact() -> None:
    records = [
        stream("a", 1.0, [1.5], timings=ServerTimings(prompt_n=100, prompt_ms=200.0)),  # waited 0.3 s
        stream("b", 1.0, [1.5], timings=ServerTimings(prompt_n=100, prompt_ms=800.0)),  # timings past send: 0
        stream("c", 1.0, [2.0], timings=ServerTimings(prompt_n=100, prompt_ms=250.0)),  # waited 0.75 s
    ]
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["wait_p95_s"] == pytest.approx(0.3 + 0.9 * 0.45)


def test_client_prefill_speed_counts_a_prompt_of_exactly_the_long_length_and_a_short_first_token() -> None:
    long = stream("long", 1.0, [1.5, 1.6], prompt=1000, timings=ServerTimings(prompt_n=1000, prompt_ms=400.0))
    metrics = compute_metrics([long], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["client_prefill_tok_s"] == pytest.approx(2000.0)


def test_output_speed_is_tokens_over_the_rounds_span_from_first_send_to_last_end() -> None:
    records = [stream("a", 10.0, [10.1, 10.2, 10.3]), stream("b", 10.2, [10.3, 10.4])]  # ends 10.31, 10.41
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["output_tok_s"] == pytest.approx(5 / 0.41)
    instant = RequestRecord(
        request_id="x", session="x", tag="chat", prompt_tokens=1, output_tokens_requested=1, send_s=3.0,
        end_s=3.0, status=RequestStatus.CONNECTION_ERROR,
    )  # fmt: skip
    assert compute_metrics([instant], long_prompt_tokens=1000, min_overlap_s=0.5)["output_tok_s"] is None


def test_refused_requests_are_counted_apart_and_in_failures() -> None:
    records = [
        stream("ok", 0.0, [1.0, 2.0]),
        stream("full", 0.0, [], status=RequestStatus.REJECTED),
        stream("full2", 0.0, [], status=RequestStatus.REJECTED),
        stream("slow", 0.0, [], status=RequestStatus.TIMEOUT),
        stream("broken", 0.0, [], status=RequestStatus.HTTP_ERROR),
    ]
    metrics = compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert (metrics["rejected"], metrics["failures"]) == (2.0, 4.0)


def test_the_wait_behind_a_long_prefill_adds_up_every_waiting_request_and_merges_windows() -> None:
    from tuner.metrics import _wait_share_behind

    untimed = stream("untimed", 0.0, [1.0])
    # "a" waits 0 .. 4 (first token 5, 1 s prompt); long prefills 1 .. 2 and 1.5 .. 3 cover 1 .. 3.
    a = stream("a", 0.0, [5.0], timings=ServerTimings(prompt_n=100, prompt_ms=1000.0))
    # "b" waits 10 .. 10.5, all of it behind the window 9 .. 11.
    b = stream("b", 10.0, [11.5], timings=ServerTimings(prompt_n=100, prompt_ms=1000.0))
    from tuner.metrics import OverlapWindow

    windows = [
        OverlapWindow(request_id="l1", start_s=1.0, end_s=2.0, new_tokens=2000),
        OverlapWindow(request_id="l2", start_s=1.5, end_s=3.0, new_tokens=2000),
        OverlapWindow(request_id="l3", start_s=9.0, end_s=11.0, new_tokens=2000),
    ]
    assert _wait_share_behind([untimed, a, b], windows) == pytest.approx((2.0 + 0.5) / (4.0 + 0.5))
    assert _wait_share_behind([b], windows) == pytest.approx(1.0)  # half a second of waiting is enough


def test_the_prompt_token_ratio_compares_the_servers_count_with_the_prompts_length() -> None:
    def ratio(*records: RequestRecord) -> float | None:
        return compute_metrics(list(records), long_prompt_tokens=1000, min_overlap_s=0.5)["prompt_token_ratio"]

    # llama-server: prompt_n counts the computed part, cache_n the rest.
    assert ratio(stream("a", 0.0, [1.0], prompt=1000, timings=ServerTimings(prompt_n=100, cache_n=900))) == 1.0
    # Ollama: prompt_n is the whole prompt as its tokenizer counted it.
    ollama = ServerTimings(prompt_n=1100, cache_n=900, prompt_n_includes_cached=True)
    assert ratio(stream("a", 0.0, [1.0], prompt=1000, timings=ollama)) == pytest.approx(1.1)
    # No timings, no count, or an empty prompt: nothing to compare, and none of them stops the others.
    skipped = [
        stream("none", 0.0, [1.0], prompt=1000),
        stream("zero", 0.0, [1.0], prompt=1000, timings=ServerTimings(prompt_n=0, cache_n=5)),
        stream("empty", 0.0, [1.0], prompt=0, timings=ServerTimings(prompt_n=3)),
    ]
    assert ratio(*skipped) is None
    one = stream("one", 0.0, [1.0], prompt=2, timings=ServerTimings(prompt_n=1, cache_n=0))
    assert ratio(*skipped, one) == pytest.approx(0.5)


STYLE = (("style", 1.0),)


def lora_stream(
    request_id: str, send: float, first: float, *, prompt_ms: float, lora: tuple[tuple[str, float], ...] = ()
) -> RequestRecord:
    """A request that waited from `send` until its prefill began, `prompt_ms` before its first token."""
    record = stream(request_id, send, [first, first + 0.5], timings=ServerTimings(prompt_n=100, prompt_ms=prompt_ms))
    return record.model_copy(update={"lora": lora})


def test_the_lora_wait_is_the_wait_while_a_request_with_another_setting_ran() -> None:
    from tuner.metrics import lora_metrics

    records = [
        # plain: waits 0 .. 1; "styled" (another setting) runs from 0.5: 0.5 s behind it.
        lora_stream("plain", 0.0, 2.0, prompt_ms=1000.0),
        # styled: waits 0.5 .. 4; "plain" runs until 2.51 and "plain2" 1 .. 3.51, merged: 0.5 .. 3.51.
        lora_stream("styled", 0.5, 5.0, prompt_ms=1000.0, lora=STYLE),
        lora_stream("plain2", 1.0, 3.0, prompt_ms=2000.0),  # waits 1 .. 1: no wait
        # styled2: waits 6 .. 7 with nothing else running: a wait, but not behind another setting.
        lora_stream("styled2", 6.0, 8.0, prompt_ms=1000.0, lora=STYLE),
    ]
    metrics = lora_metrics(records)
    # The waits behind another setting: plain 1 s, styled 3.5 s.
    assert metrics["lora_wait_p95_s"] == pytest.approx(1.0 + 0.95 * (3.5 - 1.0))
    assert metrics["lora_wait_share"] == pytest.approx((0.5 + 3.01) / (1.0 + 3.5 + 1.0))
    assert set(metrics) == {"lora_wait_p95_s", "lora_wait_share", "lora_switch_ms"}


def test_one_lora_setting_for_every_request_has_no_lora_metrics() -> None:
    from tuner.metrics import lora_metrics

    none = {"lora_wait_p95_s": None, "lora_wait_share": None, "lora_switch_ms": None}
    plain = [lora_stream("a", 0.0, 2.0, prompt_ms=500.0), lora_stream("b", 0.5, 3.0, prompt_ms=500.0)]
    assert lora_metrics(plain) == none
    styled = [r.model_copy(update={"lora": STYLE}) for r in plain]
    assert lora_metrics(styled) == none
    # Two settings but nobody waited: no share to give.
    quick = [lora_stream("a", 0.0, 0.5, prompt_ms=500.0), lora_stream("b", 1.0, 1.5, prompt_ms=500.0, lora=STYLE)]
    assert lora_metrics(quick)["lora_wait_share"] is None
    assert lora_metrics(quick)["lora_wait_p95_s"] is None


def test_a_short_lora_wait_counts_and_an_untimed_request_is_left_out() -> None:
    from tuner.metrics import lora_metrics

    # Left out as a waiter (no timings), and it runs only after the others are done.
    untimed = stream("untimed", 5.0, [9.0]).model_copy(update={"lora": STYLE})
    records = [
        untimed,
        lora_stream("plain", 0.0, 0.9, prompt_ms=500.0),  # waits 0 .. 0.4, "styled" runs from 0.2
        lora_stream("styled", 0.2, 0.6, prompt_ms=400.0, lora=STYLE),  # waits 0.2 .. 0.2: no wait
    ]
    metrics = lora_metrics(records)
    assert metrics["lora_wait_share"] == pytest.approx(0.2 / 0.4)
    assert metrics["lora_wait_p95_s"] == pytest.approx(0.4)


def _timed(request_id: str, start: float, n: int, ms: float, lora: tuple[tuple[str, float], ...]) -> RequestRecord:
    first = start + ms / 1000.0
    return stream(
        request_id, start, [first, first + 0.1], prompt=n, timings=ServerTimings(prompt_n=n, prompt_ms=ms)
    ).model_copy(update={"lora": lora})


def test_the_lora_switch_cost_compares_switched_prefills_with_steady_ones_of_their_length() -> None:
    from tuner.metrics import lora_metrics, lora_switch_cost

    # One at a time: a plain; b plain (steady, 2 ms/token); c styled (a switch: 50 ms over 2 ms/token);
    # d styled (steady, 110 tokens at 2 ms/token); e plain (a switch: 30 ms extra); f styled, one token (a
    # switch with no steady prefill of its length: not compared, rather than read against 100-token ones).
    records = [
        _timed("e", 4.0, 100, 230.0, ()),
        _timed("c", 2.0, 100, 250.0, STYLE),
        _timed("a", 0.0, 100, 200.0, ()),
        _timed("f", 5.0, 1, 62.0, STYLE),
        _timed("d", 3.0, 110, 220.0, STYLE),
        _timed("b", 1.0, 100, 200.0, ()),
        # Without timings, or without a token count, neither counts in the order of prefills.
        stream("untimed", 2.5, [2.6]),
        stream("uncounted", 2.4, [2.55], timings=ServerTimings(prompt_n=0, prompt_ms=50.0)).model_copy(
            update={"lora": STYLE}
        ),
    ]
    cost = lora_switch_cost(records)
    assert (cost.switches, cost.compared, cost.steady) == (3, 2, 2)
    assert cost.ms == pytest.approx(40.0) and cost.reason is None
    assert lora_metrics(records)["lora_switch_ms"] == pytest.approx(40.0)


def test_a_switch_cost_is_never_negative_and_absent_with_its_reason_where_the_data_cannot_give_it() -> None:
    from tuner.metrics import lora_switch_cost

    # The demo's case: short steady prefills (5 ms/token, a step's fixed cost spread over few tokens) and
    # long prefills after a switch (2 ms/token). Read per token, the switches would cost -900 ms each.
    records = [
        _timed("short-1", 0.0, 10, 50.0, ()),
        _timed("short-2", 1.0, 10, 50.0, ()),
        _timed("long-1", 2.0, 300, 600.0, STYLE),
        _timed("short-3", 3.0, 10, 50.0, STYLE),
        _timed("long-2", 4.0, 300, 600.0, ()),
    ]
    cost = lora_switch_cost(records)
    assert cost.ms is None and cost.switches == 2
    assert cost.reason is not None and "within 25% of the length" in cost.reason
    # A switched prefill faster than the steady ones of its length: no cost, never a negative one.
    faster = [_timed("a", 0.0, 100, 200.0, ()), _timed("b", 1.0, 100, 200.0, ()), _timed("c", 2.0, 100, 150.0, STYLE)]
    assert lora_switch_cost(faster).ms == 0.0
    # No steady pair, and no switch at all: absent, each with its reason.
    alone = lora_switch_cost([_timed("a", 0.0, 100, 100.0, ()), _timed("b", 1.0, 100, 100.0, STYLE)])
    assert alone.ms is None
    assert alone.reason == "no prefill ran right after one with the same adapter setting, to compare with"
    same = lora_switch_cost([_timed("a", 0.0, 100, 100.0, ()), _timed("b", 1.0, 100, 100.0, ())])
    assert same.ms is None and same.reason == "the adapter setting never changed"
    # A switched prefill that shared its steps with another prompt is not compared.
    shared = [
        _timed("a", 0.0, 100, 200.0, ()),
        _timed("b", 1.0, 100, 200.0, ()),
        _timed("c", 2.0, 100, 400.0, STYLE),
        _timed("d", 2.1, 100, 400.0, ()),
    ]
    assert lora_switch_cost(shared).compared == 0


def _task(
    task: int,
    *,
    release_s: float,
    prompt_ms: float,
    eval_ms: float,
    prompt_n: int | None = 100,
    samples: tuple[tuple[float, float], ...] = (),
    launch_s: float | None = None,
    selection: str | None = None,
    evictions: int = 0,
) -> TaskTimeline:
    return TaskTimeline(
        task=task,
        slot=task,
        launch_s=launch_s,
        release_s=release_s,
        prompt_ms=prompt_ms,
        prompt_n=prompt_n,
        eval_ms=eval_ms,
        rate_samples=[TokenRateSample(at_s=at, n_gen=0, tg=0.0, tg_3s=rate) for at, rate in samples],
        slot_selection=selection,
        prompt_cache_evictions=evictions,
    )


def test_the_servers_stall_speed_is_its_samples_inside_another_tasks_long_prefill() -> None:
    from tuner.metrics import server_metrics

    # Task 1 prefills 2,000 tokens from 10 to 20 (released at 22 after 2 s of decoding).
    long = _task(
        1, release_s=22.0, prompt_ms=10_000.0, eval_ms=2000.0, prompt_n=2000, samples=((11.0, 99.0), (19.0, 98.0))
    )
    # Task 2's samples: 9.95 .. 12 inside (within the 0.1 s tolerance), 12 .. 15 inside, 15 .. 15.4 too
    # short, 15.4 .. 20.05 inside (tolerance), 20.05 .. 23 outside.
    chat = _task(
        2,
        release_s=30.0,
        prompt_ms=100.0,
        eval_ms=20_000.0,
        samples=((9.95, 0.0), (12.0, 1.0), (15.0, 2.0), (15.4, 50.0), (20.05, 4.0), (23.0, 30.0)),
    )
    # A 999-token prompt is not a long prefill: task 3's window 0 .. 9 opens nothing.
    short = _task(3, release_s=10.0, prompt_ms=9000.0, eval_ms=1000.0, prompt_n=999)
    early = _task(4, release_s=30.0, prompt_ms=100.0, eval_ms=29_000.0, samples=((2.0, 70.0), (8.0, 80.0)))
    metrics = server_metrics([long, chat, short, early], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["server_stall_tok_s"] == pytest.approx(2.0)  # median of 1, 2, 4; not its own 98
    window_exactly = _task(5, release_s=30.0, prompt_ms=1.0, eval_ms=1.0, samples=((9.9, 0.0), (20.1, 7.0)))
    metrics = server_metrics([long, window_exactly], long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics["server_stall_tok_s"] == pytest.approx(7.0)
    # A sample interval of exactly the minimum counts; a shorter one does not.
    exact = _task(6, release_s=30.0, prompt_ms=1.0, eval_ms=1.0, samples=((12.0, 0.0), (12.5, 5.0)))
    assert server_metrics([long, exact], long_prompt_tokens=1000, min_overlap_s=0.5)["server_stall_tok_s"] == 5.0
    short_sample = _task(6, release_s=30.0, prompt_ms=1.0, eval_ms=1.0, samples=((12.0, 0.0), (12.4, 5.0)))
    assert (
        server_metrics([long, short_sample], long_prompt_tokens=1000, min_overlap_s=0.5)["server_stall_tok_s"] is None
    )
    # A task whose prompt length the log did not give opens no window.
    uncounted = _task(1, release_s=22.0, prompt_ms=10_000.0, eval_ms=2000.0, prompt_n=None)
    assert server_metrics([uncounted, exact], long_prompt_tokens=1000, min_overlap_s=0.5)["server_stall_tok_s"] is None


def test_the_server_side_waits_slot_reuse_and_evictions() -> None:
    from tuner.metrics import server_metrics

    tasks = [
        _task(
            1, launch_s=0.0, release_s=5.0, prompt_ms=1000.0, eval_ms=2000.0, selection="LCP", evictions=2
        ),  # 5 s, 3 computed
        _task(
            2, launch_s=1.0, release_s=4.0, prompt_ms=500.0, eval_ms=500.0, selection="LRU"
        ),  # 3 s in the slot, 1 s computed
        _task(
            3, launch_s=2.0, release_s=9.0, prompt_ms=1000.0, eval_ms=1000.0, selection="LCP", evictions=1
        ),  # 7 s, 2 computed
        _task(4, release_s=9.0, prompt_ms=1000.0, eval_ms=1000.0),  # no launch time, no selection
    ]
    metrics = server_metrics(tasks, long_prompt_tokens=1000, min_overlap_s=0.5)
    assert metrics == {
        "server_stall_tok_s": None,
        "server_wait_max_s": pytest.approx(5.0),
        "server_prefix_reuse_share": pytest.approx(2 / 3),
        "server_prompt_cache_evictions": 3.0,
    }
    assert server_metrics([], long_prompt_tokens=1000, min_overlap_s=0.5) == {
        "server_stall_tok_s": None,
        "server_wait_max_s": None,
        "server_prefix_reuse_share": None,
        "server_prompt_cache_evictions": 0.0,
    }


def test_requests_are_joined_to_tasks_by_shape_in_send_and_launch_order() -> None:
    from tuner.metrics import join_server_tasks

    def task(number: int, prompt: int, generated: int) -> TaskTimeline:
        # The slot holds prompt + generated - 1 tokens at release.
        return TaskTimeline(task=number, slot=0, eval_n=generated, n_tokens_at_release=prompt + generated - 1)

    first = stream("first", 1.0, [2.0, 2.1], prompt=100)
    second = stream("second", 2.0, [3.0, 3.1], prompt=100)
    other = stream("other", 0.5, [1.0, 1.1, 1.2], prompt=300)
    unmatched = stream("unmatched", 0.1, [1.0], prompt=999)
    tasks = [task(10, 300, 2), task(11, 100, 2), task(12, 300, 3), task(13, 100, 2)]
    pairs = join_server_tasks([second, unmatched, first, other], tasks)
    assert [(record.request_id, t.task) for record, t in pairs] == [("other", 12), ("first", 11), ("second", 13)]


def test_the_slo_line_is_held_at_exactly_its_bounds() -> None:
    from tuner.config import SloSpec

    records = [stream(f"r{i}", 0.0, [2.0, 2.5]) for i in range(20)]  # first token at 2 s, then 2 tok/s
    slo = SloSpec(ttft_p95_s=2.0, decode_tok_s=2.0, min_requests=20)
    assert compute_metrics(records, long_prompt_tokens=1000, min_overlap_s=0.5, slo=slo)["slo_pass"] == 1.0


def test_a_server_prompt_of_exactly_the_long_length_opens_a_window_and_an_unknown_one_never_does() -> None:
    from tuner.metrics import server_metrics

    chat = _task(2, release_s=30.0, prompt_ms=1.0, eval_ms=1.0, samples=((12.0, 0.0), (15.0, 3.0)))
    exact = _task(1, release_s=22.0, prompt_ms=10_000.0, eval_ms=2000.0, prompt_n=1000)
    assert server_metrics([exact, chat], long_prompt_tokens=1000, min_overlap_s=0.5)["server_stall_tok_s"] == 3.0
    uncounted = _task(1, release_s=22.0, prompt_ms=10_000.0, eval_ms=2000.0, prompt_n=None)
    assert server_metrics([uncounted, chat], long_prompt_tokens=1, min_overlap_s=0.5)["server_stall_tok_s"] is None


# ---- the load generator's own lateness -------------------------------------------------------------


def scheduled(request_id: str, due: float | None, sent: float) -> RequestRecord:
    """A request the schedule had sent at `due` (None: a record made before 0.2), sent at `sent`."""
    return stream(request_id, sent, [sent + 0.5]).model_copy(update={"due_s": due})


def test_the_send_lag_is_how_late_requests_left_against_their_schedule_and_never_negative() -> None:
    from tuner.metrics import send_lag

    # Lags: on time 0; 0.5 s late; sent 0.25 s early counts as 0; no schedule: left out. Sorted 0, 0, 0.5:
    # the 99th percentile lies 0.98 of the way from the second to the third, 0.98 * 0.5 = 0.49.
    records = [scheduled("a", 1.0, 1.0), scheduled("b", 2.0, 2.5), scheduled("c", 3.0, 2.75), scheduled("d", None, 4.0)]
    assert send_lag(records) == {"send_lag_p99_s": pytest.approx(0.49), "send_lag_max_s": 0.5}
    assert send_lag(records[3:]) == {"send_lag_p99_s": None, "send_lag_max_s": None}


def on_time(count: int) -> list[RequestRecord]:
    return [scheduled(f"r{i}", 2.0 + i, 2.0 + i) for i in range(count)]


def test_one_late_request_in_a_hundred_is_not_falling_behind() -> None:
    from tuner.metrics import fell_behind

    # One request 0.25 s late and one exactly 10 ms late (not more than 10 ms: on time) of 100: one late,
    # within the 1 in 100 allowed.
    records = [scheduled("late", 1.0, 1.25), scheduled("edge", 0.0, 0.01), *on_time(98)]
    assert fell_behind(records) is None


def test_two_late_requests_in_a_hundred_are_falling_behind_and_the_user_is_told_by_how_much_and_what_to_do() -> None:
    from tuner.metrics import fell_behind

    # 0.25 s and 0.5 s late, 98 on time, and one without a schedule that is not counted: 2 of 100.
    records = [scheduled("late", 1.0, 1.25), scheduled("later", 1.5, 2.0), *on_time(98), scheduled("old", None, 9.0)]
    assert fell_behind(records) == (
        "the load generator fell behind the workload's schedule: 2 of 100 requests were sent more than 10 ms late "
        "(the latest by 0.500 s), so the server saw less load than the trace holds; run serve-tuner on a less busy "
        "machine, or replay the trace less compressed (a larger workload.time_scale)"
    )


# ---- the LoRA switch cost: which setting ran just before a prefill ---------------------------------


def _served(
    request_id: str,
    lora: tuple[tuple[str, float], ...],
    *,
    began: float,
    ms: float,
    later: tuple[float, ...] = (),
    n: int = 100,
) -> RequestRecord:
    """An `n`-token prompt whose prefill began at `began` and took `ms`; its first token then, `later` after."""
    first = began + ms / 1000.0
    timings = ServerTimings(prompt_n=n, prompt_ms=ms)
    return stream(request_id, began, [first, *later], timings=timings).model_copy(update={"lora": lora})


SHARED_ALL = "every prefill after a change of adapter setting shared its steps with another prompt"


def test_a_prefill_that_begins_while_another_request_decodes_takes_that_requests_setting() -> None:
    from tuner.metrics import lora_switch_cost

    # b (styled) follows plain a: a switch, 375 ms. c (styled) begins at 4.0 while b still decodes (until
    # 9.0): steady, 250 ms for 100 tokens, though the last request to finish, a, was plain. Cost 375 - 250.
    records = [
        _served("a", (), began=0.0, ms=250.0, later=(0.5,)),
        _served("b", STYLE, began=1.0, ms=375.0, later=(1.5, 9.0)),
        _served("c", STYLE, began=4.0, ms=250.0, later=(4.5,)),
    ]
    cost = lora_switch_cost(records)
    assert (cost.ms, cost.switches, cost.compared, cost.steady) == (125.0, 1, 1, 1)


def test_a_prefill_that_begins_as_the_previous_one_ends_does_not_share_its_steps() -> None:
    from tuner.metrics import lora_switch_cost

    # b's prefill begins at 1.25, the instant a's first token ends a's: both steady and alone (250 ms for 100
    # tokens each); c, styled after plain b, is the switch: 375 - 250 ms.
    records = [
        _served("p", (), began=0.0, ms=250.0, later=(0.5,)),
        _served("a", (), began=1.0, ms=250.0, later=(1.5,)),
        _served("b", (), began=1.25, ms=250.0, later=(1.75,)),
        _served("c", STYLE, began=2.0, ms=375.0, later=(2.5,)),
    ]
    cost = lora_switch_cost(records)
    assert (cost.ms, cost.switches, cost.compared, cost.steady) == (125.0, 1, 1, 2)


def test_requests_answered_with_a_single_token_are_measured_like_any_other() -> None:
    from tuner.metrics import lora_switch_cost

    # One at a time, one token each: b and d steady (250 ms), c the switch (375 ms): 125 ms.
    records = [
        _served("a", (), began=0.0, ms=250.0),
        _served("b", (), began=1.0, ms=250.0),
        _served("c", STYLE, began=2.0, ms=375.0),
        _served("d", STYLE, began=3.0, ms=250.0),
    ]
    cost = lora_switch_cost(records)
    assert (cost.ms, cost.switches, cost.compared, cost.steady) == (125.0, 1, 1, 2)


def test_prefills_that_begin_at_the_same_moment_are_not_switches_from_each_other() -> None:
    from tuner.metrics import lora_switch_cost

    # After styled p, plain d and styled e begin together at 1.0: d is a switch (from p), e is not; both
    # shared their steps, so nothing is compared.
    records = [
        _served("p", STYLE, began=0.0, ms=250.0, later=(0.5,)),
        _served("d", (), began=1.0, ms=250.0, later=(1.5,)),
        _served("e", STYLE, began=1.0, ms=250.0, later=(1.5,)),
    ]
    cost = lora_switch_cost(records)
    assert (cost.ms, cost.reason, cost.switches, cost.compared, cost.steady) == (None, SHARED_ALL, 1, 0, 0)


def test_only_a_request_begun_over_a_millisecond_before_a_prefill_and_not_done_by_then_was_running() -> None:
    from tuner.metrics import lora_switch_cost

    # Styled o began 1.999, exactly 1 ms before plain r (2.0): the same moment, so o was not running
    # before r; r follows p, plain: steady. o follows p: the one switch.
    began_with = [
        _served("p", (), began=0.0, ms=250.0, later=(0.5,)),
        _served("o", STYLE, began=1.999, ms=250.0, later=(5.0,)),
        _served("r", (), began=2.0, ms=1000.0, later=(3.5,)),
    ]
    assert lora_switch_cost(began_with).switches == 1
    # Plain o1 ended at 1.999, exactly 1 ms before plain r began: only styled o2 still ran, so r is a
    # switch, as o1 was (it began while o2 ran).
    ended_before = [
        _served("o2", STYLE, began=0.0, ms=250.0, later=(5.0,)),
        _served("o1", (), began=1.0, ms=250.0, later=(1.999,)),
        _served("r", (), began=2.0, ms=250.0, later=(2.5,)),
    ]
    assert lora_switch_cost(ended_before).switches == 2


def test_a_request_done_within_a_millisecond_of_a_prefills_start_ran_just_before_it() -> None:
    from tuner.metrics import lora_switch_cost

    # Plain q (one token, 1 ms) began with plain r at 2.0 and ended at 2.001, the same moment: it is the
    # last request before r, so r is steady; q itself follows styled p: the one switch.
    records = [
        _served("p", STYLE, began=0.0, ms=250.0, later=(0.5,)),
        _served("q", (), began=2.0, ms=1.0, n=1),
        _served("r", (), began=2.0, ms=250.0, later=(2.5,)),
    ]
    assert lora_switch_cost(records).switches == 1


def test_a_request_the_server_gave_no_prompt_token_count_is_not_in_the_order_of_prefills() -> None:
    from tuner.metrics import lora_switch_cost

    # The styled request between plain a and plain b has no count: b follows a, and nothing changed.
    uncounted = stream("styled", 0.75, [1.0, 1.5], timings=ServerTimings(prompt_ms=250.0))
    records = [
        _served("a", (), began=0.0, ms=250.0, later=(0.5,)),
        uncounted.model_copy(update={"lora": STYLE}),
        _served("b", (), began=2.0, ms=250.0, later=(2.5,)),
    ]
    cost = lora_switch_cost(records)
    assert (cost.ms, cost.reason, cost.switches) == (None, "the adapter setting never changed", 0)


# ---- the switch cost from prefill steps -------------------------------------------------------------


def test_a_steady_prefill_a_quarter_longer_is_compared_and_one_token_prefills_count() -> None:
    from tuner.metrics import PrefillStep, switch_cost

    def step(n: int, ms: float, after_switch: bool) -> PrefillStep:
        return PrefillStep(prompt_n=n, prompt_ms=ms, after_switch=after_switch, shared=False)

    steps = [
        step(100, 250.0, True),  # against the 125-token steady one (25% longer, 2 ms/token): 250 - 200 = 50
        step(125, 250.0, False),
        step(1, 3.0, True),  # against the one-token steady one (1 ms/token): 3 - 1 = 2
        step(1, 1.0, False),
        step(100, 0.0, False),  # no time given: left out
        step(0, 5.0, False),  # no token computed: left out
    ]
    cost = switch_cost(steps)
    # The median of 50 and 2.
    assert (cost.ms, cost.switches, cost.compared, cost.steady) == (26.0, 2, 2, 2)
