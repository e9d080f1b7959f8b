"""The `Deployer` protocol, its registry, and the health wait every deployer shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import BaseModel

from tuner.config import PluginSpec, validate_options
from tuner.errors import ServerNotReady
from tuner.faults import crash_point
from tuner.http import tls_context
from tuner.models import LaunchSpec, RunningValue, ServerCommand, TunedKnob
from tuner.registry import Registry
from tuner.transports.base import Transport

__all__ = [
    "DEPLOYERS",
    "Deployer",
    "DeployerFactory",
    "Deployment",
    "PersistentDeployer",
    "RecoveringDeployer",
    "check_launch",
    "create_deployer",
    "health_answer",
    "running_values",
    "server_command",
    "uses_image_paths",
    "wait_until_healthy",
]


_MIN_POLL_S = 0.01


def running_values(
    argv: Sequence[str], environ: Mapping[str, str], tuned: Sequence[TunedKnob], *, env_source: Callable[[str], str]
) -> list[RunningValue]:
    """The tuned knobs' values in an operator's server, from its command line and environment: a flag
    decides over the variable (as the servers read them), the last of repeated flags wins. A boolean knob's
    flag takes no value (`--no-x`, `-no...` clear it); any other takes the next word or `=value`.
    `env_source` says where a variable came from. A knob found in neither is left out: the server runs
    its default."""
    found = []
    for knob in tuned:
        boolean = knob.value_type == "bool"
        negations = {f"--no-{flag[2:]}" for flag in knob.flags if boolean and flag.startswith("--")}
        value: RunningValue | None = None
        for i, word in enumerate(argv[1:], start=1):
            flag, equals, given = word.partition("=")
            if flag not in knob.flags and flag not in negations:
                continue
            where = f"the command line's {flag}"
            if equals:
                value = RunningValue(knob.name, given, where)
            elif boolean:
                negated = flag in negations or flag.startswith(("--no-", "-no"))
                value = RunningValue(knob.name, "false" if negated else "true", where)
            elif i + 1 < len(argv):
                value = RunningValue(knob.name, argv[i + 1], where)
        if value is None and knob.env and knob.env in environ:
            value = RunningValue(knob.name, environ[knob.env], env_source(knob.env))
        if value is not None:
            found.append(value)
    return found


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """A server that runs a launch spec and answered its health check."""

    launch: LaunchSpec
    pid: int | None
    started_in_s: float
    log_path: str | None
    base_url: str  # where this controller reaches it (a forwarded port for a remote host)


class Deployer(Protocol):
    async def __aenter__(self) -> Deployer:
        """Snapshots the host's current state: the baseline to restore."""
        ...

    async def __aexit__(self, *exc_info: object) -> None:
        """Restores the baseline, whatever happened."""
        ...

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        """Runs the server with `launch` and returns once it is healthy; `ServerNotReady` otherwise."""
        ...

    async def check_alive(self) -> str | None:
        """None while the deployed server runs; otherwise why it is not running."""
        ...

    async def read_log(self, since: int) -> tuple[str, int]:
        """The server's log written after position `since`, and the position to pass next time."""
        ...

    async def restore(self) -> None: ...


@runtime_checkable
class RecoveringDeployer(Protocol):
    """A deployer whose server would outlive a SIGKILLed controller unless the next run stops it: it keeps
    what identifies that server in a file of the run directory (docs/reliability.md P2)."""

    def remember_in(self, state_file: Path) -> None:
        """Where to keep it; set before the deployer is entered, whose entry stops a killed run's server."""
        ...


@runtime_checkable
class PersistentDeployer(Protocol):
    """A deployer that can also make a verified trial the host's configuration for good (`tuner apply`)."""

    async def persist(self, *, note: str) -> str:
        """Makes the running, verified trial permanent without restarting it; returns where it wrote it."""
        ...

    async def remove_persisted(self, launch: LaunchSpec) -> str | None:
        """Removes what `persist` wrote and restarts on the operator's own config; None if there was nothing.
        `launch` tells where the server answers its health check."""
        ...


class DeployerFactory(Protocol):
    @property
    def options_model(self) -> type[BaseModel]: ...

    def __call__(self, options: Any, *, transport: Transport) -> Deployer: ...


