"""The leaderboard and the recommendation, computed from the study's storage alone.

Nothing here measures or prints: `console.py` renders these rows, `tuner leaderboard` reads them
back from `runs/<study>/` at any time, also while a study is running.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import optuna
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field

from tuner.config import ParamValue
from tuner.errors import ConfigError, StudyError
from tuner.prediction_record import PredictedFigures, PredictionRecord
from tuner.runs import RunDirectory
from tuner.scoring import Verdict, verdict
from tuner.study_record import Confirmation, HostRecord, StudyRecord, TrialRecord
from tuner.study_view import StudyView, TrialView, is_scored, recommendable
from tuner.text import settings_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LEADERBOARD_JSON_VERSION",
    "HostSpread",
    "Leaderboard",
    "LeaderboardDocument",
    "LeaderboardRow",
    "PredictionOutcome",
    "Recommendation",
    "build_leaderboard",
    "leaderboard_document",
    "leaderboard_frame",
    "leaderboard_parquet",
    "row_to_apply",
]


@dataclass(frozen=True, kw_only=True)
class LeaderboardRow:
    number: int
    baseline: bool
    state: str
    settings: dict[str, ParamValue]  # every searched knob's value in this trial
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
    host: str | None = None  # the fleet host that measured it; None in a one-host study


@dataclass(frozen=True, kw_only=True)
class HostSpread:
    """The host effect: the baseline measured on every host of a fleet, beside its own round-to-round spread."""

    # objective metric -> host -> the baseline's median there
    baselines: dict[str, dict[str, float]]
    # objective metric -> (max - min) / median of the hosts' baseline medians
    between_hosts: dict[str, float]
    # objective metric -> the median over hosts of the coefficient of variation of the baseline's rounds
    between_rounds: dict[str, float]
    dropped: dict[str, str] = field(default_factory=dict)  # host -> why the fleet went on without it

    def line(self) -> str:
        """`host-to-host spread of the baseline: stall_tok_s 9.8% (round to round 3.1%), ...`."""
        parts = [
            f"{name} {spread:.1%} (round to round {self.between_rounds.get(name, float('nan')):.1%})"
            for name, spread in self.between_hosts.items()
        ]
        hosts = len(next(iter(self.baselines.values()), {}))
        text = f"host-to-host spread of the baseline over {hosts} hosts: " + (", ".join(parts) or "none measured")
        for host, reason in self.dropped.items():
            text += f"; host {host} was dropped: {reason}"
        return text


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    row: LeaderboardRow | None
    verdict: Verdict | None
    message: str


@dataclass(frozen=True, kw_only=True)
class PredictionOutcome:
    """The prediction the study started from, set beside what was measured: each trial's predicted figures
    and whether the prediction held (its best is what the study recommends, or it expected no win and there
    was none)."""

    record: PredictionRecord
    predicted: dict[int, PredictedFigures]  # trial number -> its config's predicted figures
    held: bool | None  # None: its best has not been measured yet
    message: str
    best_trial: int | None = None  # the trial that measured the predicted best


@dataclass(frozen=True, kw_only=True)
class Leaderboard:
    study_name: str
    rows: list[LeaderboardRow]
    recommendation: Recommendation
    pruned: int = 0
    pruning_saved_s: float = 0.0
    hosts: HostSpread | None = None  # a fleet's host effect; None in a one-host study
    prediction: PredictionOutcome | None = None  # a study started from a prediction (`search.predicted_from`)
    # Each re-measurement against the baseline: (trial, host or None, its pairs and verdict), by trial.
    confirmations: list[tuple[int, str | None, Confirmation]] = field(default_factory=list)
    objectives: tuple[str, ...] = ()  # the study's objective metrics: tables show each of them


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


def _row(trial: TrialView, front: frozenset[int]) -> LeaderboardRow:
    record, scores = trial.record, trial.record.round_scores
    return LeaderboardRow(
        number=trial.number,
        baseline=record.baseline,
        state=trial.state.name,
        settings=dict(trial.settings),
        changed=dict(trial.changed),
        score=trial.score,
        score_range=(min(scores), max(scores)) if scores else None,
        metrics=_metric_ranges(record.rounds),
        cv=_coefficients_of_variation(record.rounds),
        noisy=list(record.noisy),
        reason=record.fail_reason or record.prune_reason,
        violates=list(record.violates),
        pareto=trial.number in front,
        answers_changed=record.answers_changed,
        answers_changed_note=record.answers_changed_note,
        host=record.host,
    )


def _host_spread(
    baselines: dict[str | None, TrialRecord], objectives: list[str], dropped: dict[str, str]
) -> HostSpread | None:
    named = {host: record for host, record in baselines.items() if host is not None}
    if not named and not dropped:
        return None
    names = objectives or sorted({n for record in named.values() for r in record.rounds for n in r})
    medians: dict[str, dict[str, float]] = {}
    between_hosts: dict[str, float] = {}
    between_rounds: dict[str, float] = {}
    for name in names:
        per_host = {
            host: median
            for host, record in sorted(named.items())
            if (median := _metric_ranges(record.rounds).get(name))
        }
        values = {host: m[0] for host, m in per_host.items()}
        if not values:
            continue
        medians[name] = values
        middle = statistics.median(values.values())
        if len(values) >= 2 and middle != 0:
            between_hosts[name] = (max(values.values()) - min(values.values())) / abs(middle)
        cvs = [
            cv for record in named.values() if (cv := _coefficients_of_variation(record.rounds).get(name)) is not None
        ]
        if cvs:
            between_rounds[name] = statistics.median(cvs)
    return HostSpread(baselines=medians, between_hosts=between_hosts, between_rounds=between_rounds, dropped=dropped)


def build_leaderboard(study: optuna.Study | StudyView) -> Leaderboard:
    """Deployed trials, best first; failed trials last, with their reasons. In a fleet each trial's score is
    against its own host's baseline, and the host-to-host spread of the baselines is reported beside."""
    view = study if isinstance(study, StudyView) else StudyView.of(study)
    trials = view.deployed
    baselines = {host: t.record for host, t in view.baselines.items()}
    rows = [_row(t, view.front) for t in trials if t.state != TrialState.RUNNING]
    rows.sort(key=lambda r: (r.score is None, -(r.score or 0.0), r.number))
    dropped = {host: record.dropped for host, record in view.hosts.items() if record.dropped}
    recommendation = _recommend(view.record, rows, baselines, view.hosts)
    prediction = view.prediction()
    return Leaderboard(
        study_name=view.name,
        rows=rows,
        recommendation=recommendation,
        pruned=sum(1 for t in trials if t.state == TrialState.PRUNED),
        pruning_saved_s=sum(t.record.saved_s for t in trials),
        hosts=_host_spread(baselines, view.record.objectives, dropped),
        prediction=None if prediction is None else _prediction_outcome(prediction, rows, recommendation),
        confirmations=sorted(
            [(number, None, c) for number, c in view.record.confirmations.items()]
            + [(number, host, c) for host, record in view.hosts.items() for number, c in record.confirmations.items()],
            key=lambda entry: (entry[0], entry[1] or ""),
        ),
        objectives=tuple(view.record.objectives),
    )


