"""The way back without the controller: a watcher on the host, started before the original is stopped, that
puts the original back when the controller has not been heard from for `seconds` (a controller SIGKILLed, its
machine gone, its link down for good), as the systemd deployer's dead-man timer does.

The controller touches a heartbeat file on the host after every round; the watcher (a `sh` in a session
of its own, so that neither a closed SSH session nor the controller's death ends it) checks the file's age
and, once it is older than `seconds`, removes the trial container, starts the original if it ran, and
exits. Removing the heartbeat file disarms it. Its script is a file beside the heartbeat, which an operator
can read. A reboot ends it: the trial container never restarts by itself (it has no restart policy), and
the original comes back if its restart policy says so, or at the next run of the study, which restores it
first.
"""

from __future__ import annotations

import os
import secrets
import shlex
import socket
from pathlib import Path

from tuner.transports.base import Transport

__all__ = ["DeadManWatcher", "host_state_dir"]

# Root's files under /run (gone at a reboot, like the watcher); a login's in its own runtime directory.
_STATE_DIR_SCRIPT = (
    'if [ "$(id -u)" = 0 ]; then d=/run; else d="${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}"; fi; '
    'd="$d/serve-tuner"; mkdir -p -m 700 -- "$d" && [ -O "$d" ] && [ -w "$d" ] && printf %s "$d"'
)


async def host_state_dir(transport: Transport) -> str:
    """The directory, on the host, for the watcher, its heartbeat and the trial's env file: the container
    CLI's user's own (`sudo -n` where the host says so)."""
    result = await transport.run(["sh", "-c", _STATE_DIR_SCRIPT], timeout_s=30, privileged=True)
    return result.stdout.strip()


class DeadManWatcher:
    """The watcher for one container."""

    def __init__(self, transport: Transport, *, state_dir: str, cli: str, container: str, seconds: float) -> None:
        self._transport = transport
        self._seconds = seconds
        stem = f"{state_dir}/container-{container}"
        self.beat, self.script = f"{stem}.beat", f"{stem}.restore.sh"
        # The trial's env file: removed as soon as `run` returns, and by the watcher and the next run where a
        # controller killed in between left it (it holds the original's environment and any secret).
        self.env_file = f"{stem}.env"
        self._cli, self._container = cli, container
        self._token: str | None = None

    async def arm(self, *, trial: str, original_ran: bool) -> None:
        """Writes the heartbeat and starts the watcher; it restores `trial`'s original unless kept beating.
        The heartbeat holds this arming's token: a watcher whose token is no longer there (disarmed, or armed
        again by a later run) ends at its next look, so one watcher at most acts for a container."""
        cli, name = shlex.quote(self._cli), shlex.quote(self._container)
        every = max(1, min(30, int(self._seconds // 5)))
        # The token, and who holds the container (what a later run reads to tell a live study from a dead one).
        self._token = f"{secrets.token_hex(8)} {socket.gethostname()} {os.getpid()}"
        script = "\n".join([
            "#!/bin/sh",
            f"# serve-tuner: puts container {self._container} back if the controller stopped answering for "
            f"{self._seconds:g} s.",
            f"beat={shlex.quote(self.beat)}",
            f'while [ "$(cat -- "$beat" 2>/dev/null)" = {shlex.quote(self._token)} ]; do',
            '  now=$(date +%s); last=$(stat -c %Y -- "$beat" 2>/dev/null || echo "$now")',
            f"  if [ $((now - last)) -ge {int(self._seconds)} ]; then",
            f"    {cli} rm -f {shlex.quote(trial)} >/dev/null 2>&1",
            f"    {cli} start {name} >/dev/null 2>&1" if original_ran else "    :",
            f'    rm -f -- "$beat" {shlex.quote(self.env_file)} "$0"',
            "    exit 0",
            "  fi",
            f"  sleep {every}",
            "done",
            "",
        ])  # fmt: skip
        await self._transport.write_file(self.script, script.encode(), mode=0o700)
        await self._transport.write_file(self.beat, self._token.encode(), mode=0o600)
        await self._transport.run(
            ["sh", "-c", 'setsid sh "$0" </dev/null >/dev/null 2>&1 &', self.script], timeout_s=30, privileged=True
        )

    async def armed(self) -> bool:
        """Whether this arming's heartbeat is still there (its watcher has not fired, no other run took over)."""
        if self._token is None:
            return False
        found = await self._transport.run(
            ["sh", "-c", '[ "$(cat -- "$0" 2>/dev/null)" = "$1" ]', self.beat, self._token],
            timeout_s=30,
            check=False,
            privileged=True,
        )
        return found.exit_status == 0

    async def holder(self) -> tuple[float, str] | None:
        """Seconds since any run's controller last beat for this container, and what its heartbeat holds (its
        token, controller's host name and pid); None where no heartbeat is there."""
        said = await self._transport.run(
            ["sh", "-c", 'test -e "$0" && echo $(( $(date +%s) - $(stat -c %Y -- "$0") )) && cat -- "$0"', self.beat],
            timeout_s=30,
            check=False,
            privileged=True,
        )
        age, _, held = said.stdout.partition("\n")
        return (float(age), held.strip()) if said.exit_status == 0 and age.strip().isdigit() else None

    def held_by_another_run(self, holder: tuple[float, str] | None) -> str | None:
        """Why the container is another study's (a heartbeat younger than `seconds`, of a controller that is not
        known to be gone), or None."""
        if holder is None or holder[0] >= self._seconds:
            return None
        age, (_, host, pid) = holder[0], [*holder[1].split(), "", "", ""][:3]
        here = host == socket.gethostname() and pid.isdigit()
        if here and (int(pid) == os.getpid() or not Path(f"/proc/{pid}").exists()):
            return None  # its controller ran on this machine and is gone (a killed run: put back first), or is us
        return (
            f"another serve-tuner study is tuning container {self._container} now (its controller was heard from "
            f"{age:.0f} s ago); wait for it to end, or if that run is gone, its watcher puts {self._container} back "
            f"within {self._seconds - age:.0f} s (remove {self.beat} on the host to take over at once)"
        )

    async def beat_now(self) -> None:
        # -c: a heartbeat the watcher removed when it acted stays removed (a new one would read as a study's).
        await self._transport.run(["touch", "-c", "--", self.beat], timeout_s=30, privileged=True)

    async def disarm(self) -> None:
        """The watcher ends at its next look; its script goes with it."""
        self._token = None
        await self._transport.run(
            ["rm", "-f", "--", self.beat, self.script], timeout_s=30, check=False, privileged=True
        )
