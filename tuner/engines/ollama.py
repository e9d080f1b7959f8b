"""Ollama: server settings as `OLLAMA_*` environment variables (its only interface; `ollama serve` has
no tuning flags), requests through its native `/api/generate` (NDJSON) or its `/v1/completions` (SSE).

Ollama takes text, not token ids: prompts are made of one common word per token id (`text_prompts`),
so shared prefixes and history stay shared, and the server's own count of each prompt is kept. Its
final chunk's `prompt_eval_count` includes tokens served from the cache while `prompt_eval_duration`
covers only the computed part, so its prompt count is marked as a total and prefill speed is computed
from the tokens the replay knows were new. Every request carries `keep_alive`, and every request of a
trial the same load options (its `num_batch`, if tuned; `num_ctx` never), because a request whose load
options differ reloads the model in the middle of a trial. Ollama has no ignore-EOS option: answers may
end before `num_predict`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from tuner.config import ParamValue
from tuner.engines.api_key import ApiKeyOptions, bearer_headers, load_api_key
from tuner.engines.base import (
    ENGINES,
    HttpCall,
    Knob,
    KnobbedEngine,
    StreamEvent,
    check_paths_for,
    render_env_value,
    resolve_auto,
)
from tuner.engines.llama_server_log import parse_llama_server_log
from tuner.engines.memory import gguf_kv_shape, kv_bytes_per_token
from tuner.engines.openai_stream import parse_openai_sse_line, probe_answer_units
from tuner.engines.text_prompts import WORDS, ids_to_text
from tuner.errors import ConfigError
from tuner.metrics import MetricInfo
from tuner.models import LaunchSpec, ListenRule, ReplayRequest, ServerCommand, ServerTimings, TaskTimeline

__all__ = ["OLLAMA_KNOBS", "OllamaEngine", "OllamaOptions"]

_NS_PER_MS = 1_000_000

OLLAMA_KNOBS: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            name="num_parallel",
            value_type="int",
            env="OLLAMA_NUM_PARALLEL",
            minimum=1,
            description="Requests served at once per loaded model (slots of the llama-server child).",
        ),
        Knob(
            name="context_length",
            value_type="int",
            env="OLLAMA_CONTEXT_LENGTH",
            minimum=0,
            description="Default num_ctx per request; the child gets num_ctx x num_parallel KV tokens.",
        ),
        Knob(
            name="max_queue",
            value_type="int",
            env="OLLAMA_MAX_QUEUE",
            minimum=1,
            description="Pending requests before HTTP 503 (mostly behind a model load).",
        ),
        Knob(
            name="flash_attention",
            value_type="bool",
            env="OLLAMA_FLASH_ATTENTION",
            description="Flash attention (needed for a quantized KV cache).",
        ),
        Knob(
            name="kv_cache_type",
            value_type="str",
            env="OLLAMA_KV_CACHE_TYPE",
            choices=("f16", "q8_0", "q4_0"),
            description="KV cache type for K and V, all models.",
        ),
        Knob(
            name="max_loaded_models",
            value_type="int",
            env="OLLAMA_MAX_LOADED_MODELS",
            minimum=0,
            description="Models kept loaded at once (0: 3 per GPU).",
        ),
        Knob(
            name="num_batch",
            value_type="int",
            minimum=1,
            scope="request",
            description="Prompt tokens per forward pass (Ollama's default 512; its n_ubatch stays 512): the lever "
            "for a stall. Ollama reads it from the request or the Modelfile, never the environment; every request "
            "of a trial carries the trial's, because one with another value would reload the model.",
            how_to_apply="PARAMETER num_batch {value} in the model's Modelfile, then `ollama create` it again "
            "(or options.num_batch in every request: a request with another value reloads the model)",
        ),
        Knob(
            name="keep_alive",
            value_type="str",
            env="OLLAMA_KEEP_ALIVE",
            description="How long an idle model stays loaded (5m; -1 forever).",
        ),
    )
}


class OllamaOptions(ApiKeyOptions):
    binary: str = Field(
        default="ollama",
        description="The ollama executable, for the process deployer; auto for the one `tuner setup --ollama` built.",
    )
    model: str = Field(min_length=1, description="The model to load, e.g. llama3.2:3b.")
    models_dir: str | None = Field(
        default=None,
        description="OLLAMA_MODELS for a server the study starts (default: Ollama's own, ~/.ollama/models); "
        "auto for the directory `tuner setup --ollama` made the demo model in.",
    )
    host: str = Field(default="127.0.0.1", description="Address Ollama listens on (OLLAMA_HOST).")
    port: int = Field(default=11434, ge=1, le=65535, description="Port Ollama listens on.")
    api: Literal["native", "openai"] = Field(
        default="native", description="native: /api/generate (NDJSON); openai: /v1/completions (SSE)."
    )
    request_keep_alive: str = Field(
        default="30m", description="keep_alive sent with every request, so the model stays loaded all trial."
    )
    settings: dict[str, ParamValue] = Field(default_factory=dict, description="Knobs fixed for the whole study.")
    model_file: str | None = Field(default=None, description="The model's GGUF blob, for the memory pre-check.")
    memory_budget_gib: float | None = Field(
        default=None, gt=0, description="Memory for weights and KV cache; configs that need more are skipped."
    )


# What Ollama 0.11.4 logs when it drops a setting it was given (llm/server.go), and which knob that is.
_IGNORED = (
    ("flash attention enabled but not supported by gpu", "flash_attention", " (a CPU counts as no such GPU)"),
    ("flash attention enabled but not supported by model", "flash_attention", ""),
    ("quantized kv cache requested but flash attention disabled", "kv_cache_type", ""),
    ("kv cache type not supported by model", "kv_cache_type", ""),
)

# Ollama reads its address from one variable, HOST[:PORT] (envconfig.Host).
OLLAMA_LISTEN = ListenRule(address_env="OLLAMA_HOST", default_host="127.0.0.1", default_port=11434)


@ENGINES.register("ollama")
class OllamaEngine(KnobbedEngine[OllamaOptions]):
    kind = "ollama"
    metrics: ClassVar[Mapping[str, MetricInfo]] = {}  # Ollama has no /metrics; its per-request figures are common ones
    knobs: Mapping[str, Knob] = OLLAMA_KNOBS
    options_model = OllamaOptions

    def __init__(self, options: OllamaOptions, *, command: ServerCommand = ServerCommand.LOCAL) -> None:
        super().__init__(options, command=command)
        # The binary only for `auto`: a bare `ollama` is a name on the host's PATH, as Ollama's install puts it.
        paths = {"engine.binary": options.binary} if options.binary == "auto" else {}
        if options.models_dir is not None:
            paths["engine.models_dir"] = options.models_dir
        check_paths_for(command, options, paths=paths, placement=("binary", "host", "port", "models_dir"))
        # Ollama has no API key of its own: an Ollama behind an authenticating proxy (nginx, Caddy) wants one in
        # every request's Authorization header, and the server is never given it.
        self._api_key = load_api_key(options)

    def request_headers(self) -> dict[str, str]:
        return bearer_headers(self._api_key)

    def launch_spec(self, settings: Mapping[str, ParamValue]) -> LaunchSpec:
        self.check_settings(settings)
        executable = _auto(self._options.binary, "binary")  # the build before the model made with it
        env: dict[str, str] = {}
        if self._command is not ServerCommand.UNIT:  # the unit's own OLLAMA_HOST and OLLAMA_MODELS stay
            env["OLLAMA_HOST"] = f"{self._options.host}:{self._options.port}"
            if self._options.models_dir is not None:
                env["OLLAMA_MODELS"] = _auto(self._options.models_dir, "models_dir")
        for name, value in self.effective_settings(settings).items():
            knob = self.knobs[name]
            if knob.scope == "request":
                continue
            assert knob.env is not None
            env[knob.env] = render_env_value(knob, value)
        return LaunchSpec(
            executable=executable,
            args=("serve",),
            env=env,
            host=self._options.host,
            port=self._options.port,
            health_path="/api/version",
            listen=OLLAMA_LISTEN,
        )

    def check_settings(self, settings: Mapping[str, ParamValue]) -> None:
        super().check_settings(settings)
        if self._options.api == "openai" and "num_batch" in settings:
            raise ConfigError(
                "num_batch reaches Ollama only through its native API (/v1 has no such option): set engine.api = "
                '"native", or leave num_batch out'
            )

    def ignored_settings(self, startup_log: str, settings: Mapping[str, ParamValue] | None = None) -> str | None:
        """Ollama drops flash attention and a quantized KV cache where the device or model cannot take them,
        with a warning at the model's load (the warm-up): a trial that set one would measure the default
        again. Only a knob this trial set is blamed (an operator's own variable is theirs)."""
        merged = self.effective_settings(settings or {})
        flash, cache = merged.get("flash_attention") is True, merged.get("kv_cache_type")
        quantized = cache is not None and cache != "f16"
        for line in startup_log.splitlines():
            for warning, knob, why in _IGNORED:
                if warning not in line:
                    continue
                # Ollama logs the cache-type warning with `type=""` when none was asked for (flash attention on,
                # OLLAMA_KV_CACHE_TYPE unset): nothing was dropped then.
                blamed = flash if knob == "flash_attention" else quantized and f"type={cache}" in line
                if blamed:
                    return (
                        f"Ollama ignored {knob} ({self.knobs[knob].env}): its log says {warning!r}{why}, so this "
                        f"trial would measure its default again; leave {knob} out of search.params"
                    )
        return None

    def memory_need(self, settings: Mapping[str, ParamValue]) -> float | None:
        """Ollama's child gets num_ctx x num_parallel KV tokens beside the weights."""
        if self._options.model_file is None:
            return None
        model = Path(self._options.model_file)
        merged = self.effective_settings(settings)
        tokens = int(merged.get("context_length") or 4096) * int(merged.get("num_parallel") or 1)
        kv_type = str(merged.get("kv_cache_type", "f16"))
        return model.stat().st_size + tokens * kv_bytes_per_token(gguf_kv_shape(model), k_type=kv_type)

    def memory_check(self, settings: Mapping[str, ParamValue]) -> str | None:
        budget = self._options.memory_budget_gib
        need = self.memory_need(settings) if budget is not None else None
        if budget is None or need is None or need <= budget * 2**30:
            return None
        return f"needs {need / 2**30:.1f} GiB (weights plus num_ctx x num_parallel KV tokens), over {budget:g} GiB"

    def prompt_token_range(self) -> tuple[int, int]:
        return (0, len(WORDS))

    def apply_request_settings(
        self,
        requests: Sequence[ReplayRequest],
        settings: Mapping[str, ParamValue],
        *,
        lora_mix: Mapping[tuple[tuple[str, float], ...], int] | None = None,
    ) -> list[ReplayRequest]:
        load = tuple(
            (name, value)
            for name, value in sorted(self.effective_settings(settings).items())
            if self.knobs[name].scope == "request"
        )
        return [request.model_copy(update={"load_options": load}) for request in requests] if load else list(requests)

    def check_lora_adapters(self, names: set[str]) -> None:
        raise ConfigError(
            f"the workload applies LoRA adapters ({', '.join(sorted(names))}) per request, which Ollama cannot do "
            "(an adapter is part of an Ollama model, via ADAPTER in its Modelfile); drop the lora fields or tune "
            "llama-server"
        )

    def build_request(self, request: ReplayRequest) -> HttpCall:
        prompt = ids_to_text(request.prompt_token_ids)
        if self._options.api == "openai":
            body: dict[str, Any] = {
                "model": self._options.model,
                "prompt": prompt,
                "max_tokens": request.output_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            return HttpCall(method="POST", path="/v1/completions", json=body)
        body = {
            "model": self._options.model,
            "prompt": prompt,
            "raw": True,
            "stream": True,
            "keep_alive": self._options.request_keep_alive,
            "options": {**dict(request.load_options), "num_predict": request.output_tokens, "temperature": 0.0},
        }
        return HttpCall(method="POST", path="/api/generate", json=body)

    def parse_stream_line(self, line: str) -> StreamEvent | None:
        if self._options.api == "openai":
            return parse_openai_sse_line(line, prompt_count_includes_cached=True)
        return parse_ollama_ndjson_line(line)

    def probe_request(
        self,
        prompt: str,
        *,
        tokens: int,
        lora: tuple[tuple[str, float], ...] | None = None,
        load_options: tuple[tuple[str, ParamValue], ...] = (),
    ) -> HttpCall:
        body = {
            "model": self._options.model,
            "prompt": prompt,
            "raw": True,
            "stream": False,
            "keep_alive": self._options.request_keep_alive,
            "options": {**dict(load_options), "num_predict": tokens, "temperature": 0.0},
        }
        return HttpCall(method="POST", path="/api/generate", json=body)

    def check_request(self) -> HttpCall:
        """`/api/show` of the study's model: a 404 where the server lacks it and a proxy's 401 without the key,
        as a generation would, but nothing loaded on an operator's server and its keep_alive left alone."""
        return HttpCall(method="POST", path="/api/show", json={"model": self._options.model})

    def parse_probe_answer(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        return probe_answer_units(str(body.get("response", "")))

    @property
    def version_path(self) -> str:
        return "/api/version"

    def parse_version(self, body: Mapping[str, Any]) -> str | None:
        version = body.get("version")
        return version if isinstance(version, str) and version else None

    def parse_log(self, lines: Iterable[str]) -> list[TaskTimeline]:
        # Ollama copies its llama-server child's trace-level lines to its own stderr, without timestamps.
        return parse_llama_server_log(lines)

    @property
    def metrics_path(self) -> str | None:
        return None

    def round_counters(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        return {}


def _auto(configured: str, option: str) -> str:
    """A configured path, or with `auto` the one `tuner setup --ollama` made on this machine."""
    from tuner import assets

    if option == "binary":
        return resolve_auto(configured, assets.find_ollama, what="Ollama build", setup="tuner setup --ollama")

    def made() -> Path | None:
        return assets.ollama_models_dir() if assets.find_ollama_model() else None

    return resolve_auto(configured, made, what="demo model as an Ollama model", setup="tuner setup --ollama")


def parse_ollama_ndjson_line(line: str) -> StreamEvent | None:
    """One line of /api/generate or /api/chat: a text piece, or the final object with its metrics (ns)."""
    line = line.strip()
    if not line:
        return None
    try:
        chunk = json.loads(line)
    except json.JSONDecodeError:
        return StreamEvent(error=f"unreadable stream line: {line[:80]}")
    if not isinstance(chunk, dict):
        return StreamEvent(error=f"unreadable stream line: {line[:80]}")
    if "error" in chunk:
        return StreamEvent(error=str(chunk["error"]), done=True)
    piece = chunk.get("response")
    if piece is None and isinstance(chunk.get("message"), dict):
        piece = chunk["message"].get("content")
    tokens = 1 if piece else 0
    if not chunk.get("done"):
        return StreamEvent(tokens=tokens)
    eval_count = int(chunk.get("eval_count") or 0)
    prompt_ms = int(chunk.get("prompt_eval_duration") or 0) / _NS_PER_MS
    eval_ms = int(chunk.get("eval_duration") or 0) / _NS_PER_MS
    total_ms = int(chunk.get("total_duration") or 0) / _NS_PER_MS
    load_ms = int(chunk.get("load_duration") or 0) / _NS_PER_MS
    return StreamEvent(
        tokens=tokens,
        tokens_so_far=eval_count,
        done=True,
        timings=ServerTimings(
            prompt_n=int(chunk.get("prompt_eval_count") or 0),
            prompt_n_includes_cached=True,
            prompt_ms=prompt_ms,
            predicted_n=eval_count,
            predicted_ms=eval_ms,
        ),
        extra={
            "done_reason": chunk.get("done_reason"),
            "load_ms": load_ms,
            # The wait for a free slot: the handler's whole time less load, prompt and generation.
            "slot_wait_ms": max(0.0, total_ms - load_ms - prompt_ms - eval_ms),
        },
    )
