"""`tuner diagnose` paths the simulated server's logs do not reach, on lines written here in the real
server's formats (docs: the shared serving-engines reference, §1.5): prompt-cache evictions, every slot
busy, truncation and context shift; and vLLM's `/metrics` scrape, recorded (tests/data/transcripts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuner.diagnose import diagnose_log
from tuner.diagnose.vllm import read_metrics_scrape

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = ROOT / "tests" / "data" / "transcripts"


def stamp(at: float) -> str:
    """llama-server's `M.SS.mmm.uuu` prefix: minutes.seconds.milliseconds.microseconds since its start."""
    micros = round(at * 1_000_000)
    return f"{micros // 60_000_000}.{micros // 1_000_000 % 60:02d}.{micros // 1000 % 1000:03d}.{micros % 1000:03d}"


class Log:
    """A llama-server log, line by line, as this build writes it at the default verbosity."""

    def __init__(self, slots: int, ctx: int = 4096) -> None:
        self.entries: list[tuple[float, str]] = []
        self.add(0.0, "I", "srv  llama_server: initializing ...")
        self.add(
            0.3, "I", f"srv    load_model: initializing, n_slots = {slots}, n_ctx_slot = {ctx}, kv_unified = 'false'"
        )
        self.add(0.31, "I", "srv  llama_server: model loaded")

    def add(self, at: float, level: str, text: str) -> None:
        self.entries.append((at, f"{stamp(at)} {level} {text}"))

    @property
    def lines(self) -> list[str]:
        """In time order, as the server wrote them (lines of one instant in the order they were added)."""
        return [line for _, line in sorted(self.entries, key=lambda entry: entry[0])]

    def task(
        self,
        task: int,
        slot: int,
        *,
        launch: float,
        prompt: int,
        prompt_ms: float,
        wait_s: float = 0.0,
        output: int = 8,
        eval_ms: float = 200.0,
        cached: int = 0,
        truncated: bool = False,
        shift_at: float | None = None,
    ) -> float:
        """One task's lines; returns its release time."""
        self.add(launch - 0.0001, "I", f"slot get_availabl: id  {slot} | task -1 | selected slot by LRU, t_last = -1")
        self.add(launch, "I", f"slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0")
        release = launch + wait_s + prompt_ms / 1000 + eval_ms / 1000
        if shift_at is not None:
            self.add(
                shift_at,
                "W",
                f"slot   operator(): id  {slot} | task {task} | slot context shift, n_keep = 0, n_left = 4095, "
                "n_discard = 2047",
            )
        self.add(
            release,
            "I",
            f"slot print_timing: id  {slot} | task {task} | prompt eval time =  {prompt_ms:9.2f} ms / {prompt:5d} "
            f"tokens (    1.00 ms per token,  1000.00 tokens per second)",
        )
        self.add(
            release,
            "I",
            f"slot print_timing: id  {slot} | task {task} |        eval time =  {eval_ms:9.2f} ms / {output:5d} "
            "tokens (   25.00 ms per token,    40.00 tokens per second)",
        )
        n_tokens = cached + prompt + output - 1
        self.add(
            release + 0.0001,
            "I",
            f"slot      release: id  {slot} | task {task} | stop processing: n_tokens = {n_tokens}, "
            f"truncated = {int(truncated)}",
        )
        return release + 0.0001

    def evict(self, at: float) -> None:
        self.add(
            at,
            "W",
            "srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 7.031 MiB)",
        )


def figures(finding: object) -> dict[str, float | None]:
    return {f.name: f.value for f in finding.figures}  # type: ignore[attr-defined]