def _prediction_outcome(
    record: PredictionRecord, rows: list[LeaderboardRow], recommendation: Recommendation
) -> PredictionOutcome:
    predicted = {row.number: figures for row in rows if (figures := record.figures_for(row.settings)) is not None}
    said = f"prediction from {record.log}"
    none_wins = record.why_none or (
        "no config beats the baseline's score"
        if record.ranked_by == "score"
        else "no config beats the baseline's stall speed"
    )
    chosen = recommendation.row
    if record.best is None:
        if chosen is None:
            return PredictionOutcome(
                record=record, predicted=predicted, held=True,
                message=f"{said}: {none_wins}; none was recommended: it held",
            )  # fmt: skip
        return PredictionOutcome(
            record=record, predicted=predicted, held=False,
            message=f"{said}: {none_wins}, but trial {chosen.number} "
            f"({_settings(chosen)}) was recommended: it did not hold",
        )  # fmt: skip
    best = record.best
    shown = settings_text(best.settings, separator=", ")
    tried = [r for r in rows if not r.baseline and predicted.get(r.number) == best]
    measured = next((r for r in tried if r.state == "COMPLETE"), None)
    if measured is None:
        if not tried:
            return PredictionOutcome(
                record=record, predicted=predicted, held=None, message=f"{said}: best {shown}, not measured yet"
            )
        ended = tried[0]  # pruned or failed: it cannot be the recommendation
        return PredictionOutcome(
            record=record, predicted=predicted, held=False, best_trial=ended.number,
            message=f"{said}: best {shown} (trial {ended.number}); it did not hold: the trial was "
            f"{ended.state.lower()} ({ended.reason or 'no reason recorded'})",
        )  # fmt: skip
    against = _predicted_against_measured(best, measured)
    if chosen is not None and predicted.get(chosen.number) == best:
        held, why = True, "it held: the recommendation is the predicted best"
    elif chosen is None:
        held, why = False, "it did not hold: no setting beat the baseline beyond noise"
    else:
        held, why = False, f"it did not hold: the recommendation is trial {chosen.number} ({_settings(chosen)})"
    return PredictionOutcome(
        record=record, predicted=predicted, held=held, best_trial=measured.number,
        message=f"{said}: best {shown} (trial {measured.number}){against}; {why}",
    )  # fmt: skip


