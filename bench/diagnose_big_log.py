"""Big logs stream: time and peak resident memory of `tuner diagnose` (`diagnose_log`) on a synthetic day
of a busy llama-server, and on a quarter of it, to show that memory does not grow with the log's length.

    bench/diagnose_big_log.py [--hours 6,24] [--table]

The log is written here, a line at a time, in the formats of the real server at its default verbosity
(`M.SS.mmm.uuu` prefix; slot selection, launch, `n_gen` rate lines every 3 s of decoding, prompt progress
lines during long prefills, final timings, release; a prompt-cache eviction now and then): sixteen slots,
never idle for long (most tasks start in the iteration that freed their slot), short chats with a long
prompt every few dozen tasks. About 3 million lines a day. Each read runs in a process of its own, which
reports its own peak resident memory (`VmHWM` in /proc/self/status; `ru_maxrss` where there is no /proc).
Target (in the spirit of "Performance of the tuner itself"): a few hundred MB at most, whatever the length.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from provenance import write_result

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "diagnose-big-log.json"
TARGET_MB = 300
SLOTS = 16

READER = """
import json, resource, sys, time
from tuner.diagnose import diagnose_log
started = time.perf_counter()
diagnosis = diagnose_log(sys.argv[1])
seconds = time.perf_counter() - started
peak_kb = None
try:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            peak_kb = int(line.split()[1])
except OSError:
    pass
if peak_kb is None:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_mb": peak_kb / 1024, "lines": diagnosis.lines, "tasks": diagnosis.tasks,
                  "findings": [f.kind for f in diagnosis.findings]}))
"""


def stamp(at: float) -> str:
    micros = round(at * 1_000_000)
    return f"{micros // 60_000_000}.{micros // 1_000_000 % 60:02d}.{micros // 1000 % 1000:03d}.{micros % 1000:03d}"


def slot_lines(slot: int, hours: float, seed: int, first_task: Iterator[int]) -> Iterator[tuple[float, str]]:
    """One slot's tasks back to back for `hours`, each line with its time."""
    rng = random.Random(seed)
    at, end = 0.5 + 0.1 * slot, hours * 3600.0
    head = f"slot print_timing: id  {slot} | task "
    while at < end:
        task = next(first_task)
        long = rng.random() < 0.03
        prompt = rng.randint(2000, 6000) if long else rng.randint(20, 400)
        output = rng.randint(4, 16) if long else rng.randint(20, 300)
        prompt_s = prompt / 2200.0
        decode_s = output / 45.0
        yield at - 0.0001, f"I slot get_availabl: id  {slot} | task -1 | selected slot by LRU, t_last = -1"
        yield at, f"I slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0"
        if prompt_s > 3.0:
            done = 0
            for batch in range(1, prompt // 2047 + 1):
                done = min(prompt, batch * 2047)
                t = at + done / 2200.0
                if t - at >= 3.0:
                    yield (
                        t,
                        f"I {head}{task} | prompt processing, n_tokens = {done:6d}, progress = "
                        f"{done / prompt:.2f}, t = {t - at:6.2f} s / 2200.00 tokens per second",
                    )
        first = at + prompt_s
        n = 100
        while n < output:
            t = first + n / 45.0
            yield t, f"I {head}{task} | n_gen = {n:6d}, tg = 45.00 t/s, tg_3s = 45.00 t/s"
            n += 135
        release = first + decode_s
        yield (
            release,
            f"I {head}{task} | prompt eval time = {prompt_s * 1000:10.2f} ms / {prompt:5d} tokens "
            f"(    0.45 ms per token,  2200.00 tokens per second)",
        )
        yield (
            release,
            f"I {head}{task} |        eval time = {decode_s * 1000:10.2f} ms / {output:5d} tokens "
            "(   22.22 ms per token,    45.00 tokens per second)",
        )
        yield (
            release,
            f"I {head}{task} |       total time = {(prompt_s + decode_s) * 1000:10.2f} ms / "
            f"{prompt + output:5d} tokens",
        )
        yield release, f"I {head}{task} |    graphs reused = {output - 1:10d}"
        yield (
            release + 0.00001,
            f"I slot      release: id  {slot} | task {task} | stop processing: n_tokens = "
            f"{prompt + output - 1}, truncated = 0",
        )
        if rng.random() < 0.01:
            yield (
                release + 0.0002,
                "W srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 7.031 MiB)",
            )
        # Most tasks start in the iteration that freed the slot; now and then the slot idles a while.
        at = release + (0.002 if rng.random() < 0.8 else rng.uniform(0.1, 5.0))


def write_log(path: Path, hours: float, seed: int = 0) -> int:
    ids = iter(range(10**9))
    streams = [slot_lines(slot, hours, seed * 100 + slot, ids) for slot in range(SLOTS)]
    lines = 0
    with path.open("w") as out:
        out.write(f"{stamp(0.0)} I srv  llama_server: initializing ...\n")
        out.write(
            f"{stamp(0.3)} I srv    load_model: initializing, n_slots = {SLOTS}, n_ctx_slot = 8192, "
            "kv_unified = 'false'\n"
        )
        lines = 2
        for at, text in heapq.merge(*streams, key=lambda item: item[0]):
            out.write(f"{stamp(at)} {text}\n")
            lines += 1
    return lines


def read_once(path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", READER, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hours", default="6,24", help="log lengths to read, in hours (comma-separated)")
    parser.add_argument("--table", action="store_true", help="print the docs/benchmarks.md table from the results")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(RESULTS.read_text()))
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for hours in (float(h) for h in args.hours.split(",")):
            path = Path(folder) / f"day-{hours:g}h.log"
            started = time.perf_counter()
            lines = write_log(path, hours)
            written_s = time.perf_counter() - started
            result = read_once(path)
            size_mb = path.stat().st_size / 2**20
            path.unlink()
            seconds = float(result["seconds"])  # type: ignore[arg-type]
            row = {
                "hours": hours,
                "lines": lines,
                "file_mb": round(size_mb, 1),
                "tasks": result["tasks"],
                "write_s": round(written_s, 1),
                "read_s": round(seconds, 1),
                "s_per_million_lines": round(seconds / (lines / 1e6), 2),
                "peak_mb": round(float(result["peak_mb"]), 1),  # type: ignore[arg-type]
                "findings": result["findings"],
            }
            print(json.dumps(row))
            rows.append(row)
    document = {
        "benchmark": "diagnose-big-log",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "target_peak_mb": TARGET_MB,
        "rows": rows,
    }
    write_result(RESULTS, document, indent=2)
    print_table(document)


def print_table(document: dict[str, object]) -> None:
    print("| log | lines | file | requests | read | per million lines | peak RSS (target: a few hundred MB) |")
    print("|---|---|---|---|---|---|---|")
    for row in document["rows"]:  # type: ignore[attr-defined]
        print(
            f"| {row['hours']:g} h of 16 busy slots | {row['lines']:,} | {row['file_mb']:,.0f} MB | {row['tasks']:,} | "
            f"{row['read_s']:.1f} s | {row['s_per_million_lines']:.1f} s | **{row['peak_mb']:.0f} MB** |"
        )


if __name__ == "__main__":
    main()
