"""The operator's unit on the host, read and driven through the transport: `systemctl`, its properties
(`UnitState`), its files hashed, its command line, its journal, a restart that waits for a new
invocation, and the operator drop-ins that would override ours."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.deployers.systemd.paths import DROP_IN_NAME
from tuner.deployers.systemd.unit_file import (
    ExecStartMode,
    assigned_keys,
    parse_environ,
    parse_show_environment,
    shown_argv,
)
from tuner.errors import CommandFailed, DeployError, ServerNotReady, TransportError
from tuner.models import LaunchSpec
from tuner.redact import redact
from tuner.transports.base import Transport

__all__ = ["SystemdUnit", "UnitState"]

_SHOW_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "MainPID", "InvocationID", "NRestarts",
    "NeedDaemonReload", "FragmentPath", "DropInPaths", "Environment", "ExecMainStatus", "ExecStart",
)  # fmt: skip


@dataclass(frozen=True)
class UnitState:
    properties: Mapping[str, str]

    def __getitem__(self, name: str) -> str:
        return self.properties.get(name, "")

    @property
    def main_pid(self) -> int:
        return int(self["MainPID"] or 0)

    @property
    def restarts(self) -> int:
        return int(self["NRestarts"] or 0)

    @property
    def drop_ins(self) -> list[str]:
        return self["DropInPaths"].split()


class SystemdUnit:
    """One unit (`name`, a NAME.service) on the host the transport reaches; every command runs as root."""

    def __init__(self, name: str, *, transport: Transport) -> None:
        self.name = name
        self.transport = transport

    async def systemctl(self, *args: str, timeout_s: float = 60, check: bool = True) -> str:
        try:
            result = await self.transport.run(
                ["systemctl", *args], timeout_s=timeout_s, check=check, privileged=True, idempotent=True
            )
        except CommandFailed as exc:
            raise DeployError(f"systemctl {' '.join(args)} failed: {exc.stderr_tail.strip()[-300:]}") from None
        return result.stdout

    async def state(self) -> UnitState:
        args = [arg for name in _SHOW_PROPERTIES for arg in ("-p", name)]
        out = await self.systemctl("show", self.name, *args)
        return UnitState(dict(line.split("=", 1) for line in out.splitlines() if "=" in line))

    async def read(self, path: str) -> bytes | None:
        try:
            return await self.transport.read_file(path)
        except TransportError:
            return None

    async def unit_files(self, state: UnitState) -> dict[str, str]:
        """Every file that configures the unit, hashed: the fragment and each drop-in but ours."""
        paths = [state["FragmentPath"], *state.drop_ins] if state["FragmentPath"] else state.drop_ins
        hashes = {}
        for path in paths:
            if path.endswith("/" + DROP_IN_NAME):
                continue
            data = await self.read(path)
            hashes[path] = hashlib.sha256(data or b"").hexdigest()
        return hashes

    async def command_line(self, state: UnitState) -> tuple[list[str], dict[str, str]]:
        """The unit's argv and environment: its running process's own, or where it does not run, its
        ExecStart= and Environment= as systemd shows them (an EnvironmentFile= is then not read)."""
        if state["ActiveState"] == "active" and state.main_pid:
            cmdline = await self.read(f"/proc/{state.main_pid}/cmdline")
            argv = (cmdline or b"").decode(errors="replace").split("\0")[:-1]
            if argv:
                return argv, parse_environ(await self.read(f"/proc/{state.main_pid}/environ") or b"")
        return shown_argv(state["ExecStart"]), parse_show_environment(state["Environment"])

    async def restart(self, before: UnitState, *, timeout_s: float) -> None:
        """reset-failed (a start limit would refuse the start), restart without waiting for the start
        job, then wait until a new invocation exists: until then the old process may still answer the
        health check, and a trial would be taken for started while the old settings still run."""
        await self.systemctl("reset-failed", self.name, check=False)
        await self.systemctl("restart", "--no-block", self.name)
        deadline = time.monotonic() + timeout_s
        while True:
            state = await self.state()
            if state["InvocationID"] != before["InvocationID"] or state["ActiveState"] == "failed":
                return
            if time.monotonic() > deadline:
                raise ServerNotReady(f"{self.name} did not restart within {timeout_s:g} s ({state['ActiveState']})")
            await asyncio.sleep(0.1)

    async def journal(self, invocation: str) -> str:
        if not invocation:
            return ""
        result = await self.transport.run(
            ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager"],
            timeout_s=120,
            check=False,
            privileged=True,
            idempotent=True,
        )
        return result.stdout

    async def journal_tail(self) -> str:
        result = await self.transport.run(
            ["journalctl", "-u", self.name, "-n", "30", "-o", "cat", "--no-pager"],
            timeout_s=60,
            check=False,
            privileged=True,
        )
        lines = result.stdout.strip().splitlines()
        for line in reversed(lines):
            lowered = line.lower()
            if any(word in lowered for word in ("error", "failed", "invalid", "abort")) and self.name not in line:
                return f"; server log: {redact(line.strip())[:200]}"
        return f"; journal ends: {redact(lines[-1].strip())[:200]}" if lines else ""

    async def running_log(self) -> str:
        """The start of the log of the unit's running invocation: its first lines, where the server says
        how long it took to start, not weeks of requests."""
        invocation = (await self.state())["InvocationID"]
        if not invocation:
            return ""
        head = f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation)} -o cat --no-pager | head -n 400"
        result = await self.transport.run(["sh", "-c", head], timeout_s=120, check=False, privileged=True)
        return result.stdout

    async def refuse_later_overrides(
        self,
        launch: LaunchSpec,
        state: UnitState,
        *,
        exec_start: ExecStartMode,
        tuned: Sequence[str] = (),
    ) -> None:
        """An operator drop-in that sorts after ours and sets one of our keys (or of `tuned`, the variables
        every trial of the study may set) would silently win."""
        ours = set(launch.env) | set(launch.secret_env) | set(tuned)
        for path in state.drop_ins:
            name = path.rsplit("/", 1)[-1]
            if name <= DROP_IN_NAME or not path.startswith(("/etc/", "/run/", "/usr/lib/", "/lib/")):
                continue
            text = (await self.read(path) or b"").decode(errors="replace")
            names, sets_exec = assigned_keys(text)
            clash = sorted(ours & names) + (["ExecStart"] if sets_exec and exec_start != "keep" else [])
            if clash:
                raise DeployError(
                    f"{path} sorts after serve-tuner's {DROP_IN_NAME} and sets {', '.join(clash)}, which would "
                    f"override the trial's value; rename it to sort before {DROP_IN_NAME} or remove those lines"
                )
