"""The confirmation's sequential test against the fixed-n interval it replaced, on simulated paired
differences (normal, standard deviation 1, the minimum effect at 0): how often each calls a win, and how
many pairs each runs, by the true effect in standard deviations of one pair's difference. The figures are
in docs/metrics.md.

    .venv/bin/python bench/sequential_power.py [--planned 4] [--confirmations 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

from tuner.sequential import look  # noqa: E402

EFFECTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


def fixed_win(differences: np.ndarray) -> bool:
    """The interval every confirmation used before: Student's t at 95% after all the pairs."""
    n = len(differences)
    half = float(stats.t.ppf(0.975, n - 1)) * float(differences.std(ddof=1)) / math.sqrt(n)
    return float(differences.mean()) - half > 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--planned", type=int, default=4, help="pairs planned (the demo's confirm.pairs)")
    parser.add_argument("--confirmations", type=int, default=2000, help="simulated confirmations per effect")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sequential-power.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for effect in EFFECTS:
        wins = fixed_wins = pairs_run = 0
        stops: dict[str, int] = {}
        for _ in range(args.confirmations):
            differences = rng.normal(effect, 1.0, args.planned)
            fixed_wins += fixed_win(differences)
            for pairs in range(2, args.planned + 1):
                decided = look(list(differences[:pairs]), planned=args.planned, min_effect=0.0)
                if decided.stop is not None:
                    break
            assert decided.stop is not None
            wins += decided.stop == "above"
            pairs_run += pairs
            stops[decided.stop] = stops.get(decided.stop, 0) + 1
        rows.append(
            {
                "effect_sd": effect,
                "fixed_win_rate": fixed_wins / args.confirmations,
                "sequential_win_rate": wins / args.confirmations,
                "mean_pairs": pairs_run / args.confirmations,
                "stops": stops,
            }
        )
    result = {"planned_pairs": args.planned, "confirmations": args.confirmations, "rows": rows}
    write_result(args.out, result)
    print(f"| effect (sd of a pair) | wins, fixed {args.planned} pairs | wins, sequential | pairs run (mean) |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['effect_sd']:g} | {row['fixed_win_rate']:.1%} | {row['sequential_win_rate']:.1%} "
            f"| {row['mean_pairs']:.2f} of {args.planned} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
