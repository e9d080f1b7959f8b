"""Checks that this Python environment holds exactly what a lock file pins, and names the lock.

    .venv/bin/python scripts/check_lock.py requirements/dev.txt    # exit 0: the installed packages are the lock's
    .venv/bin/python scripts/check_lock.py --id                    # the lock's identity, as figures name it

scripts/bootstrap.sh runs the first after every install, so that a CI log shows the install equal to the
lock; tests/fast/test_lock.py runs the same comparison on the environment the tests run in. The lock's
identity is the first 12 hex digits of the SHA-256 of its four files (base, dev, fleet, dashboard, in
that order): a figure measured on this version names it beside the commit (docs/testing.md, "The lock").
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ("base", "dev", "fleet", "dashboard")
# Installed beside the lock and not by it: the project itself (editable), and the venv's own pip.
NOT_LOCKED = frozenset({"serve-tuner", "pip"})


def entries(lock: Path) -> list[tuple[str, str, str]]:
    """(canonical name, version, environment marker or "") of each pin, in the lock's order."""
    found = []
    for line in lock.read_text().splitlines():
        if not line[:1].isalnum():
            continue  # a comment, a hash or a "via" note
        requirement, _, marker = line.rstrip(" \\").partition(";")
        name, _, version = requirement.strip().partition("==")
        found.append((canonicalize_name(name), version.strip(), marker.strip()))
    return found


def pins(lock: Path) -> dict[str, str]:
    """The version the lock gives each package whose environment marker holds here."""
    return {name: version for name, version, marker in entries(lock) if not marker or Marker(marker).evaluate()}


def installed() -> dict[str, str]:
    """Every distribution this interpreter sees, by its canonical name."""
    return {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in metadata.distributions()
        if canonicalize_name(dist.metadata["Name"]) not in NOT_LOCKED
    }


def differences(lock: Path, have: dict[str, str] | None = None) -> list[str]:
    """One line per package whose installed version is not the lock's, or that only one side has."""
    want = pins(lock)
    have = installed() if have is None else have
    lines = []
    for name in sorted(want.keys() | have.keys()):
        if name not in have:
            lines.append(f"{name}: locked at {want[name]}, not installed")
        elif name not in want:
            lines.append(f"{name}: {have[name]} installed, not in {lock.name}")
        elif have[name] != want[name]:
            lines.append(f"{name}: {have[name]} installed, locked at {want[name]}")
    return lines


def lock_id(root: Path = ROOT) -> str:
    """The lock's identity: the first 12 hex digits of the SHA-256 of its four files, in LOCKS's order."""
    digest = hashlib.sha256()
    for name in LOCKS:
        digest.update((root / "requirements" / f"{name}.txt").read_bytes())
    return digest.hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("lock", nargs="?", type=Path, help="the lock file the environment should hold")
    parser.add_argument("--id", action="store_true", help="print the lock's identity and exit")
    args = parser.parse_args(argv)
    if args.id:
        print(lock_id())
        return 0
    if args.lock is None:
        parser.error("give a lock file (requirements/NAME.txt) or --id")
    lines = differences(args.lock)
    if lines:
        print(f"error: this environment is not {args.lock} ({len(lines)} differences):", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"installed: exactly {args.lock}, {len(pins(args.lock))} packages (lock {lock_id()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