DEPLOYERS: Registry[DeployerFactory] = Registry("deploy")


def server_command(deploy: PluginSpec, *, local_host: bool) -> ServerCommand:
    """Whose command line starts the server under this deploy: a deploy kind says so with a static
    `server_command(options, local_host=...)`; otherwise the tuner's own, here or on the host."""
    factory = DEPLOYERS.get(deploy.kind)
    decide = getattr(factory, "server_command", None)
    if callable(decide):
        options = validate_options(factory.options_model, deploy.options(), where="deploy")
        decided = decide(options, local_host=local_host)
        assert isinstance(decided, ServerCommand)
        return decided
    return ServerCommand.LOCAL if local_host else ServerCommand.REMOTE


def uses_image_paths(deploy: PluginSpec) -> bool:
    """Whether the engine's paths (binary, model) are a container image's and its mounts', not the host's:
    a deploy kind says so with a static `uses_image_paths(options)`."""
    factory = DEPLOYERS.get(deploy.kind)
    decide = getattr(factory, "uses_image_paths", None)
    return callable(decide) and bool(decide(validate_options(factory.options_model, deploy.options(), where="deploy")))


def check_launch(deploy: PluginSpec, launch: LaunchSpec) -> None:
    """`ConfigError` for a launch the deploy kind cannot carry, before any host is touched: a deploy kind
    says so with a static `check_launch(options, launch)`."""
    factory = DEPLOYERS.get(deploy.kind)
    check = getattr(factory, "check_launch", None)
    if callable(check):
        check(validate_options(factory.options_model, deploy.options(), where="deploy"), launch)


def create_deployer(spec: PluginSpec, *, transport: Transport) -> Deployer:
    factory = DEPLOYERS.get(spec.kind)
    options = validate_options(factory.options_model, spec.options(), where="deploy")
    return factory(options, transport=transport)


async def wait_until_healthy(
    launch: LaunchSpec,
    *,
    base_url: str,
    timeout_s: float,
    exited: Callable[[], Awaitable[str | None]],
    poll_s: float = 0.25,
) -> float:
    """Polls the health path until it answers 200; fails early when `exited` reports the server gone.

    Returns the seconds it took. llama-server binds its socket before loading the model and answers
    503 meanwhile, so only a 200 counts. The poll is adaptive: a tenth of the time waited so far, from
    10 ms up to `poll_s`, so that a small model's load (a few tenths of a second) is not rounded up to a
    fixed interval, while a long load (minutes for a large model, `exited` possibly a remote command) is
    asked about no more often than every `poll_s` (bench/trial_overhead.py: the fixed 0.25 s poll added
    0.19 s per server start).
    """
    started = time.monotonic()
    last = "no answer yet"
    async with httpx.AsyncClient(timeout=httpx.Timeout(2.0), verify=tls_context()) as client:
        while True:
            reason = await exited()
            crash_point("mid-health-wait")
            if reason is not None:
                raise ServerNotReady(f"the server stopped while starting: {reason}")
            try:
                response = await client.get(base_url + launch.health_path)
                if response.status_code == 200:
                    return time.monotonic() - started
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise ServerNotReady(f"the server did not become healthy within {timeout_s:g} s (last answer: {last})")
            await asyncio.sleep(min(poll_s, max(_MIN_POLL_S, waited / 10)))


async def health_answer(url: str, *, loading_wait_s: float, poll_s: float = 0.5) -> tuple[str | None, float]:
    """Asks a running server's health path, again while it answers 503, for up to `loading_wait_s`.

    Returns (None once it answers 200, else its last answer: "HTTP 503", "ConnectError", ...) and the seconds
    waited. A 503 is a server at that address that has not loaded its model yet (llama-server answers so
    from binding its socket until the model is in memory), so it is waited for rather than called unhealthy;
    any other answer is final at once.
    """
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), verify=tls_context()) as client:
        while True:
            try:
                response = await client.get(url)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                return type(exc).__name__, time.monotonic() - started
            waited = time.monotonic() - started
            if response.status_code == 200:
                return None, waited
            if response.status_code != 503 or waited >= loading_wait_s:
                return f"HTTP {response.status_code}", waited
            await asyncio.sleep(min(poll_s, max(0.0, loading_wait_s - waited)))
