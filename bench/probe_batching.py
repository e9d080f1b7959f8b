"""The correctness probes one after another against all four at once, on the real llama-server.

The gate (tuner/gate.py) asks four fixed prompts greedily on a trial's first round. Asked together, the
server decodes them in one batch; the gate may only do that if the answers are the same as one at a time.
For each n_batch / n_ubatch setting, the server (the build and model `tuner setup` makes; 4 slots, one
thread) is started afresh for each ask, as a trial's first round is, and the four probes are asked one
after another, then all at once. Reported per setting and way: the time of the four (a new server's cold
start included, as in a trial) and whether every answer equals the first setting's sequential answers,
token for token.

    .venv/bin/python bench/probe_batching.py            # about a minute and a half; bench/results/probe-batching.json
    .venv/bin/python bench/probe_batching.py --table    # the table in docs/benchmarks.md, from that file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

from tuner import assets  # noqa: E402
from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions  # noqa: E402
from tuner.gate import PROBE_PROMPTS, ask_probes  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "probe-batching.json"
SETTINGS = [(2048, 512), (64, 64), (512, 128), (2048, 2048), (256, 256)]
TOKENS = 24  # gate.tokens' default


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(binary: Path, model: Path, n_batch: int, n_ubatch: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "8192", "-np", "4"]
    argv += ["-t", "1", "-b", str(n_batch), "-ub", str(n_ubatch)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                return server, base_url
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.05)
    server.kill()
    raise SystemExit(f"llama-server -b {n_batch} -ub {n_ubatch} did not become healthy")


async def _one_at_a_time(engine: LlamaServerEngine, base_url: str) -> list[tuple[int, ...]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        answers = []
        for prompt in PROBE_PROMPTS:
            call = engine.probe_request(prompt, tokens=TOKENS, lora=None)
            response = await client.request(call.method, call.path, json=call.json)
            answers.append(engine.parse_probe_answer(response.json()))
        return answers


def run(repeats: int) -> dict[str, Any]:
    binary, model = assets.find_llama_server(), assets.find_model()
    if binary is None or model is None:
        raise SystemExit("no llama-server build or model: run `.venv/bin/tuner setup` first")
    engine = LlamaServerEngine(LlamaServerOptions.model_validate({}))
    reference: list[tuple[int, ...]] | None = None
    rows = []
    for n_batch, n_ubatch in SETTINGS:
        for way in ("one at a time", "together"):
            times, same = [], []
            for _ in range(repeats):
                server, base_url = _start(binary, model, n_batch, n_ubatch)
                try:
                    started = time.perf_counter()
                    if way == "together":
                        answers = asyncio.run(ask_probes(engine, base_url, tokens=TOKENS, timeout_s=120))
                    else:
                        answers = asyncio.run(_one_at_a_time(engine, base_url))
                    times.append(time.perf_counter() - started)
                finally:
                    server.terminate()
                    server.wait(timeout=30)
                reference = reference or answers
                same.append(answers == reference)
            row = {"n_batch": n_batch, "n_ubatch": n_ubatch, "way": way, "seconds": times, "same_answers": same}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"tokens_per_probe": TOKENS, "probes": len(PROBE_PROMPTS), "repeats": repeats, "rows": rows}


def table(results: dict[str, Any]) -> str:
    lines = [
        "| n_batch / n_ubatch | one at a time | together | answers the same |",
        "|---|---:|---:|---|",
    ]
    rows = results["rows"]
    for n_batch, n_ubatch in sorted({(r["n_batch"], r["n_ubatch"]) for r in rows}, key=SETTINGS.index):
        pair = {r["way"]: r for r in rows if (r["n_batch"], r["n_ubatch"]) == (n_batch, n_ubatch)}
        spans = {way: f"{min(r['seconds']):.2f}-{max(r['seconds']):.2f} s" for way, r in pair.items()}
        same = all(all(r["same_answers"]) for r in pair.values())
        lines.append(
            f"| {n_batch} / {n_ubatch} | {spans['one at a time']} | {spans['together']} | {'yes' if same else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="server starts per setting and way")
    parser.add_argument("--table", action="store_true", help="print the table from the saved results")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file (default: %(default)s)")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    results = run(args.repeats)
    write_result(args.out, results, indent=2)
    print(table(results))


if __name__ == "__main__":
    main()
