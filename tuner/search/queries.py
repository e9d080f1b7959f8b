"""Read-only questions about a study's trials: a host's baseline, the trials the budget counts, the settings
measured before; and the best so far that the observer is told (the confirmation's candidates are
`tuner.study_view`'s)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.observers import StudyObserver
from tuner.study_record import TrialRecord
from tuner.study_view import trials_done

__all__ = [
    "BestSoFar",
    "claimed_trials",
    "deployed_trials",
    "is_baseline",
    "measured_settings",
    "over_budget",
    "own_baseline",
]


def is_baseline(trial: FrozenTrial | optuna.Trial) -> bool:
    return TrialRecord.of(trial).baseline


def own_baseline(study: optuna.Study, host: str | None) -> FrozenTrial | None:
    """The host's measured baseline (a one-host study's: host None): every score of a trial on that host is
    relative to its median."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (record := TrialRecord.of(trial)).baseline and record.host == host:  # this host's own
            return trial
    return None


def deployed_trials(study: optuna.Study) -> int:
    """Trials after the baseline that were deployed, on any host."""
    return trials_done(map(TrialRecord.of, study.get_trials(deepcopy=False)))


def claimed_trials(study: optuna.Study) -> int:
    """Deployed trials and those running but not deployed yet (a peer's batch waiting for its turn), on any
    host (the budget is the study's). A trial a dead controller left, re-queued, counts once: as its copy,
    once a host takes it."""
    return len(_claimed(study.get_trials(deepcopy=False)))


def _claimed(trials: Sequence[FrozenTrial]) -> dict[int, TrialRecord]:
    """The trials `claimed_trials` counts, by number, in order, with their records."""
    records = {trial.number: (trial, TrialRecord.of(trial)) for trial in trials}
    requeued = {record.requeued_from for _, record in records.values() if record.requeued_from is not None}
    return {
        number: record
        for number, (trial, record) in sorted(records.items())
        if not (record.baseline or number in requeued) and (record.deployed or trial.state == TrialState.RUNNING)
    }


def over_budget(study: optuna.Study, number: int, budget: int) -> bool:
    """Whether a trial just asked is one more than the study's budget: two hosts' controllers may both see
    one trial left and ask at once. Trial numbers order them, and the later of the two sees the earlier
    one's trial (created before its own), so exactly the later one is over. A re-queued trial's copy takes
    its original's place and is never over."""
    claimed = _claimed(study.get_trials(deepcopy=False))
    record = claimed.get(number)
    return record is not None and record.requeued_from is None and list(claimed).index(number) >= budget


def measured_settings(study: optuna.Study) -> dict[tuple[tuple[str, Any], ...], FrozenTrial]:
    """The deployed trials' settings (sorted items) and the trial that measured them, a whole measurement
    rather than a pruned one where both exist."""
    measured: dict[tuple[tuple[str, Any], ...], FrozenTrial] = {}
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    for trial in sorted(trials, key=lambda t: t.state != TrialState.COMPLETE):  # a whole measurement first
        record = TrialRecord.of(trial)
        if record.deployed and record.settings is not None:
            measured.setdefault(tuple(sorted(record.settings.items())), trial)
    return measured


class BestSoFar:
    """Tells the observer the best measured trial whenever it changes: the highest finite score of the
    completed trials that break no constraint, the baseline aside."""

    def __init__(self, study: optuna.Study, observer: StudyObserver) -> None:
        self.study = study
        self.observer = observer
        self.best: tuple[float, int, dict[str, ParamValue]] | None = None

    def tell_stored(self) -> None:
        """The best of the trials the study already holds (a resume's), read once."""
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            record = TrialRecord.of(trial)
            if record.deployed and not record.baseline and not record.violates and record.score is not None:
                self.consider(trial.number, record.score, record.settings or {}, tell=False)
        if self.best is not None:
            self.observer.best_so_far(number=self.best[1], score=self.best[0], settings=self.best[2])

    def consider(self, number: int, score: float, settings: Mapping[str, ParamValue], *, tell: bool = True) -> None:
        """A trial just scored (one that breaks no constraint, not the baseline)."""
        if math.isfinite(score) and (self.best is None or score > self.best[0]):
            self.best = (score, number, dict(settings))
            if tell:
                self.observer.best_so_far(number=number, score=score, settings=self.best[2])
