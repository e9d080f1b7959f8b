"""The leaderboard and the recommendation, computed from the study's storage alone.

Nothing here measures or prints: `console.py` renders these rows, `tuner leaderboard` reads them
back from `runs/<study>/` at any time, also while a study is running.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.scoring import Verdict, verdict

__all__ = ["Leaderboard", "LeaderboardRow", "Recommendation", "build_leaderboard", "leaderboard_frame"]


@dataclass(frozen=True, kw_only=True)
class LeaderboardRow:
    number: int
    baseline: bool
    state: str
    params: dict[str, ParamValue]
    changed: dict[str, ParamValue]
    score: float | None
    score_range: tuple[float, float] | None
    metrics: dict[str, tuple[float, float, float]]  # name -> (median, min, max) over rounds
    cv: dict[str, float]  # name -> coefficient of variation over rounds (stdev / mean)
    noisy: list[str]
    reason: str | None
    violates: list[str] = field(default_factory=list)
    pareto: bool = False
    answers_changed: float | None = None  # share of the workload's requests whose answers the settings change
    answers_changed_note: str | None = None


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    row: LeaderboardRow | None
    verdict: Verdict | None
    message: str


@dataclass(frozen=True, kw_only=True)
class Leaderboard:
    study_name: str
    rows: list[LeaderboardRow]
    recommendation: Recommendation
    pruned: int = 0
    pruning_saved_s: float = 0.0


def _metric_ranges(rounds: Sequence[dict[str, float | None]]) -> dict[str, tuple[float, float, float]]:
    result = {}
    for name in sorted({n for r in rounds for n in r}):
        values = [v for v in (r.get(name) for r in rounds) if v is not None]
        if values:
            result[name] = (statistics.median(values), min(values), max(values))
    return result


def _coefficients_of_variation(rounds: Sequence[dict[str, float | None]]) -> dict[str, float]:
    result = {}
    for name in sorted({n for r in rounds for n in r}):
        values = [v for v in (r.get(name) for r in rounds) if v is not None]
        if len(values) >= 2 and statistics.fmean(values) != 0:
            result[name] = statistics.stdev(values) / abs(statistics.fmean(values))
    return result


def _score(trial: FrozenTrial) -> float | None:
    if trial.state != TrialState.COMPLETE:
        return None
    if "score" in trial.user_attrs:
        return float(trial.user_attrs["score"])
    return trial.values[0] if trial.values and len(trial.values) == 1 else None


def _row(trial: FrozenTrial, baseline_params: dict[str, ParamValue], front: set[int]) -> LeaderboardRow:
    scores = list(trial.user_attrs.get("round_scores", []))
    is_baseline = bool(trial.user_attrs.get("baseline"))
    settings: dict[str, ParamValue] = dict(trial.user_attrs.get("settings", trial.params))
    return LeaderboardRow(
        number=trial.number,
        baseline=is_baseline,
        state=trial.state.name,
        params=settings,
        changed={} if is_baseline else {k: v for k, v in settings.items() if baseline_params.get(k) != v},
        score=_score(trial),
        score_range=(min(scores), max(scores)) if scores else None,
        metrics=_metric_ranges(trial.user_attrs.get("rounds", [])),
        cv=_coefficients_of_variation(trial.user_attrs.get("rounds", [])),
        noisy=list(trial.user_attrs.get("noisy", [])),
        reason=trial.user_attrs.get("fail_reason") or trial.user_attrs.get("prune_reason"),
        violates=list(trial.user_attrs.get("violates", [])),
        pareto=trial.number in front,
        answers_changed=trial.user_attrs.get("answers_changed"),
        answers_changed_note=trial.user_attrs.get("answers_changed_note"),
    )


def build_leaderboard(study: optuna.Study) -> Leaderboard:
    """Deployed trials, best first; failed trials last, with their reasons."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("deployed")]
    baseline_trial = next((t for t in trials if t.user_attrs.get("baseline") and t.state == TrialState.COMPLETE), None)
    baseline_params = dict(baseline_trial.user_attrs.get("settings", baseline_trial.params)) if baseline_trial else {}
    front = {t.number for t in study.best_trials} if len(study.directions) > 1 else set()
    rows = [_row(t, baseline_params, front) for t in trials if t.state != TrialState.RUNNING]
    rows.sort(key=lambda r: (r.score is None, -(r.score or 0.0), r.number))
    return Leaderboard(
        study_name=study.study_name,
        rows=rows,
        recommendation=_recommend(study, rows, baseline_trial, float(study.user_attrs.get("min_effect", 0.0))),
        pruned=sum(1 for t in trials if t.state == TrialState.PRUNED),
        pruning_saved_s=sum(float(t.user_attrs.get("saved_s", 0.0)) for t in trials),
    )


