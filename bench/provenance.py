"""What a figure ran on: the day, the commit and the lock (requirements/*.txt, scripts/check_lock.py's
identity), written into every result file of bench/ beside its figures. The same versions of every
package give the same figures a better chance; a figure that names no lock ran on whatever an unlocked
install picked that day (before 2026-12-07)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["lock_id", "measured_on", "write_result"]


def lock_id() -> str:
    """The lock's identity, as scripts/check_lock.py --id prints it (its one definition)."""
    spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
    assert spec is not None and spec.loader is not None
    check_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_lock)
    return str(check_lock.lock_id(ROOT))


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def measured_on() -> dict[str, str]:
    """{"date", "commit", "lock"} of a measurement made now, on this checkout."""
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": _commit(), "lock": lock_id()}


def write_result(path: Path, document: Any, *, indent: int = 1, default: Any = None) -> None:
    """Writes a bench's result file, its "measured_on" (day, commit, lock) first."""
    stamped = {"measured_on": measured_on(), **document} if isinstance(document, dict) else document
    path.write_text(json.dumps(stamped, indent=indent, default=default) + "\n")
