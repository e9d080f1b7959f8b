"""The unit as found before the study (whether it ran, each of its files hashed, its effective
environment), kept on the host until a restore finishes, and the restore held to it."""

from __future__ import annotations

import json

from tuner.deployers.systemd.unit import SystemdUnit, UnitState
from tuner.deployers.systemd.unit_file import parse_show_environment

__all__ = ["difference_from_snapshot", "read_snapshot", "take_snapshot"]


async def take_snapshot(unit: SystemdUnit, state: UnitState) -> dict[str, object]:
    return {
        "active": state["ActiveState"] in ("active", "activating", "reloading"),
        "files": await unit.unit_files(state),
        "environment": parse_show_environment(state["Environment"]),
    }


def read_snapshot(raw: bytes) -> dict[str, object]:
    """The snapshot an earlier run left on the host; one it cannot read still says to restart the unit."""
    try:
        snapshot = json.loads(raw)
    except ValueError:
        return {"active": True}
    if not isinstance(snapshot, dict):
        return {"active": True}
    if not isinstance(snapshot.get("files"), dict) or not isinstance(snapshot.get("environment"), dict):
        return {"active": bool(snapshot.get("active", True))}
    return snapshot


async def difference_from_snapshot(unit: SystemdUnit, state: UnitState, baseline: dict[str, object]) -> str | None:
    """After a restore: every file of the unit byte-identical, and its effective environment (what
    `systemctl show` reports from all its files) the one found before the study."""
    files, snapshot = await unit.unit_files(state), baseline["files"]
    assert isinstance(snapshot, dict)
    changed = sorted(path for path in {*files, *snapshot} if files.get(path) != snapshot.get(path))
    if changed:
        return (
            f"{changed[0]} differs from the snapshot taken before the study (someone changed "
            f"{unit.name}'s files meanwhile); check the unit by hand"
        )
    environment = parse_show_environment(state["Environment"])
    if environment != baseline["environment"]:
        return (
            f"{unit.name}'s environment differs from the one before the study after restoring; check "
            f"`systemctl show -p Environment {unit.name}` by hand"
        )
    return None
