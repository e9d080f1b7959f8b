"""Guard mutants: for each guard (a check that refuses, restores, verifies or redacts) named in
`tests/guard_mutants/*.toml`, disable it in a scratch copy of the repository and run the tests that
should notice. A mutant is KILLED when one of them fails, SURVIVED when they all pass, HUNG when they
ran past 15 minutes, and NOT RUN when a test skipped (its real part is missing here), a test's setup
failed (which says nothing of the guard) or the run broke for another reason.

    .venv/bin/python scripts/guard_mutants.py                  # every mutant, then a markdown report
    .venv/bin/python scripts/guard_mutants.py --only systemd-  # mutants whose name starts so
    .venv/bin/python scripts/guard_mutants.py --list           # the catalogue, nothing run

Each catalogue entry:

    [[mutant]]
    name = "systemd-verify-pending-reload"         # unique, kebab-case
    guard = "a trial with a pending daemon-reload is refused"
    file = "tuner/deployers/systemd/start.py"
    find = 'if after["NeedDaemonReload"] != "no":'  # must occur exactly once in the file
    replace = "if False:"
    tests = ["tests/real/test_systemd_deployer.py::test_the_verification_refuses_..."]

The tests named are first run on the unmutated copy (`--no-clean-run` skips that): a mutant counts as
killed only by tests that pass without it. The working tree is never touched. Exit status: 0 when every
mutant run was killed, 1 when one survived or could not be run, 2 for a broken catalogue.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "guard_mutants"


@dataclass(frozen=True)
class Mutant:
    name: str
    guard: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    source: str  # the catalogue file it came from


@dataclass(frozen=True)
class Outcome:
    verdict: str  # KILLED, SURVIVED, HUNG (its tests never ended), NOT RUN
    detail: str
    seconds: float


class CatalogueError(Exception):
    """A catalogue entry that cannot be applied; the script exits 2, as its documentation says."""


def load_catalogue() -> list[Mutant]:
    mutants: list[Mutant] = []
    for path in sorted(CATALOGUE.glob("*.toml")):
        for entry in tomllib.loads(path.read_text()).get("mutant", []):
            missing = {"name", "guard", "file", "find", "replace", "tests"} - set(entry)
            if missing:
                raise CatalogueError(f"{path.name}: a mutant lacks {', '.join(sorted(missing))}")
            mutant = Mutant(
                name=entry["name"], guard=entry["guard"], file=entry["file"], find=entry["find"],
                replace=entry["replace"], tests=tuple(entry["tests"]), source=path.name,
            )  # fmt: skip
            text = (ROOT / mutant.file).read_text()
            if text.count(mutant.find) != 1:
                raise CatalogueError(
                    f"{path.name}: mutant {mutant.name}: `find` occurs {text.count(mutant.find)} times in "
                    f"{mutant.file}, not once; quote more of the line"
                )
            mutants.append(mutant)
    names = [m.name for m in mutants]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        raise CatalogueError(f"mutant names used twice: {', '.join(sorted(duplicated))}")
    return mutants


def scratch_copy(into: Path) -> Path:
    """The tracked and untracked-but-not-ignored files of the working tree, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


# A mutant that makes a loop spin (a disabled exit condition) must not hang the whole run.
_TEST_TIMEOUT_S = 900