def _recommend(
    study: optuna.Study, rows: list[LeaderboardRow], baseline_trial: FrozenTrial | None, min_effect: float
) -> Recommendation:
    """The best setting that was re-measured against the baseline and won beyond noise; without a
    re-measurement (confirm.top = 0, or an interrupted run), the range test on the search rounds."""
    if baseline_trial is None:
        return Recommendation(row=None, verdict=None, message="no baseline has been measured yet")
    scored = [r for r in rows if not r.baseline and r.score is not None and r.changed]
    measured = [r for r in scored if not r.violates]
    if scored and not measured:
        best = scored[0]
        return Recommendation(
            row=None,
            verdict=None,
            message=f"keep the baseline: every trial measured beside it breaks a constraint (best was trial "
            f"{best.number}, {_settings(best)}: {'; '.join(best.violates)})",
        )
    allowed = bool(study.user_attrs.get("allow_answer_changes"))
    candidates = [r for r in measured if allowed or not r.answers_changed]
    held_back = next((r for r in measured if r not in candidates), None)
    recommendation = _recommend_among(study, candidates, baseline_trial, min_effect)
    if held_back is None or (
        recommendation.row is not None and (recommendation.row.score or 0) >= (held_back.score or 0)
    ):
        return recommendation
    note = (
        f"trial {held_back.number} ({_settings(held_back)}) scored {held_back.score:+.2f} but changes the answers "
        f"of about {held_back.answers_changed:.0%} of the workload's requests ({held_back.answers_changed_note}): "
        "set gate.allow_answer_changes = true in the study file if that is acceptable"
    )
    if not candidates:
        message = f"keep the baseline: every setting that beat it changes answers; {note}"
    else:
        message = f"{recommendation.message}; {note}"
    return Recommendation(row=recommendation.row, verdict=recommendation.verdict, message=message)


def _recommend_among(
    study: optuna.Study, candidates: list[LeaderboardRow], baseline_trial: FrozenTrial, min_effect: float
) -> Recommendation:
    if not candidates:
        return Recommendation(row=None, verdict=None, message="no trial has been measured beside the baseline yet")
    confirmed = [
        (r, study.user_attrs[f"confirmation_{r.number}"])
        for r in candidates
        if f"confirmation_{r.number}" in study.user_attrs
    ]
    if confirmed:
        winners = [(r, c) for r, c in confirmed if c["ci"][0] > min_effect]
        row, result = max(winners or confirmed, key=lambda rc: float(rc[1]["mean"]))
        low, high = result["ci"]
        evidence = (
            f"paired score difference {result['mean']:+.2f} over {len(result['differences'])} alternating "
            f"re-measurements against the baseline, 95% interval {low:+.2f}..{high:+.2f}"
        )
        decision = Verdict(better=bool(winners), reason=evidence)
        if winners:
            return Recommendation(
                row=row, verdict=decision, message=f"recommended: {_settings(row)} (trial {row.number}): {evidence}"
            )
        return Recommendation(
            row=None,
            verdict=decision,
            message=f"no setting beat the baseline beyond noise; keep the baseline (best candidate was "
            f"{_settings(row)}, trial {row.number}: {evidence}, not above the minimum effect {min_effect:.2f})",
        )
    best = candidates[0]
    baseline_scores = list(baseline_trial.user_attrs.get("round_scores", []))
    best_scores = [best.score_range[0], best.score_range[1]] if best.score_range else []
    decision = verdict(best_scores, baseline_scores, min_effect=min_effect)
    if decision.better:
        message = f"recommended: {_settings(best)} (trial {best.number}, not re-measured): {decision.reason}"
    else:
        message = (
            f"no setting beat the baseline beyond the run-to-run spread; keep the baseline "
            f"(best candidate was {_settings(best)}, trial {best.number}: {decision.reason})"
        )
    return Recommendation(row=best if decision.better else None, verdict=decision, message=message)


def _settings(row: LeaderboardRow) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(row.changed.items()))


def leaderboard_frame(board: Leaderboard) -> pd.DataFrame:
    """One row per trial, for CSV export: params, score and each metric's median, min and max."""
    records = []
    for row in board.rows:
        record: dict[str, object] = {
            "trial": row.number,
            "baseline": row.baseline,
            "state": row.state,
            "score": row.score,
            "score_min": row.score_range[0] if row.score_range else None,
            "score_max": row.score_range[1] if row.score_range else None,
            "noisy": ",".join(row.noisy),
            "pareto": row.pareto,
            "reason": row.reason,
            "violates": "; ".join(row.violates),
        }
        record.update({f"param_{k}": v for k, v in row.params.items()})
        for name, (median, low, high) in row.metrics.items():
            record[name] = median
            record[f"{name}_min"] = low
            record[f"{name}_max"] = high
            record[f"{name}_cv"] = row.cv.get(name)
        records.append(record)
    return pd.DataFrame.from_records(records)
