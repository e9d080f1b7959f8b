"""Checks that this Python environment holds exactly what a lock file pins, and names the lock.

    .venv/bin/python scripts/check_lock.py requirements/dev.txt    # exit 0: the installed packages are the lock's
    python3 scripts/check_lock.py --id                             # the lock's identity, as figures name it

scripts/bootstrap.sh runs the first after every install (so that a CI log shows the install equal to the
lock) and, with --quiet, before reusing .venv; tests/fast/test_lock.py runs the same comparison on the
environment the tests run in. The lock's identity is the first 12 hex digits of the SHA-256 of its four
files' pins and hashes (base, dev, fleet, dashboard, in that order; comments left out, so that a new
"via" note alone changes nothing): a figure names it beside its commit (docs/testing.md, "The lock").
`--id` needs nothing but the standard library (scripts/lock.sh runs it before any venv exists).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ("base", "dev", "fleet", "dashboard")
# Installed beside the lock and not by it: the project itself (editable), and the venv's own pip.
NOT_LOCKED = frozenset({"serve-tuner", "pip"})


class LockError(Exception):
    """A lock file that cannot be read as one: its message is one line."""


def _pin_lines(lock: Path) -> list[tuple[int, str]]:
    """(line number, text) of each pin, its hashes and line continuations taken off."""
    try:
        text = lock.read_text()
    except OSError as exc:
        raise LockError(f"{lock}: {exc.strerror or exc}; pass a lock file such as requirements/dev.txt") from None
    return [
        (number, line.split(" --hash=")[0].rstrip(" \\"))
        for number, line in enumerate(text.splitlines(), start=1)
        if line[:1].isalnum()  # not a comment, a hash or a "via" note
    ]


def entries(lock: Path) -> list[tuple[str, str, str]]:
    """(canonical name, version, environment marker or "") of each pin, in the lock's order; a line that
    is not an exact pin (`name==version`, an optional marker) is refused, naming it."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found = []
    for number, line in _pin_lines(lock):
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise LockError(f"{lock}:{number}: not a requirement ({exc}); run scripts/lock.sh") from None
        pinned = list(requirement.specifier)
        if requirement.url or requirement.extras or len(pinned) != 1 or pinned[0].operator != "==":
            raise LockError(f"{lock}:{number}: {line!r} is not an exact pin (name==version); run scripts/lock.sh")
        marker = str(requirement.marker) if requirement.marker else ""
        found.append((canonicalize_name(requirement.name), pinned[0].version, marker))
    return found


def pins(lock: Path) -> dict[str, str]:
    """The version the lock gives each package whose environment marker holds here."""
    from packaging.markers import Marker

    return {name: version for name, version, marker in entries(lock) if not marker or Marker(marker).evaluate()}


def installed() -> dict[str, str]:
    """Every distribution this interpreter sees, by its canonical name."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    names = {canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    return {name: version for name, version in names.items() if name not in NOT_LOCKED}


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
    """The lock's identity: 12 hex digits of the SHA-256 of its four files' pins and hashes."""
    digest = hashlib.sha256()
    for name in LOCKS:
        lock = root / "requirements" / f"{name}.txt"
        for line in lock.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                digest.update(line.strip().encode() + b"\n")
    return digest.hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("lock", nargs="?", type=Path, help="the lock file the environment should hold")
    parser.add_argument("--id", action="store_true", help="print the lock's identity and exit")
    parser.add_argument("--quiet", action="store_true", help="print nothing when the environment is the lock")
    args = parser.parse_args(argv)
    if args.id:
        print(lock_id())
        return 0
    if args.lock is None:
        parser.error("give a lock file (requirements/NAME.txt) or --id")
    try:
        lines = differences(args.lock)
        count = len(pins(args.lock))
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if lines:
        print(f"error: this environment is not {args.lock} ({len(lines)} differences):", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"installed: exactly {args.lock}, {count} packages (lock {lock_id()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
