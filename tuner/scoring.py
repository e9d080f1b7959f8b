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

import numpy as np

from tuner.config import ObjectiveSpec
from tuner.errors import MeasurementError

__all__ = [
    "MIN_EFFECT_RATIO_LOG",
    "NOISE_FLAG_RATIO",
    "RATIO_CLAMP",
    "Verdict",
    "bootstrap_ci",
    "difference_ci",
    "median_metrics",
    "min_effect",
    "noisy_metrics",
    "objective_terms",
    "score_round",
    "verdict",
]

# A metric whose ratio to the baseline is beyond 100x either way carries no more information, and a
# stall speed of exactly 0 must not turn into minus infinity.
RATIO_CLAMP = 100.0
# The source article flags a setting whose rounds differ by 20% or more on a headline metric.
NOISE_FLAG_RATIO = 0.20
# Different GPUs of one model and different days move numbers by about 10% (source article); within one
# session, a gain under 5% on every objective is not worth a config change.
MIN_EFFECT_RATIO_LOG = math.log(1.05)

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


# What a metric needs from a round, for the error when it had no data.
_STALL_NEEDS = (
    "it needs a stream decoding for at least metrics.min_overlap_s while another request's prompt of at least "
    "metrics.long_prompt_tokens new tokens is prefilled"
)
_NEEDS = {
    "stall_tok_s": _STALL_NEEDS,
    "unstalled_tok_s": _STALL_NEEDS,
    "server_stall_tok_s": _STALL_NEEDS,
    "prefill_tok_s": "it needs a prompt of at least metrics.long_prompt_tokens new tokens",
}


def objective_terms(metrics: Metrics, reference: Metrics, objectives: Sequence[ObjectiveSpec]) -> list[float]:
    """Per objective, the signed log-ratio against the reference: > 0 is better, whatever the direction."""
    terms = []
    for objective in objectives:
        value, base = metrics.get(objective.metric), reference.get(objective.metric)
        # NaN is no figure either: min() and max() pass it through, and it would clamp to the best score.
        if value is None or base is None or math.isnan(value) or math.isnan(base):
            needs = _NEEDS.get(objective.metric, "the workload may lack what it measures")
            raise MeasurementError(f"metric {objective.metric} had no data in this round; {needs}")
        sign = 1.0 if objective.direction == "maximize" else -1.0
        terms.append(sign * _log_ratio(value, base))
    return terms


def score_round(metrics: Metrics, reference: Metrics, objectives: Sequence[ObjectiveSpec]) -> float:
    terms = objective_terms(metrics, reference, objectives)
    return sum(objective.weight * term for objective, term in zip(objectives, terms, strict=True))


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
    reason: str


def bootstrap_ci(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (scipy's), seeded so that a study reads the same twice."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or float(data.min()) == float(data.max()):
        return float(data.mean()), float(data.mean())  # nothing to resample: every resample is this mean
    from scipy import stats  # here, not at the top: scipy.stats takes most of a second to import

    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def difference_ci(values: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """The interval of the mean paired difference: Student's t, or the bootstrap where that is wider.

    A percentile bootstrap of two or three differences is only their range, so two lucky pairs of a
    config against itself would look certain; the t interval widens with few pairs, as it must. The
    confirmation asks for each look's share of its 5% (`tuner.sequential`); at confidence 1 (a look with
    no share) the interval is everything.
    """
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or confidence >= 1:
        return (-math.inf, math.inf)
    from scipy import stats  # here, not at the top: every `tuner` command imports this module

    degrees = len(data) - 1
    t = float(stats.t.ppf(1 - (1 - confidence) / 2, degrees))  # the exact quantile, not a table's row
    half = t * float(data.std(ddof=1)) / math.sqrt(len(data))
    mean = float(data.mean())
    low, high = bootstrap_ci(values, confidence=confidence)
    return min(mean - half, low), max(mean + half, high)


def min_effect(objectives: Sequence[ObjectiveSpec]) -> float:
    """The smallest score gain called a win: 5% better on every objective."""
    return MIN_EFFECT_RATIO_LOG * sum(o.weight for o in objectives)


def verdict(candidate_scores: Sequence[float], baseline_scores: Sequence[float], *, min_effect: float) -> Verdict:
    """A candidate beats the baseline only if its worst round beats the baseline's best round by more
    than the larger of the two trials' own round-to-round ranges and by more than `min_effect`.

    With two rounds each, "every candidate round above every baseline round" alone happens by chance
    one time in six when the two configs are the same; asking the gap to exceed the measured spread
    and a minimum effect keeps such a coin toss from being reported as a win.
    """
    if not candidate_scores or not baseline_scores:
        return Verdict(better=False, reason="not enough rounds to compare")
    margin = min(candidate_scores) - max(baseline_scores)
    spread = max(max(candidate_scores) - min(candidate_scores), max(baseline_scores) - min(baseline_scores))
    needed = max(min_effect, spread)
    if margin > needed:
        return Verdict(
            better=True,
            reason=f"its worst round beat the baseline's best by {margin:.2f}, more than the {needed:.2f} "
            "that noise and the minimum effect ask",
        )
    return Verdict(
        better=False,
        reason=f"its gap to the baseline ({margin:+.2f}) is within the {needed:.2f} that noise and the minimum "
        "effect ask",
    )