def run_tests(
    copy: Path, tests: tuple[str, ...], *, timeout_s: float | None = _TEST_TIMEOUT_S
) -> tuple[int, str, int, int]:
    """pytest on the copy: (exit status, last lines, tests whose call failed, tests skipped). An error in a
    test's setup (a fixture, a port clash, a host that did not boot) is no kill: it says nothing of the
    guard. A run past the timeout is exit status -1."""
    report = copy / ".guard-mutant-report.xml"
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # a missing part skips, not fails
    env["PYTHONPATH"] = str(copy)
    python = ROOT / ".venv" / "bin" / "python"
    try:
        done = subprocess.run(
            [str(python if python.exists() else sys.executable), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", *tests],
            cwd=copy, env=env, capture_output=True, text=True, check=False, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return -1, f"the tests ran past {timeout_s} s", 0, 0
    failed = skipped = 0
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            # junit marks a failed call <failure>, and a failed setup or teardown <error>.
            failed += len(case.findall("failure"))
            skipped += len(case.findall("skipped"))
    tail = " | ".join(line for line in (done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode, tail, failed, skipped


def check_imports_the_copy(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    python = ROOT / ".venv" / "bin" / "python"
    where = subprocess.run(
        [str(python if python.exists() else sys.executable), "-c", "import tuner; print(tuner.__file__)"],
        cwd=copy, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the scratch copy imports tuner from {where}, not from the copy")


def try_mutant(mutant: Mutant, workdir: Path) -> Outcome:
    started = time.monotonic()
    copy = scratch_copy(workdir / mutant.name)
    target = copy / mutant.file
    target.write_text(target.read_text().replace(mutant.find, mutant.replace, 1))
    status, tail, failed, skipped = run_tests(copy, mutant.tests)
    took = time.monotonic() - started
    shutil.rmtree(copy, ignore_errors=True)
    if skipped:
        return Outcome("NOT RUN", f"{skipped} test(s) skipped: {tail}", took)
    if status == 1 and failed:
        return Outcome("KILLED", tail, took)
    if status == 0:
        return Outcome("SURVIVED", tail, took)
    if status == -1:
        return Outcome("HUNG", tail, took)
    return Outcome("NOT RUN", f"pytest exited {status}: {tail}", took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only mutants whose name starts with this")
    parser.add_argument("--list", action="store_true", help="print the catalogue and run nothing")
    parser.add_argument("--no-clean-run", action="store_true", help="skip the run of the tests without mutants")
    args = parser.parse_args()
    try:
        catalogue = load_catalogue()
    except CatalogueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mutants = [m for m in catalogue if m.name.startswith(args.only)]
    if not mutants:
        print(f"no mutant's name starts with {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name}: {mutant.guard} ({mutant.file}; {len(mutant.tests)} test(s))")
        return 0
    with tempfile.TemporaryDirectory(prefix="guard-mutants-") as scratch:
        workdir = Path(scratch)
        clean = scratch_copy(workdir / "clean")
        check_imports_the_copy(clean)
        if not args.no_clean_run:
            tests = tuple(dict.fromkeys(test for mutant in mutants for test in mutant.tests))
            print(f"clean run of the {len(tests)} test(s) the mutants name ...", flush=True)
            # Every catalogue's tests in one run (systemd boots, the apply tests): no per-mutant limit.
            status, tail, _, skipped = run_tests(clean, tests, timeout_s=None)
            if status != 0 or skipped:
                print(f"the tests do not pass cleanly (exit {status}, {skipped} skipped): {tail}", file=sys.stderr)
                return 1
        shutil.rmtree(clean, ignore_errors=True)
        rows = []
        for mutant in mutants:
            print(f"{mutant.name} ...", end=" ", flush=True)
            outcome = try_mutant(mutant, workdir)
            print(f"{outcome.verdict} ({outcome.seconds:.0f} s)", flush=True)
            rows.append((mutant, outcome))
    killed = sum(outcome.verdict == "KILLED" for _, outcome in rows)
    print(f"\n{killed} of {len(rows)} guard mutants killed\n")
    print("| mutant | guard | verdict | killed by |")
    print("|---|---|---|---|")
    for mutant, outcome in rows:
        by = ", ".join(f"`{test.split('::')[-1]}`" for test in mutant.tests)
        print(f"| `{mutant.name}` | {mutant.guard} | {outcome.verdict} | {by} |")
    for mutant, outcome in rows:
        if outcome.verdict != "KILLED":
            print(f"\n{mutant.name}: {outcome.verdict}: {outcome.detail}", file=sys.stderr)
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
