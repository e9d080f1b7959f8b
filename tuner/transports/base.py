"""The `Transport` protocol and its registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from tuner.config import PluginSpec, validate_options
from tuner.registry import Registry

__all__ = ["TRANSPORTS", "CommandResult", "ProcessHandle", "Transport", "TransportFactory", "create_transport"]


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str


@runtime_checkable
class ProcessHandle(Protocol):
    """A background process started through a transport."""

    @property
    def pid(self) -> int: ...

    async def poll(self) -> int | None:
        """The exit status if the process has ended, else None."""
        ...

    async def stop(self, *, grace_s: float) -> int:
        """Asks the process to end (SIGTERM), kills it after `grace_s`, and returns its exit status."""
        ...


@runtime_checkable
class Transport(Protocol):
    """How serve-tuner reaches the host: commands, files and background processes."""

    async def __aenter__(self) -> Transport: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        check: bool = True,
        privileged: bool = False,
        idempotent: bool = False,
    ) -> CommandResult:
        """Runs a command without a shell; raises `CommandFailed` on a non-zero exit when `check`.
        `privileged` steps (systemctl, files under /run and /etc) go through the host's sudo where the
        transport is configured for it. An `idempotent` command (one that may run twice, like
        `systemctl show` or `daemon-reload`) is sent again when the link drops while it runs."""
        ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Writes a file atomically: a reader sees the old content or the new one, never a part."""
        ...

    async def read_file(self, path: str) -> bytes: ...

    async def remove_file(self, path: str) -> None: ...

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: str) -> ProcessHandle:
        """Starts a background process whose stdout and stderr go to `log_path`."""
        ...

    async def reach(self, host: str, port: int) -> str:
        """The base URL at which this controller reaches `host:port` as the host sees it (through a
        forwarded port when the server listens only on the host's loopback)."""
        ...


class TransportFactory(Protocol):
    @property
    def options_model(self) -> type[BaseModel]: ...

    def __call__(self, options: Any) -> Transport: ...


TRANSPORTS: Registry[TransportFactory] = Registry("host")


def create_transport(spec: PluginSpec) -> Transport:
    factory = TRANSPORTS.get(spec.kind)
    options = validate_options(factory.options_model, spec.options(), where="host")
    return factory(options)
