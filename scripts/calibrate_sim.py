"""Measures the real llama-server on this machine and fits the simulated server's constants to it.

For each n_batch (n_ubatch = n_batch, 32 to 2048, and the default 2048/512) it starts the built
llama-server (`tuner setup`) with 4 slots of 8,192 tokens and measures:

- the stall probe: one user streaming while another request's 3,000-token prompt is prefilled; the
  streaming user's speed meanwhile (`stall_tok_s`, the study's own metric);
- solo prefill speed (the 3,000-token prompt alone) and, at the default, solo decode speed with 1 and 4
  streams.

Then it fits `tuner.sim.model.CostModel` by coordinate descent on the log of every figure, replaying the
same probes on the simulated server's own clock, and writes the constants with both tables into
`tuner/sim/calibration.json` (what the simulator loads by default) and a Markdown table on stdout for
docs/simulator.md. Run it on a quiet machine (the measurement took 4m14s on 2 cores on 2026-12-05; the fit
adds its own time):

    .venv/bin/python scripts/calibrate_sim.py [--measured FILE] [--out tuner/sim/calibration.json]

`--measured FILE` fits again from a JSON of earlier measurements (the `measured` key of the output).
`--check` fits nothing: it sets the measurements beside what the shipped calibration predicts (is it still
right on this machine?) and writes only where `--out` says, the shipped file untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.cli.library_warnings import hide_library_warnings  # noqa: E402

hide_library_warnings()  # before the imports below: one of them imports asyncssh, which a library may make warn

from tuner.config import PluginSpec  # noqa: E402
from tuner.deployers.process import ProcessDeployer, ProcessOptions  # noqa: E402
from tuner.engines import create_engine  # noqa: E402
from tuner.engines.base import Engine  # noqa: E402
from tuner.files import write_atomic  # noqa: E402
from tuner.loadgen import replay  # noqa: E402
from tuner.metrics import compute_metrics  # noqa: E402
from tuner.models import ReplayRequest, RequestRecord  # noqa: E402
from tuner.sim.model import CostModel, NoiseModel, SimSettings, SimulatedLlamaServer, load_cost_model  # noqa: E402
from tuner.sim.virtual import replay_virtual  # noqa: E402
from tuner.transports import LocalTransport  # noqa: E402

CONFIGS = [(2048, 512)] + [(b, b) for b in (32, 64, 128, 256, 512, 1024, 2048)]
LONG_PROMPT = 3000
BASE = {"ctx_size": 32768, "n_parallel": 4, "threads": 2}


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(100, 30000) for _ in range(n))


def probes(seed: int) -> dict[str, list[ReplayRequest]]:
    """Fresh prompts for every probe, so that no probe hits another's cache."""
    rng = random.Random(seed)

    def request(name: str, offset: float, prompt: int, output: int) -> ReplayRequest:
        return ReplayRequest(
            request_id=name,
            session=name,
            offset_s=offset,
            prompt_token_ids=_tokens(rng, prompt),
            output_tokens=output,
            tag=name,
        )

    return {
        "stall": [request("stream", 0.0, 100, 400), request("long", 1.0, LONG_PROMPT, 4)],
        "prefill": [request("long-solo", 0.0, LONG_PROMPT, 4)],
        "decode1": [request("decode", 0.0, 50, 200)],
        "decode4": [request(f"decode-{i}", 0.0, 50, 200) for i in range(4)],
    }


def figures(kind: str, records: Sequence[RequestRecord]) -> dict[str, float | None]:
    metrics = compute_metrics(records, long_prompt_tokens=LONG_PROMPT - 100, min_overlap_s=0.0)
    if kind == "stall":
        return {"stall_tok_s": metrics["stall_tok_s"]}
    if kind == "prefill":
        return {"prefill_tok_s": metrics["prefill_tok_s"]}
    return {f"{kind}_tok_s": metrics["decode_tok_s"]}


def _engine(settings: dict[str, Any]) -> Engine:
    return create_engine(PluginSpec.model_validate({"kind": "llama-server", "settings": {**BASE, **settings}}))


