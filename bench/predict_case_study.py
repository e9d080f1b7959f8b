"""The prediction against the case study's own GPU figures (seed 000, issue 28, point 4): GLM-5.3-Flash 3-bit
on two GPUs, llama-server with 4 slots and a unified KV cache, at its defaults (n_batch 2048, n_ubatch 512).

The calibration is the product's (`tuner.predict.calibrate_from_log`), fed the figures the article prints
instead of a log's: prefill speed by chunk size (about 2048 tokens: 845 tok/s; 600-1,500: 816; 256-600: 719;
64-256: 436, taken as the buckets 2048, 1024, 512 and 256 that `tuner diagnose` reports), one stream decoding
alone at 52 tok/s, and its long prompts' prefill (5,000+ new tokens: 824 tok/s median; a 20,000-token prompt
here, the article's "20K-token re-reads"). The simulated llama-server then replays what the article measured:
a stream of 347 tokens (its median answer) beside a long prompt that arrives once the stream is under way,
at n_batch 2048 down to 128, and reports the stream's speed during the prefill (`stall_tok_s`) and the
prefill speed, each the median and range over seeds of the simulator's run-to-run noise.

    .venv/bin/python bench/predict_case_study.py [--out bench/results/predict-case-study.json]   # seconds

The article's figures it is compared with: at n_batch 2048, 0.34 tok/s (the median tg_3s of 59 samples beside
15K+ token prefills) and its own estimate 0.39 (one token per 2048/800 s); at n_batch 512, 1.62 tok/s (the
median of 15 samples on a day of traffic) and 2.06 (one measurement beside a 6,201-token prefill, which
prefilled at 802 tok/s), prefill of 5,000+ token prompts 830 tok/s.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from provenance import write_result

from tuner.config import PluginSpec
from tuner.diagnose.report import Diagnosis, Figure, ServerFacts
from tuner.engines import create_engine
from tuner.metrics import compute_metrics
from tuner.models import ReplayRequest, TaskTimeline
from tuner.predict import calibrate_from_log
from tuner.sim.inputs import NoiseModel, SimSettings
from tuner.sim.model import SimulatedLlamaServer
from tuner.sim.virtual import replay_virtual

CHUNKS = {2048: 845.0, 1024: 816.0, 512: 719.0, 256: 436.0}  # the article's prefill speed by chunk size
DECODE_ALONE = 52.0  # tok/s, one stream decoding alone
LONG_PREFILL = 824.0  # tok/s, the median prefill of 5,000+ token prompts before the change
ANSWER = 347  # tokens, the median answer
SLOTS = 4
NOISE = NoiseModel(restart=0.05, iteration=0.1)  # the prediction's own (tuner/predict.py)
ARTICLE = {
    (20000, 2048): ("0.34 measured (median of 59), 0.39 its estimate", 0.34),
    (20000, 512): ("1.62 measured (median of 15, on traffic)", 1.62),
    (6201, 512): ("2.06 measured once, prefill 802 tok/s", 2.06),
}


def case_study_diagnosis() -> tuple[Diagnosis, list[TaskTimeline]]:
    """The article's figures in the form a log's diagnosis carries them."""
    profile = [
        Figure(name=f"prefill_tok_s_chunk_{size}", label=f"the article's table ({size})", value=speed)
        for size, speed in CHUNKS.items()
    ]
    profile.append(Figure(name="decode_tok_s_width_1", label="the article (one stream alone)", value=DECODE_ALONE))
    diagnosis = Diagnosis(
        source="seed 000",
        log_kind="llama-server",
        lines=0,
        tasks=1,
        span_s=0.0,
        long_prompt_tokens=5000,
        server=ServerFacts(n_slots=SLOTS, n_batch=2048),
        profile=profile,
    )
    long_prompt = TaskTimeline(
        task=0, slot=0, prompt_n=20000, prompt_ms=20000 / LONG_PREFILL * 1000, eval_n=ANSWER,
        eval_ms=ANSWER / DECODE_ALONE * 1000,
    )  # fmt: skip
    return diagnosis, [long_prompt]


def request(request_id: str, offset: float, prompt: int, output: int) -> ReplayRequest:
    tokens = tuple(100 + (sum(map(ord, request_id)) * 7919 + 31 * i) % 29000 for i in range(prompt))
    return ReplayRequest(
        request_id=request_id, session=request_id, offset_s=offset, prompt_token_ids=tokens, output_tokens=output
    )


def predicted(long_prompt: int, n_batch: int, seeds: int) -> dict[str, tuple[float, float, float] | None]:
    diagnosis, tasks = case_study_diagnosis()
    calibration = calibrate_from_log(diagnosis, tasks)
    engine = create_engine(PluginSpec.model_validate({"kind": "llama-server", "binary": "simulated"}))
    settings = SimSettings(
        n_batch=n_batch, n_ubatch=min(512, n_batch), n_parallel=SLOTS, ctx_size=SLOTS * 32768, kv_unified=True
    )
    # The stream is 2 s in (about 100 tokens) when the long prompt arrives, so it decodes through the prefill.
    requests = [request("stream", 0.0, 200, ANSWER), request("long", 2.0, long_prompt, 4)]
    samples: dict[str, list[float]] = {"stall_tok_s": [], "prefill_tok_s": []}
    for seed in range(seeds):
        server = SimulatedLlamaServer(settings, cost=calibration.cost, noise=NOISE, seed=seed)
        done = replay_virtual(requests, server, engine=engine, start_s=0.0, request_timeout_s=1e9)
        metrics = compute_metrics(done.records, long_prompt_tokens=5000, min_overlap_s=0.5)
        for name, values in samples.items():
            if (value := metrics.get(name)) is not None:
                values.append(value)
    return {
        name: (statistics.median(values), min(values), max(values)) if values else None
        for name, values in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="simulator seeds per config (5)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    diagnosis, tasks = case_study_diagnosis()
    calibration = calibrate_from_log(diagnosis, tasks)
    print(
        f"calibration: the shipped costs x {calibration.prefill_factor:.4f} for prefill, "
        f"x {calibration.decode_factor:.4f} for decode"
    )
    rows = []
    print("| long prompt | n_batch | stall predicted (tok/s) | prefill predicted (tok/s) | the article | off by |")
    print("|---|---|---|---|---|---|")
    for long_prompt, n_batch in [(20000, b) for b in (2048, 1024, 512, 256, 128)] + [(6201, 512)]:
        figures = predicted(long_prompt, n_batch, args.seeds)
        stall, prefill = figures["stall_tok_s"], figures["prefill_tok_s"]
        article, measured = ARTICLE.get((long_prompt, n_batch), ("", None))
        off = f"{stall[0] / measured - 1:+.0%}" if stall and measured else ""
        stall_text = f"{stall[0]:.2f} ({stall[1]:.2f}-{stall[2]:.2f})" if stall else "-"
        prefill_text = f"{prefill[0]:.0f} ({prefill[1]:.0f}-{prefill[2]:.0f})" if prefill else "-"
        print(f"| {long_prompt:,} | {n_batch} | {stall_text} | {prefill_text} | {article} | {off} |")
        rows.append({"long_prompt": long_prompt, "n_batch": n_batch, **figures, "article": measured})
    if args.out:
        document = {
            "prefill_factor": calibration.prefill_factor,
            "decode_factor": calibration.decode_factor,
            "fitted": calibration.fitted,
            "rows": rows,
        }
        write_result(args.out, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
