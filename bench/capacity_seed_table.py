"""Seed 004's capacity table against the simulated llama-server calibrated from its single-user figures (issue 29,
point 4): Qwen3 14B Q4_K_M on one H200, llama-server at its defaults (n_batch 2048, n_ubatch 512, 4,096 tokens
of context a slot) with `-np 4` and `-np 16`.

The calibration is the product's (`tuner.predict.calibrate_from_log`), fed what the seed prints for one user
instead of a log's figures: a stream decoding alone at 152 tok/s (its per-user speed at 1 user, 150.9 to 153.2
over both configs and rounds) and prefill of its ~640-token prompts in the 0.2 s of its TTFT median at 1 user
(3,200 tok/s, in chunks of up to 512). Nothing of the seed's multi-user rows goes in. The sweep is
`tuner capacity`'s own (`tuner.capacity.sweep.run_sweep`) on the simulator's clock (`SimulatedCapacityTarget`):
closed-loop users asking the seed's summaries (576 to 704 prompt tokens behind a shared 67-token system prompt,
140 tokens out), a 15 s warm-up and a 60 s window, two rounds, the seed's SLO (TTFT p95 at most 2 s, at least
10 tok/s per user), the simulator's run-to-run noise (5% a start, 10% a pass).

    .venv/bin/python bench/capacity_seed_table.py [--out bench/results/capacity-seed-004.json]   # about a minute
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from provenance import write_result

from tuner.capacity.record import CapacitySweep, SweptConfig
from tuner.capacity.simulated import SimulatedCapacityTarget
from tuner.capacity.sweep import run_sweep
from tuner.config import load_study
from tuner.diagnose.report import Diagnosis, Figure, ServerFacts
from tuner.models import TaskTimeline
from tuner.predict import calibrate_from_log
from tuner.search import prepare_study
from tuner.sim.inputs import NoiseModel

ROOT = Path(__file__).resolve().parent.parent
DECODE_ALONE = 152.0  # tok/s: one user's speed
PROMPT, TTFT_ALONE = 640, 0.2  # the summaries' prompt, and its TTFT median at 1 user
NOISE = NoiseModel(restart=0.05, iteration=0.10)  # the prediction's own (tuner/predict.py)
# The seed's rows (its full table): users -> (total tok/s low, high), (per-user low, high), (TTFT p95 low, high),
# within the SLO in both rounds.
SEED: dict[int, dict[int, tuple[tuple[float, float], tuple[float, float], tuple[float, float], bool]]] = {
    4: {
        1: ((98, 117), (151.6, 152.7), (0.2, 2.7), False),
        2: ((113, 126), (101.8, 107.9), (2.5, 3.7), False),
        4: ((208, 211), (69.0, 69.4), (0.4, 0.4), True),
        8: ((234, 241), (70.3, 70.3), (3.3, 6.4), False),
        16: ((247, 259), (69.6, 71.3), (7.5, 7.7), False),
    },
    16: {
        1: ((106, 111), (150.9, 153.2), (0.2, 1.8), True),
        2: ((113, 116), (67.3, 67.5), (0.3, 0.4), True),
        4: ((96, 161), (34.6, 41.8), (0.5, 3.2), False),
        8: ((162, 198), (23.0, 26.6), (0.5, 0.6), True),
        16: ((404, 413), (26.4, 27.1), (0.6, 0.6), True),
        32: ((400, 405), (26.7, 27.2), (6.5, 6.8), False),
    },
}


def seed_calibration() -> tuple[Diagnosis, list[TaskTimeline]]:
    profile = [
        Figure(name="prefill_tok_s_chunk_512", label="seed 004 (TTFT at 1 user)", value=PROMPT / TTFT_ALONE),
        Figure(name="decode_tok_s_width_1", label="seed 004 (one user)", value=DECODE_ALONE),
    ]
    diagnosis = Diagnosis(
        source="seed 004", log_kind="llama-server", lines=0, tasks=1, span_s=0.0, long_prompt_tokens=512,
        server=ServerFacts(n_slots=16, n_batch=2048), profile=profile,
    )  # fmt: skip
    alone = TaskTimeline(
        task=0, slot=0, prompt_n=PROMPT, prompt_ms=TTFT_ALONE * 1000, eval_n=140, eval_ms=140 / DECODE_ALONE * 1000
    )
    return diagnosis, [alone]


def simulate(slots: int, users: list[int], seed: int) -> SweptConfig:
    diagnosis, tasks = seed_calibration()
    calibration = calibrate_from_log(diagnosis, tasks)
    overrides = [
        'engine.binary="simulated"',
        f"engine.settings.n_parallel={slots}",
        f"engine.settings.ctx_size={4096 * slots}",
    ]
    spec, base_dir = load_study(ROOT / "studies" / "stall-demo.toml", overrides)
    prepared = prepare_study(spec, base_dir)
    sweep = CapacitySweep(
        study="seed-004", host=None, started="-", shape="summary", users=users, warm_up_s=15.0, window_s=60.0,
        rounds=2, slo_ttft_p95_s=2.0, slo_decode_tok_s=10.0, slo_min_requests=20,
        configs=[SweptConfig(trial=None, settings={})], server=f"simulated llama-server, -np {slots}",
    )  # fmt: skip
    target = SimulatedCapacityTarget(prepared, seed=seed, cost=calibration.cost, noise=NOISE)
    done = asyncio.run(run_sweep(sweep, target, prepared, save=lambda _: None, say=lambda _: None))
    return done.configs[0]


def _range(values: list[float], digits: int) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}-{high:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the simulator's seed")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    diagnosis, tasks = seed_calibration()
    calibration = calibrate_from_log(diagnosis, tasks)
    print(
        f"calibration: the shipped costs x {calibration.prefill_factor:.4f} for prefill, "
        f"x {calibration.decode_factor:.4f} for decode"
    )
    document: dict[str, object] = {
        "prefill_factor": calibration.prefill_factor, "decode_factor": calibration.decode_factor, "rows": [],
    }  # fmt: skip
    rows: list[dict[str, object]] = document["rows"]  # type: ignore[assignment]
    print("| -np | users | total tok/s seed | simulated | off | per-user seed | simulated | off | TTFT p95 seed | "
          "simulated | SLO seed | simulated |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for slots, table in SEED.items():
        swept = simulate(slots, list(table), args.seed)
        for users, (total, per_user, ttft, held) in table.items():
            levels = [f for f in swept.levels if f.users == users]
            if not levels:
                print(f"| {slots} | {users} | {total[0]:.0f}-{total[1]:.0f} | (the climb stopped) | | | | | | | | |")
                continue
            sim_total = [f.total_tok_s for f in levels]
            sim_user = [f.per_user_tok_s or 0.0 for f in levels]
            sim_ttft = [f.ttft_p95_s or 0.0 for f in levels]
            sim_held = all(f.verdict == "pass" for f in levels) and len(levels) == 2
            off_total = sum(sim_total) / len(sim_total) / ((total[0] + total[1]) / 2) - 1
            off_user = sum(sim_user) / len(sim_user) / ((per_user[0] + per_user[1]) / 2) - 1
            print(
                f"| {slots} | {users} | {total[0]:.0f}-{total[1]:.0f} | {_range(sim_total, 0)} | {off_total:+.0%} | "
                f"{per_user[0]:.1f}-{per_user[1]:.1f} | {_range(sim_user, 1)} | {off_user:+.0%} | "
                f"{ttft[0]:.1f}-{ttft[1]:.1f} | {_range(sim_ttft, 2)} | {'ok' if held else 'FAIL'} | "
                f"{'ok' if sim_held else 'FAIL'} |"
            )
            rows.append({
                "slots": slots, "users": users, "seed": {"total": total, "per_user": per_user, "ttft_p95": ttft,
                "held": held}, "simulated": {"total": sim_total, "per_user": sim_user, "ttft_p95": sim_ttft,
                "held": sim_held},
            })  # fmt: skip
        print(f"-np {slots}: capacity simulated {swept.capacity}")
        document[f"capacity_np{slots}"] = swept.capacity
    if args.out:
        write_result(args.out, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