async def measure_real(repeats: int) -> list[dict[str, Any]]:
    rows = []
    async with LocalTransport() as transport:
        for repeat in range(repeats):
            for n_batch, n_ubatch in CONFIGS:
                engine = _engine({"n_batch": n_batch, "n_ubatch": n_ubatch})
                row: dict[str, Any] = {"n_batch": n_batch, "n_ubatch": n_ubatch, "repeat": repeat}
                deployer = ProcessDeployer(ProcessOptions(start_timeout_s=120), transport=transport)
                with tempfile.TemporaryDirectory() as scratch:
                    async with deployer:
                        deployment = await deployer.apply(engine.launch_spec({}), log_path=f"{scratch}/server.log")
                        kinds = ["stall", "prefill"] + (
                            ["decode1", "decode4"] if (n_batch, n_ubatch) == (2048, 512) else []
                        )
                        for kind, requests in probes(seed=1000 * repeat + n_batch + n_ubatch).items():
                            if kind not in kinds:
                                continue
                            records = await replay(
                                requests, engine=engine, base_url=deployment.base_url, request_timeout_s=300
                            )
                            row.update(figures(kind, records))
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def simulate(cost: CostModel, n_batch: int, n_ubatch: int, seed: int = 0) -> dict[str, float | None]:
    engine = _engine({})
    settings = SimSettings(n_batch=n_batch, n_ubatch=n_ubatch, n_parallel=4, ctx_size=32768, kv_unified=False)
    out: dict[str, float | None] = {}
    for kind, requests in probes(seed).items():
        if kind.startswith("decode") and (n_batch, n_ubatch) != (2048, 512):
            continue
        server = SimulatedLlamaServer(settings, cost=cost, noise=NoiseModel(), seed=seed)
        done = replay_virtual(requests, server, engine=engine, start_s=0.0, request_timeout_s=1e9)
        out.update(figures(kind, done.records))
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def measured_table(rows: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, float]]:
    table: dict[tuple[int, int], dict[str, list[float]]] = {}
    for row in rows:
        entry = table.setdefault((row["n_batch"], row["n_ubatch"]), {})
        for key, value in row.items():
            if key.endswith("_tok_s") and value is not None:
                entry.setdefault(key, []).append(float(value))
    return {config: {k: _median(v) for k, v in entry.items()} for config, entry in table.items()}


def loss(cost: CostModel, table: dict[tuple[int, int], dict[str, float]]) -> float:
    total = 0.0
    for (n_batch, n_ubatch), real in table.items():
        sim = simulate(cost, n_batch, n_ubatch)
        for key, value in real.items():
            got = sim.get(key)
            total += 10.0 if got is None or got <= 0 else math.log(got / value) ** 2
    return total


def _with(cost: CostModel, index: int, factor: float) -> CostModel:
    if index == 0:
        return replace(cost, pass_s=cost.pass_s * factor)
    if index == 1:
        return replace(cost, context_s=cost.context_s * factor)
    if index == 2:
        return replace(cost, sample_s=cost.sample_s * factor)
    points = list(cost.token_points)
    width, value = points[index - 3]
    points[index - 3] = (width, value * factor)
    return replace(cost, token_points=tuple(points))


def fit(table: dict[tuple[int, int], dict[str, float]], start: CostModel) -> CostModel:
    widths = (1, 4, 32, 64, 128, 256, 512, 1024, 2048)
    known = dict(start.token_points)
    cost = replace(start, token_points=tuple((w, known.get(w, start.token_s(w))) for w in widths))
    best = loss(cost, table)
    step = 1.5
    while step > 1.01:
        improved = False
        for index in range(3 + len(widths)):
            for factor in (step, 1 / step):
                candidate = _with(cost, index, factor)
                value = loss(candidate, table)
                if value < best - 1e-9:
                    cost, best, improved = candidate, value, True
        if not improved:
            step = math.sqrt(step)
        print(f"fit: loss {best:.4f}, step {step:.3f}", file=sys.stderr, flush=True)
    return cost


def _cells(key: str, real: dict[str, float], sim: dict[str, float | None]) -> str:
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:.0f}"

    got, want = sim.get(key), real.get(key)
    error = "" if got is None or not want else f" ({100 * (got / want - 1):+.0f}%)"
    return f"{shown(want)} | {shown(got)}{error}"


