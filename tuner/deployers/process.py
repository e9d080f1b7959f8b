"""The `process` deployer: the server is a child process of the controller, configured through its
environment and arguments. Its baseline is "nothing of ours running", so restoring stops the child.

A server that dies after it answered its health check (a crash, the OOM killer) is seen by
`check_alive`, which the study asks after every round: that round, and its trial, fail with the reason
and no score (docs/reliability.md P8).

A controller killed with SIGKILL cannot stop its child, which runs in a process group of its own: the
deployer keeps the child's process id and start time in the run directory while it runs, and the next
run's deployer stops that process group first if a process with that id and that start time still runs
(docs/reliability.md P2). The start time tells it from an unrelated process that got the id since.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from pydantic import Field

from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.errors import ServerNotReady, TransportError
from tuner.faults import crash_point
from tuner.files import write_atomic
from tuner.models import LaunchSpec
from tuner.redact import redact
from tuner.transports.base import ProcessHandle, Transport

__all__ = ["ProcessDeployer", "ProcessOptions"]

_LOG = logging.getLogger(__name__)


class ProcessOptions(StrictModel):
    start_timeout_s: float = Field(default=120.0, gt=0, description="Longest wait for a healthy server.")
    stop_grace_s: float = Field(default=10.0, gt=0, description="Wait after SIGTERM before SIGKILL.")
    inherit_env: list[str] = Field(
        default_factory=lambda: ["PATH", "HOME", "LANG", "TMPDIR"],
        description="Variables of the controller's environment the server also gets; nothing else leaks in.",
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@DEPLOYERS.register("process")
class ProcessDeployer:
    options_model = ProcessOptions

    def __init__(self, options: ProcessOptions, *, transport: Transport) -> None:
        self._options = options
        self._transport = transport
        self._child: ProcessHandle | None = None
        self._log_path: str | None = None
        self._state_file: Path | None = None

    def remember_in(self, state_file: Path) -> None:
        self._state_file = state_file

    async def __aenter__(self) -> ProcessDeployer:
        await self._stop_leftover()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.restore()

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        await self._stop_child()
        env = {name: os.environ[name] for name in self._options.inherit_env if name in os.environ}
        env.update(launch.env)
        env.update(launch.secret_values())  # over ssh the environment travels in a 0600 file, never argv
        self._log_path = log_path
        self._child = await self._transport.spawn([launch.executable, *launch.args], env=env, log_path=log_path)
        await self._remember(self._child.pid)
        crash_point("after-restart")
        base_url = await self._transport.reach(launch.host, launch.port)
        try:
            took = await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=self.check_alive
            )
        except ServerNotReady as exc:
            await self._stop_child()
            raise ServerNotReady(f"{exc}{await self._log_tail(log_path)}") from None
        return Deployment(launch=launch, pid=self._child.pid, started_in_s=took, log_path=log_path, base_url=base_url)

    async def check_alive(self) -> str | None:
        if self._child is None:
            return "no server was started"
        status = await self._child.poll()
        if status is None:
            return None
        if status < 0:
            # Killed by a signal: SIGKILL from outside is most often the kernel's OOM killer.
            return f"the process was killed by {_signal_name(-status)}"
        return f"the process exited with status {status}"

    async def read_log(self, since: int) -> tuple[str, int]:
        if self._log_path is None:
            return "", since
        data = await self._transport.read_file(self._log_path)
        return data[since:].decode(errors="replace"), len(data)

    async def restore(self) -> None:
        if self._child is not None:
            crash_point("mid-restore")
        await self._stop_child()

    async def _log_tail(self, log_path: str) -> str:
        """The server's last error line, which usually names the real cause (bad flag, port in use)."""
        try:
            lines = (await self._transport.read_file(log_path)).decode(errors="replace").splitlines()
        except TransportError:
            return ""
        # Read after `_stop_child`, which scrubbed the file of any key the server logged.
        for line in reversed(lines):
            lowered = line.lower()
            if any(word in lowered for word in ("error", "failed", "invalid", "abort")):
                return f"; server log: {line.strip()[:200]}"
        return f"; server log ends: {lines[-1].strip()[:200]}" if lines else ""

    async def _stop_child(self) -> None:
        if self._child is not None:
            child, self._child = self._child, None
            await child.stop(grace_s=self._options.stop_grace_s)
            await self._scrub_log()
            self._forget()

    async def _start_time(self, pid: int) -> str | None:
        """Field 22 of /proc/PID/stat (clock ticks since boot), or None if no such process runs."""
        found = await self._transport.run(["cat", f"/proc/{pid}/stat"], timeout_s=30, check=False)
        if found.exit_status != 0 or ")" not in found.stdout:
            return None
        fields = found.stdout.rsplit(")", 1)[1].split()  # the command name before it may hold spaces
        return fields[19] if len(fields) > 19 else None

    async def _remember(self, pid: int) -> None:
        if self._state_file is None:
            return
        started = await self._start_time(pid)
        state = {"pid": pid, "start": started, "written": time.time()}
        write_atomic(self._state_file, json.dumps(state).encode())

    def _forget(self) -> None:
        if self._state_file is not None:
            self._state_file.unlink(missing_ok=True)

    async def _stop_leftover(self) -> None:
        """A killed run's server, if it still runs: its process group is stopped before anything starts."""
        if self._state_file is None or not self._state_file.is_file():
            return
        try:
            state = json.loads(self._state_file.read_text())
            pid, started = int(state["pid"]), state["start"]
        except (ValueError, KeyError, TypeError):
            self._forget()  # not ours to act on: a damaged file names no process we can trust
            return
        if started is not None and await self._start_time(pid) == started:
            _LOG.warning("stopping the server a killed run left behind (process group %d)", pid)
            await self._transport.run(["kill", "-TERM", "--", f"-{pid}"], timeout_s=30, check=False)
            deadline = time.monotonic() + self._options.stop_grace_s
            while await self._start_time(pid) == started and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if await self._start_time(pid) == started:
                await self._transport.run(["kill", "-KILL", "--", f"-{pid}"], timeout_s=30, check=False)
        self._forget()

    async def _scrub_log(self) -> None:
        """The server's log stays in the run directory as evidence: a key it logged (its own, or a
        request's Authorization header) is scrubbed once the server has stopped writing to it."""
        if self._log_path is None:
            return
        try:
            text = (await self._transport.read_file(self._log_path)).decode(errors="replace")
        except TransportError:
            return
        scrubbed = redact(text)
        if scrubbed != text:
            # Not fatal: a failed trial's reason and the CLI's error line are scrubbed on their own.
            with contextlib.suppress(TransportError):
                await self._transport.write_file(self._log_path, scrubbed.encode())