def test_every_slot_busy_counts_the_requests_launched_as_a_slot_freed_and_for_how_long() -> None:
    log = Log(slots=1)
    free = log.task(1, 0, launch=1.0, prompt=300, prompt_ms=1500)  # busy 1.0 .. 2.7
    free = log.task(2, 0, launch=free + 0.002, prompt=300, prompt_ms=1500)  # launched in the same iteration
    free = log.task(3, 0, launch=free + 0.002, prompt=300, prompt_ms=1500)
    log.task(4, 0, launch=free + 2.0, prompt=300, prompt_ms=1500)  # came later: the slot was free
    diagnosis = diagnose_log(log.lines)
    queueing = diagnosis.finding("queueing")
    assert queueing is not None
    by_name = figures(queueing)
    assert by_name["queued"] == 2 and by_name["slots"] == 1
    # The one slot was busy from task 1's launch to task 3's release, and during task 4.
    assert by_name["all_slots_busy_s"] == pytest.approx(3 * 1.7 + 1.7, abs=0.01)
    assert [e.tasks for e in queueing.evidence] == [[2], [3]]
    assert queueing.fixes[0].knob == "n_parallel"
    assert "2 requests waited for a free slot" in queueing.summary


def test_a_slot_freed_with_another_slot_idle_is_no_queueing() -> None:
    log = Log(slots=2)
    free = log.task(1, 0, launch=1.0, prompt=300, prompt_ms=1500)
    log.task(2, 0, launch=free + 0.002, prompt=300, prompt_ms=1500)  # slot 1 was idle: it had no wait
    assert diagnose_log(log.lines).finding("queueing") is None


def test_prompt_cache_evictions_are_counted_and_a_returning_conversation_prefilled_again_is_named() -> None:
    log = Log(slots=1)
    free = log.task(1, 0, launch=1.0, prompt=1200, prompt_ms=3000)
    log.evict(free + 1.0)
    log.evict(free + 1.5)
    # The conversation returns: nothing of it cached after the evictions.
    log.task(2, 0, launch=free + 2.0, prompt=1300, prompt_ms=3200)
    diagnosis = diagnose_log(log.lines)
    sources = diagnosis.finding("long_prefills")
    assert sources is not None
    by_name = figures(sources)
    assert by_name["prompt_cache_evictions"] == 2
    assert by_name["first_turn_count"] == 1 and by_name["after_evictions_count"] == 1
    assert by_name["after_evictions_tokens"] == 1300
    assert "evicted 2 entries" in sources.summary
    (fix,) = sources.fixes
    assert fix.knob == "cache_ram" and "2 evictions" in fix.action


def test_truncated_prompts_and_context_shifts_are_their_own_source_with_the_context_fix() -> None:
    log = Log(slots=2, ctx=2048)
    log.task(1, 0, launch=1.0, prompt=2048, prompt_ms=4000, truncated=True)
    log.task(2, 1, launch=1.5, prompt=1500, prompt_ms=3000, output=900, eval_ms=9000, shift_at=8.0)
    log.task(3, 0, launch=20.0, prompt=1100, prompt_ms=2000)  # a long first turn, neither cut
    diagnosis = diagnose_log(log.lines)
    sources = diagnosis.finding("long_prefills")
    assert sources is not None
    by_name = figures(sources)
    assert by_name["truncated_count"] == 2 and by_name["truncated_tokens"] == 2048 + 1500
    assert by_name["first_turn_count"] == 1
    assert [f.knob for f in sources.fixes] == ["kv_unified"]
    # A short prompt cut, alone: no long prefill, so no finding of where long prefills come from.
    short = Log(slots=1, ctx=512)
    short.task(1, 0, launch=1.0, prompt=512, prompt_ms=500, truncated=True)
    assert diagnose_log(short.lines).finding("long_prefills") is None  # no long prefill: nothing to say of sources


