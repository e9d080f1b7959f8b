"""The simulated llama-server's command line, read by the real server's rules: its `LLAMA_ARG_*`
variables first, then its flags, each flag over its variable with the real server's warning line; and
the simulator's own `--sim-*` options (speed, seed, noise, calibration, faults). `tuner-sim-llama-server
--help` prints `USAGE`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner import catalog
from tuner.sim.inputs import NoiseModel, SimSettings, load_cost_model

__all__ = ["USAGE", "CommandLine", "CommandLineError", "Fault", "parse_command_line", "parse_fault"]

# flag spellings -> (setting, kind); the environment variable of each is in _ENV.
_FLAGS: dict[str, tuple[str, str]] = {
    "-b": ("n_batch", "int"),
    "--batch-size": ("n_batch", "int"),
    "-ub": ("n_ubatch", "int"),
    "--ubatch-size": ("n_ubatch", "int"),
    "-np": ("n_parallel", "int"),
    "--parallel": ("n_parallel", "int"),
    "-c": ("ctx_size", "int"),
    "--ctx-size": ("ctx_size", "int"),
    "-cram": ("cache_ram", "int"),
    "--cache-ram": ("cache_ram", "int"),
    "-lv": ("verbosity", "int"),
    "--verbosity": ("verbosity", "int"),
    "-t": ("threads", "int"),
    "--threads": ("threads", "int"),
    "-m": ("model", "str"),
    "--model": ("model", "str"),
    "--host": ("host", "str"),
    "--port": ("port", "int"),
    "-fa": ("flash_attn", "str"),
    "--flash-attn": ("flash_attn", "str"),
    "-ctk": ("cache_type_k", "str"),
    "--cache-type-k": ("cache_type_k", "str"),
    "-ctv": ("cache_type_v", "str"),
    "--cache-type-v": ("cache_type_v", "str"),
    "--api-key": ("api_key", "str"),
}
_SWITCHES: dict[str, tuple[str, bool]] = {
    "--kv-unified": ("kv_unified", True),
    "-kvu": ("kv_unified", True),
    "--no-kv-unified": ("kv_unified", False),
    "-cb": ("cont_batching", True),
    "--cont-batching": ("cont_batching", True),
    "-nocb": ("cont_batching", False),
    "--no-cont-batching": ("cont_batching", False),
    "--cache-prompt": ("cache_prompt", True),
    "--no-cache-prompt": ("cache_prompt", False),
    "--metrics": ("metrics", True),
}
_ENV: dict[str, str] = {
    "n_batch": "LLAMA_ARG_BATCH",
    "n_ubatch": "LLAMA_ARG_UBATCH",
    "n_parallel": "LLAMA_ARG_N_PARALLEL",
    "ctx_size": "LLAMA_ARG_CTX_SIZE",
    "cache_ram": "LLAMA_ARG_CACHE_RAM",
    "verbosity": "LLAMA_ARG_LOG_VERBOSITY",
    "threads": "LLAMA_ARG_THREADS",
    "model": "LLAMA_ARG_MODEL",
    "host": "LLAMA_ARG_HOST",
    "port": "LLAMA_ARG_PORT",
    "flash_attn": "LLAMA_ARG_FLASH_ATTN",
    "cache_type_k": "LLAMA_ARG_CACHE_TYPE_K",
    "cache_type_v": "LLAMA_ARG_CACHE_TYPE_V",
    "kv_unified": "LLAMA_ARG_KV_UNIFIED",
    "cont_batching": "LLAMA_ARG_CONT_BATCHING",
    "cache_prompt": "LLAMA_ARG_CACHE_PROMPT",
    "metrics": "LLAMA_ARG_ENDPOINT_METRICS",
    "api_key": "LLAMA_API_KEY",
}
_SIM_OPTIONS = {
    "--sim-speed": "speed",
    "--sim-seed": "seed",
    "--sim-noise-restart": "noise_restart",
    "--sim-noise-iteration": "noise_iteration",
    "--sim-calibration": "calibration",
    "--sim-fault": "fault",
}


class CommandLineError(Exception):
    """What the real server prints as `error: ...` before exiting 1."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    when: tuple[str, str] | None  # (setting, value) that must match
    kind: str  # refuse-start | die-after | hang-after
    after: int = 0

    def applies(self, values: Mapping[str, object]) -> bool:
        return self.when is None or str(values.get(self.when[0])).lower() == self.when[1].lower()


