"""The container CLI (`docker` or `podman`) on the host, as the deployer runs it: every command as the login,
or all of them through `sudo -n` where host.sudo is true, so that all of them see the same containers
(rootful and rootless podman keep separate ones) and the env file, written the same way with mode 0600, is
readable by the `run` that reads it."""

from __future__ import annotations

import json
from typing import Any

from tuner.errors import CommandFailed, DeployError
from tuner.redact import redact
from tuner.transports.base import CommandResult, Transport

__all__ = ["ContainerCli"]


class ContainerCli:
    def __init__(self, cli: str, transport: Transport) -> None:
        self._cli = cli
        self._transport = transport

    async def run(self, *args: str, timeout_s: float, check: bool) -> CommandResult:
        return await self._transport.run([self._cli, *args], timeout_s=timeout_s, check=check, privileged=True)

    async def __call__(self, *args: str, timeout_s: float = 120) -> str:
        """Its output; `DeployError` naming the command and its error where it fails."""
        try:
            result = await self.run(*args, timeout_s=timeout_s, check=True)
        except CommandFailed as exc:
            said = redact(exc.stderr_tail.strip())[-300:]
            command = args[2] if args[0] == "--runtime" else args[0]  # podman's global flag comes first
            raise DeployError(f"`{self._cli} {command}` failed: {said}") from None
        return result.stdout

    async def inspect(self, name: str) -> dict[str, Any] | None:
        """The container's `inspect`; None where there is no such container."""
        result = await self.run("inspect", "--type", "container", name, timeout_s=60, check=False)
        if result.exit_status != 0:
            if "permission denied" in result.stderr.lower():
                raise DeployError(
                    f"`{self._cli} inspect` was refused ({result.stderr.strip()[-160:]}); add the login to "
                    "the docker group, or set host.sudo = true (docs/production-host.md)"
                )
            return None
        data = json.loads(result.stdout)
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise DeployError(f"{self._cli} inspect {name} gave no container description")
        return data[0]