def _predicted_against_measured(figures: PredictedFigures, row: LeaderboardRow) -> str:
    """`, score +1.53 predicted, +1.76 measured` where the prediction ranked by the study's score, then `, stall
    2.10 tok/s predicted (1.90..2.30), 2.40 measured (+14%)`; each left out where either figure is missing."""
    said = ""
    if figures.score is not None and row.score is not None:
        said += f", score {figures.score:+.2f} predicted, {row.score:+.2f} measured"
    predicted, spread = figures.median.get("stall_tok_s"), figures.spread.get("stall_tok_s")
    if predicted is None or "stall_tok_s" not in row.metrics:
        return said
    measured = row.metrics["stall_tok_s"][0]
    between = f" ({spread[0]:.2f}..{spread[1]:.2f})" if spread is not None else ""
    off = f" ({measured / predicted - 1:+.0%})" if predicted > 0 else ""
    return f"{said}, stall {predicted:.2f} tok/s predicted{between}, {measured:.2f} measured{off}"


def row_to_apply(run_path: Path, trial: int | None, storage_url: str | None = None) -> LeaderboardRow:
    """`tuner apply`'s choice, read from the run alone: the recommendation, or `trial` if it completed."""
    view = StudyView.open(RunDirectory(run_path), storage_url)
    board = build_leaderboard(view)
    if trial is None:
        if board.recommendation.row is None:
            raise StudyError(
                f"nothing to apply: {board.recommendation.message} (pass --trial N to apply a trial anyway)"
            )
        return board.recommendation.row
    row = next((r for r in board.rows if r.number == trial), None)
    if row is None or row.state != "COMPLETE":
        done = ", ".join(str(r.number) for r in board.rows if r.state == "COMPLETE")
        if not done:
            raise ConfigError(f"--trial {trial}: no trial of {run_path} completed yet; run the study first")
        if row is not None:
            what = f"trial {trial} did not complete ({row.state.lower()})"
        elif any(t.number == trial for t in view.trials):  # a proposal that never reached the host
            what = f"trial {trial} was never deployed (a proposal the search skipped or refused, or a stop kept back)"
        else:
            what = "no trial has that number"
        raise ConfigError(f"--trial {trial}: {what} in {run_path}; choose one of: {done}")
    return row


def _recommend(
    study: StudyRecord,
    rows: list[LeaderboardRow],
    baselines: dict[str | None, TrialRecord],
    fleet: dict[str, HostRecord] | None = None,
) -> Recommendation:
    """The best setting that was re-measured against the baseline and won beyond noise; without a
    re-measurement (confirm.top = 0, or an interrupted run), the range test on the search rounds."""
    baseline = next(iter(baselines.values()), None)
    if baseline is None:
        return Recommendation(row=None, verdict=None, message="no baseline has been measured yet")
    scored = [r for r in rows if is_scored(r)]
    measured = [r for r in scored if not r.violates]
    if scored and not measured:
        best = scored[0]
        return Recommendation(
            row=None,
            verdict=None,
            message=f"keep the baseline: every trial measured beside it breaks a constraint (best was trial "
            f"{best.number}, {_settings(best)}: {'; '.join(best.violates)})",
        )
    allowed = study.allow_answer_changes
    candidates = [r for r in rows if recommendable(r, allow_answer_changes=allowed)]  # the confirmation's rule too
    held_back = next((r for r in measured if r not in candidates), None)
    recommendation = (
        _recommend_in_fleet(study, candidates, baselines, fleet)
        if fleet
        else _recommend_among(study, candidates, baseline)
    )
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


