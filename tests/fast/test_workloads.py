from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from tuner.errors import WorkloadError
from tuner.models import ReplayRequest
from tuner.workloads import load_trace, synthesize_requests

REPO = Path(__file__).resolve().parents[2]
HEADER = '{"format": "serve-tuner-trace", "version": 1, "name": "t"}\n'
LINE = (
    '{"id": "%s", "offset_s": 0, "session": "s", "prompt": {"shared_prefix": [{"block": "sys", "tokens": 8}],'
    ' "new_tokens": %d}, "output_tokens": 4}\n'
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return path


def test_prompts_have_exact_token_counts_and_share_their_prefix_blocks(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, HEADER + LINE % ("a", 100) + LINE % ("b", 50)))
    a, b = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=0)
    assert (a.prompt_tokens, b.prompt_tokens) == (108, 58)
    assert a.prompt_token_ids[:8] == b.prompt_token_ids[:8]
    assert a.prompt_token_ids[8:16] != b.prompt_token_ids[8:16]
    assert all(100 <= t < 30000 for t in a.prompt_token_ids)


def test_new_tokens_differ_between_rounds_so_no_round_hits_the_cache_of_another(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, HEADER + LINE % ("a", 100)))
    (first,) = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=0)
    (second,) = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=1)
    assert first.prompt_token_ids[:8] == second.prompt_token_ids[:8]
    assert first.prompt_token_ids[8:] != second.prompt_token_ids[8:]


def test_a_variant_keeps_the_rounds_shape_and_begins_with_none_of_its_tokens(tmp_path: Path) -> None:
    # A reused server's host-RAM prompt cache holds the rounds it measured; a variant of the next round's
    # prompts has the same lengths and the same sharing between its own requests, and no prompt begins with
    # a token of any variant-0 prompt's beginning, so nothing cached before can serve it.
    trace = load_trace(write(tmp_path, HEADER + LINE % ("a", 100) + LINE % ("b", 50) + SESSION.replace('"s"', '"t"')))

    def made(variant: int) -> list[ReplayRequest]:
        return synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=2, variant=variant)

    canonical, reused, again = made(0), made(1), made(2)
    assert made(0) == canonical  # the prompts every earlier version made for this round
    for other in (reused, again):
        assert [r.prompt_tokens for r in other] == [r.prompt_tokens for r in canonical]
        assert [r.answer_spans for r in other] == [r.answer_spans for r in canonical]
        for mine, theirs in itertools.product(other, canonical):
            assert mine.prompt_token_ids[0] != theirs.prompt_token_ids[0]
        for (a, b), (x, y) in itertools.combinations(zip(other, canonical, strict=True), 2):
            assert _common_prefix(a.prompt_token_ids, b.prompt_token_ids) == _common_prefix(
                x.prompt_token_ids, y.prompt_token_ids
            )
    assert reused[0].prompt_token_ids[0] != again[0].prompt_token_ids[0]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_a_malformed_line_is_reported_with_file_and_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + LINE % ("a", 100) + "{not json\n")
    with pytest.raises(WorkloadError, match=r"trace.jsonl:3: not valid JSON"):
        load_trace(path)


def test_an_unknown_field_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + (LINE % ("a", 100)).replace('"output_tokens"', '"outputs": 3, "output_tokens"'))
    with pytest.raises(WorkloadError, match=r":2: outputs: unknown key"):
        load_trace(path)


def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER.replace('"version": 1', '"version": 9') + LINE % ("a", 1))
    with pytest.raises(WorkloadError, match="version 9 is not supported"):
        load_trace(path)


def test_the_bundled_stall_workload_has_long_prompts_among_streaming_chats() -> None:
    trace = load_trace(REPO / "workloads" / "stall.jsonl")
    long = [r for r in trace.requests if r.prompt.new_tokens >= 1000]
    chats = [r for r in trace.requests if r.tag == "chat"]
    assert len(long) >= 2 and len(chats) >= 3
    first_long = min(r.offset_s for r in long)
    assert any(r.offset_s < first_long for r in chats)


