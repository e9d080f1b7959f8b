"""llama.cpp's llama-server: knobs as `LLAMA_ARG_*` variables, `/completion` with token-id prompts.

Prompts go as token ids so that every request has exactly the recorded number of prompt tokens
without a tokenizer round trip, and `ignore_eos` makes every answer exactly as long as recorded.
"""

from __future__ import annotations

import copy
import math
import re
import socket
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from tuner import assets, catalog
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
from tuner.engines.llama_server_api import (
    completion_body,
    flush_requests,
    parse_probe_answer,
    parse_stream_line,
    parse_version,
    probe_body,
    round_counters,
)
from tuner.engines.llama_server_knobs import (
    LLAMA_SERVER_KNOBS,
    LLAMA_SERVER_LISTEN,
    LLAMA_SERVER_METRICS,
    LORA_POLICIES,
)
from tuner.engines.llama_server_log import parse_llama_server_log
from tuner.engines.memory import gguf_kv_shape, kv_bytes_per_token
from tuner.errors import AssetError, ConfigError
from tuner.metrics import MetricInfo
from tuner.models import LaunchSpec, ReplayRequest, ServerCommand, TaskTimeline

__all__ = [
    "LLAMA_SERVER_KNOBS",
    "LLAMA_SERVER_LISTEN",
    "LLAMA_SERVER_METRICS",
    "LORA_POLICIES",
    "SIMULATED",
    "LlamaServerEngine",
    "LlamaServerOptions",
]

# `engine.binary = "simulated"`: the simulated llama-server (tuner.sim), installed beside the controller's
# Python as a program of the same package; it runs where the controller runs (a local host).
SIMULATED = "simulated"
_SIMULATOR_PROGRAM = "tuner-sim-llama-server"

# Ids below 100 hold SmolLM2's and most vocabularies' special tokens; 30000 fits any vocabulary of
# 32K or more, so synthesized prompts never contain a control token.
_PROMPT_TOKEN_RANGE = (100, 30000)
# common/arg.cpp, when a flag and its environment variable are both given.
_OVERWRITTEN_BY_FLAG = re.compile(
    r"(?P<env>LLAMA_ARG_\w+) environment variable is set, but will be overwritten by command line argument "
    r"(?P<flag>\S+)"
)
_N_SLOTS = re.compile(r"load_model: initializing, n_slots = (\d+)")
# The line the server writes once its model is loaded and it serves, stamped minutes.seconds.ms.us since start.
_LISTENING = re.compile(r"(?:^|\s)(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) I srv +\w+: listening on ", re.MULTILINE)


class LlamaServerOptions(ApiKeyOptions):
    binary: str = Field(
        default="auto",
        description="Path of llama-server, auto for the built one, or simulated for serve-tuner's simulated "
        "llama-server (no build, no model; docs/simulator.md).",
    )
    model: str = Field(
        default="auto", description="Path of the GGUF model, or auto for SmolLM2-135M (none needed when simulated)."
    )
    host: str = Field(default="127.0.0.1", description="Address the server listens on.")
    port: int = Field(default=0, ge=0, le=65535, description="Port to listen on; 0 picks a free one per trial.")
    settings: dict[str, ParamValue] = Field(
        default_factory=dict, description="Knobs fixed for the whole study, the baseline included."
    )
    extra_args: list[str] = Field(default_factory=list, description="More command-line arguments.")
    memory_budget_gib: float | None = Field(
        default=None,
        gt=0,
        description="Memory for the weights and the KV cache (ctx_size tokens); configs that need more are "
        "skipped before any restart.",
    )
    lora_adapters: dict[str, str] = Field(
        default_factory=dict,
        description="Adapter name (as the workload names it) to GGUF path, or auto for the test adapter "
        "`tuner setup` writes; loaded at launch at scale 0, applied per request.",
    )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@ENGINES.register("llama-server")
