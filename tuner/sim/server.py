"""`tuner-sim-llama-server`: the simulated llama-server as a program, started like the real binary.

It reads the same `LLAMA_ARG_*` variables and flags (a flag wins over its variable, with the real
server's warning line), binds its port before the "model" loads (every route answers 503 until then),
and serves what serve-tuner uses: `/health`, `/completion` and `/v1/chat/completions` (streaming and
not), `/metrics`, `/slots`, `/lora-adapters` and `/props`. Its log goes to stderr in llama-server's
line shape. The model runs `--sim-speed` times faster than real time; log timestamps and timings are on
the wall clock, so the client's and the server's figures agree.

Options of its own (the real server refuses them, so a study that sets them runs only here):
`--sim-speed N`, `--sim-seed N`, `--sim-noise-restart SIGMA`, `--sim-noise-iteration SIGMA`,
`--sim-calibration FILE` (constants from `scripts/calibrate_sim.py`), and `--sim-fault SPEC` to make
one config misbehave: `[KNOB=VALUE:]refuse-start`, `[KNOB=VALUE:]die-after=N` (exit after N requests)
or `[KNOB=VALUE:]hang-after=N` (stop answering after N requests while `/health` stays 200).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import h11

from tuner.sim.model import NoiseModel, SimSettings, SimTask, SimulatedLlamaServer, format_log_line, load_cost_model

__all__ = ["main", "parse_command_line"]

_MAX_BODY = 64 * 2**20

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


def _parse_fault(text: str) -> Fault:
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
_SPEED_RANGE = (0.01, 1000.0)

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
                self.faults.append(_parse_fault(self.value_of(flag, inline)))
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


_VOCABULARY = 49152  # SmolLM2's
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 501: b"Not Implemented",
            503: b"Service Unavailable"}  # fmt: skip


def _integer(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    return value


def _text_tokens(text: str) -> list[int]:
    """A stand-in tokenizer: about four characters a token, stable across runs."""
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)] or [""]
    return [100 + zlib.crc32(piece.encode()) % 29900 for piece in pieces]


class _Response:
    def __init__(self, status: int, body: Any, *, content_type: str = "application/json") -> None:
        self.status = status
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.content_type = content_type


class SimHttpServer:
    def __init__(self, command: CommandLine) -> None:
        self.command = command
        self.started = time.perf_counter()
        self.loaded = False
        self.requests_seen = 0
        self.hanging = False
        cost = load_cost_model(command.calibration)
        # The restart-to-restart draw differs per start: the seed with this process's id.
        self.model = SimulatedLlamaServer(
            command.settings,
            cost=cost,
            noise=command.noise,
            seed=command.seed * 1_000_003 + os.getpid(),
            log=self._log_line,
            speed=command.speed,
        )
        self.load_s = cost.load_s / command.speed
        # The model computes an iteration's tokens when it starts; they are released to the clients only
        # once the wall clock reaches its end.
        self.released_s = 0.0
        self._work = asyncio.Event()
        self._waiters: dict[int, asyncio.Event] = {}
        self.faults = [f for f in command.faults if f.applies({**command.values, **vars(command.settings)})]

    # --- clock and log ----------------------------------------------------------------------------------

    def wall_s(self) -> float:
        return time.perf_counter() - self.started

    def model_s(self) -> float:
        return self.wall_s() * self.command.speed

    def _log_line(self, at_wall_s: float, line: str) -> None:
        sys.stderr.write(format_log_line(at_wall_s, line) + "\n")
        sys.stderr.flush()

    def log(self, line: str) -> None:
        self._log_line(self.wall_s(), line)

    # --- the loop ---------------------------------------------------------------------------------------

    async def run_loop(self) -> None:
        while True:
            if self.hanging or not self.model.busy:
                self._work.clear()
                await self._work.wait()
                continue
            now = self.model_s()
            end = self.model.step(now)
            if end is None:
                self.released_s = now
                self._wake_all()
                self._work.clear()
                if not self.model.busy:
                    await self._work.wait()
                continue
            delay = (end - self.model_s()) / self.command.speed
            if delay > 0:
                await asyncio.sleep(delay)
            self.released_s = end
            self._wake_all()

    def _wake_all(self) -> None:
        for event in self._waiters.values():
            event.set()

    async def wait_for(self, task: SimTask) -> None:
        event = self._waiters.setdefault(task.id, asyncio.Event())
        await event.wait()
        event.clear()

    # --- HTTP -------------------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read_request(connection, reader)
                if request is None:
                    break
                await self._dispatch(connection, writer, request, body)
                if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
                    break
                connection.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _read_request(
        self, connection: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = b""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                connection.receive_data(data)
                if not data and request is None:
                    return None, b""
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                return request, body
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def _send(self, writer: asyncio.StreamWriter, connection: h11.Connection, event: h11.Event) -> None:
        data = connection.send(event)
        if data:
            writer.write(data)
            await writer.drain()

    async def _respond(self, connection: h11.Connection, writer: asyncio.StreamWriter, response: _Response) -> None:
        headers = [("content-type", response.content_type), ("content-length", str(len(response.body)))]
        reason = _REASONS.get(response.status, b"")
        await self._send(writer, connection, h11.Response(status_code=response.status, headers=headers, reason=reason))
        await self._send(writer, connection, h11.Data(data=response.body))
        await self._send(writer, connection, h11.EndOfMessage())

    def _error(self, status: int, message: str, kind: str) -> _Response:
        return _Response(status, {"error": {"code": status, "message": message, "type": kind}})

    async def _dispatch(
        self, connection: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        path = request.target.decode().split("?", 1)[0]
        method = request.method.decode()
        if not self.loaded:
            await self._respond(connection, writer, self._error(503, "Loading model", "unavailable_error"))
            return
        if path in ("/health", "/v1/health"):
            await self._respond(connection, writer, _Response(200, {"status": "ok"}))
            return
        key = self.command.api_key
        if key is not None:
            headers = {name.decode().lower(): value.decode() for name, value in request.headers}
            given = headers.get("authorization", "").removeprefix("Bearer ").strip() or headers.get("x-api-key")
            if given != key:
                await self._respond(connection, writer, self._error(401, "Invalid API Key", "authentication_error"))
                return
        if path == "/metrics" and method == "GET":
            if not self.command.metrics:
                response = self._error(501, "This server does not support metrics endpoint.", "not_supported_error")
            else:
                response = _Response(200, self._metrics_text().encode(), content_type="text/plain; version=0.0.4")
            await self._respond(connection, writer, response)
        elif path == "/slots" and method == "GET":
            await self._respond(connection, writer, _Response(200, self._slots()))
        elif path == "/lora-adapters" and method == "GET":
            adapters = [
                {"id": i, "path": p, "scale": s, "task_name": "", "prompt_prefix": ""}
                for i, (p, s) in enumerate(
                    zip(self.model.settings.lora_adapters, self.model.settings.lora_scales, strict=True)
                )
            ]
            await self._respond(connection, writer, _Response(200, adapters))
        elif path == "/lora-adapters" and method == "POST":
            await self._respond(connection, writer, self._set_global_scales(body))
        elif path == "/props" and method == "GET":
            props = {
                "total_slots": self.model.settings.n_parallel,
                "model_path": "simulated",
                "build_info": "simulated",
            }
            await self._respond(connection, writer, _Response(200, props))
        elif path in ("/completion", "/completions", "/v1/chat/completions", "/v1/completions") and method == "POST":
            await self._generate(connection, writer, path, body)
        else:
            await self._respond(connection, writer, self._error(404, "File Not Found", "not_found_error"))

    def _set_global_scales(self, body: bytes) -> _Response:
        """`[{"id": N, "scale": S}, ...]`: the scales a request without `lora` runs with; unlisted adapters 0."""
        try:
            pairs = self._lora(json.loads(body or b"null"))
        except ValueError as exc:
            return self._error(400, str(exc), "invalid_request_error")
        scales = [0.0] * len(self.model.settings.lora_adapters)
        for adapter, scale in pairs or []:
            scales[adapter] = scale
        self.model.settings = replace(self.model.settings, lora_scales=tuple(scales))
        return _Response(200, {"success": True})

    def _slots(self) -> list[dict[str, Any]]:
        out = []
        for slot in self.model.slots:
            task = slot.task
            out.append(
                {
                    "id": slot.id,
                    "n_ctx": self.model.settings.n_ctx_slot,
                    "speculative": False,
                    "is_processing": task is not None,
                    "id_task": task.id if task else -1,
                    "n_prompt_tokens": len(task.prompt) if task else 0,
                    "n_prompt_tokens_processed": (task.n_past - task.n_cached) if task else 0,
                    "n_prompt_tokens_cache": task.n_cached if task else 0,
                    "next_token": [
                        {
                            "has_next_token": task is not None,
                            "has_new_line": False,
                            "n_remain": (task.n_predict - len(task.generated)) if task else -1,
                            "n_decoded": len(task.generated) if task else 0,
                        }
                    ],
                }
            )
        return out

    def _metrics_text(self) -> str:
        c, speed = self.model.counters, self.command.speed
        processing = sum(1 for s in self.model.slots if s.task is not None)
        rows = [
            ("counter", "prompt_tokens_total", c.prompt_tokens),
            ("counter", "prompt_tokens_cached_total", c.prompt_tokens_cached),
            ("counter", "prompt_seconds_total", c.prompt_seconds / speed),
            ("counter", "tokens_predicted_total", c.tokens_predicted),
            ("counter", "tokens_predicted_seconds_total", c.tokens_predicted_seconds / speed),
            ("counter", "n_decode_total", c.n_decode),
            ("counter", "n_tokens_max", c.n_tokens_max),
            ("gauge", "n_busy_slots_per_decode", c.busy_slots_sum / c.n_decode if c.n_decode else 0),
            ("gauge", "requests_processing", processing),
            ("gauge", "requests_deferred", len(self.model.queue)),
        ]
        lines = []
        for kind, name, value in rows:
            lines += [f"# HELP llamacpp:{name} {name}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
        return "\n".join(lines) + "\n"

    def _check_faults(self) -> None:
        self.requests_seen += 1
        for fault in self.faults:
            if fault.kind == "die-after" and self.requests_seen > fault.after:
                self.log("E srv  simulated fault: the server dies (--sim-fault die-after)")
                os._exit(134)
            if fault.kind == "hang-after" and self.requests_seen > fault.after:
                self.hanging = True

    async def _generate(self, connection: h11.Connection, writer: asyncio.StreamWriter, path: str, body: bytes) -> None:
        try:
            payload = json.loads(body or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("the body is not an object")
        except ValueError as exc:
            await self._respond(connection, writer, self._error(400, f"invalid JSON: {exc}", "invalid_request_error"))
            return
        try:
            prompt = self._prompt(payload, chat=path == "/v1/chat/completions")
            n_predict = _integer(payload.get("n_predict", payload.get("max_tokens", -1)), "n_predict")
            lora_pairs = self._lora(payload.get("lora"))
        except ValueError as exc:
            await self._respond(connection, writer, self._error(400, str(exc), "invalid_request_error"))
            return
        self._check_faults()
        chat = path.startswith("/v1/")
        task = self.model.submit(prompt, n_predict, now=self.model_s(), lora=lora_pairs)
        if task.error is not None:
            await self._respond(connection, writer, self._error(400, task.error, "exceed_context_size_error"))
            return
        self._work.set()
        stream = payload.get("stream") is True
        try:
            if stream:
                await self._stream(connection, writer, task, chat=chat, payload=payload)
            else:
                while not self._finished(task):
                    await self.wait_for(task)
                await self._respond(connection, writer, _Response(200, self._final(task, chat=chat, payload=payload)))
        finally:
            self._waiters.pop(task.id, None)
            if not task.done:
                self.model.cancel(task, now=self.model_s())

    def _finished(self, task: SimTask) -> bool:
        return task.done and (task.finished_s or 0.0) <= self.released_s

    def _prompt(self, payload: Mapping[str, Any], *, chat: bool) -> list[int]:
        if chat:
            messages = payload.get("messages") or []
            text = "".join(f"<|{m.get('role', '')}|>{m.get('content', '')}" for m in messages if isinstance(m, dict))
            return _text_tokens(text)
        prompt = payload.get("prompt", "")
        if isinstance(prompt, list):
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _VOCABULARY for t in prompt):
                raise ValueError(f"prompt: token ids must be integers from 0 to {_VOCABULARY - 1}")
            return list(prompt) or [1]
        if not isinstance(prompt, str):
            raise ValueError("prompt must be a string or a list of token ids")
        return _text_tokens(prompt)

    def _lora(self, field: object) -> list[tuple[int, float]] | None:
        """A request's `lora`: [{"id": N, "scale": S}, ...] naming loaded adapters, or None (the global scales)."""
        if field is None:
            return None
        if not isinstance(field, list) or not all(isinstance(item, dict) for item in field):
            raise ValueError('lora must be a list of {"id": N, "scale": S}')
        pairs = []
        for item in field:
            adapter, scale = item.get("id"), item.get("scale")
            if not isinstance(adapter, int) or isinstance(adapter, bool):
                raise ValueError("lora: each id must be an integer")
            if not isinstance(scale, int | float) or isinstance(scale, bool) or not math.isfinite(scale):
                raise ValueError("lora: each scale must be a number")
            if not 0 <= adapter < len(self.model.settings.lora_adapters):
                raise ValueError(f"lora: invalid adapter id {adapter}")
            pairs.append((adapter, float(scale)))
        return pairs

    async def _stream(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        task: SimTask,
        *,
        chat: bool,
        payload: Mapping[str, Any],
    ) -> None:
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        await self._send(writer, connection, h11.Response(status_code=200, headers=headers, reason=b"OK"))
        sent = 0
        while True:
            while sent < len(task.generated) and task.token_s[sent] <= self.released_s:
                token = task.generated[sent]
                sent += 1
                chunk: dict[str, Any]
                if chat:
                    chunk = {
                        "choices": [{"finish_reason": None, "index": 0, "delta": {"content": f" t{token}"}}],
                        "object": "chat.completion.chunk",
                        "id": f"chatcmpl-{task.id}",
                    }
                else:
                    chunk = {
                        "index": 0,
                        "content": f" t{token}",
                        "tokens": [token],
                        "stop": False,
                        "id_slot": -1,
                        "tokens_predicted": sent,
                        "tokens_evaluated": len(task.prompt),
                    }
                await self._send(
                    writer,
                    connection,
                    h11.Data(data=b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"),
                )
            if self._finished(task) and sent == len(task.generated):
                break
            await self.wait_for(task)
        final = self._final(task, chat=chat, payload=payload, streamed=True)
        for part in final if isinstance(final, list) else [final]:
            await self._send(writer, connection, h11.Data(data=b"data: " + json.dumps(part).encode() + b"\n\n"))
        if chat:
            await self._send(writer, connection, h11.Data(data=b"data: [DONE]\n\n"))
        await self._send(writer, connection, h11.EndOfMessage())

    def _final(self, task: SimTask, *, chat: bool, payload: Mapping[str, Any], streamed: bool = False) -> Any:
        timings = self.model.timings(task)
        stop_type = "limit"
        if not chat:
            final: dict[str, Any] = {
                "index": 0,
                "content": "" if streamed else "".join(f" t{t}" for t in task.generated),
                "tokens": [] if streamed else (list(task.generated) if payload.get("return_tokens") else []),
                "id_slot": task.slot if task.slot is not None else -1,
                "stop": True,
                "model": "simulated",
                "tokens_predicted": len(task.generated),
                "tokens_evaluated": len(task.prompt),
                "stop_type": stop_type,
                "truncated": task.truncated,
                "tokens_cached": task.n_past + max(0, len(task.generated) - 1),
                "timings": timings,
            }
            return final
        usage = {
            "completion_tokens": len(task.generated),
            "prompt_tokens": len(task.prompt),
            "total_tokens": len(task.prompt) + len(task.generated),
            "prompt_tokens_details": {"cached_tokens": task.n_cached},
        }
        if not streamed:
            return {
                "choices": [
                    {
                        "finish_reason": "length",
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(f" t{t}" for t in task.generated)},
                    }
                ],
                "object": "chat.completion",
                "usage": usage,
                "timings": timings,
            }
        parts: list[Any] = [
            {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}
        ]
        options = payload.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            parts.append({"choices": [], "object": "chat.completion.chunk", "usage": usage, "timings": timings})
        return parts