def test_the_summary_counts_what_the_stall_workload_will_replay() -> None:
    from tuner.workloads import summarize_trace

    summary = summarize_trace(load_trace(REPO / "workloads" / "stall.jsonl"))
    assert (summary.requests, summary.sessions, summary.long_prompts) == (7, 5, 2)
    assert summary.new_tokens.max == 2000 and summary.output_tokens.total == 1088
    # Seven requests share the 48-token system prompt; the first one computes it, six reuse it.
    assert summary.prefix_reuse == pytest.approx(6 * 48 / 4036)
    assert summary.tags == {"chat": 5, "resume": 1, "summary": 1}
    assert summary.output_tokens.mean == pytest.approx(1088 / 7)


def reuse_trace(tmp_path: Path, *lines: str) -> Path:
    return write(tmp_path, HEADER + "".join(line + "\n" for line in lines))


def request_line(
    rid: str,
    at: float,
    *,
    blocks: tuple[str, ...] = (),
    session: str = "",
    turn: int = 0,
    history: int = 0,
    new: int = 100,
    output: int = 10,
) -> str:
    prefix = [{"block": b, "tokens": 50} for b in blocks]
    prompt = {"shared_prefix": prefix, "history_tokens": history, "new_tokens": new}
    fields = {"id": rid, "offset_s": at, "session": session or rid, "turn": turn, "prompt": prompt}
    return json.dumps({**fields, "output_tokens": output, "duration_s": 1.0})


def test_a_prefix_block_is_reusable_only_once_an_earlier_request_computed_it(tmp_path: Path) -> None:
    from tuner.workloads import summarize_trace

    trace = load_trace(
        reuse_trace(
            tmp_path,
            request_line("first", 0.0, blocks=("a", "b")),  # computes a and b
            request_line("beside", 0.0, blocks=("a",)),  # sent at the same instant: computes a too
            request_line("later", 5.0, blocks=("a", "c")),  # a is cached, c is new
            request_line("reordered", 6.0, blocks=("c", "b")),  # c cached; b is cached but not behind c's start
            request_line("elsewhere", 7.0, blocks=("d", "a")),  # d is new, so nothing behind it matches
        )
    )
    summary = summarize_trace(trace)
    reused = 50 + 50 + 50  # later's a, reordered's c and b (both blocks seen before it)
    assert summary.prefix_reuse == pytest.approx(reused / summary.prompt_tokens.total)


def test_history_is_reusable_only_as_far_as_the_sessions_previous_turn_computed_it(tmp_path: Path) -> None:
    from tuner.workloads import summarize_trace

    trace = load_trace(
        reuse_trace(
            tmp_path,
            # Recorded mid-way: 400 tokens of history that no request in the trace computed.
            request_line("s.3", 0.0, session="s", turn=3, history=400, new=100, output=20),
            # Held by turn 3: its history, its new tokens and its answer, 520 tokens; 600 claimed.
            request_line("s.4", 10.0, session="s", turn=4, history=600, new=30, output=20),
        )
    )
    summary = summarize_trace(trace)
    assert summary.history_reuse == pytest.approx(520 / summary.prompt_tokens.total)


@pytest.mark.parametrize("kind", ["summarize", "chat", "stall", "agent"])
def test_every_generator_writes_a_trace_that_reads_back_identical(kind: str, tmp_path: Path) -> None:
    from tuner.workloads import SynthOptions, dump_trace, synthesize_trace

    trace = synthesize_trace(kind, SynthOptions(users=4, turns=3, seed=7, long_tokens=6000))
    path = tmp_path / "trace.jsonl"
    path.write_text(dump_trace(trace))
    assert load_trace(path) == trace
    assert synthesize_trace(kind, SynthOptions(users=4, turns=3, seed=7, long_tokens=6000)) == trace
    assert synthesize_trace(kind, SynthOptions(users=4, turns=3, seed=8, long_tokens=6000)) != trace


def test_the_summarize_generator_is_a_closed_loop_of_document_summaries() -> None:
    from tuner.workloads import SynthOptions, synthesize_trace

    trace = synthesize_trace("summarize", SynthOptions(users=8, turns=5, seed=0, long_tokens=1))
    assert len({r.session for r in trace.requests}) == 8 and len(trace.requests) == 40
    # Every turn is due at once and nobody thinks: the next request goes as soon as the answer ends.
    assert all(r.offset_s == 0 and r.think_s == 0 for r in trace.requests)
    assert all(r.prompt.shared_prefix[0].tokens == 67 and 576 <= r.prompt.new_tokens <= 704 for r in trace.requests)
    assert all(r.output_tokens == 256 for r in trace.requests)


