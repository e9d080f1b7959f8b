"""Runs each real-server test that asserts a measured figure or verdict N times under a chosen load, and
reports the pass rates per load.

A test that asserts a verdict from measurements must hold on a slower or busier machine than the one it was
written on: CI's machines differ in speed and share their cores. The loads:

- `quiet`: nothing else runs;
- `half`: a busy loop pinned to each core, at the tests' own priority: the scheduler gives every thread of the
  tests about half a core, as on a machine whose cores are half as fast. Measured on a 2-core machine on
  2026-12-03, llama-server with one thread prefilled at 45 tok/s against 84 alone and decoded at 16 tok/s
  against 33. A CPU quota of half the machine (a cgroup's `cpu.max` of one core of two, this script's
  `half` until then) slowed it by nothing (89 tok/s): its one busy thread still got a whole core;
- `busy-core`: a busy loop pinned to CPU 0 (the load of the earlier results).

Every run is its own pytest process under `CI=true` (a missing part fails instead of skipping), the tests
are interleaved (round 1 of each, then round 2, ...) so that a slow drift of the machine spreads over all of
them, and the results are written after every run, so an interrupted measurement keeps what it measured.
While the file named by `--pause-file` exists, no new run starts. `--whole-suite` runs `scripts/test.sh`
once under the load instead (`CI=true`), and records whether it passed and how long it took (`--log FILE`
keeps its whole output: a failure's cause is rarely in its last lines).

    .venv/bin/python scripts/pass_rates_under_load.py --load half --repeats 5
    .venv/bin/python scripts/pass_rates_under_load.py --load quiet --repeats 5
    .venv/bin/python scripts/pass_rates_under_load.py --report     # the table, a column per load
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results/pass-rates-by-load.json"

# The real-server tests that assert a measured figure or verdict: those marked `measures` (the ones CI runs
# with the machine to themselves), less the report's browser test, which only reads the tiny study's shared
# run (its own measurement is the tiny study test's).
READS_A_SHARED_RUN = ("tests/real/test_report_browser.py::",)


def measurement_tests() -> list[str]:
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "measures"]
    listed = subprocess.run([*collect, "tests/real"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tests = [line for line in listed.splitlines() if line.startswith("tests/real/") and "::" in line]
    return [t for t in tests if not t.startswith(READS_A_SHARED_RUN)]


LOADS = ("quiet", "half", "busy-core")


def _busy_loops(cpus: list[int]) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"]) for cpu in cpus]


@contextlib.contextmanager
def _load(load: str) -> Iterator[str]:
    """`load` on the machine while the tests run; yields its description for the results file."""
    if load == "quiet":
        yield "nothing else running"
        return
    cpus = [0] if load == "busy-core" else list(range(os.cpu_count() or 1))
    loops = _busy_loops(cpus)
    described = f"a busy loop pinned to each of {len(cpus)} cores"
    try:
        yield "one busy loop pinned to CPU 0" if load == "busy-core" else described
    finally:
        for loop in loops:
            loop.kill()


def _run(argv: list[str], *, log: Path | None = None) -> tuple[bool, float, str]:
    started = time.monotonic()
    result = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "CI": "true"}, capture_output=True, text=True, check=False
    )
    if log is not None:
        log.write_text(result.stdout + result.stderr)
    tail = (result.stdout + result.stderr).strip().splitlines()
    summary = next((line for line in reversed(tail) if " in " in line and ("passed" in line or "failed" in line)), "")
    passed = result.returncode == 0 and "passed" in summary and "skipped" not in summary
    # Kept in the results file, which is committed: this machine's paths are left out of it.
    failure = (
        "" if passed else "\n".join(tail[-15:]).replace(str(ROOT), "<repo>").replace(tempfile.gettempdir(), "<tmp>")
    )
    return passed, time.monotonic() - started, failure


def _table(results: dict[str, dict[str, object]]) -> str:
    loads = [load for load in LOADS if load in results]
    lines = ["| test | " + " | ".join(loads) + " |", "|---|" + "---|" * len(loads)]
    tests = list(dict.fromkeys(t for load in loads for t in results[load]["runs"]))  # type: ignore[attr-defined]
    for test in tests:
        cells = []
        for load in loads:
            runs = results[load]["runs"].get(test, [])  # type: ignore[attr-defined]
            if not runs:
                cells.append("")
                continue
            seconds = sorted(float(r["seconds"]) for r in runs)
            passed = sum(1 for r in runs if r["passed"])
            cells.append(f"{passed}/{len(runs)} ({seconds[len(seconds) // 2]:.0f} s)")
        lines.append(f"| `{test.removeprefix('tests/')}` | " + " | ".join(cells) + " |")
    for load in loads:
        suite = results[load].get("whole_suite")
        if suite:
            lines.append(f"\n`CI=true ./scripts/test.sh` under {load}: {suite}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--load", choices=LOADS, default="half")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--pause-file", type=Path, default=ROOT / ".pass-rates-pause")
    parser.add_argument("--only", action="append", default=[], help="a substring of the tests to run")
    parser.add_argument("--whole-suite", action="store_true", help="run CI=true scripts/test.sh once instead")
    parser.add_argument("--log", type=Path, help="with --whole-suite: keep the suite's whole output in this file")
    parser.add_argument("--report", action="store_true", help="print the results file as a Markdown table")
    args = parser.parse_args()
    stored: dict[str, dict[str, object]] = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.report:
        print(_table(stored))
        return 0
    entry = stored.setdefault(args.load, {"load": "", "runs": {}})
    runs: dict[str, list[dict[str, object]]] = entry["runs"]  # type: ignore[assignment]

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stored, indent=1) + "\n")

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    day = time.strftime("%Y-%m-%d", time.gmtime())
    with _load(args.load) as described:
        entry["load"] = described
        if args.whole_suite:
            passed, seconds, failure = _run([str(ROOT / "scripts/test.sh")], log=args.log)
            entry["whole_suite"] = (
                f"{'passed' if passed else 'FAILED'} in {seconds / 60:.0f} min ({day}, commit {commit})"
            )
            save()
            print(entry["whole_suite"], failure, sep="\n")
            return 0 if passed else 1
        tests = [t for t in measurement_tests() if not args.only or any(o in t for o in args.only)]
        for _ in range(args.repeats):
            for test in tests:
                done = runs.setdefault(test, [])
                if len(done) >= args.repeats:
                    continue
                while args.pause_file.exists():
                    time.sleep(5)
                passed, seconds, failure = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test])
                done.append(
                    {"passed": passed, "seconds": round(seconds, 1), "failure": failure, "day": day, "commit": commit}
                )
                print(f"{'PASS' if passed else 'FAIL'} {seconds:6.0f}s {args.load} {test}", flush=True)
                save()
    for test in tests:
        done = runs.get(test, [])
        print(f"{sum(1 for r in done if r['passed']):2d}/{len(done):2d}  {test}")
    return 0 if all(all(r["passed"] for r in runs.get(t, [])) for t in tests) else 1


if __name__ == "__main__":
    sys.exit(main())
