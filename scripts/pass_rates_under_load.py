"""Runs each real-server study test N times with a busy loop on one core, and reports the pass rates.

A test that asserts a verdict from measurements must hold on a busy machine: CI shares its cores.
Every run is its own pytest process under `CI=true` (a missing part fails instead of skipping), the
tests are interleaved (round 1 of each, then round 2, ...) so that a slow drift of the machine spreads
over all of them, and the results are written after every run, so an interrupted measurement keeps
what it measured. While the file named by `--pause-file` exists, no new run starts (a quiet machine
for another measurement).

    .venv/bin/python scripts/pass_rates_under_load.py --repeats 10 --out bench/results/pass-rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Every test that runs a study (`tuner run`) against the real llama-server.
STUDY_TESTS = (
    "tests/real/test_tiny_study.py::test_a_tiny_study_finds_small_batches_lift_stall_speed_and_resumes",
    "tests/real/test_tiny_study.py::test_the_same_config_measured_again_is_not_called_a_win",
    "tests/real/test_tiny_study.py::test_client_and_server_measurements_agree",
    "tests/real/test_tiny_study.py::test_an_interrupted_study_stops_its_server_and_resumes_cleanly[2-130]",
    "tests/real/test_tiny_study.py::test_an_interrupted_study_stops_its_server_and_resumes_cleanly[15-143]",
    "tests/real/test_tiny_study.py::test_a_full_disk_stops_the_run_with_one_line_and_earlier_trials_stay_readable",
    "tests/real/test_tiny_study.py::test_an_unusable_port_fails_the_baseline_with_one_line_and_leaves_no_server",
    "tests/real/test_lora_study.py::test_mixed_lora_traffic_waits_before_prefill_and_one_setting_for_all_removes_the_wait",
    "tests/real/test_lora_study.py::test_a_lora_study_finds_the_wait_and_recommends_a_policy_only_if_answers_may_change",
    "tests/real/test_api_key_real_server.py::test_the_api_key_is_used_but_never_printed_or_written",
    "tests/real/test_ssh.py::test_a_study_runs_its_server_on_a_host_reached_over_ssh",
    "tests/real/test_systemd_deployer.py::test_a_study_tunes_the_operators_unit_over_ssh_and_apply_keeps_its_model_address_and_port",
)


def _hog() -> subprocess.Popen[bytes]:
    """A busy loop pinned to CPU 0."""
    return subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])


def _run_once(test: str) -> tuple[bool, float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env={**os.environ, "CI": "true"},
        capture_output=True,
        text=True,
        check=False,
    )
    tail = (result.stdout + result.stderr).strip().splitlines()
    summary = next((line for line in reversed(tail) if " in " in line and ("passed" in line or "failed" in line)), "")
    passed = result.returncode == 0 and "passed" in summary and "skipped" not in summary
    # Kept in the results file, which is committed: this machine's paths are left out of it.
    failure = (
        "" if passed else "\n".join(tail[-15:]).replace(str(ROOT), "<repo>").replace(tempfile.gettempdir(), "<tmp>")
    )
    return passed, time.monotonic() - started, failure


def _table(runs: dict[str, list[dict[str, object]]]) -> str:
    lines = ["| test | passed | runs | median time |", "|---|---|---|---|"]
    for test, results in runs.items():
        if not results:
            continue
        seconds = sorted(float(str(r["seconds"])) for r in results)
        passed = sum(1 for r in results if r["passed"])
        name = test.removeprefix("tests/")
        lines.append(f"| `{name}` | {passed} | {len(results)} | {seconds[len(seconds) // 2]:.0f} s |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/pass-rates-under-load.json")
    parser.add_argument("--pause-file", type=Path, default=ROOT / ".pass-rates-pause")
    parser.add_argument("--only", action="append", default=[], help="a substring of the tests to run")
    parser.add_argument("--report", action="store_true", help="print the results file as a Markdown table")
    args = parser.parse_args()
    if args.report:
        print(_table(json.loads(args.out.read_text())["runs"]))
        return 0
    tests = [t for t in STUDY_TESTS if not args.only or any(o in t for o in args.only)]
    results: dict[str, list[dict[str, object]]] = {t: [] for t in tests}
    if args.out.exists():
        results.update({k: v for k, v in json.loads(args.out.read_text())["runs"].items() if k in results})
    hog = _hog()
    try:
        for _ in range(args.repeats):
            for test in tests:
                if len(results[test]) >= args.repeats:
                    continue
                while args.pause_file.exists():
                    time.sleep(5)
                passed, seconds, failure = _run_once(test)
                results[test].append({"passed": passed, "seconds": round(seconds, 1), "failure": failure})
                print(f"{'PASS' if passed else 'FAIL'} {seconds:6.0f}s {test}", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(
                    json.dumps({"load": "one busy loop pinned to CPU 0", "runs": results}, indent=1) + "\n"
                )
    finally:
        hog.kill()
    for test, runs in results.items():
        passed = sum(1 for r in runs if r["passed"])
        print(f"{passed:2d}/{len(runs):2d}  {test}")
    return 0 if all(all(r["passed"] for r in runs) for runs in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
