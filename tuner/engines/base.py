"""The `Engine` protocol, the description of one knob, and the engine registry."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from tuner.config import ParamValue, PluginSpec, StrictModel, validate_options
from tuner.errors import AssetError, ConfigError
from tuner.metrics import MetricInfo
from tuner.models import LaunchSpec, ReplayRequest, ServerCommand, ServerTimings, TaskTimeline
from tuner.registry import Registry

__all__ = [
    "ENGINES",
    "Engine",
    "EngineFactory",
    "HttpCall",
    "Knob",
    "KnobbedEngine",
    "StreamEvent",
    "check_paths_for",
    "create_engine",
    "parse_prometheus_text",
    "render_env_value",
    "request_setting_advice",
]


# Booleans as Go's strconv.ParseBool (Ollama) and llama.cpp's flags read them.
_TRUE_WORDS = frozenset(("1", "t", "true", "on", "yes", "enabled"))
_FALSE_WORDS = frozenset(("0", "f", "false", "off", "no", "disabled"))
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One server setting: how it is passed and which values are valid."""

    name: str
    value_type: Literal["int", "float", "bool", "str"]
    env: str | None = None
    flag: str | None = None
    # Every other spelling of the flag the server takes (long forms, negations): a unit's command line
    # that carries any of them decides the knob whatever the environment says.
    other_flags: tuple[str, ...] = ()
    minimum: int | None = None
    # The servers read integer settings into a C int (llama.cpp's std::stoi, vLLM's and Ollama's limits
    # are no larger in practice): a larger value is a unit mistake (ctx_size = 1e12), refused up front.
    maximum: int = 2**31 - 1
    choices: tuple[str, ...] = ()
    description: str = ""
    # "server": set at launch (env var or flag); "request": changes what the replay sends, not the server.
    scope: Literal["server", "request"] = "server"
    # How an operator makes a request-scope setting stick where the host's configuration cannot carry it.
    how_to_apply: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        return ((self.flag,) if self.flag else ()) + self.other_flags

    def parse(self, text: str) -> ParamValue:
        """A value as a server is given it (a variable's or a flag's text, quotes and spaces around it
        dropped, as Ollama's envconfig does) in this knob's type; ValueError for one it would not read."""
        text = text.strip().strip("\"'").strip()
        if self.value_type == "bool":
            lowered = text.lower()
            if lowered in _TRUE_WORDS:
                return True
            if lowered in _FALSE_WORDS:
                return False
            raise ValueError(f"{text!r} is not a boolean")
        if self.value_type == "int":
            if not _INTEGER.fullmatch(text):  # int() would also take 1_0 and other scripts' digits
                raise ValueError(f"{text!r} is not a whole number")
            return int(text)
        if self.value_type == "float":
            return float(text)
        return text

    def check(self, value: ParamValue) -> None:
        types: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "bool": bool, "str": str}
        expected = types[self.value_type]
        if isinstance(value, bool) and self.value_type != "bool":
            raise ConfigError(f"knob {self.name!r} takes a {self.value_type}, got {value!r}")
        if not isinstance(value, expected):
            raise ConfigError(f"knob {self.name!r} takes a {self.value_type}, got {value!r}")
        if self.minimum is not None and isinstance(value, int) and value < self.minimum:
            raise ConfigError(f"knob {self.name!r} must be >= {self.minimum}, got {value!r}")
        if self.value_type == "int" and isinstance(value, int) and value > self.maximum:
            raise ConfigError(
                f"knob {self.name!r} must be <= {self.maximum} (the server reads it as a 32-bit integer), got {value!r}"
            )
        if self.choices and value not in self.choices:
            raise ConfigError(f"knob {self.name!r} must be one of {', '.join(self.choices)}, got {value!r}")


def request_setting_advice(knobs: Mapping[str, Knob], settings: Mapping[str, ParamValue]) -> list[str]:
    """For each request-scope setting, how an operator keeps it (the host's configuration cannot carry it)."""
    advice = []
    for name, value in sorted(settings.items()):
        knob = knobs.get(name)
        how = knob.how_to_apply.format(value=value) if knob is not None and knob.how_to_apply else ""
        advice.append(f"{name}={value}: {how or 'what every client sends with each request'}")
    return advice


