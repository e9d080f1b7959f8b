"""What `tuner record` adds to a request: time to first byte and to the end of the stream, with and
without the proxy in between, on the same loopback SSE server (bench/sse_server.py), in one run.

    bench/recorder_overhead.py [--requests 300]

Requests go one at a time (chat completions, 64 streamed tokens), alternating direct and proxied, so
that drift on the machine hits both alike. Reported: p50 and p99 of each, and the added milliseconds.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from loadgen_vs_guidellm import free_port  # noqa: E402
from provenance import write_result  # noqa: E402


def timed(client: httpx.Client, url: str) -> tuple[float, float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        for _ in response.iter_raw():
            if first is None:
                first = time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    port, proxy_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, str(BENCH / "sse_server.py"), "--port", str(port), "--stats", f"{tmp}/s.json",
             "--tokens", "64", "--burst", "1"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        proxy = subprocess.Popen(
            [sys.executable, "-m", "tuner", "record", "--upstream", f"http://127.0.0.1:{port}",
             "--listen", f"127.0.0.1:{proxy_port}", "--out", f"{tmp}/trace.jsonl"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None and proxy.stdout is not None
            server.stdout.readline()
            proxy.stdout.readline()
            rows: dict[str, list[tuple[float, float]]] = {"direct": [], "proxied": []}
            with httpx.Client(timeout=30) as client:
                for i in range(args.requests):
                    for name, url in (("direct", port), ("proxied", proxy_port))[:: 1 if i % 2 else -1]:
                        rows[name].append(timed(client, f"http://127.0.0.1:{url}"))
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=30)
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        recorded = len(Path(f"{tmp}/trace.jsonl").read_text().splitlines()) - 1

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    result = {}
    for index, what in enumerate(("first byte", "whole stream")):
        direct = [r[index] for r in rows["direct"]]
        proxied = [r[index] for r in rows["proxied"]]
        result[what] = {
            "direct_p50_ms": pct(direct, 0.5),
            "proxied_p50_ms": pct(proxied, 0.5),
            "direct_p99_ms": pct(direct, 0.99),
            "proxied_p99_ms": pct(proxied, 0.99),
            "added_median_ms": statistics.median(p - d for p, d in zip(proxied, direct, strict=True)) * 1000,
        }
        row = result[what]
        print(
            f"{what:<13} direct p50 {row['direct_p50_ms']:6.2f} p99 {row['direct_p99_ms']:6.2f} ms | proxied p50 "
            f"{row['proxied_p50_ms']:6.2f} p99 {row['proxied_p99_ms']:6.2f} ms | "
            f"added (median) {row['added_median_ms']:.2f} ms"
        )
    print(f"the proxy recorded {recorded} of {args.requests} proxied requests")
    out = BENCH / "results" / "recorder_overhead.json"
    out.parent.mkdir(exist_ok=True)
    write_result(out, {**result, "recorded": recorded, "requests": args.requests}, indent=2)


if __name__ == "__main__":
    main()