def test_the_stall_generator_puts_long_prompts_among_streaming_chats() -> None:
    from tuner.workloads import SynthOptions, summarize_trace, synthesize_trace

    trace = synthesize_trace("stall", SynthOptions(users=6, turns=3, seed=1, long_tokens=12000))
    summary = summarize_trace(trace)
    assert summary.long_prompts == 3 and summary.new_tokens.max <= 12000
    first_long = min(r.offset_s for r in trace.requests if r.prompt.new_tokens >= 1000)
    assert any(r.tag == "chat" and r.offset_s < first_long for r in trace.requests)


SESSION = (
    '{"id": "t0", "offset_s": 0, "session": "s", "turn": 0, "prompt": {"shared_prefix": [{"block": "sys",'
    ' "tokens": 8}], "new_tokens": 20}, "output_tokens": 6}\n'
    '{"id": "t1", "offset_s": 1, "session": "s", "turn": 1, "think_s": 0.5, "prompt": {"shared_prefix":'
    ' [{"block": "sys", "tokens": 8}], "history_tokens": 26, "new_tokens": 10}, "output_tokens": 4,'
    ' "lora": [{"adapter": "support", "scale": 0.5}]}\n'
)


def test_a_turn_repeats_the_sessions_earlier_prompt_and_marks_where_the_answer_goes(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, HEADER + SESSION))
    first, second = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=0)
    assert (first.prompt_tokens, second.prompt_tokens) == (28, 44)
    assert second.prompt_token_ids[:28] == first.prompt_token_ids
    (span,) = second.answer_spans
    assert (span.start, span.length, span.request_id) == (28, 6, "t0")
    assert second.lora == (("support", 0.5),) and first.lora is None


def test_the_answer_the_server_generated_replaces_the_placeholder_keeping_the_length(tmp_path: Path) -> None:
    from tuner.loadgen import with_answers

    trace = load_trace(write(tmp_path, HEADER + SESSION))
    _, second = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=0)
    spliced = with_answers(second, {"t0": [7, 8, 9]})
    assert spliced.prompt_token_ids[28:31] == (7, 8, 9)
    assert spliced.prompt_token_ids[31:] == second.prompt_token_ids[31:]
    assert spliced.prompt_tokens == second.prompt_tokens


def test_history_beyond_what_the_trace_holds_is_invented_once_per_session(tmp_path: Path) -> None:
    late = SESSION.splitlines()[1].replace('"history_tokens": 26', '"history_tokens": 300') + "\n"
    trace = load_trace(write(tmp_path, HEADER + late))
    (request,) = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=0)
    assert request.prompt_tokens == 318 and request.answer_spans == ()


def test_old_traces_without_history_or_lora_still_load(tmp_path: Path) -> None:
    trace = load_trace(REPO / "workloads" / "stall.jsonl")
    assert all(r.prompt.history_tokens == 0 and r.lora == [] for r in trace.requests)


def shapes(*rows: tuple[str, float, float | None, int]) -> str:
    """(session, offset, recorded duration, turn) rows as trace lines with 100 new and 30 output tokens."""
    lines = [HEADER.strip()]
    for index, (session, offset, duration, turn) in enumerate(rows):
        row: dict[str, object] = {
            "id": f"r{index}",
            "offset_s": offset,
            "session": session,
            "turn": turn,
            "prompt": {"new_tokens": 100},
            "output_tokens": 30,
        }
        if duration is not None:
            row["duration_s"] = duration
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def test_in_flight_concurrency_uses_recorded_durations_and_a_turn_ending_as_another_starts_is_no_overlap(
    tmp_path: Path,
) -> None:
    from tuner.workloads import concurrency_profile

    trace = load_trace(write(tmp_path, shapes(("a", 0, 2, 0), ("b", 1, 2, 0), ("c", 3, 1, 0))))
    profile = concurrency_profile(trace, buckets=4)
    assert profile.basis == "recorded durations"
    assert profile.peak == 2 and profile.mean == pytest.approx(5 / 4)
    assert profile.in_flight_peak == [1, 2, 1, 1] and profile.arrivals == [1, 1, 0, 1]


