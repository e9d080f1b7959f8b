"""How the loop's trials end: measured and scored (`finish_measured`), failed, pruned after their first
round, skipped before deployment, told an earlier trial's values, or interrupted, each through
`tuner.study_record.end_trial` (the record written, then told to Optuna), as a fleet's stale trials are."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.config import StudySpec
from tuner.errors import MeasurementError
from tuner.scoring import median_metrics, noisy_metrics, objective_terms, score_round
from tuner.study_record import end_trial

__all__ = ["Finished", "end_trial", "finish_measured", "record_constraints", "skip_trial"]

Metrics = Mapping[str, float | None]


def skip_trial(study: optuna.Study, trial: optuna.Trial, reason: str) -> str:
    """A proposal that needs no deployment ends PRUNED with its reason; returns the reason."""
    end_trial(study, trial, state=TrialState.PRUNED, skip_reason=reason)
    return reason


def record_constraints(
    trial: optuna.Trial, spec: StudySpec, medians: Metrics, reference: Metrics
) -> tuple[list[float], list[str]]:
    """Tells the sampler by how much the trial breaks each metric constraint, and returns the amounts and
    the broken constraints as text, for its record; the baseline is its own reference."""
    amounts, broken = [], []
    for constraint in spec.constraints:
        violations = constraint.violations(medians.get(constraint.metric), reference.get(constraint.metric))
        amounts.append(max((amount for _, amount in violations), default=0.0))
        broken += [text for text, _ in violations]
    # For the samplers (TPE and GP steer away from infeasible trials); named "0", "1", ... as the
    # deprecated constraints_func stored them, so a study begun with it reads the same on resume.
    for index, amount in enumerate(amounts):
        trial.set_constraint(str(index), amount)
    return amounts, broken


class Finished:
    """A measured trial's outcome, as `finish_measured` recorded and told it."""

    def __init__(self, score: float, noisy: list[str], broken: list[str]) -> None:
        self.score, self.noisy, self.broken = score, noisy, broken


def finish_measured(
    study: optuna.Study,
    trial: optuna.Trial,
    rounds: list[dict[str, float | None]],
    *,
    spec: StudySpec,
    reference: Metrics,
    baseline: bool,
    trial_dir: Path,
) -> Finished:
    """Scores the rounds against `reference` (the baseline's medians), records and tells the outcome;
    `MeasurementError` if an objective metric had no data."""
    objectives = spec.objectives
    try:
        scores = [score_round(metrics, reference, objectives) for metrics in rounds]
    except MeasurementError as exc:
        failed = sum(int(m.get("failures") or 0) for m in rounds)
        if not failed:
            raise
        raise MeasurementError(f"{exc}; {failed} requests failed, see {trial_dir}/round-*.jsonl") from None
    noisy = noisy_metrics(rounds, [o.metric for o in objectives])
    amounts, broken = record_constraints(trial, spec, median_metrics(rounds), reference)
    value = statistics.median(scores)
    told: float | list[float] | None
    if spec.combine == "pareto":
        terms = [objective_terms(metrics, reference, objectives) for metrics in rounds]
        told = [statistics.median(column) for column in zip(*terms, strict=True)]
    else:
        told = value if math.isfinite(value) else None
    # One write of the whole outcome: each write appends the record, rounds included, to the journal.
    end_trial(
        study,
        trial,
        told,
        first_score=value if baseline and spec.combine != "pareto" else None,
        rounds=rounds,
        round_scores=scores,
        noisy=noisy,
        score=value,
        constraint_violations=amounts,
        violates=broken,
    )
    return Finished(value, noisy, broken)
