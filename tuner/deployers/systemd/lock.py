"""The host's lock: one controller per host and unit, a directory made atomically with its holder
(`owner.json`: controller, pid, last heartbeat) inside; a holder silent too long is taken over."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from tuner.deployers.systemd.paths import STATE_DIR, HostPaths
from tuner.deployers.systemd.unit import SystemdUnit
from tuner.errors import StudyError

__all__ = ["HostLock", "read_holder"]


def read_holder(raw: bytes | None) -> dict[str, object]:
    """A lock's holder as `owner.json` says; anything unreadable counts as no holder (a stale lock)."""
    try:
        holder = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


class HostLock:
    """This controller's hold on `unit`'s lock; `stale_s`: how long a silent holder keeps it."""

    def __init__(self, unit: SystemdUnit, paths: HostPaths, *, stale_s: float) -> None:
        self._unit = unit
        self._paths = paths
        self._stale_s = stale_s
        self._owner = {"controller": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        self._locked = False
        self.last_beat = 0.0  # time.monotonic() of the last write of owner.json

    async def take(self) -> None:
        """One controller per host and unit: a directory made atomically, with its holder inside."""
        if self._locked:
            return
        transport, lock_dir = self._unit.transport, self._paths.lock_dir
        await transport.run(
            ["mkdir", "-p", "--", STATE_DIR], timeout_s=30, check=False, privileged=True, idempotent=True
        )
        made = await transport.run(["mkdir", "--", lock_dir], timeout_s=30, check=False, privileged=True)
        if made.exit_status != 0:
            holder = read_holder(await self._unit.read(self._paths.lock_owner))
            if not self.stale(holder):
                raise StudyError(
                    f"another serve-tuner (pid {holder.get('pid')} on {holder.get('controller')}) is tuning "
                    f"{self._unit.name} on this host; wait for it to finish, or stop it (a holder silent for "
                    f"{self._stale_s:g} s is taken over; removing {lock_dir} forces it now)"
                )
        await self.write_owner()
        self._locked = True

    async def write_owner(self) -> None:
        """Who holds the lock, and when it was last heard from (what `stale` reads on another run)."""
        self._owner["beat"] = time.time()
        self.last_beat = time.monotonic()
        await self._unit.transport.write_file(self._paths.lock_owner, json.dumps(self._owner).encode(), mode=0o600)

    def stale(self, holder: Mapping[str, object]) -> bool:
        if not holder:
            return True  # a lock directory without its holder: the controller died while taking it
        if holder.get("controller") == self._owner["controller"]:
            pid = holder.get("pid")
            if isinstance(pid, int) and not Path(f"/proc/{pid}").exists():
                return True  # the holder ran on this machine and is gone
        beat = holder.get("beat")
        return not isinstance(beat, (int, float)) or time.time() - beat > self._stale_s

    async def release(self) -> None:
        if self._locked:
            command = ["rm", "-rf", "--", self._paths.lock_dir]
            await self._unit.transport.run(command, timeout_s=30, check=False, privileged=True)
            self._locked = False