def test_without_durations_a_sessions_next_turn_is_placed_after_the_estimated_end_of_the_last(tmp_path: Path) -> None:
    from tuner.workloads import concurrency_profile

    trace = load_trace(write(tmp_path, shapes(("a", 0, None, 0), ("a", 0, None, 1), ("b", 0.5, None, 0))))
    profile = concurrency_profile(trace, prefill_tok_s=100, decode_tok_s=30)
    # Each request takes 1 s of prefill and 1 s of decode; turn 1 of `a` starts at 2 s, not at 0.
    assert sorted(zip(profile.starts.tolist(), profile.ends.tolist(), strict=True)) == [(0, 2), (0.5, 2.5), (2, 4)]
    assert profile.peak == 2 and "estimated" in profile.basis


def test_workload_show_prints_means_beside_the_percentiles_and_says_what_reuse_assumes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tuner.cli import main

    assert main(["workload", "show", str(REPO / "workloads" / "stall.jsonl")]) == 0
    # The table's box-drawing characters aside, the words and numbers as a user reads them.
    printed = " ".join(re.sub(r"[^\w%.,:;()'-]", " ", capsys.readouterr().out).split())
    assert "mean p50 p95 max total" in printed
    assert "output 155 " in printed  # 1,088 output tokens over 7 requests
    assert "7% in shared prefixes" in printed and "only what an earlier request computed" in printed
    assert "assumes a cache that never evicts" in printed