async def _serve(command: CommandLine) -> int:
    server = SimHttpServer(command)
    server.log("I srv  llama_server: initializing ...")
    for warning in command.warnings:
        server.log(warning)
    if any(f.kind == "refuse-start" for f in server.faults):
        server.log("E srv    load_model: simulated fault: failed to load model (--sim-fault refuse-start)")
        return 1
    try:
        listener = await asyncio.start_server(server.handle, command.host, command.port)
    except OSError as exc:
        where = f"hostname: {command.host}, port: {command.port}"
        server.log(f"E srv    start: couldn't bind HTTP server socket, {where}: {exc.strerror}")
        return 1
    port = listener.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    for line in server.model.startup_lines():
        server.log(line)
    # The "model" loads; a SIGTERM meanwhile ends the server at once, as it would the real one.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=server.load_s)
    if stop.is_set():
        return 0
    server.loaded = True
    server.log("I srv  llama_server: model loaded")
    server.log(f"I srv  llama_server: listening on http://{command.host}:{port}")
    loop_task = asyncio.create_task(server.run_loop())
    async with listener:
        await stop.wait()
    loop_task.cancel()
    server.log("I srv    operator(): operator(): cleaning up before exit...")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--help" in args or "-h" in args:
        sys.stdout.write(USAGE)
        return 0
    try:
        command = parse_command_line(args, os.environ)
    except CommandLineError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return asyncio.run(_serve(command))


if __name__ == "__main__":
    sys.exit(main())