def _recommend_among(study: StudyRecord, candidates: list[LeaderboardRow], baseline: TrialRecord) -> Recommendation:
    if not candidates:
        return Recommendation(row=None, verdict=None, message="no trial has been measured beside the baseline yet")
    min_effect = study.min_effect
    confirmed = [(r, study.confirmations[r.number]) for r in candidates if r.number in study.confirmations]
    if confirmed:
        winners = [(r, c) for r, c in confirmed if c.ci[0] > min_effect]
        row, result = max(winners or confirmed, key=lambda rc: rc[1].mean)
        low, high = result.ci
        evidence = (
            f"paired score difference {result.mean:+.2f} against the baseline, 95% interval {low:+.2f}..{high:+.2f}, "
            f"over {result.pairs_told()}"
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
    baseline_scores = baseline.round_scores
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


def _held(host: str, confirmation: Confirmation) -> str:
    low, high = confirmation.ci
    return f"{host} ({confirmation.mean:+.2f}, {low:+.2f}..{high:+.2f} over {confirmation.pairs_told()})"


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _recommend_in_fleet(
    study: StudyRecord,
    candidates: list[LeaderboardRow],
    baselines: dict[str | None, TrialRecord],
    fleet: dict[str, HostRecord],
) -> Recommendation:
    """A fleet's: a candidate re-measured against each host's own baseline on that host is recommended only if
    its gain held (interval above the minimum effect) on every host that re-measured it."""
    if not candidates:
        return Recommendation(row=None, verdict=None, message="no trial has been measured beside the baseline yet")
    min_effect = study.min_effect
    confirmed = [
        (
            row,
            {
                host: record.confirmations[row.number]
                for host, record in sorted(fleet.items())
                if row.number in record.confirmations
            },
        )
        for row in candidates
    ]
    confirmed = [(row, on_hosts) for row, on_hosts in confirmed if on_hosts]
    if not confirmed:
        best = candidates[0]
        reference = baselines.get(best.host) or next(iter(baselines.values()))
        best_scores = [best.score_range[0], best.score_range[1]] if best.score_range else []
        decision = verdict(best_scores, reference.round_scores, min_effect=min_effect)
        where = f" on {best.host}" if best.host else ""
        if decision.better:
            message = f"recommended: {_settings(best)} (trial {best.number}{where}, not re-measured): {decision.reason}"
        else:
            message = (
                f"no setting beat the baseline beyond the run-to-run spread; keep the baseline (best candidate was "
                f"{_settings(best)}, trial {best.number}{where}: {decision.reason})"
            )
        return Recommendation(row=best if decision.better else None, verdict=decision, message=message)

    def held_everywhere(on_hosts: dict[str, Confirmation]) -> bool:
        return all(c.ci[0] > min_effect for c in on_hosts.values())

    winners = [(row, on_hosts) for row, on_hosts in confirmed if held_everywhere(on_hosts)]
    row, on_hosts = max(winners or confirmed, key=lambda ro: statistics.fmean(c.mean for c in ro[1].values()))
    held = [_held(h, c) for h, c in on_hosts.items() if c.ci[0] > min_effect]
    missed = [_held(h, c) for h, c in on_hosts.items() if c.ci[0] <= min_effect]
    evidence = "paired score difference against each host's own baseline, 95% interval: "
    evidence += f"held on {_and(held)}" if held else ""
    evidence += ("; " if held else "") + (f"not on {_and(missed)}" if missed else "")
    if len(on_hosts) < 2 and len(fleet) >= 2:
        evidence += f" (re-measured on {len(on_hosts)} host of {len(fleet)})"
    decision = Verdict(better=bool(winners), reason=evidence)
    if winners:
        return Recommendation(
            row=row, verdict=decision, message=f"recommended: {_settings(row)} (trial {row.number}): {evidence}"
        )
    return Recommendation(
        row=None,
        verdict=decision,
        message=f"no setting held its gain on every host; keep the baseline (best candidate was {_settings(row)}, "
        f"trial {row.number}: {evidence}; the minimum effect is {min_effect:.2f})",
    )


def _settings(row: LeaderboardRow) -> str:
    return settings_text(row.changed, separator=", ")


def leaderboard_frame(board: Leaderboard) -> pd.DataFrame:
    """One row per trial, for CSV export: params, score and each metric's median, min and max."""
    import pandas as pd  # only --csv and --parquet need it: a quarter of a second to import

    records = []
    fleet = any(row.host for row in board.rows)  # a one-host study's columns stay as they were
    for row in board.rows:
        record: dict[str, object] = {
            "trial": row.number,
            **({"host": row.host} if fleet else {}),
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
        record.update({f"param_{k}": v for k, v in row.settings.items()})
        for name, (median, low, high) in row.metrics.items():
            record[name] = median
            record[f"{name}_min"] = low
            record[f"{name}_max"] = high
            record[f"{name}_cv"] = row.cv.get(name)
        records.append(record)
    return pd.DataFrame.from_records(records)


def leaderboard_parquet(board: Leaderboard) -> bytes:
    """The CSV's table as Parquet. A column whose values mix types (a knob that is a number in one trial
    and `auto` in another) is written as text, as the CSV has it: Parquet columns have one type."""
    frame = leaderboard_frame(board)
    for column in frame.columns:
        values = frame[column].dropna()
        if frame[column].dtype == object and len({type(v) for v in values}) > 1:
            frame[column] = frame[column].map(lambda v: v if v is None else str(v))
    data = frame.to_parquet(index=False)
    assert data is not None  # no path given: pandas returns the bytes
    return data


# Bumped when a field of the JSON document changes meaning or goes away; new fields keep it.
LEADERBOARD_JSON_VERSION = 1


class _Document(BaseModel):
    # Scripts read these: an unknown field is a bug here, not input to tolerate. Values that are not
    # finite (a ratio over zero) are written as null: JSON has no NaN.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="null")


class MetricSummary(_Document):
    median: float
    min: float
    max: float


class RowDocument(_Document):
    number: int = Field(description="The Optuna trial number.")
    baseline: bool
    state: str = Field(description="COMPLETE, PRUNED or FAIL.")
    settings: dict[str, ParamValue] = Field(description="Every searched knob's value in this trial.")
    changed: dict[str, ParamValue] = Field(description="The settings that differ from the baseline's.")
    score: float | None = Field(description="Weighted log-ratio against the baseline's median; null if not scored.")
    score_range: tuple[float, float] | None = Field(description="The lowest and highest round score.")
    metrics: dict[str, MetricSummary] = Field(description="Each metric's median, min and max over rounds.")
    cv: dict[str, float] = Field(description="Each metric's coefficient of variation over rounds.")
    noisy: list[str] = Field(description="Objective metrics whose rounds differ by 20% or more.")
    reason: str | None = Field(description="Why the trial failed or was pruned.")
    violates: list[str] = Field(description="The constraints the trial breaks.")
    pareto: bool = Field(description="On the Pareto front (studies with several objectives).")
    answers_changed: float | None = Field(description="Share of the workload's requests whose answers change.")
    answers_changed_note: str | None
    host: str | None = Field(default=None, description="The fleet host that measured it; null in a one-host study.")


class HostSpreadDocument(_Document):
    baselines: dict[str, dict[str, float]] = Field(description="Objective metric -> host -> baseline's median.")
    between_hosts: dict[str, float] = Field(description="(max - min) / median of the hosts' baseline medians.")
    between_rounds: dict[str, float] = Field(description="Median over hosts of the baseline rounds' CV.")
    dropped: dict[str, str] = Field(description="Hosts the fleet went on without, and why.")


class PredictedTrialDocument(_Document):
    median: dict[str, float | None] = Field(description="Each metric's median over the simulator's seeds.")
    spread: dict[str, tuple[float, float] | None] = Field(description="Each metric's lowest and highest.")
    eligible: bool = Field(
        description="Predicted to keep the study's constraints (ranked by stall speed: 80% of the baseline's prefill)."
    )
    score: float | None = Field(description="Its predicted score (ranked by the study's score); null otherwise.")


class PredictionDocument(_Document):
    log: str = Field(description="The server log the prediction was calibrated from.")
    best: dict[str, ParamValue] | None = Field(description="The config predicted to win; null: none beats baseline.")
    held: bool | None = Field(description="Whether the study recommends the predicted best; null: not yet known.")
    message: str = Field(description="What the leaderboard says of it.")
    best_trial: int | None = Field(description="The trial that measured the predicted best; null: none yet.")
    ranked_by: Literal["stall", "score"] = Field(
        description="score: by the study's objectives and constraints; stall: by stall speed."
    )
    why_none: str | None = Field(description="Ranked by the score, where no config is the predicted best: why.")
    trials: dict[int, PredictedTrialDocument] = Field(description="Trial number -> its config's predicted figures.")


class ConfirmationDocument(_Document):
    trial: int = Field(description="The trial re-measured against the baseline in alternating pairs.")
    host: str | None = Field(description="The fleet host it was re-measured on; null on one host.")
    differences: list[float] = Field(description="The trial's score minus the baseline's, per pair.")
    mean: float
    ci: list[float] = Field(description="The interval the sequential test holds at 95% over all its looks.")
    pairs_run: int
    pairs_planned: int | None = Field(
        description="The most pairs it would run; null: stored before the sequential confirmation (all ran)."
    )
    stopped: str | None = Field(description="Why the pairs stopped: above, below, futile or all pairs; null: as above.")
    told: str = Field(description="How many pairs ran and why they stopped, as the recommendation says it.")


class LeaderboardDocument(_Document):
    """`tuner leaderboard RUN_DIR --json`: the leaderboard for scripts, rows best first."""

    version: int = LEADERBOARD_JSON_VERSION
    study_name: str
    recommendation: str = Field(description="The recommendation, as the table's last line says it.")
    recommended_trial: int | None = Field(description="The recommended trial's number; null: keep the baseline.")
    pruned: int
    pruning_saved_s: float
    rows: list[RowDocument]
    hosts: HostSpreadDocument | None = Field(default=None, description="A fleet's host effect; null on one host.")
    prediction: PredictionDocument | None = Field(
        default=None, description="The prediction the study started from (search.predicted_from); null: none."
    )
    confirmations: list[ConfirmationDocument] = Field(
        default_factory=list, description="Each re-measurement against the baseline, by trial."
    )


def leaderboard_document(board: Leaderboard) -> LeaderboardDocument:
    recommended = board.recommendation.row
    return LeaderboardDocument(
        study_name=board.study_name,
        recommendation=board.recommendation.message,
        recommended_trial=None if recommended is None else recommended.number,
        pruned=board.pruned,
        pruning_saved_s=board.pruning_saved_s,
        rows=[
            RowDocument(
                number=row.number,
                baseline=row.baseline,
                state=row.state,
                settings=row.settings,
                changed=row.changed,
                score=row.score,
                score_range=row.score_range,
                metrics={
                    name: MetricSummary(median=median, min=low, max=high)
                    for name, (median, low, high) in row.metrics.items()
                },
                cv=row.cv,
                noisy=row.noisy,
                reason=row.reason,
                violates=row.violates,
                pareto=row.pareto,
                answers_changed=row.answers_changed,
                answers_changed_note=row.answers_changed_note,
                host=row.host,
            )
            for row in board.rows
        ],
        hosts=None
        if board.hosts is None
        else HostSpreadDocument(
            baselines=board.hosts.baselines,
            between_hosts=board.hosts.between_hosts,
            between_rounds=board.hosts.between_rounds,
            dropped=board.hosts.dropped,
        ),
        prediction=None
        if board.prediction is None
        else PredictionDocument(
            log=board.prediction.record.log,
            best=None if board.prediction.record.best is None else board.prediction.record.best.settings,
            held=board.prediction.held,
            message=board.prediction.message,
            best_trial=board.prediction.best_trial,
            ranked_by=board.prediction.record.ranked_by,
            why_none=board.prediction.record.why_none,
            trials={
                number: PredictedTrialDocument(
                    median=figures.median, spread=figures.spread, eligible=figures.eligible, score=figures.score
                )
                for number, figures in board.prediction.predicted.items()
            },
        ),
        confirmations=[
            ConfirmationDocument(
                trial=number,
                host=host,
                differences=confirmation.differences,
                mean=confirmation.mean,
                ci=confirmation.ci,
                pairs_run=len(confirmation.differences),
                pairs_planned=confirmation.planned_pairs,
                stopped=confirmation.stopped,
                told=confirmation.pairs_told(),
            )
            for number, host, confirmation in board.confirmations
        ],
    )
