"""The llama-server engine against wire transcripts recorded from the real server (tests/data/*.sse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import free_port
from tests.support.stand_in import run_stand_in
from tuner.config import PluginSpec
from tuner.engines import Engine, StreamEvent, create_engine
from tuner.engines.base import parse_prometheus_text
from tuner.errors import ConfigError
from tuner.models import ReplayRequest

DATA = Path(__file__).resolve().parents[1] / "data"


def llama(settings: dict[str, object] | None = None, **options: object) -> Engine:
    table = {"kind": "llama-server", "binary": "/bin/true", "model": "/bin/true", "settings": settings or {}, **options}
    return create_engine(PluginSpec.model_validate(table))


def events(name: str) -> list[StreamEvent]:
    engine = llama()
    return [e for e in map(engine.parse_stream_line, (DATA / name).read_text().splitlines()) if e is not None]


def test_a_recorded_completion_stream_yields_every_token_and_the_server_timings() -> None:
    stream = events("llama-server-completion.sse")
    assert [e.tokens_so_far for e in stream] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    final = stream[-1]
    assert final.done and final.timings is not None
    assert final.timings.prompt_n == 40 and final.timings.predicted_n == 8
    assert final.timings.prompt_ms > 0


def test_tokens_withheld_for_incomplete_utf8_are_still_counted() -> None:
    # Recorded: 8 tokens came in 3 lines listing only 2 of them.
    stream = events("llama-server-completion-withheld-bytes.sse")
    assert sum(e.tokens for e in stream) < 8
    assert stream[-1].tokens_so_far == 8 and stream[-1].done


def test_an_error_chunk_is_reported_as_an_error() -> None:
    engine = llama()
    event = engine.parse_stream_line(
        'data: {"error": {"code": 400, "message": "bad prompt", "type": "invalid_request_error"}}'
    )
    assert event is not None and event.error == "bad prompt" and event.done


def test_knobs_become_llama_arg_variables_over_the_base_settings() -> None:
    engine = llama({"n_parallel": 4, "ctx_size": 32768})
    launch = engine.launch_spec({"n_batch": 128, "kv_unified": True})
    assert launch.env["LLAMA_ARG_BATCH"] == "128"
    assert launch.env["LLAMA_ARG_KV_UNIFIED"] == "1"
    assert launch.env["LLAMA_ARG_N_PARALLEL"] == "4"
    assert launch.env["LLAMA_ARG_PORT"] == str(launch.port) and launch.port > 0
    baseline = engine.launch_spec({})
    assert "LLAMA_ARG_BATCH" not in baseline.env


def test_requests_send_token_ids_and_ask_for_exact_output_length() -> None:
    engine = llama()
    call = engine.build_request(
        ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(101, 102), output_tokens=5)
    )
    assert call.path == "/completion"
    assert call.json["prompt"] == [101, 102] and call.json["n_predict"] == 5 and call.json["ignore_eos"] is True


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("n_batch", 0, ">= 1"),
        ("n_batch", "512", "takes a int"),
        ("n_batch", True, "takes a int"),  # a bool is an int to Python, not to llama-server
        ("kv_unified", 1, "takes a bool"),
        ("flash_attn", "maybe", "one of on, off, auto"),
        ("batch", 512, "unknown llama-server knob 'batch'"),
    ],
)
def test_invalid_knob_values_are_refused(knob: str, value: object, message: str) -> None:
    engine = llama()
    with pytest.raises(ConfigError, match=message):
        engine.launch_spec({knob: value})  # type: ignore[dict-item]


def test_prometheus_counters_of_a_round_become_decode_calls_and_tokens_per_call() -> None:
    # Recorded around one 300-token prompt with 20 generated tokens at n_batch 64: 5 prompt batches
    # (64 x 4 + 44) and 19 generation steps.
    before = parse_prometheus_text((DATA / "llama-server-metrics-before.txt").read_text())
    after = parse_prometheus_text((DATA / "llama-server-metrics-after.txt").read_text())
    counters = llama().round_counters(before, after)
    assert counters["server_decode_calls"] == 24
    assert counters["server_tokens_per_decode"] == pytest.approx(320 / 24)


def test_a_server_without_the_counters_yields_none_not_zero() -> None:
    assert llama().round_counters({}, {}) == {"server_decode_calls": None, "server_tokens_per_decode": None}


def test_named_adapters_load_at_launch_at_scale_0_and_requests_pick_them_by_id(tmp_path: Path) -> None:
    support, legal = tmp_path / "support.gguf", tmp_path / "legal.gguf"
    support.touch()
    legal.touch()
    engine = llama(lora_adapters={"support": str(support), "legal": str(legal)})
    launch = engine.launch_spec({"lora_policy": "all_on"})
    assert launch.args[:4] == ("--lora-scaled", f"{support}:0", "--lora-scaled", f"{legal}:0")
    assert not any("LORA" in name for name in launch.env)
    with run_stand_in(launch, engine="llama-server") as server:  # as llama-server reads its flags
        assert server.launch["lora_adapters"] == [f"{support}:0", f"{legal}:0"]
    call = engine.build_request(
        ReplayRequest(
            request_id="a", session="s", offset_s=0, prompt_token_ids=(101,), output_tokens=1, lora=(("legal", 0.5),)
        )
    )
    assert call.json["lora"] == [{"id": 1, "scale": 0.5}]


def test_a_missing_adapter_file_is_refused_on_the_host_with_the_key_to_fix(tmp_path: Path) -> None:
    import asyncio

    from tuner.config import PluginSpec, StudySpec
    from tuner.search import check_host_files

    engine = llama(lora_adapters={"support": str(tmp_path / "gone.gguf")})
    spec = StudySpec.model_construct(host=PluginSpec(kind="local"))
    with pytest.raises(ConfigError, match=r"gone\.gguf does not exist on the host; fix engine\.lora_adapters\.support"):
        asyncio.run(check_host_files(spec, engine))


def test_a_workload_naming_an_adapter_the_engine_lacks_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"adapter\(s\) legal .* add them to engine.lora_adapters"):
        llama(lora_adapters={"support": "/m/support.gguf"}).check_lora_adapters({"support", "legal"})


@pytest.mark.parametrize("name", ["llama-server-completion.sse", "llama-server-completion-withheld-bytes.sse"])
def test_the_fast_reading_of_partial_chunks_agrees_with_a_full_json_parse(name: str) -> None:
    import json

    engine = llama()
    for line in (DATA / name).read_text().splitlines():
        if not line.startswith("data:"):
            continue
        chunk = json.loads(line[5:])
        event = engine.parse_stream_line(line)
        assert event is not None
        assert event.token_ids == tuple(chunk["tokens"]) and event.tokens_so_far == chunk["tokens_predicted"]
        # A content with quotes, as the model may write them, reads the same.
        tricky = line.replace(f'"content":{json.dumps(chunk["content"])}', '"content":"say \\"stop\\":false, "')
        again = engine.parse_stream_line(tricky)
        assert again is not None and again.token_ids == event.token_ids and again.done == event.done


def test_a_lora_policy_changes_what_requests_ask_for_not_the_server() -> None:
    engine = llama(lora_adapters={"support": "/m/support.gguf"})
    mixed = [
        ReplayRequest(
            request_id=str(i), session=str(i), offset_s=0, prompt_token_ids=(101,), output_tokens=1, lora=lora
        )
        for i, lora in enumerate([(("support", 1.0),), None, (("support", 1.0),), (("support", 0.5),)])
    ]
    assert engine.apply_request_settings(mixed, {}) == mixed
    assert engine.apply_request_settings(mixed, {"lora_policy": "as_recorded"}) == mixed
    assert {r.lora for r in engine.apply_request_settings(mixed, {"lora_policy": "all_on"})} == {(("support", 1.0),)}
    assert {r.lora for r in engine.apply_request_settings(mixed, {"lora_policy": "all_off"})} == {()}
    assert engine.build_request(engine.apply_request_settings(mixed, {"lora_policy": "all_off"})[0]).json["lora"] == []


def test_all_on_gives_a_session_the_rounds_most_used_setting_not_its_own() -> None:
    # The replay makes a round a session at a time: a session that used only scale 0.5 still gets the round's
    # most used setting, as it would with the round's requests all at hand.
    engine = llama(lora_adapters={"support": "/m/support.gguf"})
    session = [
        ReplayRequest(
            request_id="a", session="s", offset_s=0, prompt_token_ids=(101,), output_tokens=1, lora=(("support", 0.5),)
        )
    ]
    mix = {(("support", 0.5),): 1, (): 4, (("support", 1.0),): 3}
    (applied,) = engine.apply_request_settings(session, {"lora_policy": "all_on"}, lora_mix=mix)
    assert applied.lora == (("support", 1.0),)
    (alone,) = engine.apply_request_settings(session, {"lora_policy": "all_on"})
    assert alone.lora == (("support", 0.5),)


def test_a_tuned_setting_overridden_by_the_units_own_flag_is_named_with_the_fix() -> None:
    """llama-server prefers a flag to its environment variable and says so at start; for a tuned knob
    that means the trial would measure the unit's value, not the trial's."""
    log = (
        "warn: LLAMA_ARG_MODEL environment variable is set, but will be overwritten by command line argument -m\n"
        "warn: LLAMA_ARG_PORT environment variable is set, but will be overwritten by command line argument --port\n"
    )
    engine = llama()
    assert engine.ignored_settings(log) is None  # where the unit names its model and port itself: harmless
    log += "warn: LLAMA_ARG_BATCH environment variable is set, but will be overwritten by command line argument -b\n"
    message = engine.ignored_settings(log)
    assert message is not None and "n_batch" in message and "-b" in message and 'exec_start = "replace"' in message


def test_a_flag_on_the_command_line_wins_over_the_tuned_variable_and_the_startup_log_says_so() -> None:
    """Started with the unit's own `-b 512` and the trial's LLAMA_ARG_BATCH=128, the server (the stand-in,
    which applies llama-server's precedence and prints its warning) runs at 512, and the engine reads
    from that log which tuned setting was lost; the unit's own port flag is harmless."""
    port = free_port()
    engine = llama(port=port, extra_args=["--port", str(port), "-b", "512"])
    with run_stand_in(engine.launch_spec({"n_batch": 128}), engine="llama-server") as server:
        assert server.launch["settings"] == {"n_batch": 512}
    log = "\n".join(server.stderr)
    assert "LLAMA_ARG_PORT environment variable is set, but will be overwritten by command line argument --port" in log
    assert engine.ignored_settings(log) == (
        "llama-server ignored n_batch (LLAMA_ARG_BATCH): the command line sets -b, which wins; remove it from the "
        'unit\'s ExecStart or set deploy.exec_start = "replace"'
    )
    with run_stand_in(llama(port=port, extra_args=["--port", str(port)]).launch_spec({"n_batch": 128}),
                      engine="llama-server") as server:  # fmt: skip
        assert server.launch["settings"] == {"n_batch": 128}
    assert engine.ignored_settings("\n".join(server.stderr)) is None


def test_a_replay_through_the_stand_in_with_adapters_gets_every_token_and_the_cached_prefix(tmp_path: Path) -> None:
    """TRANSCRIPT-BASED stand-in for llama-server's /completion: it refuses a body the server would not
    take (an unknown field, an adapter id not loaded) and stops at the end of text unless told to ignore it."""
    import asyncio

    from tuner.loadgen import replay
    from tuner.models import RequestStatus

    support, legal = tmp_path / "support.gguf", tmp_path / "legal.gguf"
    engine = llama(port=free_port(), lora_adapters={"support": str(support), "legal": str(legal)})
    shared = tuple(range(100, 140))
    first = ReplayRequest(
        request_id="a", session="a", offset_s=0, prompt_token_ids=shared, output_tokens=12, lora=(("legal", 0.5),)
    )
    second = first.model_copy(
        update={"request_id": "b", "session": "b", "offset_s": 0.3, "prompt_token_ids": (*shared, *range(200, 210))}
    )
    with run_stand_in(engine.launch_spec({}), engine="llama-server") as server:
        records = asyncio.run(replay([first, second], engine=engine, base_url=server.base_url, request_timeout_s=30))
        received = server.received()
    assert [(r.status, r.error) for r in records] == [(RequestStatus.OK, None)] * 2
    assert [len(r.token_s) for r in records] == [12, 12]
    assert [(t.cache_n, t.prompt_n) for t in (r.timings for r in records) if t is not None] == [(0, 40), (40, 10)]
    assert [entry["body"]["lora"] for entry in received] == [[{"id": 1, "scale": 0.5}]] * 2


def test_the_correctness_probe_reads_the_token_ids_of_a_whole_answer() -> None:
    import httpx

    engine = llama(port=free_port())
    call = engine.probe_request("The capital of France is", tokens=4)
    with run_stand_in(engine.launch_spec({}), engine="llama-server") as server:
        answer = httpx.post(f"{server.base_url}{call.path}", json=call.json, timeout=10)
    assert answer.status_code == 200, answer.text
    assert engine.parse_probe_answer(answer.json()) == (1000, 1001, 1002, 1003)


def test_prometheus_text_with_timestamps_escaped_labels_and_infinities_is_read_as_written() -> None:
    text = (
        "# TYPE llamacpp:n_decode_total counter\n"
        "llamacpp:n_decode_total 12 1700000000000\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{model_name="a \\"b\\" c",le="+Inf"} 7\n'
        'vllm:time_to_first_token_seconds_count{model_name="a \\"b\\" c"} 7\n'
        'vllm:time_to_first_token_seconds_sum{model_name="a \\"b\\" c"} 1.5\n'
    )
    values = parse_prometheus_text(text)
    # The timestamp is not the value (a split on the last space would read 1700000000000).
    assert values["llamacpp:n_decode_total"] == 12.0
    assert values['vllm:time_to_first_token_seconds_sum{model_name="a \\"b\\" c"}'] == 1.5
    assert values['vllm:time_to_first_token_seconds_bucket{model_name="a \\"b\\" c",le="+Inf"}'] == 7.0
    assert parse_prometheus_text("this is { not prometheus\n") == {}
    # A line it cannot read costs that line only; a counter keeps the name it was written with.
    assert parse_prometheus_text('a 1\nb{x="1"} nope\n# TYPE c counter\nc 3\n') == {"a": 1.0, "c": 3.0}
