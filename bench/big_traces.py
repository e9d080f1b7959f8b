"""Big traces in bounded memory: time and peak resident memory of `tuner workload import`, `tuner
workload show --plot` and the replay's loader on traces of 100,000 and 1,000,000 requests.

    bench/big_traces.py [--rows 100000,1000000] [--table] [--kinds mooncake,azure-conv,azure-code]

The sources are synthetic (no real trace is shipped or fetched), drawn to match the public traces' own
distributions, measured on 2026-12-04 from the traces themselves (figures in docs/benchmarks.md):
- **mooncake**: JSONL in Mooncake's format, shaped like its conversation trace (`conversation_trace.jsonl`
  of the FAST'25 release, 12,031 requests): block 0 (a shared system prompt) first in every request; 38.7%
  of requests extend an earlier request's whole chain of blocks (a later turn of its conversation, a
  median of 422 requests later) by new blocks, a median of 2 (p90 20), the others add a median of 10
  (p90 49) to block 0;
  prompts of 512 tokens a block but the last (a median of 6,900 tokens, a mean of 12,000); answers of a
  median of 350 tokens; arrivals on 3 s ticks at 3.4 requests a second. At a million requests: about 24
  block ids a request, three quarters of the distinct ids named once.
- **azure-conv** and **azure-code**: CSV in the Azure LLM inference traces' format
  (`TIMESTAMP,ContextTokens,GeneratedTokens`), lengths drawn like its 2023 conversation trace (a median of
  1,020 prompt tokens, 129 out) and its code trace (a median of 1,469 prompt tokens up to the 7,437 it
  holds, 13 out).

Each command runs in a process of its own, and its peak resident memory is the kernel's count for that
process (`wait4`). The replay's loader is what `tuner run` does with the study's trace before the first
trial: read it (`load_trace`) and keep a share of its sessions (`thin_sessions`, keep 0.1). Targets
(issue "The night's cost"): a million real-shaped rows within 500 MB and 60 s a step on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from provenance import write_result

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "big-traces.json"
TARGET_MB, TARGET_S = 500, 60.0

LOADER = (
    "import sys; from pathlib import Path; from tuner.workloads import load_trace, thin_sessions; "
    "trace = load_trace(Path(sys.argv[1])); kept = thin_sessions(trace, keep=0.1, seed=0); "
    "print(len(trace), len(kept))"
)


def _lognormal_int(rng: random.Random, median: float, p90: float, low: int, high: int) -> int:
    """A whole number drawn from the lognormal with this median and 90th percentile, within low..high."""
    sigma = math.log(p90 / median) / 1.2816
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def write_mooncake(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    recent: collections.deque[list[int]] = collections.deque(maxlen=12_000)  # the requests a turn may extend
    next_id = 1
    tick_ms, at = 0, 0
    with path.open("w") as out:
        lines = []
        for _ in range(rows):
            if rng.random() < 1 / 10.2:  # about 10 requests a 3 s tick: 3.4 a second
                tick_ms += 3000
                at = tick_ms
            parent = recent[-_lognormal_int(rng, 422, 1660, 1, len(recent))] if recent else []
            # A later turn: its conversation so far, then a few blocks (a conversation ends within about
            # 150 blocks, as the trace's 99th percentile of a reused prefix has it).
            if parent and len(parent) <= 150 and rng.random() < 0.40:
                prefix, new = parent, _lognormal_int(rng, 2, 20, 1, 247)
            else:  # a first turn: the system prompt, then its own blocks
                prefix, new = [0], _lognormal_int(rng, 10, 45, 1, 247)
            ids = [*prefix, *range(next_id, next_id + new)][:247]
            next_id += new
            recent.append(ids)
            tokens = (len(ids) - 1) * 512 + rng.randint(1, 512)
            output = max(1, min(2000, round(rng.gauss(343, 200))))
            lines.append(
                json.dumps({"timestamp": at, "input_length": tokens, "output_length": output, "hash_ids": ids})
            )
            if len(lines) == 10_000:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")


# The Azure 2023 traces' shapes: prompt median and p90, its cap; answer median and p90, its cap; rate.
_AZURE_SHAPES = {
    "azure-conv": (1020, 2734, 14_050, 129, 424, 1000, 5.5),
    "azure-code": (1469, 5186, 7437, 13, 55, 1899, 2.6),
}
AZURE_RATES = {shape: figures[-1] for shape, figures in _AZURE_SHAPES.items()}  # requests/s, as drawn


def write_azure(path: Path, rows: int, seed: int = 0, *, shape: str = "azure-conv") -> None:
    prompt_median, prompt_p90, prompt_cap, answer_median, answer_p90, answer_cap, rate = _AZURE_SHAPES[shape]
    rng = random.Random(seed)
    start = datetime(2023, 11, 16, 18, 15, tzinfo=UTC)
    at = 0.0
    with path.open("w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        lines = []
        for _ in range(rows):
            at += rng.expovariate(rate)
            stamp = (start + timedelta(seconds=at)).isoformat(sep=" ", timespec="microseconds").split("+")[0]
            context = _lognormal_int(rng, prompt_median, prompt_p90, 1, prompt_cap)
            generated = _lognormal_int(rng, answer_median, answer_p90, 1, answer_cap)
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


WRITERS: dict[str, tuple[Callable[[Path, int], None], str, str]] = {
    "mooncake": (write_mooncake, "mooncake", "jsonl"),
    "azure-conv": (functools.partial(write_azure, shape="azure-conv"), "azure", "csv"),
    "azure-code": (functools.partial(write_azure, shape="azure-code"), "azure", "csv"),
}


def run(rows_list: list[int], kinds: list[str]) -> dict[str, object]:
    python = sys.executable
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for rows in rows_list:
            for kind in kinds:
                writer, importer, suffix = WRITERS[kind]
                source, trace = work / f"{kind}-{rows}.{suffix}", work / f"{kind}-{rows}-trace.jsonl"
                writer(source, rows)
                steps = {
                    "import": [python, "-m", "tuner", "workload", "import", importer, str(source), "--out", str(trace)],
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
                        f"{kind:10} {step:16} {rows:>9,} rows: {figures['seconds']:7.2f} s {figures['peak_mb']:8.1f} MB"
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", default="100000,1000000", help="trace sizes, comma-separated (two or more)")
    parser.add_argument("--table", action="store_true", help="print the table from --out's figures and exit")
    parser.add_argument("--kinds", default=",".join(WRITERS), help=f"sources, comma-separated ({', '.join(WRITERS)})")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"the figures' file (default: the tracked {RESULTS.name})"
    )
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    rows_list = sorted(int(r) for r in args.rows.split(","))
    data = run(rows_list, args.kinds.split(","))
    write_result(args.out, data, indent=2)
    print(table(data))


if __name__ == "__main__":
    main()