def markdown(table: dict[tuple[int, int], dict[str, float]], cost: CostModel) -> str:
    lines = [
        "| n_batch / n_ubatch | stall real | stall simulated | prefill real | prefill simulated |",
        "|---|---|---|---|---|",
    ]
    for (n_batch, n_ubatch), real in sorted(table.items(), key=lambda item: (item[0][0], item[0][1])):
        sim = simulate(cost, n_batch, n_ubatch)

        stall = _cells("stall_tok_s", real, sim)
        prefill = _cells("prefill_tok_s", real, sim)
        lines.append(f"| {n_batch} / {n_ubatch} | {stall} | {prefill} |")
    default = table.get((2048, 512), {})
    sim = simulate(cost, 2048, 512)
    for key, label in (("decode1_tok_s", "1 stream"), ("decode4_tok_s", "4 streams")):
        if key in default:
            lines.append(f"\nSolo decode, {label}: real {default[key]:.1f} tok/s per stream, simulated {sim[key]:.1f}.")
    return "\n".join(lines)


def _out_problem(out: Path | None, shipped: Path, *, check: bool) -> str | None:
    """Why `--out` cannot be written, found before minutes of measurement; None where it can."""
    if out is None:
        return None
    if check and out.resolve() == shipped.resolve():
        return f"--check writes nothing into {shipped.name}, the shipped calibration: pass --out another file"
    if out.is_dir():
        return f"--out {out} is a directory: name a file in it"
    if not out.parent.is_dir():
        return f"--out {out}: {out.parent} is not a directory: make it first, or name a file in one"
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        return f"--out {out} cannot be written here: name a file you may write"
    return None


def _measured_rows(path: Path) -> list[dict[str, Any]] | str:
    """The `measured` rows of an earlier output, or the one line that says why they cannot be read."""
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = (exc.strerror or type(exc).__name__) if isinstance(exc, OSError) else "not JSON"
        return f"--measured {path}: {reason}; pass an output of scripts/calibrate_sim.py"
    rows = document.get("measured") if isinstance(document, dict) else None

    def well_formed(row: object) -> bool:
        speeds = [v for k, v in row.items() if k.endswith("_tok_s")] if isinstance(row, dict) else []
        return (
            isinstance(row, dict)
            and isinstance(row.get("n_batch"), int)
            and isinstance(row.get("n_ubatch"), int)
            and all(v is None or (isinstance(v, (int, float)) and v > 0) for v in speeds)
        )

    if not isinstance(rows, list) or not rows or not all(well_formed(row) for row in rows):
        return (
            f"--measured {path}: no `measured` list of rows with n_batch, n_ubatch and speeds above zero; pass an "
            "output of scripts/calibrate_sim.py"
        )
    return [dict(row) for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="measurements of each config (medians are fitted)")
    parser.add_argument("--measured", type=Path, help="fit again from an earlier output's measurements")
    parser.add_argument(
        "--check",
        action="store_true",
        help="fit nothing: the measurements beside the shipped calibration's figures (writes only to --out)",
    )
    parser.add_argument("--out", type=Path, help="default: tuner/sim/calibration.json; with --check, nowhere")
    args = parser.parse_args()
    shipped = ROOT / "tuner/sim/calibration.json"
    problem = _out_problem(args.out, shipped, check=args.check)
    rows = None if problem or args.measured is None else _measured_rows(args.measured)
    if problem or isinstance(rows, str):
        print(f"error: {problem or rows}", file=sys.stderr)
        return 2
    if rows is None:
        rows = asyncio.run(measure_real(args.repeats))
    table = measured_table(rows)
    cost = load_cost_model() if args.check else fit(table, load_cost_model())
    out = args.out if args.out is not None or args.check else shipped
    output = {
        "source": "scripts/calibrate_sim.py against the real llama-server (SmolLM2-135M Q4_1, 2 threads, 4 slots "
        "of 8,192 tokens) on a 2-core CPU",
        "cost_model": cost.to_json(),
        "measured": rows,
    }
    print(markdown(table, cost))  # first: a file that cannot be written loses no measurement
    if out is not None:
        try:
            write_atomic(out, (json.dumps(output, indent=1) + "\n").encode())
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            print(f"error: cannot write --out {out}: {reason}; the measurements are the table above", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
