"""The `process` deployer: the server is a child process of the controller, configured through its
environment and arguments. Its baseline is "nothing of ours running", so restoring stops the child.

A server that dies after it answered its health check (a crash, the OOM killer) is seen by
`check_alive`, which the study asks after every round: that round, and its trial, fail with the reason
and no score (docs/reliability.md P8).
"""

from __future__ import annotations

import contextlib
import os
import signal

from pydantic import Field

from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.errors import ServerNotReady, TransportError
from tuner.faults import crash_point
from tuner.models import LaunchSpec
from tuner.redact import redact
from tuner.transports.base import ProcessHandle, Transport

__all__ = ["ProcessDeployer", "ProcessOptions"]


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

    async def __aenter__(self) -> ProcessDeployer:
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
