"""The peers protocol: what the search loop asks of the other controllers driving its study. A single host
has none (`SoloPeers`, whose calls do nothing); a fleet's host has its peers (`tuner.search.fleet_peers`).
The loop calls the same hooks either way and has no branch on which it is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.search.ending import end_trial
from tuner.search.queries import is_baseline
from tuner.server_reuse import Servers
from tuner.study_record import (
    INTERRUPTED,
    StudyRecord,
    TrialRecord,
    new_trial_attrs,
    update_study_record,
)
from tuner.trial_runner import PreparedStudy

__all__ = ["Peers", "Pending", "SoloPeers", "requeue_baseline"]


@dataclass(kw_only=True)
class Pending:
    """A trial being measured in the current batch."""

    trial: optuna.Trial
    settings: dict[str, ParamValue]
    baseline: bool
    planned: int
    rounds: list[dict[str, float | None]] = field(default_factory=list)
    pruned: bool = False


class _Record(Protocol):
    @property
    def reference_answers(self) -> list[list[int]] | None: ...
    @property
    def confirmations(self) -> dict[int, Any]: ...


class Peers(Protocol):
    """The loop's hooks; a method returning a reason (`str`) has ended the trial as skipped with it."""

    host: str | None  # the host this loop measures on (None: the study's only one)
    prepared: PreparedStudy  # the loop's, its baseline's settings read from the host once it is reached

    def begin(self) -> None:
        """A (re)start's housekeeping before the host is reached: interrupted trials, the baseline queued."""

    def record(self) -> _Record:
        """This host's part of the study record (its reference answers, its confirmations)."""

    def update_record(self, **changes: Any) -> None: ...

    def leases(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while the loop searches: the running trials' leases renewed."""

    def before_asking(self, baseline: FrozenTrial | None) -> Pending | None:
        """A batch of its own to measure first (this host's baseline), or None."""

    def took(self, trial: optuna.Trial) -> str | None: ...

    def measuring(self, trial: optuna.Trial, settings: dict[str, ParamValue]) -> str | None: ...

    def done(self, batch: list[Pending]) -> None: ...

    async def check_host(self, servers: Servers, baseline_of: Callable[[], FrozenTrial | None]) -> None: ...

    async def wait(self, deadline: float | None, *, exhausted: bool) -> bool:
        """Whether the loop searches again, once the peers' trials are done."""


def requeue_baseline(study: optuna.Study, params: dict[str, Any]) -> None:
    """The queued baseline's parameters set to `params` (the values read from the operator's server), so
    that the samplers, which read a trial's parameters, see the baseline where it was measured. Optuna keeps
    an enqueued trial's parameters as its `fixed_params`, which a waiting trial may still change."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if is_baseline(trial):
            study._storage.set_trial_system_attr(trial._trial_id, "fixed_params", params)


class SoloPeers:
    """A single host's loop: no peers, so no leases, no wait and nothing measured elsewhere."""

    host: str | None = None

    def __init__(self, study: optuna.Study, prepared: PreparedStudy) -> None:
        self.study = study
        self.prepared = prepared

    def begin(self) -> None:
        # A trial left RUNNING was the controller's that died (we hold the run directory's lock now).
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            end_trial(
                self.study, optuna.Trial(self.study, trial._trial_id), state=TrialState.FAIL, fail_reason=INTERRUPTED
            )
        trials = self.study.get_trials(deepcopy=False)
        done = any(is_baseline(t) and t.state == TrialState.COMPLETE for t in trials)
        queued = any(is_baseline(t) and t.state == TrialState.WAITING for t in trials)
        if not done and not queued:
            settings = self.prepared.space.encode(self.prepared.baseline_settings)
            self.study.enqueue_trial(settings, user_attrs=new_trial_attrs(TrialRecord(baseline=True)))

    def record(self) -> StudyRecord:
        return StudyRecord.of(self.study)

    def update_record(self, **changes: Any) -> None:
        update_study_record(self.study, **changes)

    def leases(self) -> contextlib.AbstractAsyncContextManager[None]:
        return _nothing()

    def before_asking(self, baseline: FrozenTrial | None) -> Pending | None:
        return None

    def took(self, trial: optuna.Trial) -> str | None:
        return None

    def measuring(self, trial: optuna.Trial, settings: dict[str, ParamValue]) -> str | None:
        return None

    def done(self, batch: list[Pending]) -> None:
        pass

    async def check_host(self, servers: Servers, baseline_of: Callable[[], FrozenTrial | None]) -> None:
        pass

    async def wait(self, deadline: float | None, *, exhausted: bool) -> bool:
        return False


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield
