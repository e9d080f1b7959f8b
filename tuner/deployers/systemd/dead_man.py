"""The dead-man timer: a transient systemd timer on the host, armed before every change and re-armed by
the heartbeat, that puts the unit back on its baseline if this controller stops answering."""

from __future__ import annotations

import shlex

from tuner.deployers.systemd.paths import HostPaths
from tuner.transports.base import Transport

__all__ = ["DeadManTimer"]


class DeadManTimer:
    """The timer for one unit; it fires `seconds` after it was last armed."""

    def __init__(self, paths: HostPaths, *, transport: Transport, seconds: float) -> None:
        self._paths = paths
        self._transport = transport
        self._seconds = seconds

    async def arm(self, *, active: bool) -> None:
        """A transient timer on the host that restores the baseline (the unit restarted if it was `active`,
        else stopped) unless re-armed in time. Its script is a file beside the lock, which an operator can
        read, rather than a command line systemd would re-escape."""
        await self.disarm()
        paths = self._paths
        unit = shlex.quote(paths.unit)
        script = "\n".join([
            "#!/bin/sh",
            f"# serve-tuner: puts {paths.unit} back on its baseline if the controller stopped answering.",
            f"rm -f {shlex.quote(paths.runtime_drop_in)} {shlex.quote(paths.secrets)}",
            "systemctl daemon-reload",
            f"systemctl reset-failed {unit}",
            f"systemctl restart {unit}" if active else f"systemctl stop {unit}",
            f"rm -f {shlex.quote(paths.snapshot)}",
            f"rm -rf {shlex.quote(paths.lock_dir)}",
            'rm -f -- "$0"',  # the shell holds the script open: it reads on after the name is gone
            "",
        ])  # fmt: skip
        await self._transport.write_file(paths.restore_script, script.encode(), mode=0o700)
        await self._transport.run(
            ["systemd-run", f"--unit={paths.timer}", f"--on-active={int(self._seconds)}s",
             "--timer-property=AccuracySec=1s", "--description=serve-tuner: restore the baseline of " + paths.unit,
             "/bin/sh", paths.restore_script],
            timeout_s=60,
            privileged=True,
        )  # fmt: skip

    async def disarm(self) -> None:
        timer = self._paths.timer
        await self._transport.run(["systemctl", "stop", f"{timer}.timer"], timeout_s=60, check=False, privileged=True)
        await self._transport.run(
            ["systemctl", "reset-failed", f"{timer}.timer", f"{timer}.service"],
            timeout_s=60,
            check=False,
            privileged=True,
        )