def test_a_vllm_metrics_scrape_is_read_per_series_summed_over_labels_and_timestamps_are_not_values() -> None:
    recorded = read_metrics_scrape((TRANSCRIPTS / "vllm-metrics-after.txt").read_text().splitlines())
    assert recorded["vllm:num_preemptions_total"] == 7
    assert recorded["vllm:request_queue_time_seconds_sum"] == 6.0
    assert recorded["vllm:request_queue_time_seconds_count"] == 70
    assert recorded["vllm:num_requests_waiting"] == 2
    cpu = read_metrics_scrape((TRANSCRIPTS / "vllm-cpu-metrics-after.txt").read_text().splitlines())
    # The waiting gauge by reason is its own series; the plain gauge is not their sum.
    assert cpu["vllm:num_requests_waiting"] == 0.0
    assert "vllm:num_requests_waiting_by_reason" in cpu
    text = [
        "# TYPE vllm:num_preemptions_total counter",
        'vllm:num_preemptions_total{engine="0",model_name="a b"} 3 1700000000000',
        'vllm:num_preemptions_total{engine="1",model_name="x}y"} 4',
        "vllm:kv_cache_usage_perc NaN",
        "not a metric line",
    ]
    assert read_metrics_scrape(text) == {"vllm:num_preemptions_total": 7.0}


