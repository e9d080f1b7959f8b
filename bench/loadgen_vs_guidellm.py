"""serve-tuner's load generator against guidellm's, on the same loopback SSE server, in one run.

    bench/loadgen_vs_guidellm.py [--guidellm PATH] [--quick]

Two scenarios, both clients pinned to CPU 0 and the server (bench/sse_server.py) to CPU 1:

1. schedule: 200 requests/s at a constant rate, 8 tokens each. The server timestamps each request's
   arrival; the send-time error of request i is its arrival minus i/200 s, less the median of those
   (the clients start their clocks at different moments). Reported: p50/p99/max of |error|.
2. streams: 1,000 streams opened at once, 1,000 tokens each, sent by the server as fast as the client
   reads them. Reported: streams open at once (server-side), streamed tokens/s = all tokens / the time
   from the first arrival to the last stream's end.

guidellm is installed into bench/.venv-guidellm on first use (it brings torch and its CUDA libraries:
6.0 GB). Results are ratios measured in the same run, printed and written to
bench/results/loadgen_vs_guidellm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import write_result

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_guidellm(path: str | None) -> str:
    if path:
        return path
    venv = BENCH / ".venv-guidellm"
    binary = venv / "bin" / "guidellm"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "guidellm==0.8.1"], check=True)
    return str(binary)


def pinned(cpu: int, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *argv] if os.cpu_count() and os.cpu_count() > 1 else argv  # type: ignore[operator]


def with_server(server_args: list[str], client: list[str], workdir: Path) -> dict[str, object]:
    port = free_port()
    stats = workdir / f"stats-{port}.json"
    server = subprocess.Popen(
        pinned(
            1, [sys.executable, str(BENCH / "sse_server.py"), "--port", str(port), "--stats", str(stats), *server_args]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        argv = [part.replace("{port}", str(port)).replace("{workdir}", str(workdir)) for part in client]
        done = subprocess.run(pinned(0, argv), check=False, capture_output=True, text=True, timeout=900, cwd=workdir)
        if done.returncode != 0:
            raise SystemExit(f"client failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    loaded: dict[str, object] = json.loads(stats.read_text())
    return loaded


def schedule_error(arrivals: list[float], rate: float) -> dict[str, float]:
    arrivals = sorted(arrivals)
    offsets = [t - i / rate for i, t in enumerate(arrivals)]
    centre = statistics.median(offsets)
    errors = sorted(abs(o - centre) * 1000 for o in offsets)

    def pick(q: float) -> float:
        return errors[min(len(errors) - 1, int(q * len(errors)))]

    return {"requests": len(arrivals), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": errors[-1]}


def throughput(stats: dict[str, object]) -> dict[str, float]:
    arrivals, ends = stats["arrivals"], stats["ends"]
    assert isinstance(arrivals, list) and isinstance(ends, list)
    span = max(ends) - min(arrivals)
    return {
        "streams": len(ends),
        "max_open": float(stats["max_open"]),  # type: ignore[arg-type]
        "tokens_per_s": float(stats["tokens"]) / span,  # type: ignore[arg-type]
        "server_cpu_share": float(stats["cpu_s"]) / span,  # type: ignore[arg-type]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", help="path of a guidellm executable (default: install one)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests, for a smoke run")
    args = parser.parse_args()
    guidellm = ensure_guidellm(args.guidellm)
    scale = 10 if args.quick else 1
    rate, scheduled = 200.0, 2000 // scale
    streams, stream_tokens = 1000 // scale, 2000
    tuner_client = [sys.executable, str(BENCH / "drive_tuner.py"), "--base-url", "http://127.0.0.1:{port}"]
    guidellm_client = [
        guidellm, "run", "--backend", "kind=openai_http,target=http://127.0.0.1:{port},model=bench",
        "--data", "kind=json_file,path={workdir}/prompts.jsonl", "--disable-console",
        "--output", "kind=json,path={workdir}/guidellm.json",
    ]  # fmt: skip
    results: dict[str, dict[str, dict[str, float]]] = {"schedule": {}, "streams": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with (workdir / "prompts.jsonl").open("w") as handle:
            for i in range(max(scheduled, streams)):
                handle.write(json.dumps({"prompt": f"benchmark prompt {i}"}) + "\n")
        schedule_server = ["--tokens", "8", "--burst", "8"]
        results["schedule"]["serve-tuner"] = schedule_error(
            with_server(schedule_server, [*tuner_client, "--requests", str(scheduled), "--rate", str(rate)], workdir)[
                "arrivals"
            ],  # type: ignore[arg-type]
            rate,
        )
        results["schedule"]["guidellm"] = schedule_error(
            with_server(
                schedule_server,
                [
                    *guidellm_client,
                    "--profile",
                    f"kind=constant,rate={rate:g}",
                    "--constraint",
                    f"kind=max_requests,count={scheduled}",
                ],
                workdir,
            )["arrivals"],  # type: ignore[arg-type]
            rate,
        )
        stream_server = ["--tokens", str(stream_tokens), "--burst", "20", "--interval-ms", "200"]
        results["streams"]["serve-tuner"] = throughput(
            with_server(
                stream_server, [*tuner_client, "--requests", str(streams), "--tokens", str(stream_tokens)], workdir
            )
        )
        results["streams"]["guidellm"] = throughput(
            with_server(
                stream_server,
                [
                    *guidellm_client,
                    "--profile",
                    f"kind=concurrent,streams={streams}",
                    "--constraint",
                    f"kind=max_requests,count={streams}",
                ],
                workdir,
            )
        )
    ours, theirs = results["schedule"]["serve-tuner"], results["schedule"]["guidellm"]
    print(f"schedule at {rate:g} req/s, |send-time error| in ms (p50 / p99 / max):")
    for name, row in results["schedule"].items():
        print(
            f"  {name:<12} {row['p50_ms']:7.2f} {row['p99_ms']:7.2f} {row['max_ms']:7.2f}"
            f"  ({row['requests']:.0f} requests)"
        )
    print(f"  p99 ratio serve-tuner / guidellm: {ours['p99_ms'] / theirs['p99_ms']:.4f} (lower is better)")
    print(f"{streams} streams of {stream_tokens} tokens on one client core:")
    for name, row in results["streams"].items():
        print(
            f"  {name:<12} {row['tokens_per_s']:10.0f} tokens/s, {row['max_open']:.0f} streams open at once "
            f"(server busy {row['server_cpu_share']:.0%} of the time: below 100%, the client is what is measured)"
        )
    ratio = results["streams"]["serve-tuner"]["tokens_per_s"] / results["streams"]["guidellm"]["tokens_per_s"]
    print(f"  tokens/s ratio serve-tuner / guidellm: {ratio:.2f} (higher is better)")
    out = BENCH / "results" / "loadgen_vs_guidellm.json"
    out.parent.mkdir(exist_ok=True)
    write_result(out, results, indent=2)
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