@dataclass(frozen=True, kw_only=True)
class HttpCall:
    method: str
    path: str
    json: dict[str, Any]


@dataclass(kw_only=True, slots=True)  # not frozen: one is made per streamed token, and frozen init is slow
class StreamEvent:
    """What one line of a response stream carried.

    `tokens_so_far`, when the engine reports it, is the number of tokens generated up to this line; it
    is more reliable than counting tokens per line, because llama-server withholds tokens that end
    in an incomplete UTF-8 character and sends them later without listing them.
    """

    tokens: int = 0
    tokens_so_far: int | None = None
    token_ids: tuple[int, ...] = ()
    done: bool = False
    timings: ServerTimings | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class SettingsModel(Protocol):
    @property
    def settings(self) -> Mapping[str, ParamValue]: ...


OptionsT = TypeVar("OptionsT", bound=SettingsModel)


class KnobbedEngine(Generic[OptionsT]):
    """What every engine does alike with its knobs: check values, and keep the study-wide settings."""

    kind: str
    knobs: Mapping[str, Knob]

    def __init__(self, options: OptionsT, *, command: ServerCommand = ServerCommand.LOCAL) -> None:
        self._options = options
        self._command = command
        try:
            self.check_settings(options.settings)
        except ConfigError as exc:
            raise ConfigError(f"engine.settings: {exc}") from None

    @property
    def base_settings(self) -> Mapping[str, ParamValue]:
        return self._options.settings

    def effective_settings(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        # The one place a trial's settings meet the study-wide ones: the trial's win.
        return {**self._options.settings, **settings}

    def check_settings(self, settings: Mapping[str, ParamValue]) -> None:
        for name, value in settings.items():
            knob = self.knobs.get(name)
            if knob is None:
                raise ConfigError(f"unknown {self.kind} knob {name!r}; valid: {', '.join(sorted(self.knobs))}")
            knob.check(value)

    def ignored_settings(self, startup_log: str, settings: Mapping[str, ParamValue] | None = None) -> str | None:
        """Why the server ignores a setting it was given, read from its startup log; None by default."""
        return None

    def server_settings(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """The effective settings the server itself runs with: request-scope knobs left out."""
        merged = self.effective_settings(settings)
        return {name: value for name, value in merged.items() if self.knobs[name].scope == "server"}

    def reuse_refusal(self, settings: Mapping[str, ParamValue]) -> str | None:
        """By default a running server is never reused for another trial: nothing is known to clear its
        caches (prefix or prompt caches would serve the next trial's round from the last one's prompts)."""
        return f"{self.kind} has no request known to clear its caches"

    def slot_count(self, startup_log: str) -> int | None:
        """How many slots the server runs, from its startup log; None where it does not say."""
        return None

    def startup_s(self, log: str) -> float | None:
        """How long the server took from its start to serving, by its own log's clock; None where it
        does not say."""
        return None

    def clock_speed(self) -> float:
        """How many times faster than real time the server runs: 1 for a real one."""
        return 1.0

    def flush_requests(self, slots: int) -> list[ReplayRequest]:
        """Requests that leave no slot holding an earlier prompt; none by default."""
        return []

    def host_files(self) -> dict[str, str]:
        """No files of the host's by default."""
        return {}

    def request_headers(self) -> dict[str, str]:
        """No headers by default."""
        return {}


def check_paths_for(
    command: ServerCommand, options: StrictModel, *, paths: Mapping[str, str], placement: Sequence[str] = ()
) -> None:
    """Refuses, in one line, an engine path or address that means nothing for whose command starts the
    server: `auto` (this machine's build) anywhere but here, or a program, model or address of the study's
    (`placement`, the option names) where the operator's unit keeps its own."""
    if command is not ServerCommand.LOCAL:
        for key, value in paths.items():
            if value == "auto":
                raise ConfigError(
                    f'{key} = "auto" means a file of this machine\'s (`tuner setup`), which the host does not have; '
                    f"set {key} to its path on the host"
                )
            if command is ServerCommand.REMOTE and not value.startswith("/"):
                raise ConfigError(
                    f"{key} = {value!r} is relative: the server on the host would resolve it from its own working "
                    f"directory, not yours; set {key} to its absolute path on the host"
                )
    if command is ServerCommand.UNIT:
        given = sorted(name for name in placement if name in options.model_fields_set)
        if given:
            raise ConfigError(
                f"engine.{given[0]} is the operator's own: deploy.exec_start = \"keep\" runs the unit's command "
                f"line, which sets the program, model, address and port; remove engine.{given[0]} from the study "
                "(the unit's are read and shown), or set deploy.exec_start = \"replace\" to run the study's own"
            )


def resolve_auto(
    configured: str, find_built: Callable[[], Path | None], *, what: str, setup: str = "tuner setup"
) -> str:
    """A configured path (a path on the host, which the study checks there), or with `auto` the one
    `setup` made here."""
    if configured != "auto":
        return configured
    found = find_built()
    if found is None:
        raise AssetError(f"the {what} is not there yet; run `{setup}` (one time, about 10 minutes)")
    return str(found)


def render_env_value(knob: Knob, value: ParamValue) -> str:
    """A knob's value as its environment variable takes it: booleans as 1 and 0."""
    if knob.value_type == "bool":
        return "1" if value else "0"
    return str(value)


class Engine(Protocol):
    kind: str
    knobs: Mapping[str, Knob]

    @property
    def metrics(self) -> Mapping[str, MetricInfo]:
        """What its `round_counters` adds to a round, beside the common METRICS."""
        ...

    @property
    def base_settings(self) -> Mapping[str, ParamValue]:
        """The study-wide settings (`engine.settings`): the baseline's, and every trial's base."""
        ...

    def effective_settings(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """What a server runs with: the base settings with a trial's `settings` on top."""
        ...

    def check_settings(self, settings: Mapping[str, ParamValue]) -> None:
        """Raises `ConfigError` for an unknown knob or an invalid value."""
        ...

    def launch_spec(self, settings: Mapping[str, ParamValue]) -> LaunchSpec:
        """The launch of the engine's base settings with a trial's `settings` on top; {} is the baseline."""
        ...

    def prompt_token_range(self) -> tuple[int, int]:
        """Token ids that are safe to put in a synthesized prompt: [low, high)."""
        ...

    def apply_request_settings(
        self,
        requests: Sequence[ReplayRequest],
        settings: Mapping[str, ParamValue],
        *,
        lora_mix: Mapping[tuple[tuple[str, float], ...], int] | None = None,
    ) -> list[ReplayRequest]:
        """The requests as a trial with these settings sends them (request-scoped knobs, e.g. a LoRA policy).
        `lora_mix` is the whole round's requests per adapter set, in the order of each set's first request
        (`Trace.lora_mix`), for a policy decided on the round while its requests come a session at a time;
        None: decided on `requests` themselves."""
        ...

    def memory_need(self, settings: Mapping[str, ParamValue]) -> float | None:
        """Bytes these settings need (weights and KV cache), or None when the engine cannot tell."""
        ...

    def memory_check(self, settings: Mapping[str, ParamValue]) -> str | None:
        """Why these settings cannot fit in the configured memory (KV cache beside the weights), or None;
        None too when the engine has no memory budget to check against."""
        ...

    def check_lora_adapters(self, names: set[str]) -> None:
        """Raises `ConfigError` unless every adapter a workload names is configured for the engine."""
        ...

    def request_headers(self) -> dict[str, str]:
        """Headers every request to the server carries (its API key); never logged."""
        ...

    def host_files(self) -> dict[str, str]:
        """Files the configuration names on the host (study-file key to path), checked there before a
        study starts: on a remote host they need not exist on this machine."""
        ...

    def ignored_settings(self, startup_log: str, settings: Mapping[str, ParamValue] | None = None) -> str | None:
        """Why the server ignores one of the settings it was given (a flag in a systemd unit's own
        ExecStart wins over the environment variable, say), read from its startup log; None if none."""
        ...

    def server_settings(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """The effective settings the server itself runs with: request-scope knobs (a LoRA policy) left out.
        Two trials with equal server settings can share a running server."""
        ...

    def reuse_refusal(self, settings: Mapping[str, ParamValue]) -> str | None:
        """Why a running server with these settings cannot measure a round of another trial without a
        restart (a cache that no request clears and that a variant of the round's prompts could still hit);
        None where `flush_requests` clears what a restart would, or what it leaves no variant can use."""
        ...

    def slot_count(self, startup_log: str) -> int | None:
        """How many slots (sequences served at once) the server runs, from its startup log; None if unknown."""
        ...

    def startup_s(self, log: str) -> float | None:
        """How long the server took from its start to serving (the model loaded), by its own log's clock;
        None where its log does not say."""
        ...

    def clock_speed(self) -> float:
        """How many times faster than real time the server runs: 1, but for a simulated server's speed-up."""
        ...

    def flush_requests(self, slots: int) -> list[ReplayRequest]:
        """Requests, tagged "slot-flush", that together leave each of `slots` idle slots holding a short
        prompt of their own instead of an earlier round's (see `reuse_refusal`)."""
        ...

    def build_request(self, request: ReplayRequest) -> HttpCall: ...

    def parse_stream_line(self, line: str) -> StreamEvent | None:
        """Reads one line of the streamed response; None for lines that carry nothing."""
        ...

    def check_request(self) -> HttpCall:
        """The one small request `--check` sends to a running server, with the study's model name (and the
        key, in the headers): a 1-token probe by default."""
        ...

    def probe_request(
        self,
        prompt: str,
        *,
        tokens: int,
        lora: tuple[tuple[str, float], ...] | None = None,
        load_options: tuple[tuple[str, ParamValue], ...] = (),
    ) -> HttpCall:
        """A non-streamed, greedy (temperature 0) completion of a fixed text prompt, for the correctness gate;
        `lora` asks for these adapters (empty: none), None for the server's default; `load_options` are the
        trial's (`ReplayRequest.load_options`), which an engine that loads no model per request ignores."""
        ...

    def parse_probe_answer(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        """The generated token ids of a probe's answer."""
        ...

    @property
    def version_path(self) -> str:
        """The GET endpoint that says which build of the server runs (for the report; never required)."""
        ...

    def parse_version(self, body: Mapping[str, Any]) -> str | None:
        """The build or version string in `version_path`'s answer; None when it has none."""
        ...

    def parse_log(self, lines: Iterable[str]) -> list[TaskTimeline]:
        """The server's own account of each task in a stretch of its log."""
        ...

    @property
    def metrics_path(self) -> str | None:
        """Path of the server's Prometheus endpoint, or None if it has none."""
        ...

    def round_counters(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        """Round metrics from two scrapes of the Prometheus endpoint, taken before and after the round."""
        ...


class EngineFactory(Protocol):
    metrics: Mapping[str, MetricInfo]

    @property
    def options_model(self) -> type[BaseModel]: ...

    def __call__(self, options: Any, *, command: ServerCommand = ...) -> Engine: ...


ENGINES: Registry[EngineFactory] = Registry("engine")


def create_engine(spec: PluginSpec, *, command: ServerCommand = ServerCommand.LOCAL) -> Engine:
    """The study's engine; `command` says whose command line starts its server (`ConfigError` for a
    path that cannot mean anything there, such as `auto` on another host)."""
    factory = ENGINES.get(spec.kind)
    options = validate_options(factory.options_model, spec.options(), where="engine")
    return factory(options, command=command)


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Series name (with its labels, `name{a="x",b="y"}`) to value, from Prometheus' text format, read by
    prometheus_client's parser (timestamps, escaped label values, `+Inf`). Each sample line is read on its
    own, so a line it cannot read costs that line only, and every series keeps the name it was written
    with (the parser would add `_total` to a counter's name that lacks it)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        for family in families:
            for sample in family.samples:
                labels = ",".join(f'{name}="{_escape_label(value)}"' for name, value in sample.labels.items())
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return values


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