@dataclass(frozen=True, kw_only=True)
class CommandLine:
    settings: SimSettings
    values: dict[str, object]
    host: str
    port: int
    metrics: bool
    api_key: str | None
    speed: float
    seed: int
    noise: NoiseModel
    calibration: Path | None
    faults: tuple[Fault, ...]
    warnings: tuple[str, ...]


def parse_fault(text: str) -> Fault:
    when: tuple[str, str] | None = None
    if ":" in text:
        condition, text = text.split(":", 1)
        name, _, value = condition.partition("=")
        if not name or not value:
            raise CommandLineError(f"--sim-fault {condition!r}: a condition is SETTING=VALUE")
        if name not in _SETTING_NAMES:
            # A misspelt condition would never match, and a test of the fault would pass testing nothing.
            raise CommandLineError(
                f"--sim-fault {condition!r}: unknown setting {name!r}; one of {', '.join(sorted(_SETTING_NAMES))}"
            )
        when = (name, value)
    kind, _, count = text.partition("=")
    if kind == "refuse-start" and not count:
        return Fault(when=when, kind=kind)
    if kind in ("die-after", "hang-after") and count.isdigit():
        return Fault(when=when, kind=kind, after=int(count))
    raise CommandLineError(f"--sim-fault {text!r}: one of refuse-start, die-after=N, hang-after=N")


def _convert(value: str, kind: str, flag: str) -> object:
    if kind == "int":
        try:
            return int(value)
        except ValueError:
            raise CommandLineError(f"invalid value for {flag}: {value}") from None
    return value


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "on", "yes", "enabled")


_SWITCH_NAMES = {name for name, _ in _SWITCHES.values()}
_FLAG_KINDS = {name: kind for name, kind in _FLAGS.values()}
_SETTING_NAMES = _SWITCH_NAMES | set(_FLAG_KINDS) | set(_ENV)

# The speed factor's sane range: below it a start outlasts any health wait, above it one model step is
# shorter than the event loop's own latency and the simulated timings stop meaning anything.
_SPEED_RANGE = catalog.SIM_SPEED_RANGE

USAGE = """usage: tuner-sim-llama-server [llama-server's flags and LLAMA_ARG_* variables] [--sim-* options]

serve-tuner's simulated llama-server (docs/simulator.md): llama-server's HTTP API and log lines, on a
calibrated model of its loop. Beside the llama-server flags the tuner passes:
  --sim-speed N            run N times faster than real time (0.01 to 1000; default 1)
  --sim-seed N             seed of the noise (default 0)
  --sim-noise-restart S    log-normal sigma once per start (default 0)
  --sim-noise-iteration S  log-normal sigma per forward pass (default 0)
  --sim-calibration FILE   cost-model constants (scripts/calibrate_sim.py writes them)
  --sim-fault SPEC         [SETTING=VALUE:]refuse-start | die-after=N | hang-after=N (N: requests since start)
"""