def vllm_stats(waiting: int, count: int = 12) -> list[str]:
    return [
        f"INFO 11-29 10:00:{10 * i:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 500.0 tokens/s, Avg "
        f"generation throughput: 90.0 tokens/s, Running: 4 reqs, Waiting: {waiting if i % 2 else 0} reqs, GPU KV "
        "cache usage: 50.0%, Prefix cache hit rate: 10.0%"
        for i in range(count // 2)
    ]


def test_the_scrape_adds_the_mean_queue_time_and_preemptions_the_stats_lines_did_not_show(tmp_path: Path) -> None:
    stats = tmp_path / "vllm.log"
    stats.write_text("\n".join(vllm_stats(waiting=2)) + "\n")
    without = diagnose_log(stats)
    assert without.finding("vllm_kv_pressure") is None
    assert any("--metrics FILE" in note for note in without.notes)
    diagnosis = diagnose_log(stats, metrics_scrape=TRANSCRIPTS / "vllm-metrics-after.txt")
    queueing = diagnosis.finding("vllm_queueing")
    assert queueing is not None and figures(queueing)["queue_time_mean_s"] == pytest.approx(6.0 / 70)
    pressure = diagnosis.finding("vllm_kv_pressure")
    assert pressure is not None and figures(pressure)["preemptions"] == 7
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "diagnose",
            str(stats),
            "--metrics",
            str(TRANSCRIPTS / "vllm-metrics-after.txt"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "7 preemptions" in done.stdout and "mean queue time" in done.stdout


def test_a_streams_tokens_across_a_long_prefills_end_are_counted_one_per_logged_iteration() -> None:
    """A stream at 33 tok/s, then beside a 2,000-token prefill in 32 iterations of 0.25 s (one token each),
    then at 50 tok/s: its rate line before the prefill's end and the one after it straddle the end, and the
    usual speed would count 25 of that stretch's tokens inside the prefill where 8 were."""
    log = Log(slots=2)
    head = "slot print_timing: id  0 | task 1 |"
    log.add(0.9999, "I", "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1")
    log.add(1.0, "I", "slot launch_slot_: id  0 | task 1 | processing task, is_child = 0")
    # Decoding from 1.1 s: 33 tok/s until the long prompt's prefill starts at 7.5 s (n = 212 there), one token
    # per iteration until it ends at 15.5 s (n = 244), then 50 tok/s.
    for at, n, rate in ((4.1, 100, 33.0), (7.1, 199, 33.0), (10.5, 224, 3.5), (13.5, 236, 4.0), (16.5, 294, 19.3)):
        log.add(at, "I", f"{head} n_gen = {n:6d}, tg = {rate:6.2f} t/s, tg_3s = {rate:6.2f} t/s")
    log.add(
        17.0,
        "I",
        f"{head} prompt eval time =     100.00 ms /    40 tokens (    2.50 ms per token,   400.00 tokens per second)",
    )
    log.add(
        17.0,
        "I",
        f"{head}        eval time =   15900.00 ms /   319 tokens (   49.84 ms per token,    20.06 tokens per second)",
    )
    log.add(17.0001, "I", "slot      release: id  0 | task 1 | stop processing: n_tokens = 358, truncated = 0")
    long_head = "slot print_timing: id  1 | task 2 |"
    log.add(7.4999, "I", "slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1")
    log.add(7.5, "I", "slot launch_slot_: id  1 | task 2 | processing task, is_child = 0")
    for k in range(12, 32):  # progress lines once the prefill has run 3 s, one per iteration of 62 tokens
        at = 7.5 + 0.25 * k
        log.add(
            at,
            "I",
            f"{long_head} prompt processing, n_tokens = {62 * k:6d}, progress = {k / 32:.2f}, "
            f"t = {0.25 * k:6.2f} s / 248.00 tokens per second",
        )
    log.add(
        15.6,
        "I",
        f"{long_head} prompt eval time =    8000.00 ms /  2000 tokens (4.00 ms per token, 250.00 tokens per second)",
    )
    log.add(
        15.6,
        "I",
        f"{long_head}        eval time =     100.00 ms /     4 tokens (25.00 ms per token, 40.00 tokens per second)",
    )
    log.add(15.6001, "I", "slot      release: id  1 | task 2 | stop processing: n_tokens = 2003, truncated = 0")
    stall = diagnose_log(log.lines).finding("stalls")
    assert stall is not None
    # 12 tokens from 7.5 s to 10.5 s (the usual speed's share of the stretch before it), 12, and 8: 32 in 8 s.
    assert figures(stall)["stall_tok_s"] == pytest.approx(32 / 8, rel=0.05)


def test_a_streams_tokens_in_a_prefill_whose_iterations_slow_down_are_its_logged_iterations() -> None:
    """A 2,000-token prefill in 32 iterations: 12 of 0.25 s before its progress lines begin, then 20 of 0.4 s
    (later batches attend over more context). In the stretch that crosses its end, the stream's tokens are
    the iterations the log shows there (4); counted from where the lines begin, less the first iterations'
    length times the time to the stretch, they would come out below zero."""
    log = Log(slots=2)
    # The stream: decoding from 1.1 s at 33 tok/s to the prefill's start at 7.5 s (n = 212), one token per
    # iteration to its end at 18.5 s (n = 244), then 50 tok/s; the rate lines after 10.5 s fall on
    # iteration ends.
    log.task(1, 0, launch=1.0, prompt=40, prompt_ms=100, output=369, eval_ms=19_900)
    lines = ((4.1, 100, 33.0), (7.1, 199, 33.0), (10.5, 224, 3.5), (13.7, 232, 2.5), (16.9, 240, 2.5))
    for at, n, rate in (*lines, (19.9, 314, 24.7)):
        log.add(
            at,
            "I",
            f"slot print_timing: id  0 | task 1 | n_gen = {n:6d}, tg = {rate:6.2f} t/s, tg_3s = {rate:6.2f} t/s",
        )
    # The long prompt: prefilled from 7.5 s to 18.5 s, progress lines from its 12th iteration's end (3 s in).
    log.task(2, 1, launch=7.5, prompt=2000, prompt_ms=11_000, output=4, eval_ms=100)
    for k in range(12, 32):
        at = 10.5 + 0.4 * (k - 12)
        log.add(
            at,
            "I",
            f"slot print_timing: id  1 | task 2 | prompt processing, n_tokens = {62 * k:6d}, progress = {k / 32:.2f}, "
            f"t = {at - 7.5:6.2f} s / {62 * k / (at - 7.5):.2f} tokens per second",
        )
    stall = diagnose_log(log.lines).finding("stalls")
    assert stall is not None
    # 12 tokens in the unlogged 3 s, then 8, 8 and 4 logged iterations: 32 in 11 s.
    assert figures(stall)["stall_tok_s"] == pytest.approx(32 / 11, rel=0.05)


def test_streams_that_keep_most_of_their_speed_beside_a_long_prefill_are_no_finding() -> None:
    """A long prompt prefilled beside a stream whose rate lines show it kept its 40 tok/s: no stall."""
    log = Log(slots=2)
    log.task(1, 0, launch=0.5, prompt=40, prompt_ms=40, output=400, eval_ms=10_000)
    for k in range(1, 10):
        log.add(
            0.54 + k,
            "I",
            f"slot print_timing: id  0 | task 1 | n_gen = {1 + 40 * k:6d}, tg =  40.00 t/s, tg_3s =  40.00 t/s",
        )
    log.task(2, 1, launch=3.0, prompt=2000, prompt_ms=4000, output=4, eval_ms=200)
    diagnosis = diagnose_log(log.lines, long_prompt_tokens=1000)
    assert diagnosis.finding("stalls") is None, diagnosis.findings


def short_log_beside_a_two_batch_prefill(*, solo: bool, long_output: int = 4) -> Log:
    """A short log as a new user's first try makes one (issue 28): a request alone, then a stream of 120
    tokens beside a 3,000-token prompt prefilled at n_batch 2048 in two iterations, 3 s to 36 s. The first
    ends at 25 s, past the progress lines' delay, so one line shows it; the second ends where decoding starts.
    The stream decodes at 40 tok/s before and after, and gets one token per iteration in between (2 in 33 s);
    its only rate line (at 100 tokens) comes after the prefill."""
    log = Log(slots=2)
    if solo:
        log.task(0, 0, launch=0.2, prompt=40, prompt_ms=100, output=60, eval_ms=1500)
    log.task(1, 0, launch=2.0, prompt=40, prompt_ms=100, output=120, eval_ms=35_950)
    log.add(37.55, "I", "slot print_timing: id  0 | task 1 | n_gen =    100, tg =   2.79 t/s, tg_3s =  21.00 t/s")
    log.task(2, 1, launch=3.0, prompt=3000, prompt_ms=33_000, output=long_output, eval_ms=200)
    log.add(
        25.0,
        "I",
        "slot print_timing: id  1 | task 2 | prompt processing, n_tokens =   2047, progress = 0.68, "
        "t =  22.00 s / 93.05 tokens per second",
    )
    return log


def test_a_stream_beside_a_prefill_with_one_progress_line_gets_one_token_per_iteration() -> None:
    # Spread over the rate line's whole stretch, the stream's tokens would come out at 2.7 tok/s, 40x what it got.
    diagnosis = diagnose_log(short_log_beside_a_two_batch_prefill(solo=True).lines, long_prompt_tokens=1000)
    stall = diagnosis.finding("stalls")
    assert stall is not None, diagnosis.findings
    by_name = figures(stall)
    assert by_name["stall_tok_s"] == pytest.approx(2 / 33, rel=0.1)
    assert by_name["unstalled_tok_s"] == pytest.approx(40.0)  # the request that decoded alone
    assert "requests that decoded with no long prefill beside them" in next(
        f.label for f in stall.figures if f.name == "unstalled_tok_s"
    )
    # The one line's 2,047 tokens were one batch: n_batch 2048, named in the fix with what a smaller one gives.
    assert diagnosis.server.n_batch == 2048
    (fix,) = stall.fixes
    assert fix.knob == "n_batch" and "now 0.06 tok/s at n_batch 2048" in (fix.estimate or "")


def test_a_frozen_stream_with_nothing_to_compare_it_with_is_a_finding_under_the_floor() -> None:
    # No request decoded alone, no rate line outside the prefill: only the floor says the stream was frozen.
    log = short_log_beside_a_two_batch_prefill(solo=False, long_output=1)
    stall = diagnose_log(log.lines, long_prompt_tokens=1000).finding("stalls")
    assert stall is not None
    assert figures(stall)["unstalled_tok_s"] is None and stall.user_seconds_lost is None
    assert "under the 1 tok/s a reader can follow (no speed elsewhere in this log)" in stall.summary


def test_at_the_smallest_n_batch_the_fix_names_no_smaller_one() -> None:
    """A stream at one token per 0.7 s iteration beside a prefill in chunks of 32: n_batch 32 is where a
    study starts, so the fix says what is left instead of naming n_batch again."""
    log = Log(slots=2)
    log.task(0, 0, launch=0.2, prompt=40, prompt_ms=100, output=60, eval_ms=1500)
    log.task(1, 0, launch=2.0, prompt=40, prompt_ms=100, output=80, eval_ms=22_000)
    log.task(2, 1, launch=3.0, prompt=1024, prompt_ms=22_400, output=4, eval_ms=200)
    for k in range(5, 32):  # after 3 s: one line per 32-token iteration of 0.7 s
        at = 3.0 + 0.7 * k
        log.add(
            at,
            "I",
            f"slot print_timing: id  1 | task 2 | prompt processing, n_tokens = {32 * k:6d}, progress = {k / 32:.2f}, "
            f"t = {0.7 * k:6.2f} s / 45.71 tokens per second",
        )
    diagnosis = diagnose_log(log.lines, long_prompt_tokens=1000)
    stall = diagnosis.finding("stalls")
    assert stall is not None and diagnosis.server.n_batch == 32
    (fix,) = stall.fixes
    assert fix.knob is None and fix.study_params == []
    assert fix.action.startswith("n_batch is already 32, the smallest a study tries")


def test_a_stream_above_the_floor_with_nothing_to_compare_it_with_is_no_finding_and_a_note_says_why() -> None:
    """A stream beside a 2,000-token prefill in iterations of 0.25 s (4 tok/s to it), no request alone and no
    rate line: slow, maybe, but not frozen, and nothing says what it does elsewhere."""
    log = Log(slots=2)
    log.task(1, 0, launch=2.0, prompt=40, prompt_ms=100, output=60, eval_ms=12_000)
    log.task(2, 1, launch=3.0, prompt=2000, prompt_ms=8000, output=1, eval_ms=100)
    for k in range(12, 32):
        log.add(
            3.0 + 0.25 * k,
            "I",
            f"slot print_timing: id  1 | task 2 | prompt processing, n_tokens = {62 * k:6d}, progress = {k / 32:.2f}, "
            f"t = {0.25 * k:6.2f} s / 248.00 tokens per second",
        )
    diagnosis = diagnose_log(log.lines, long_prompt_tokens=1000)
    assert diagnosis.finding("stalls") is None, diagnosis.findings
    assert any("no stall is claimed" in note for note in diagnosis.notes), diagnosis.notes


@pytest.mark.parametrize(
    ("prompt", "first_n", "first_at", "end"),
    [
        (1000, 600, 6.3, 8.0),  # 3.3 s in, too early to rule out two batches before it; the rest, 400, is over half
        (2900, 2047, 25.0, 33.0),  # the rest, 853, is under half; but 22 s in, no two batches fit before it
    ],
    ids=["the rest over half the line's batch", "the line past twice the delay"],
)
def test_one_progress_line_is_one_batch_by_either_rule(prompt: int, first_n: int, first_at: float, end: float) -> None:
    """The long prompt's prefill runs from 3 s in two batches, the first ending at its one progress line; the
    stream, decoding at 40 tok/s before and after, gets a token at each batch's end."""
    log = Log(slots=2)
    log.task(0, 0, launch=0.2, prompt=40, prompt_ms=100, output=60, eval_ms=1500)
    after = 80 - 36 - 2  # the stream's tokens after the prefill: 36 before it, one per batch in it
    log.task(1, 0, launch=2.0, prompt=40, prompt_ms=100, output=80, eval_ms=(end + after / 40 - 2.1) * 1000)
    log.task(2, 1, launch=3.0, prompt=prompt, prompt_ms=(end - 3.0) * 1000, output=4, eval_ms=200)
    log.add(
        first_at,
        "I",
        f"slot print_timing: id  1 | task 2 | prompt processing, n_tokens = {first_n:6d}, progress = "
        f"{first_n / prompt:.2f}, t = {first_at - 3.0:6.2f} s / {first_n / (first_at - 3.0):.2f} tokens per second",
    )
    stall = diagnose_log(log.lines, long_prompt_tokens=1000).finding("stalls")
    assert stall is not None
    assert figures(stall)["stall_tok_s"] == pytest.approx(2 / (end - 3.0), rel=0.15)
