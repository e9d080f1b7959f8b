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
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import h11

from tuner.sim.api import (
    final_answer,
    integer,
    lora_adapters_listed,
    metrics_text,
    props,
    request_lora,
    request_prompt,
    slots_listed,
    stream_chunk,
)
from tuner.sim.command_line import USAGE, CommandLine, CommandLineError, parse_command_line
from tuner.sim.model import SimTask, SimulatedLlamaServer, format_log_line, load_cost_model

__all__ = ["CommandLineError", "main", "parse_command_line"]

_MAX_BODY = 64 * 2**20
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 501: b"Not Implemented",
            503: b"Service Unavailable"}  # fmt: skip


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
                response = _Response(
                    200, metrics_text(self.model, self.command.speed).encode(), content_type="text/plain; version=0.0.4"
                )
            await self._respond(connection, writer, response)
        elif path == "/slots" and method == "GET":
            await self._respond(connection, writer, _Response(200, slots_listed(self.model)))
        elif path == "/lora-adapters" and method == "GET":
            adapters = lora_adapters_listed(self.model.settings)
            await self._respond(connection, writer, _Response(200, adapters))
        elif path == "/lora-adapters" and method == "POST":
            await self._respond(connection, writer, self._set_global_scales(body))
        elif path == "/props" and method == "GET":
            await self._respond(connection, writer, _Response(200, props(self.model.settings)))
        elif path in ("/completion", "/completions", "/v1/chat/completions", "/v1/completions") and method == "POST":
            await self._generate(connection, writer, path, body)
        else:
            await self._respond(connection, writer, self._error(404, "File Not Found", "not_found_error"))

    def _set_global_scales(self, body: bytes) -> _Response:
        """`[{"id": N, "scale": S}, ...]`: the scales a request without `lora` runs with; unlisted adapters 0."""
        try:
            pairs = request_lora(json.loads(body or b"null"), adapters=len(self.model.settings.lora_adapters))
        except ValueError as exc:
            return self._error(400, str(exc), "invalid_request_error")
        scales = [0.0] * len(self.model.settings.lora_adapters)
        for adapter, scale in pairs or []:
            scales[adapter] = scale
        self.model.settings = replace(self.model.settings, lora_scales=tuple(scales))
        return _Response(200, {"success": True})

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
            prompt = request_prompt(payload, chat=path == "/v1/chat/completions")
            n_predict = integer(payload.get("n_predict", payload.get("max_tokens", -1)), "n_predict")
            lora_pairs = request_lora(payload.get("lora"), adapters=len(self.model.settings.lora_adapters))
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
                chunk = stream_chunk(task, token, sent, chat=chat)
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
        return final_answer(task, self.model.timings(task), chat=chat, payload=payload, streamed=streamed)


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