class LlamaServerEngine(KnobbedEngine[LlamaServerOptions]):
    kind = "llama-server"
    knobs: Mapping[str, Knob] = LLAMA_SERVER_KNOBS
    metrics: ClassVar[Mapping[str, MetricInfo]] = LLAMA_SERVER_METRICS
    options_model = LlamaServerOptions

    def __init__(self, options: LlamaServerOptions, *, command: ServerCommand = ServerCommand.LOCAL) -> None:
        super().__init__(options, command=command)
        self._model_on_host: tuple[Path, int] | None = None
        if options.binary != SIMULATED:
            adapters = {f"engine.lora_adapters.{name}": path for name, path in options.lora_adapters.items()}
            if command is ServerCommand.UNIT:
                check_paths_for(command, options, paths=adapters, placement=("binary", "model", "host", "port"))
            else:
                paths = {"engine.binary": options.binary, "engine.model": options.model, **adapters}
                check_paths_for(command, options, paths=paths)
        # The server gets it as LLAMA_API_KEY through a file only it can read (the deployer's secret_env).
        self._api_key = load_api_key(options)

    @property
    def _unit_command(self) -> bool:
        return self._command is ServerCommand.UNIT

    @property
    def _adapters(self) -> list[str]:
        return list(self._options.lora_adapters)  # an adapter's id in a request is its place here

    def request_headers(self) -> dict[str, str]:
        return bearer_headers(self._api_key)

    def host_files(self) -> dict[str, str]:
        configured: dict[str, str] = {}
        if self._command is not ServerCommand.UNIT:  # the unit's own program and model are its business
            configured["engine.model"] = self._options.model
            if not self.simulated:
                configured["engine.binary"] = self._options.binary
        configured.update({f"engine.lora_adapters.{name}": path for name, path in self._options.lora_adapters.items()})
        return {key: path for key, path in configured.items() if path != "auto"}

    @property
    def simulated(self) -> bool:
        return self._options.binary == SIMULATED

    def resolve_binary(self) -> str:
        if self.simulated:
            return str(Path(sys.executable).with_name(_SIMULATOR_PROGRAM))
        return resolve_auto(self._options.binary, assets.find_llama_server, what="llama-server binary")

    def resolve_model(self) -> str:
        if self.simulated and self._options.model == "auto":
            return SIMULATED  # the simulator loads no model
        return resolve_auto(self._options.model, assets.find_model, what="model file")

    def launch_spec(self, settings: Mapping[str, ParamValue]) -> LaunchSpec:
        self.check_settings(settings)
        env: dict[str, str] = {}
        if self._unit_command:
            # The unit's own model, address and port stay: its drop-in carries the trial's knobs and nothing
            # else; the deployer reads where the server listens from the unit (LLAMA_SERVER_LISTEN).
            port = self._options.port
        else:
            port = self._options.port or _free_port(self._options.host)
            env = {
                "LLAMA_ARG_MODEL": self.resolve_model(),
                "LLAMA_ARG_HOST": self._options.host,
                "LLAMA_ARG_PORT": str(port),
                "LLAMA_ARG_ENDPOINT_METRICS": "1",
            }
        for name, value in self.effective_settings(settings).items():
            knob = self.knobs[name]
            if knob.scope == "request":
                continue
            assert knob.env is not None
            env[knob.env] = render_env_value(knob, value)
        # The adapter flags have no environment variable; each adapter is loaded at global scale 0, applied
        # only by a request's own `lora` field (docs/architecture.md, "The llama-server engine").
        lora_args: list[str] = []
        for name, configured in self._options.lora_adapters.items():
            if self.simulated and configured == "auto":
                path = f"{SIMULATED}-{name}.gguf"  # the simulator loads nothing, it only numbers the adapters
            else:
                path = resolve_auto(configured, assets.find_test_lora, what="LoRA adapter")
            lora_args += ["--lora-scaled", f"{path}:0"]
        return LaunchSpec(
            executable=self._options.binary if self._unit_command else self.resolve_binary(),
            args=(*lora_args, *self._options.extra_args),
            env=env,
            # With the unit's own command its own key stays (requests still carry ours: a wrong one is a 401).
            secret_env={"LLAMA_API_KEY": self._api_key} if self._api_key and not self._unit_command else {},
            host=self._options.host,
            port=port,
            health_path="/health",
            listen=LLAMA_SERVER_LISTEN,
        )

    def memory_need(self, settings: Mapping[str, ParamValue]) -> float | None:
        """llama-server allocates ctx_size KV tokens (all slots together) beside the weights at start."""
        if self._model_on_host is not None:
            header, size = self._model_on_host
        elif self._command is ServerCommand.UNIT:
            return None  # the unit's model is on the host: `with_model_from_host` brings its header here
        else:
            try:
                model = Path(self.resolve_model())
            except AssetError:
                return None
            if not model.is_file():
                return None  # a model on a remote host: its header cannot be read from here
            header, size = model, model.stat().st_size
        merged = self.effective_settings(settings)
        tokens = int(merged.get("ctx_size") or 4096)
        k_type = str(merged.get("cache_type_k", "f16"))
        v_type = str(merged.get("cache_type_v", k_type))
        return size + tokens * kv_bytes_per_token(gguf_kv_shape(header), k_type=k_type, v_type=v_type)

    @property
    def memory_budget_gib(self) -> float | None:
        return self._options.memory_budget_gib

    def model_path_on_host(self) -> str | None:
        """The model the study names on the host (None: the unit's own, or this machine's build)."""
        return None if self._unit_command or self._options.model == "auto" or self.simulated else self._options.model

    def with_model_from_host(self, header: Path, size: int) -> LlamaServerEngine:
        """This engine with the start of a model file read from the host (`header`, its GGUF header) and the
        file's size standing in for the file: the memory pre-check of a model that is not on this machine."""
        twin = copy.copy(self)
        twin._model_on_host = (header, size)
        return twin

    def memory_check(self, settings: Mapping[str, ParamValue]) -> str | None:
        budget = self._options.memory_budget_gib
        need = self.memory_need(settings) if budget is not None else None
        if budget is None or need is None or need <= budget * 2**30:
            return None
        tokens = int(self.effective_settings(settings).get("ctx_size") or 4096)
        return f"needs {need / 2**30:.2f} GiB (weights plus {tokens} KV tokens), over the {budget:g} GiB budget"

    def prompt_token_range(self) -> tuple[int, int]:
        return _PROMPT_TOKEN_RANGE

    def apply_request_settings(
        self,
        requests: Sequence[ReplayRequest],
        settings: Mapping[str, ParamValue],
        *,
        lora_mix: Mapping[tuple[tuple[str, float], ...], int] | None = None,
    ) -> list[ReplayRequest]:
        policy = self.effective_settings(settings).get("lora_policy", "as_recorded")
        if policy == "as_recorded":
            return list(requests)
        if policy == "all_off":
            return [r.model_copy(update={"lora": ()}) for r in requests]
        # The round's most used setting (ties: the one used first), not the most used of these requests.
        used = (
            Counter({uses: count for uses, count in lora_mix.items() if uses})
            if lora_mix is not None
            else Counter(r.lora for r in requests if r.lora)
        )
        if not used:
            return list(requests)
        most_common = used.most_common(1)[0][0]
        return [r.model_copy(update={"lora": most_common}) for r in requests]

    def ignored_settings(self, startup_log: str, settings: Mapping[str, ParamValue] | None = None) -> str | None:
        by_env = {knob.env: knob for knob in self.knobs.values() if knob.env}
        for match in _OVERWRITTEN_BY_FLAG.finditer(startup_log):
            knob = by_env.get(match["env"])
            if knob is not None:
                return (
                    f"llama-server ignored {knob.name} ({match['env']}): the command line sets {match['flag']}, "
                    'which wins; remove it from the unit\'s ExecStart or set deploy.exec_start = "replace"'
                )
        return None

    def reuse_refusal(self, settings: Mapping[str, ParamValue]) -> str | None:
        # `flush_requests` clears every slot; what the host-RAM prompt cache keeps, a reused round's variant
        # of its prompts cannot use (docs/architecture.md, "The llama-server engine").
        return None

    def startup_s(self, log: str) -> float | None:
        found = _LISTENING.search(log)
        if found is None:
            return None
        minutes, seconds, ms, us = (int(part) for part in found.groups())
        return minutes * 60 + seconds + ms / 1e3 + us / 1e6

    def clock_speed(self) -> float:
        if not self.simulated:
            return 1.0
        args, speed = self._options.extra_args, 1.0
        for i, flag in enumerate(args):  # the last one counts, as in the simulator's own parser
            if flag == "--sim-speed":
                text = args[i + 1] if i + 1 < len(args) else ""
            elif flag.startswith("--sim-speed="):
                text = flag.removeprefix("--sim-speed=")
            else:
                continue
            try:
                speed = float(text)
            except ValueError:
                speed = 1.0
        # Outside the simulator's range it refuses to start; the estimate keeps real time meanwhile.
        return (
            speed if math.isfinite(speed) and catalog.SIM_SPEED_RANGE[0] <= speed <= catalog.SIM_SPEED_RANGE[1] else 1.0
        )

    def slot_count(self, startup_log: str) -> int | None:
        found = _N_SLOTS.findall(startup_log)
        return int(found[-1]) if found else None

    def flush_requests(self, slots: int) -> list[ReplayRequest]:
        return flush_requests(slots, self.prompt_token_range())

    def check_lora_adapters(self, names: set[str]) -> None:
        missing = sorted(names - set(self._options.lora_adapters))
        if missing:
            raise ConfigError(
                f"the workload applies LoRA adapter(s) {', '.join(missing)} that the engine does not load; add them "
                f'to engine.lora_adapters, e.g. lora_adapters = {{ {missing[0]} = "path/to/adapter.gguf" }}'
            )

    def build_request(self, request: ReplayRequest) -> HttpCall:
        return HttpCall(method="POST", path="/completion", json=completion_body(request, self._adapters))

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
        body = probe_body(prompt, tokens=tokens, adapters=self._adapters, lora=lora)
        return HttpCall(method="POST", path="/completion", json=body)

    def parse_probe_answer(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        return parse_probe_answer(body)

    @property
    def version_path(self) -> str:
        return "/props"

    def parse_version(self, body: Mapping[str, Any]) -> str | None:
        return parse_version(body)

    def parse_log(self, lines: Iterable[str]) -> list[TaskTimeline]:
        return parse_llama_server_log(lines)

    @property
    def metrics_path(self) -> str | None:
        return "/metrics"

    def round_counters(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        return round_counters(before, after)

    def parse_stream_line(self, line: str) -> StreamEvent | None:
        return parse_stream_line(line)
