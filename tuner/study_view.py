"""One read model of a study, built once from its storage (and its run directory): every trial with its
record, its settings, its score and what it changes from the baseline; the baselines per host; the trials by
state; the count of trials done; and the one candidate rule that the confirmation and the recommendation
share, so the confirmation never spends its pairs of rounds on a trial that could never be recommended.

The readers (the leaderboard, `tuner apply`'s choice of a trial, the fleet summary) build it from a storage
opened read-only, the search loop from its own study. It imports neither the search loop nor the deployers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.prediction_record import PredictionRecord, read_prediction
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly
from tuner.study_record import Confirmation, HostRecord, StudyRecord, TrialRecord, host_records

__all__ = [
    "Contender",
    "StudyView",
    "TrialView",
    "is_scored",
    "recommendable",
    "to_confirm",
    "trials_done",
]


class Contender(Protocol):
    """What the candidate rule reads of a trial: a leaderboard row or a `TrialView`."""

    @property
    def number(self) -> int: ...
    @property
    def baseline(self) -> bool: ...
    @property
    def score(self) -> float | None: ...
    @property
    def changed(self) -> Mapping[str, ParamValue]: ...
    @property
    def violates(self) -> Sequence[str]: ...
    @property
    def answers_changed(self) -> float | None: ...


C = TypeVar("C", bound=Contender)


def is_scored(trial: Contender) -> bool:
    """Scored beside the baseline with settings of its own (the baseline itself, or a trial that changes
    nothing, has nothing to recommend)."""
    return not trial.baseline and trial.score is not None and bool(trial.changed)


def recommendable(trial: Contender, *, allow_answer_changes: bool) -> bool:
    """The one candidate rule: a trial the recommendation may choose, hence the only kind the confirmation
    re-measures. It is scored, breaks no constraint, and changes no answers unless the study allows it."""
    return is_scored(trial) and not trial.violates and (allow_answer_changes or not trial.answers_changed)


def to_confirm(trials: Iterable[C], *, allow_answer_changes: bool, top: int, confirmed: Collection[int]) -> list[C]:
    """Among deployed `trials` (a duplicate, told its twin's score, never was): the `top` best recommendable ones
    that scored above the baseline, less those already re-measured (a resumed confirmation does not move on to
    the next best). Equal scores keep the trials' order."""
    above = [t for t in trials if recommendable(t, allow_answer_changes=allow_answer_changes) and (t.score or 0) > 0]
    best = sorted(above, key=lambda t: -(t.score or 0.0))[:top]
    return [t for t in best if t.number not in confirmed]


def trials_done(records: Iterable[TrialRecord]) -> int:
    """Trials after the baseline that were deployed (what the budget counts), among `records`."""
    return sum(1 for record in records if record.deployed and not record.baseline)


def _score(trial: FrozenTrial, record: TrialRecord) -> float | None:
    if trial.state != TrialState.COMPLETE:
        return None
    if record.score is not None:
        return record.score
    return trial.values[0] if trial.values and len(trial.values) == 1 else None


def _settings_of(trial: FrozenTrial, record: TrialRecord) -> dict[str, ParamValue]:
    # A baseline enqueued and deployed has no decoded settings only if the controller died in between.
    return dict(record.settings if record.settings is not None else trial.params)


@dataclass(frozen=True, kw_only=True)
class TrialView:
    """One trial as every reader sees it."""

    trial: FrozenTrial
    record: TrialRecord
    settings: dict[str, ParamValue]  # every searched knob's value in this trial
    changed: dict[str, ParamValue]  # those that differ from the baseline's; empty for the baseline
    score: float | None  # against its host's baseline; None unless COMPLETE

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def state(self) -> TrialState:
        return self.trial.state

    @property
    def baseline(self) -> bool:
        return self.record.baseline

    @property
    def deployed(self) -> bool:
        return self.record.deployed

    @property
    def host(self) -> str | None:
        return self.record.host

    @property
    def violates(self) -> list[str]:
        return self.record.violates

    @property
    def answers_changed(self) -> float | None:
        return self.record.answers_changed


@dataclass(frozen=True, kw_only=True)
class StudyView:
    """A study read once: its trials in number order, its record and its fleet hosts' records."""

    name: str
    record: StudyRecord
    hosts: dict[str, HostRecord]  # a fleet's hosts by name; empty for a one-host study
    trials: tuple[TrialView, ...]
    front: frozenset[int]  # the Pareto front's trial numbers (several objectives), else empty
    run_dir: RunDirectory | None = None

    @classmethod
    def of(cls, study: optuna.Study, run_dir: RunDirectory | None = None) -> StudyView:
        frozen = study.get_trials(deepcopy=False)
        records = [(trial, TrialRecord.of(trial)) for trial in frozen]
        # Every trial's changes are against the first measured baseline's settings (a fleet's hosts share them).
        first = next(
            (
                (trial, record)
                for trial, record in records
                if record.deployed and record.baseline and trial.state == TrialState.COMPLETE
            ),
            None,
        )
        base = {} if first is None else _settings_of(*first)
        trials = []
        for trial, record in records:
            settings = _settings_of(trial, record)
            changed = {} if record.baseline else {k: v for k, v in settings.items() if base.get(k) != v}
            trials.append(
                TrialView(trial=trial, record=record, settings=settings, changed=changed, score=_score(trial, record))
            )
        return cls(
            name=study.study_name,
            record=StudyRecord.of(study),
            hosts=host_records(study),
            trials=tuple(trials),
            front=frozenset(t.number for t in study.best_trials) if len(study.directions) > 1 else frozenset(),
            run_dir=run_dir,
        )

    @classmethod
    def open(cls, run_dir: RunDirectory, storage_url: str | None = None) -> StudyView:
        """The study a run directory holds (a fleet's from the storage its spec names), read-only."""
        return cls.of(open_optuna_study_readonly(run_dir, storage_url), run_dir)

    def prediction(self) -> PredictionRecord | None:
        """The prediction the study started from (`search.predicted_from`), where its run directory has one."""
        return None if self.run_dir is None else read_prediction(self.run_dir.prediction_path)

    def in_state(self, *states: TrialState) -> list[TrialView]:
        return [t for t in self.trials if t.state in states]

    @property
    def deployed(self) -> list[TrialView]:
        """The trials that reached a host, the baselines included: the leaderboard's rows."""
        return [t for t in self.trials if t.deployed]

    @property
    def baselines(self) -> dict[str | None, TrialView]:
        """Each host's measured baseline (a one-host study's under None): the first complete one, which every
        score on that host is relative to."""
        found: dict[str | None, TrialView] = {}
        for t in self.trials:
            if t.deployed and t.baseline and t.state == TrialState.COMPLETE:
                found.setdefault(t.host, t)
        return found

    def trials_done(self, host: str | None = None) -> int:
        """Trials after the baseline that were deployed: on any host, or on `host` alone."""
        return trials_done(t.record for t in self.trials if host is None or t.host == host)

    @property
    def allow_answer_changes(self) -> bool:
        return self.record.allow_answer_changes

    def confirmations(self, host: str | None = None) -> dict[int, Confirmation]:
        """The study's re-measurements, or a fleet host's (each against that host's own baseline)."""
        if host is None:
            return self.record.confirmations
        return self.hosts.get(host, HostRecord()).confirmations

    def candidates(self) -> list[TrialView]:
        """The trials the recommendation may choose, best first."""
        ranked = sorted(self.deployed, key=lambda t: (t.score is None, -(t.score or 0.0), t.number))
        return [t for t in ranked if recommendable(t, allow_answer_changes=self.allow_answer_changes)]

    def to_confirm(self, *, top: int, host: str | None = None) -> list[TrialView]:
        """What the confirmation re-measures next on `host` (None: a one-host study)."""
        return to_confirm(
            self.deployed, allow_answer_changes=self.allow_answer_changes, top=top, confirmed=self.confirmations(host)
        )
