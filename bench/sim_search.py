"""The study's decisions measured over many simulated studies (docs/simulator.md shows the figures).

- A/A: studies whose every trial is the baseline config under noise (tests/data/aa-space.toml); the share
  that recommends something is the false-win rate, with its 95% Clopper-Pearson interval.
- The demo's search: `studies/stall-demo.toml` as shipped, one study per seed; the share whose
  recommendation is in the knee region (n_batch <= 256, stall >= 4x the baseline's, prefill >= 0.8x), and
  the confirmation pairs the sequential test ran against those planned (the first 20 seeds and all).
- A/A confirmations: how many pairs the confirmations of the A/A studies ran, of those planned.

    .venv/bin/python bench/sim_search.py [--aa 1000] [--seeds 100] [--out bench/results/sim-search.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

from tests.support.sim_study import AA_OVERRIDES, NOISE, SimulatedStudy, prepare_simulated, run_simulated  # noqa: E402
from tuner.study_record import StudyRecord  # noqa: E402


def _tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval, by bisection on the tails (no scipy needed)."""
    alpha = (1 - level) / 2

    def solve(target: float, k_tail: int) -> float:
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            if _tail(k_tail, n, mid) < target:
                low = mid
            else:
                high = mid
        return (low + high) / 2

    lower = 0.0 if k == 0 else solve(alpha, k)
    upper = 1.0 if k == n else solve(1 - alpha, k + 1)
    return lower, upper


class Pairs:
    """Confirmation pairs run against those planned, and why they stopped, over many studies."""

    def __init__(self) -> None:
        self.confirmations = self.run = self.planned = 0
        self.stopped: dict[str, int] = {}

    def add(self, study: SimulatedStudy, planned: int) -> None:
        for confirmation in StudyRecord.of(study.study).confirmations.values():
            self.confirmations += 1
            self.run += len(confirmation.differences)
            self.planned += planned
            reason = confirmation.stopped or "all pairs"
            self.stopped[reason] = self.stopped.get(reason, 0) + 1

    def summary(self) -> dict[str, object]:
        return {
            "confirmations": self.confirmations,
            "pairs_run": self.run,
            "pairs_planned": self.planned,
            "saved_share": 1 - self.run / self.planned if self.planned else 0.0,
            "stopped": self.stopped,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa", type=int, default=1000, help="A/A studies")
    parser.add_argument("--seeds", type=int, default=100, help="demo studies")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sim-search.json")
    args = parser.parse_args()
    aa = prepare_simulated(AA_OVERRIDES)
    with tempfile.TemporaryDirectory() as scratch:
        wins, aa_pairs = 0, Pairs()
        for seed in range(args.aa):
            study = run_simulated(aa, Path(scratch) / f"aa-{seed}", seed=seed)
            wins += study.board.recommendation.row is not None
            aa_pairs.add(study, aa.spec.confirm.pairs)
        knee, nothing, demo_pairs, first_20 = 0, 0, Pairs(), Pairs()
        for seed in range(args.seeds):
            prepared = prepare_simulated([f"seed={seed}", f"workload.seed={seed}"])
            study = run_simulated(prepared, Path(scratch) / f"demo-{seed}", seed=seed)
            demo_pairs.add(study, prepared.spec.confirm.pairs)
            if seed < 20:
                first_20.add(study, prepared.spec.confirm.pairs)
            board = study.board
            chosen, baseline = board.recommendation.row, next(r for r in board.rows if r.baseline)
            if chosen is None:
                nothing += 1
                continue
            stall = chosen.metrics["stall_tok_s"][0] / baseline.metrics["stall_tok_s"][0]
            prefill = chosen.metrics["prefill_tok_s"][0] / baseline.metrics["prefill_tok_s"][0]
            knee += int(chosen.settings["n_batch"]) <= 256 and stall >= 4 and prefill >= 0.8
    low, high = clopper_pearson(wins, args.aa)
    result = {
        "noise": {"restart_sigma": NOISE.restart, "iteration_sigma": NOISE.iteration},
        "aa": {
            "studies": args.aa,
            "false_wins": wins,
            "rate": wins / args.aa,
            "ci95": [low, high],
            "confirmation_pairs": aa_pairs.summary(),
        },
        "demo": {
            "seeds": args.seeds,
            "knee": knee,
            "nothing_recommended": nothing,
            "rate": knee / args.seeds,
            "confirmation_pairs": demo_pairs.summary(),
            "confirmation_pairs_first_20_seeds": first_20.summary(),
        },
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
