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

import shlex

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
        self._cli, self._container = cli, container

    async def arm(self, *, trial: str, original_ran: bool) -> None:
        """Writes the heartbeat and starts the watcher; it restores `trial`'s original unless kept beating."""
        cli, name = shlex.quote(self._cli), shlex.quote(self._container)
        every = max(1, min(30, int(self._seconds // 5)))
        script = "\n".join([
            "#!/bin/sh",
            f"# serve-tuner: puts container {self._container} back if the controller stopped answering for "
            f"{self._seconds:g} s.",
            f"beat={shlex.quote(self.beat)}",
            'while [ -e "$beat" ]; do',
            '  now=$(date +%s); last=$(stat -c %Y -- "$beat" 2>/dev/null || echo "$now")',
            f"  if [ $((now - last)) -ge {int(self._seconds)} ]; then",
            f"    {cli} rm -f {shlex.quote(trial)} >/dev/null 2>&1",
            f"    {cli} start {name} >/dev/null 2>&1" if original_ran else "    :",
            '    rm -f -- "$beat"',
            "    exit 0",
            "  fi",
            f"  sleep {every}",
            "done",
            "",
        ])  # fmt: skip
        await self._transport.write_file(self.script, script.encode(), mode=0o700)
        await self.beat_now()
        await self._transport.run(
            ["sh", "-c", 'setsid sh "$0" </dev/null >/dev/null 2>&1 &', self.script], timeout_s=30, privileged=True
        )

    async def armed(self) -> bool:
        """Whether its heartbeat is still there (the watcher has not fired)."""
        found = await self._transport.run(
            ["sh", "-c", 'test -e "$0"', self.beat], timeout_s=30, check=False, privileged=True
        )
        return found.exit_status == 0

    async def beat_now(self) -> None:
        await self._transport.run(["touch", "--", self.beat], timeout_s=30, privileged=True)

    async def disarm(self) -> None:
        """The watcher ends at its next look; its script goes with it."""
        await self._transport.run(
            ["rm", "-f", "--", self.beat, self.script], timeout_s=30, check=False, privileged=True
        )
