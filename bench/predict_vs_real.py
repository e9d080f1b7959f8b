"""`tuner diagnose --predict` against the real llama-server (issue 28, point 4, on a short log).

Records one short log per config on the real llama-server (`tuner setup`'s build and SmolLM2, one thread):
a request alone, then one stream beside a long prompt. Predicts from the baseline's log alone (n_batch 2048,
n_ubatch 512, llama-server's defaults) and prints, per config, the predicted stall speed and prefill speed
beside what this script's own client measured on that config.

    .venv/bin/python bench/predict_vs_real.py [--long 2000] [--out bench/results/predict-vs-real.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuner.config import PluginSpec
from tuner.deployers import ProcessDeployer
from tuner.deployers.process import ProcessOptions
from tuner.diagnose import diagnose_log
from tuner.engines import create_engine
from tuner.loadgen import replay
from tuner.metrics import compute_metrics
from tuner.models import ReplayRequest, RequestRecord
from tuner.predict import predict
from tuner.transports import LocalTransport

CONFIGS = [(2048, 512), (1024, 1024), (512, 512), (256, 256), (128, 128), (64, 64), (32, 32)]


def request(request_id: str, offset: float, prompt: int, output: int) -> ReplayRequest:
    tokens = tuple(100 + (sum(map(ord, request_id)) * 7919 + 31 * i) % 29000 for i in range(prompt))
    return ReplayRequest(
        request_id=request_id, session=request_id, offset_s=offset, prompt_token_ids=tokens, output_tokens=output
    )


async def record(log: Path, n_batch: int, n_ubatch: int, long_prompt: int) -> list[RequestRecord]:
    settings = {"n_parallel": 2, "ctx_size": 2 * 4096, "threads": 1, "n_batch": n_batch, "n_ubatch": n_ubatch}
    engine = create_engine(PluginSpec.model_validate({"kind": "llama-server", "settings": settings}))
    records: list[RequestRecord] = []
    async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
        deployment = await deployer.apply(engine.launch_spec({}), log_path=str(log))
        for batch in (
            [request("solo", 0.0, 40, 60)],
            [request("stream", 0.0, 40, 120), request("long", 1.0, long_prompt, 4)],
        ):
            records += await replay(batch, engine=engine, base_url=deployment.base_url, request_timeout_s=600)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", type=int, default=2000, help="the long prompt's tokens (2000)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="predict-vs-real-") as scratch:
        logs = {}
        for n_batch, n_ubatch in CONFIGS:
            log = Path(scratch) / f"{n_batch}-{n_ubatch}.log"
            records = asyncio.run(record(log, n_batch, n_ubatch, args.long))
            metrics = compute_metrics(records, long_prompt_tokens=args.long, min_overlap_s=0.5)
            logs[(n_batch, n_ubatch)] = log
            rows.append(
                {"n_batch": n_batch, "n_ubatch": n_ubatch, **{k: metrics[k] for k in ("stall_tok_s", "prefill_tok_s")}}
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        baseline_log = logs[CONFIGS[0]]
        prediction = predict(
            diagnose_log(baseline_log, long_prompt_tokens=args.long), baseline_log, long_prompt_tokens=args.long
        )
    predicted = {
        (int(str(c.settings["n_batch"])), int(str(c.settings["n_ubatch"]))): c.median for c in prediction.configs
    }
    best = prediction.best.settings if prediction.best is not None else "the baseline"
    calibration = prediction.calibration
    print(
        f"calibration: the shipped costs x {calibration.prefill_factor:.2f} for prefill, "
        f"x {calibration.decode_factor:.2f} for decode; predicted best: {best}"
    )
    print("| n_batch / n_ubatch | stall measured | stall predicted | prefill measured | prefill predicted |")
    print("|---|---|---|---|---|")
    for row in rows:
        guess = predicted.get((row["n_batch"], row["n_ubatch"]), {})
        cells = [
            f"{value:.2f}" if value is not None else "-"
            for value in (
                row["stall_tok_s"],
                guess.get("stall_tok_s"),
                row["prefill_tok_s"],
                guess.get("prefill_tok_s"),
            )
        ]
        print(f"| {row['n_batch']} / {row['n_ubatch']} | " + " | ".join(cells) + " |")
        row["predicted"] = guess
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "long_prompt": args.long,
                    "prefill_factor": prediction.calibration.prefill_factor,
                    "decode_factor": prediction.calibration.decode_factor,
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
