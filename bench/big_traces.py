"""Big traces in bounded memory: time and peak resident memory of `tuner workload import`, `tuner
workload show --plot` and the replay's loader on traces of 100,000 and 1,000,000 requests.

    bench/big_traces.py [--rows 100000,1000000] [--table]

The sources are synthetic, in the shapes of the public traces (no real trace is shipped or fetched):
- **mooncake**: JSONL in Mooncake's format, about 13,000 prompt tokens and up to 32 block ids a request (its
  its conversation trace; requests belong to 20,000 conversations whose turns share a growing chain
  of blocks, and every request adds blocks of its own, so most ids are named once (a real day's trace
  names tens of millions of blocks);
- **azure**: CSV in the Azure LLM inference trace's format (`TIMESTAMP,ContextTokens,GeneratedTokens`),
  lengths drawn like its conversation trace's (median about 1,000 and 250 tokens).

Each command runs in a process of its own, and its peak resident memory is the kernel's count for that
process (`wait4`). The replay's loader is what `tuner run` does with the study's trace before the first
trial: read it (`load_trace`) and keep a share of its sessions (`thin_sessions`, keep 0.1). Targets
(issue "Performance of the tuner itself"): a million-row trace within 500 MB and 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "big-traces.json"
TARGET_MB, TARGET_S = 500, 60.0

LOADER = (
    "import sys; from pathlib import Path; from tuner.workloads import load_trace, thin_sessions; "
    "trace = load_trace(Path(sys.argv[1])); kept = thin_sessions(trace, keep=0.1, seed=0); "
    "print(len(trace), len(kept))"
)


def write_mooncake(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    conversations = 20_000
    chains: dict[int, list[int]] = {}
    next_id = 10_000_000
    at = 0
    with path.open("w") as out:
        lines = []
        for _ in range(rows):
            at += rng.randint(0, 40)
            conversation = rng.randrange(conversations)
            chain = chains.setdefault(conversation, [conversation * 1000 + k for k in range(rng.randint(1, 6))])
            own = rng.randint(2, 14)
            ids = [*chain[:18], *range(next_id, next_id + own)]
            next_id += own
            if len(chain) < 18:
                chain.append(ids[len(chain)])  # the next turn repeats this one's first new block
            tokens = len(ids) * 512 - rng.randrange(512)
            lines.append(
                json.dumps(
                    {"timestamp": at, "input_length": tokens, "output_length": rng.randint(20, 800), "hash_ids": ids}
                )
            )
            if len(lines) == 10_000:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")


def write_azure(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    start = datetime(2024, 5, 10, tzinfo=UTC)
    at = 0.0
    with path.open("w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        lines = []
        for _ in range(rows):
            at += rng.expovariate(20.0)
            stamp = (start + timedelta(seconds=at)).isoformat(timespec="microseconds")
            context = max(1, min(100_000, int(rng.lognormvariate(6.9, 1.0))))
            generated = max(1, min(8_000, int(rng.lognormvariate(5.5, 0.8))))
            lines.append(f"{stamp},{context},{generated}")
            if len(lines) == 10_000:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")


def measured(command: list[str]) -> dict[str, float]:
    """Runs `command`; its wall time and the peak resident memory of its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    errors = process.stderr.read().decode() if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command[2:])} failed: {errors.strip()[-500:]}")
    return {"seconds": round(seconds, 2), "peak_mb": round(usage.ru_maxrss / 1024, 1)}


def run(rows_list: list[int]) -> dict[str, object]:
    python = sys.executable
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for rows in rows_list:
            for kind, writer, suffix in (("mooncake", write_mooncake, "jsonl"), ("azure", write_azure, "csv")):
                source, trace = work / f"{kind}-{rows}.{suffix}", work / f"{kind}-{rows}-trace.jsonl"
                writer(source, rows)
                steps = {
                    "import": [python, "-m", "tuner", "workload", "import", kind, str(source), "--out", str(trace)],
                    "show --plot": [
                        python,
                        "-m",
                        "tuner",
                        "workload",
                        "show",
                        str(trace),
                        "--plot",
                        str(work / "p.png"),
                    ],
                    "replay's loader": [python, "-c", LOADER, str(trace)],
                }
                for step, command in steps.items():
                    figures = measured(command)
                    figures["source_mb"] = round(source.stat().st_size / 2**20, 1)
                    results.setdefault(f"{kind} {step}", {})[str(rows)] = figures
                    print(
                        f"{kind:9} {step:16} {rows:>9,} rows: {figures['seconds']:7.2f} s {figures['peak_mb']:8.1f} MB"
                    )
                source.unlink()
                trace.unlink()
    return {
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "rows": rows_list,
        "results": results,
        "target": {"peak_mb": TARGET_MB, "seconds": TARGET_S, "rows": 1_000_000},
    }


def table(data: dict[str, object]) -> str:
    rows_list = [int(r) for r in data["rows"]]  # type: ignore[attr-defined]
    low, high = min(rows_list), max(rows_list)
    lines = [
        f"| step | {low:,} rows: time, peak | {high:,} rows: time, peak | per 100,000 rows: time, memory |",
        "|---|---|---|---|",
    ]
    for step, by_rows in data["results"].items():  # type: ignore[attr-defined]
        small, big = by_rows[str(low)], by_rows[str(high)]
        scale = (high - low) / 100_000
        per_s = (big["seconds"] - small["seconds"]) / scale
        per_mb = (big["peak_mb"] - small["peak_mb"]) / scale
        flag = " (over target)" if big["peak_mb"] > TARGET_MB or big["seconds"] > TARGET_S else ""
        lines.append(
            f"| {step} | {small['seconds']:.1f} s, {small['peak_mb']:.0f} MB | "
            f"**{big['seconds']:.1f} s, {big['peak_mb']:.0f} MB**{flag} | {per_s:+.2f} s, {per_mb:+.1f} MB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="trace sizes, comma-separated (two or more)")
    parser.add_argument("--table", action="store_true", help=f"print the table from {RESULTS.name} and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())))
        return
    rows_list = sorted(int(r) for r in args.rows.split(","))
    data = run(rows_list)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(table(data))


if __name__ == "__main__":
    main()