class _Parser:
    """The real server's rules: variables first, then flags, each flag over its variable with a warning."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.args = list(argv)
        self.index = 0
        self.values: dict[str, object] = {"host": "127.0.0.1", "port": 8080, "metrics": False}
        self.from_env: set[str] = set()
        self.warnings: list[str] = []
        self.sim: dict[str, str] = {}
        self.faults: list[Fault] = []
        self.lora_paths: list[str] = []
        self.lora_scales: list[float] = []
        for name, variable in _ENV.items():
            if variable in env:
                kind = "bool" if name in _SWITCH_NAMES else _FLAG_KINDS.get(name, "str")
                raw = env[variable]
                self.values[name] = _truthy(raw) if kind == "bool" else _convert(raw, kind, variable)
                self.from_env.add(name)

    def value_of(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        self.index += 1
        if self.index >= len(self.args):
            raise CommandLineError(f"expected value for argument {flag}")
        return self.args[self.index]

    def set(self, name: str, value: object, flag: str) -> None:
        if name in self.from_env:
            self.warnings.append(
                f"W {_ENV[name]} environment variable is set, but will be overwritten by command line argument {flag}"
            )
            self.from_env.discard(name)
        self.values[name] = value

    def parse(self) -> None:
        while self.index < len(self.args):
            arg = self.args[self.index]
            flag, inline = arg, None
            if arg.startswith("--") and "=" in arg:
                flag, inline = arg.split("=", 1)
            if flag in _FLAGS:
                name, kind = _FLAGS[flag]
                self.set(name, _convert(self.value_of(flag, inline), kind, flag), flag)
            elif flag in _SWITCHES:
                name, on = _SWITCHES[flag]
                self.set(name, on, flag)
            elif flag in ("--lora", "--lora-scaled"):
                self.add_adapter(flag, self.value_of(flag, inline))
            elif flag == "--sim-fault":
                self.faults.append(parse_fault(self.value_of(flag, inline)))
            elif flag in _SIM_OPTIONS:
                self.sim[flag] = self.value_of(flag, inline)
            else:
                raise CommandLineError(f"invalid argument: {arg}")
            self.index += 1

    def add_adapter(self, flag: str, spec: str) -> None:
        path, scale = spec, "1"
        if flag == "--lora-scaled":
            path, _, scale = spec.rpartition(":")
        try:
            self.lora_scales.append(float(scale))
        except ValueError:
            raise CommandLineError(f"invalid value for {flag}: {spec}") from None
        self.lora_paths.append(path)

    def settings(self) -> SimSettings:
        values = self.values
        changes: dict[str, Any] = {}
        for name in ("n_batch", "n_ubatch", "n_parallel", "ctx_size", "cache_ram", "verbosity"):
            if name in values:
                changes[name] = int(str(values[name]))
        for name in ("kv_unified", "cont_batching", "cache_prompt"):
            if name in values:
                changes[name] = bool(values[name])
        if "n_parallel" in values and "kv_unified" not in values:
            changes["kv_unified"] = False  # only -np auto turns the unified KV buffer on
        if changes.get("ctx_size") == 0:
            changes["ctx_size"] = SimSettings().ctx_size  # 0: the model's own, here the default
        for name, lowest in (("n_batch", 1), ("n_ubatch", 1), ("n_parallel", 1), ("ctx_size", 0), ("cache_ram", -1)):
            if changes.get(name, lowest) < lowest:
                raise CommandLineError(f"invalid value for {name}: {changes[name]}")
        changes["lora_adapters"], changes["lora_scales"] = tuple(self.lora_paths), tuple(self.lora_scales)
        return replace(SimSettings(), **changes)


def _sim_number(sim: Mapping[str, str], flag: str, default: str, *, kind: type[float] | type[int] = float) -> Any:
    text = sim.get(flag, default)
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise CommandLineError(f"invalid value for {flag}: {text!r} is not {what}") from None
    if not math.isfinite(value):
        raise CommandLineError(f"invalid value for {flag}: {text!r} is not a finite number")
    return value


def parse_command_line(argv: Sequence[str], env: Mapping[str, str]) -> CommandLine:
    parser = _Parser(argv, env)
    parser.parse()
    sim, values = parser.sim, parser.values
    speed = _sim_number(sim, "--sim-speed", "1")
    seed = _sim_number(sim, "--sim-seed", "0", kind=int)
    noise = NoiseModel(
        restart=_sim_number(sim, "--sim-noise-restart", "0"), iteration=_sim_number(sim, "--sim-noise-iteration", "0")
    )
    if not _SPEED_RANGE[0] <= speed <= _SPEED_RANGE[1]:
        raise CommandLineError(
            f"--sim-speed must be between {_SPEED_RANGE[0]:g} and {_SPEED_RANGE[1]:g}, got {speed:g}"
        )
    if not all(x >= 0 for x in (noise.restart, noise.iteration)):
        raise CommandLineError("the --sim-noise- options must be finite numbers of at least 0")
    port = int(str(values["port"]))
    if not 1 <= port <= 65535:
        raise CommandLineError(f"invalid value for --port: {port} (1 to 65535)")
    calibration = Path(sim["--sim-calibration"]) if "--sim-calibration" in sim else None
    if calibration is not None:
        try:
            load_cost_model(calibration)  # read again at start; refused here, before the server listens
        except ValueError as exc:
            raise CommandLineError(f"--sim-calibration {exc}") from None
    return CommandLine(
        settings=parser.settings(),
        values=values,
        host=str(values["host"]),
        port=port,
        metrics=bool(values["metrics"]),
        api_key=str(values["api_key"]) if values.get("api_key") else None,
        speed=speed,
        seed=seed,
        noise=noise,
        calibration=calibration,
        faults=tuple(parser.faults),
        warnings=tuple(parser.warnings),
    )