def test_workload_show_draws_a_plot_and_refuses_an_image_type_it_cannot_write(tmp_path: Path) -> None:
    from tuner.cli import main

    plot = tmp_path / "stall.png"
    stall = str(REPO / "workloads" / "stall.jsonl")
    assert main(["workload", "show", stall, "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000
    assert main(["workload", "show", stall, "--plot", str(tmp_path / "stall.jpg")]) == 2
    assert not (tmp_path / "stall.jpg").exists()


def test_chat_and_agent_sessions_carry_their_conversation_as_history() -> None:
    from tuner.workloads import SynthOptions, synthesize_trace

    for kind in ("chat", "agent"):
        trace = synthesize_trace(kind, SynthOptions(users=2, turns=3, seed=0, long_tokens=8000))
        session = sorted((r for r in trace.requests if r.session == trace.requests[0].session), key=lambda r: r.turn)
        assert session[0].prompt.history_tokens == 0
        for earlier, later in itertools.pairwise(session):
            assert later.prompt.history_tokens == (
                earlier.prompt.history_tokens + earlier.prompt.new_tokens + earlier.output_tokens
            )


def test_a_day_compressed_with_keep_concurrency_keeps_its_in_flight_profile() -> None:
    from tuner.workloads import SynthOptions, Trace, concurrency_profile, synthesize_trace, thin_sessions

    day = synthesize_trace("chat", SynthOptions(users=400, turns=4, seed=1, long_tokens=8000))
    scale = 0.1
    compressed = Trace(
        header=day.header,
        requests=[
            r.model_copy(update={"offset_s": r.offset_s * scale, "think_s": r.think_s * scale})
            for r in thin_sessions(day, keep=scale, seed=0).requests
        ],
    )
    sessions = {r.session for r in compressed.requests}
    assert 25 <= len(sessions) <= 55  # about a tenth of 400, whole sessions only
    assert all(sum(1 for r in compressed.requests if r.session == s) == 4 for s in sessions)
    # Ten times faster with a tenth of the users: the same arrivals per second, so the same concurrency.
    original = concurrency_profile(day, decode_tok_s=30)
    kept = concurrency_profile(compressed, decode_tok_s=30)
    assert kept.mean == pytest.approx(original.mean, rel=0.5)
    assert thin_sessions(day, keep=1.0, seed=0) is day


def test_a_trace_is_written_line_for_line_as_its_request_models_write_themselves(tmp_path: Path) -> None:
    # The writer makes each line from the trace's columns, not from models: every field's default must be
    # left out and every value written exactly as the model writes it, LoRA scales and content included.
    from tuner.workloads import LoraUse, PrefixBlock, PromptShape, Trace, TraceHeader, TraceRequest, trace_lines

    requests = [
        TraceRequest(id="a", offset_s=0.0, session="a", prompt=PromptShape(new_tokens=5), output_tokens=1),
        TraceRequest(
            id="b",
            offset_s=1e-6,
            session="s",
            turn=2,
            think_s=0.25,
            prompt=PromptShape(shared_prefix=[PrefixBlock(block="sys", tokens=7)], history_tokens=3, new_tokens=0),
            output_tokens=9,
            lora=[LoraUse(adapter="x"), LoraUse(adapter="y", scale=0.5)],
            tag="agent",
            duration_s=1234567.125,
            content={"messages": [{"role": "user", "content": "héllo \u2028"}]},
        ),
        TraceRequest(
            id="c",
            offset_s=86400.5,
            session="s",
            think_s=0.0,
            prompt=PromptShape(new_tokens=1),
            output_tokens=2,
            tag="chat",
        ),
    ]
    header = TraceHeader(format="serve-tuner-trace", version=1, name="t")
    written = b"".join(trace_lines(Trace(header=header, requests=requests), batch=2)).decode().split("\n")[:-1]
    for line, request in zip(written[1:], requests, strict=True):
        assert line == request.model_dump_json(exclude_defaults=True)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(written) + "\n")
    assert list(load_trace(path).requests) == requests


@pytest.mark.parametrize("chunk", [65_536, 7])
def test_the_column_summary_counts_what_the_request_by_request_summary_of_0_1_0_counted(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The summary moved from one request object at a time to columns (a million requests must fit in
    # memory); on traces with sessions, think time, shared prefixes, ties at one instant and partial
    # histories it must count exactly what the old code counted.
    import random

    from tests.support.summary_reference import reference_summary
    from tuner.workloads import (
        PrefixBlock,
        PromptShape,
        SynthOptions,
        Trace,
        TraceHeader,
        TraceRequest,
        concurrency_profile,
        summarize_trace,
        synthesize_trace,
    )

    monkeypatch.setattr("tuner.workloads.summary._CHUNK", chunk)  # a big trace is walked in chunks
    rng = random.Random(7)
    shuffled = []
    for index in range(400):
        session = f"s{rng.randrange(60)}"
        blocks = [
            PrefixBlock(block=f"b{rng.randrange(6)}", tokens=rng.choice((16, 64))) for _ in range(rng.randrange(4))
        ]
        shuffled.append(
            TraceRequest(
                id=f"r{index}",
                offset_s=float(rng.randrange(40)),  # whole seconds: many requests share an instant
                session=session if rng.random() < 0.8 else f"r{index}",
                turn=rng.randrange(4),
                think_s=rng.choice((0.0, 0.5, 3.0)),
                prompt=PromptShape(
                    shared_prefix=blocks, history_tokens=rng.randrange(0, 900), new_tokens=rng.randrange(1, 3000)
                ),
                output_tokens=rng.randrange(1, 400),
            )
        )
    header = TraceHeader(format="serve-tuner-trace", version=1, name="mixed")
    traces = [
        Trace(header=header, requests=sorted(shuffled, key=lambda r: r.offset_s)),
        synthesize_trace("stall", SynthOptions(users=12, turns=5, seed=3, long_tokens=6000)),
        synthesize_trace("chat", SynthOptions(users=30, turns=4, seed=1, long_tokens=6000)),
        load_trace(REPO / "workloads" / "stall.jsonl"),
    ]
    # The columns give back every request as it was, blocks of another size than their first use included,
    # also after a selection reorders them.
    assert list(traces[0].requests) == sorted(shuffled, key=lambda r: r.offset_s)
    picked = [399, 3, 250, 3]
    assert list(traces[0].take(picked).requests) == [traces[0].requests[i] for i in picked]
    for trace in traces:
        expected = reference_summary(list(trace.requests))
        summary = summarize_trace(trace)
        prompt_total = sum(r.prompt.total_tokens for r in trace.requests)
        assert summary.prompt_tokens.total == prompt_total, trace.header.name
        assert trace.prefix_tokens.tolist() == [r.prompt.prefix_tokens for r in trace.requests]
        assert summary.prefix_reuse == expected["prefix"] / prompt_total, trace.header.name
        assert summary.history_reuse == expected["history"] / prompt_total, trace.header.name
        profile = concurrency_profile(trace)
        assert profile.in_flight_peak == expected["in_flight_peak"], trace.header.name
        assert profile.arrivals == expected["arrivals"], trace.header.name
        assert profile.mean == pytest.approx(expected["mean"], rel=1e-12), trace.header.name
        assert sorted(zip(profile.starts.tolist(), profile.ends.tolist(), strict=True)) == expected["intervals"]


def test_a_round_made_a_session_at_a_time_is_the_round_made_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The replay takes a round's sessions as it needs them, in the order of their first arrivals, and keeps
    # only some shared blocks made: neither may change a prompt.
    from tuner.workloads import SynthOptions, synthesize_sessions, synthesize_trace

    trace = synthesize_trace("chat", SynthOptions(users=25, turns=4, seed=5, long_tokens=3000))
    whole = synthesize_requests(trace, token_range=(100, 30000), seed=1, round_index=1)
    monkeypatch.setattr("tuner.workloads.synthesis._BLOCKS_KEPT", 1)
    sessions = list(synthesize_sessions(trace, token_range=(100, 30000), seed=1, round_index=1))
    assert {r.request_id: r for s in sessions for r in s} == {r.request_id: r for r in whole}
    firsts = [s[0].offset_s for s in sessions]
    assert firsts == sorted(firsts)
    for session in sessions:
        assert len({r.session for r in session}) == 1
        assert [r.turn for r in session] == sorted(r.turn for r in session)
    assert any(r.prompt_token_ids[:8] == whole[0].prompt_token_ids[:8] for r in whole[1:])  # blocks are shared


def test_a_trace_that_names_a_request_id_twice_is_refused_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + LINE % ("a", 100) + LINE % ("b", 50) + LINE % ("a", 7))
    with pytest.raises(WorkloadError, match=r"request id 'a' appears twice; ids must be unique"):
        load_trace(path)


def test_prompt_tokens_are_drawn_exactly_as_randrange_draws_them() -> None:
    # The faster draw must give the numbers randrange gives: a resumed study replays the prompts it began with.
    import random

    from tuner.workloads.synthesis import _draw

    for low, high in ((100, 49_152), (0, 1), (5, 6), (3, 2**20 + 7)):
        expected, drawn = random.Random(9), random.Random(9)
        assert _draw(drawn, low, high, 3000) == [expected.randrange(low, high) for _ in range(3000)]
        assert drawn.random() == expected.random()  # and leave the generator where randrange leaves it


def test_a_session_named_like_one_of_its_requests_is_one_session(tmp_path: Path) -> None:
    # A request whose session is its own id is stored without a session entry; a later turn naming that
    # session must still be the same session: one conversation, its history reused, replayed in order.
    from tuner.workloads import summarize_trace, synthesize_sessions

    lines = [
        '{"id": "a", "offset_s": 0, "session": "a", "prompt": {"new_tokens": 40}, "output_tokens": 20}',
        '{"id": "b", "offset_s": 1, "session": "a", "turn": 1, "prompt": {"history_tokens": 60, "new_tokens": 5},'
        ' "output_tokens": 3}',
        '{"id": "c", "offset_s": 2, "session": "c", "prompt": {"new_tokens": 9}, "output_tokens": 2}',
    ]
    trace = load_trace(write(tmp_path, HEADER + "\n".join(lines) + "\n"))
    summary = summarize_trace(trace)
    assert summary.sessions == 2
    assert summary.history_reuse == 60 / (40 + 65 + 9)
    sessions = list(synthesize_sessions(trace, token_range=(100, 30000), seed=1, round_index=0))
    assert [[r.request_id for r in s] for s in sessions] == [["a", "b"], ["c"]]


def test_a_requests_prefix_tokens_are_all_its_blocks_tokens_when_no_block_follows(tmp_path: Path) -> None:
    lines = [
        '{"id": "a", "offset_s": 0, "session": "a", "prompt": {"shared_prefix": [{"block": "x", "tokens": 100},'
        ' {"block": "y", "tokens": 7}], "new_tokens": 1}, "output_tokens": 2}',
        '{"id": "b", "offset_s": 1, "session": "b", "prompt": {"new_tokens": 3}, "output_tokens": 2}',
    ]
    trace = load_trace(write(tmp_path, HEADER + "\n".join(lines) + "\n"))
    assert trace.prefix_tokens.tolist() == [107, 0]


def test_an_empty_token_range_is_refused_not_drawn_from_forever() -> None:
    import random

    from tuner.workloads.synthesis import _draw

    with pytest.raises(ValueError, match="empty token range"):
        _draw(random.Random(1), 5, 5, 3)
