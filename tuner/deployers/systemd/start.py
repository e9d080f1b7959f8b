"""Watching the unit start: a trial's (`StartWatcher`: whether systemd gave up on it; `verify_started`:
what runs is what was meant) and the baseline's after a restore (`wait_restored`)."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Sequence

from tuner.deployers.base import wait_until_healthy
from tuner.deployers.systemd.operator_server import UnitServer
from tuner.deployers.systemd.unit import SystemdUnit, UnitState
from tuner.deployers.systemd.unit_file import ExecStartMode, parse_environ
from tuner.errors import DeployError, ServerNotReady
from tuner.models import LaunchSpec

__all__ = ["StartWatcher", "verify_started", "wait_restored"]


class StartWatcher:
    """Tells, while a trial starts, whether systemd gave up on it: Type=simple units report a
    successful start even when the binary fails at once, so Result=, NRestarts and the state decide."""

    def __init__(self, unit: SystemdUnit, before: UnitState) -> None:
        self._unit = unit
        self._before = before
        self._seen_pid = 0

    async def failure(self) -> str | None:
        state = await self._unit.state()
        unit = self._unit.name
        if state["ActiveState"] == "failed":
            return f"{unit} failed ({state['Result']}, exit status {state['ExecMainStatus']})"
        if state.main_pid and state.main_pid != self._before.main_pid:
            if self._seen_pid and state.main_pid != self._seen_pid:
                return f"{unit} exited and was restarted by Restart= (exit status {state['ExecMainStatus']})"
            self._seen_pid = state.main_pid
        if state.restarts > 0:  # reset-failed zeroed the counter before our restart
            return f"{unit} exited and was restarted {state.restarts} time(s) (exit status {state['ExecMainStatus']})"
        if state["ActiveState"] == "activating" and state["SubState"] == "auto-restart":
            return f"{unit} exited (exit status {state['ExecMainStatus']}) and waits to be restarted"
        return None


async def verify_started(
    unit: SystemdUnit,
    launch: LaunchSpec,
    before: UnitState,
    after: UnitState,
    *,
    exec_start: ExecStartMode,
    command: Sequence[str] | None = None,
) -> None:
    """What runs is what was meant: scored trials must not measure a stale or half-applied config (P6)."""
    if after["NeedDaemonReload"] != "no":
        raise DeployError(f"{unit.name} has a pending daemon-reload: its files changed while the trial started")
    if after.main_pid in (0, before.main_pid) or after["InvocationID"] == before["InvocationID"]:
        raise DeployError(
            f"{unit.name} did not restart (MainPID {after.main_pid}); the trial would measure the old settings"
        )
    environ = await unit.read(f"/proc/{after.main_pid}/environ")
    if environ is None:
        raise DeployError(f"cannot read the environment of {unit.name}'s process {after.main_pid}")
    running = parse_environ(environ)
    for name, value in launch.env.items():
        if running.get(name) != value:
            raise DeployError(
                f"{unit.name} runs with {name}={running.get(name, '(unset)')!r}, not {value!r}: an "
                "EnvironmentFile= or a later drop-in overrides it; remove that setting from the unit"
            )
    for name, secret in launch.secret_values().items():
        if running.get(name) != secret:  # compared, never shown
            raise DeployError(f"{unit.name} does not run with the {name} it was given: another setting overrides it")
    if exec_start != "keep":  # `container`: the unit's own `run`, carrying the trial (`command`)
        cmdline = await unit.read(f"/proc/{after.main_pid}/cmdline")
        argv = (cmdline or b"").decode(errors="replace").split("\0")[:-1]
        if argv != list(command if command is not None else launch.command):
            raise DeployError(f"{unit.name} runs {shlex.join(argv)[:200]}, not the trial's command line")


async def wait_restored(unit: SystemdUnit, server: UnitServer, launch: LaunchSpec | None, *, timeout_s: float) -> None:
    """The unit active again after a restore and, where a launch says how to ask, its server healthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = await unit.state()
        if state["ActiveState"] == "active":
            break
        if state["ActiveState"] == "failed" or time.monotonic() > deadline:
            raise DeployError(
                f"{unit.name} did not come back on its baseline ({state['ActiveState']}, result "
                f"{state['Result']}){await unit.journal_tail()}; check it with `systemctl status {unit.name}`"
            )
        await asyncio.sleep(0.25)
    if launch is not None:
        base_url = await server.address(launch)
        remaining = max(deadline - time.monotonic(), 1.0)

        async def stopped() -> str | None:
            now = await unit.state()
            return None if now["ActiveState"] in ("active", "activating") else f"{unit.name} is {now['ActiveState']}"

        try:
            await wait_until_healthy(launch, base_url=base_url, timeout_s=remaining, exited=stopped)
        except ServerNotReady as exc:
            raise DeployError(f"{unit.name} is back on its baseline but not healthy: {exc}") from None
