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
from tuner.errors import DeployError, ServerNotReady, TransportError
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

    async def _identity(self, pid: int) -> tuple[str, str] | None:
        """(boot id, start time in clock ticks since boot) of a live process, or None if no such process
        runs (a zombie has exited: only its parent's wait is missing)."""
        found = await self._transport.run(
            ["cat", "/proc/sys/kernel/random/boot_id", f"/proc/{pid}/stat"], timeout_s=30, check=False
        )
        boot, _, stat = found.stdout.partition("\n")
        if found.exit_status != 0 or ")" not in stat:
            return None
        fields = stat.rsplit(")", 1)[1].split()  # the command name before it may hold spaces and parentheses
        if len(fields) < 20 or fields[0] in ("Z", "X"):
            return None
        return boot.strip(), fields[19]

    async def _remember(self, pid: int) -> None:
        if self._state_file is None:
            return
        identity = await self._identity(pid)
        state = {"pid": pid, "boot": identity[0] if identity else None, "start": identity[1] if identity else None}
        try:
            write_atomic(self._state_file, json.dumps(state).encode())
        except OSError as exc:
            await self._stop_child()
            raise DeployError(
                f"cannot record the server's process in {self._state_file} ({exc.strerror}); a controller killed "
                "now would leave it running: free the run directory's disk and run again"
            ) from None

    def _forget(self) -> None:
        if self._state_file is not None:
            with contextlib.suppress(OSError):  # never in the way of the error being raised
                self._state_file.unlink(missing_ok=True)

    async def _stop_leftover(self) -> None:
        """A killed run's server, if it still runs: its process group is stopped before anything starts."""
        if self._state_file is None or not self._state_file.is_file():
            return
        try:
            state = json.loads(self._state_file.read_text())
            pid, identity = int(state["pid"]), (state["boot"], state["start"])
        except (ValueError, KeyError, TypeError):
            self._forget()  # not ours to act on: a damaged file names no process we can trust
            return
        if None in identity or await self._identity(pid) != identity:
            self._forget()  # gone, or the id now belongs to another process (another boot, another start)
            return
        _LOG.warning("stopping the server a killed run left behind (process group %d)", pid)
        for signal_name, wait_s in (("TERM", self._options.stop_grace_s), ("KILL", 10.0)):
            await self._transport.run(["kill", f"-{signal_name}", "--", f"-{pid}"], timeout_s=30, check=False)
            deadline = time.monotonic() + wait_s
            while await self._identity(pid) == identity and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if await self._identity(pid) != identity:
                self._forget()
                return
        raise DeployError(
            f"the server a killed run left behind (process group {pid}) still runs after SIGKILL; stop it "
            f"yourself (kill -KILL -- -{pid}), then run again"
        )

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
