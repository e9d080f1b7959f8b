"""Turns a round's metrics into one score, and decides whether a trial beat the baseline.

The score is a weighted sum of log-ratios against the baseline's median: 0 is the baseline,
+0.69 on a weight-1 metric means twice as good. Log-ratios make tok/s and seconds comparable
and treat a halving and a doubling symmetrically.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.config import ObjectiveSpec
from tuner.errors import MeasurementError

__all__ = [
    "NOISE_FLAG_RATIO",
    "RATIO_CLAMP",
    "Verdict",
    "median_metrics",
    "noisy_metrics",
    "score_round",
    "verdict",
]

# A metric whose ratio to the baseline is beyond 100x either way carries no more information, and a
# stall speed of exactly 0 must not turn into minus infinity.
RATIO_CLAMP = 100.0
# The source article flags a setting whose rounds differ by 20% or more on a headline metric.
NOISE_FLAG_RATIO = 0.20

Metrics = Mapping[str, float | None]


def median_metrics(rounds: Sequence[Metrics]) -> dict[str, float | None]:
    names = {name for metrics in rounds for name in metrics}
    result: dict[str, float | None] = {}
    for name in sorted(names):
        values = [m[name] for m in rounds if m.get(name) is not None]
        result[name] = statistics.median(v for v in values if v is not None) if values else None
    return result


def _log_ratio(value: float, reference: float) -> float:
    if reference <= 0 and value <= 0:
        return 0.0
    if reference <= 0:
        return math.log(RATIO_CLAMP)
    if value <= 0:
        return -math.log(RATIO_CLAMP)
    return max(-math.log(RATIO_CLAMP), min(math.log(RATIO_CLAMP), math.log(value / reference)))


def score_round(metrics: Metrics, reference: Metrics, objectives: Sequence[ObjectiveSpec]) -> float:
    total = 0.0
    for objective in objectives:
        value, base = metrics.get(objective.metric), reference.get(objective.metric)
        if value is None or base is None:
            raise MeasurementError(
                f"metric {objective.metric} had no data in this round; the workload may lack what it "
                "measures (long prompts for stall_tok_s and prefill_tok_s)"
            )
        sign = 1.0 if objective.direction == "maximize" else -1.0
        total += objective.weight * sign * _log_ratio(value, base)
    return total


def noisy_metrics(rounds: Sequence[Metrics], names: Sequence[str]) -> list[str]:
    """Metrics whose rounds differ by NOISE_FLAG_RATIO or more: (max - min) / min."""
    flagged = []
    for name in names:
        values = [v for v in (m.get(name) for m in rounds) if v is not None]
        if len(values) < 2:
            continue
        low, high = min(values), max(values)
        if high - low > 0 and (low <= 0 or (high - low) / low >= NOISE_FLAG_RATIO):
            flagged.append(name)
    return flagged


@dataclass(frozen=True, kw_only=True)
class Verdict:
    better: bool
    margin: float
    reason: str


def verdict(candidate_scores: Sequence[float], baseline_scores: Sequence[float]) -> Verdict:
    """A candidate beats the baseline only if its worst round beats the baseline's best round.

    With two or three rounds a confidence interval would be wider than this range test, so the test is
    strict on purpose: a win inside the run-to-run spread is never called a win.
    """
    if not candidate_scores or not baseline_scores:
        return Verdict(better=False, margin=0.0, reason="not enough rounds to compare")
    margin = min(candidate_scores) - max(baseline_scores)
    if margin > 0:
        return Verdict(better=True, margin=margin, reason="every round beat every baseline round")
    return Verdict(better=False, margin=margin, reason="its rounds overlap the baseline's spread")
