"""Replay at production scale: the load generator's send-time accuracy while it replays a compressed
trace at hundreds of requests per second against a loopback stub, and its report when it cannot.

    bench/replay_rate.py [--seconds 20] [--rates 100:16,300:16,300:64,600:64,1000:64,2000:64] [--table]

The trace is an Azure-shaped one (`bench/big_traces.py`'s conversation source, 5.5 requests/s, prompts with a median of
about 1,000 tokens), imported with `tuner workload import azure` and compressed with the study's own
`time_scale` to each rate. The client is the study's replay path itself: the trace loaded as a study
loads it, its prompts made a session at a time (`synthesize_sessions`) as the replay takes them, sent by
`replay_sessions`; pinned to CPU 0, the stub (`bench/sse_server.py`, 16 or 64 tokens a request, one
every 15 ms, each its own network write as a real server streams them) to CPU 1.

Two measures of lateness per request: the client's own (its send time minus the time the schedule
had it sent), and the server's (its arrival on the server's clock against the schedule, less the median
difference, since the two clocks start apart). Target (issue "Performance of the tuner itself"): p99 at
most 2 ms at 300 requests/s or more, and a report, not silence, where the client cannot keep up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results" / "replay-rate.json"
TARGET_P99_MS = 2.0
sys.path.insert(0, str(BENCH))

from big_traces import AZURE_RATES, write_azure  # noqa: E402
from loadgen_vs_guidellm import free_port, pinned  # noqa: E402
from provenance import write_result  # noqa: E402

# requests/s of the trace before compression: the source's own (it was 20 until the source took the public
# trace's 5.5 on 2026-12-05, and this constant stayed, so the rates replayed were a quarter of those named).
SOURCE_RATE = AZURE_RATES["azure-conv"]


def client(trace_path: Path, rate: float, seconds: float, base_url: str, out: Path) -> None:
    """The study's replay path: what `tuner run` does with a round, against `base_url`."""
    from tuner.config import PluginSpec
    from tuner.engines import create_engine
    from tuner.loadgen import replay_sessions
    from tuner.metrics import fell_behind
    from tuner.workloads import load_trace, synthesize_sessions

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    engine = create_engine(
        PluginSpec.model_validate({"kind": "llama-server", "binary": "/bin/true", "model": "/bin/true"})
    )
    trace = load_trace(trace_path)
    keep = trace.take(range(min(len(trace), int(rate * seconds))))
    sessions = synthesize_sessions(
        keep, token_range=engine.prompt_token_range(), seed=0, round_index=0, time_scale=SOURCE_RATE / rate
    )
    if os.environ.get("BENCH_PREMADE"):  # an experiment: every prompt made before the clock starts
        sessions = iter(list(sessions))
    records = asyncio.run(replay_sessions(sessions, engine=engine, base_url=base_url, request_timeout_s=600))
    out.write_text(
        json.dumps(
            {
                "due_s": [r.due_s for r in records],
                "send_s": [r.send_s for r in records],
                "failed": sum(1 for r in records if not r.ok),
                "fell_behind": fell_behind(records),
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def percentiles(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(ordered[-1], 3)}


def measure(trace: Path, rate: float, seconds: float, work: Path, answer_tokens: int) -> dict[str, object]:
    port = free_port()
    stats, out = work / f"stats-{rate:g}.json", work / f"client-{rate:g}.json"
    server = subprocess.Popen(
        pinned(1, [sys.executable, str(BENCH / "sse_server.py"), "--port", str(port), "--stats", str(stats),
                   "--tokens", str(answer_tokens), "--interval-ms", "15"]),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", str(trace), str(rate), str(seconds),
                f"http://127.0.0.1:{port}", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(pinned(0, argv), capture_output=True, text=True, timeout=1200, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"client failed at {rate:g} requests/s:\n{done.stderr[-2000:]}")
    finally:
        server.send_signal(15)
        server.wait(timeout=60)
    seen = json.loads(out.read_text())
    arrivals = sorted(json.loads(stats.read_text())["arrivals"])
    due = sorted(seen["due_s"])
    client_ms = [(send - when) * 1000 for send, when in zip(seen["send_s"], seen["due_s"], strict=True)]
    offsets = [a - d for a, d in zip(arrivals, due, strict=False)]
    middle = statistics.median(offsets)
    server_ms = [abs(o - middle) * 1000 for o in offsets]
    span = due[-1] - due[0]
    return {
        "rate": rate,
        "requests": len(due),
        "achieved_rate": round((len(due) - 1) / span, 1) if span > 0 else None,
        "failed": seen["failed"],
        "client_late": percentiles(client_ms),
        "server_error": percentiles(server_ms),
        "fell_behind": seen["fell_behind"],
        "client_peak_mb": round(seen["peak_mb"], 1),
    }


def table(data: dict[str, object]) -> str:
    lines = [
        "| schedule | answer tokens | requests | client: sent late p50 / p99 / max "
        "| server: arrival error p50 / p99 / max | reported |",
        "|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:  # type: ignore[attr-defined]
        c, s = run["client_late"], run["server_error"]
        behind = "fell behind" if run["fell_behind"] else "nothing (on schedule)"
        flag = "**" if c["p99_ms"] <= TARGET_P99_MS and s["p99_ms"] <= TARGET_P99_MS else ""
        lines.append(
            f"| {run['rate']:g} requests/s | {run.get('answer_tokens', 64)} | {run['requests']:,} | "
            f"{flag}{c['p50_ms']:.2f} / {c['p99_ms']:.2f} / "
            f"{c['max_ms']:.1f} ms{flag} | {s['p50_ms']:.2f} / {s['p99_ms']:.2f} / {s['max_ms']:.1f} ms | {behind} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        given = sys.argv[2:7]
        client(Path(given[0]), float(given[1]), float(given[2]), given[3], Path(given[4]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of compressed trace per rate")
    parser.add_argument(
        "--rates",
        default="100:16,300:16,300:64,600:64,1000:64,2000:64",
        help="requests/s, comma-separated, each with the tokens the stub streams a request (RATE:TOKENS)",
    )
    parser.add_argument("--answer-tokens", type=int, default=64, help="tokens the stub streams a request")
    parser.add_argument("--table", action="store_true", help=f"print the table from {RESULTS.name} and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())))
        return
    rates = [
        (float(rate), int(tokens or args.answer_tokens))
        for rate, _, tokens in (part.partition(":") for part in args.rates.split(","))
    ]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        source, trace = work / "azure.csv", work / "azure.jsonl"
        write_azure(source, int(max(rate for rate, _ in rates) * args.seconds) + 10)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [sys.executable, "-m", "tuner", "workload", "import", "azure", str(source), "--out", str(trace)],
            check=True, capture_output=True, env=env,
        )  # fmt: skip
        runs = []
        for rate, tokens in rates:
            runs.append({**measure(trace, rate, args.seconds, work, tokens), "answer_tokens": tokens})
            print(json.dumps(runs[-1]))
    data = {
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "seconds": args.seconds,
        "runs": runs,
    }
    write_result(RESULTS, data, indent=2)
    print(table(data))


if __name__ == "__main__":
    main()
