"""Progress hooks: the study reports what happens, observers show it. The study never imports rich.

A round of a trial is reported as it goes: `round_started`, then `server_starting` (a restart; `server_ready`
once healthy, then `warming_up` or the correctness `probing`) or `server_reused`, then `replay_started`, and
`round_finished`. Every observer subclasses `NullObserver`, so one that ignores an event needs no method for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the console's observer subclasses these: a console needs no pydantic
    from tuner.config import ParamValue

__all__ = ["FLEET_HOST", "NullObserver", "Observers", "StudyObserver"]

# The host whose loop reports an event, where one controller drives several hosts of a fleet (each loop is
# an asyncio task of its own, with its own value): their lines interleave, and the console names the host.
FLEET_HOST: ContextVar[str | None] = ContextVar("fleet_host", default=None)


class StudyObserver(Protocol):
    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None: ...

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None: ...

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        """Round `index` of `total` of trial `number` begins (a confirmation's rounds count over all its pairs)."""
        ...

    def server_starting(self, *, number: int) -> None: ...

    def server_ready(self, *, number: int, seconds: float) -> None: ...

    def warming_up(self, *, number: int) -> None: ...

    def probing(self, *, number: int) -> None: ...

    def server_reused(self, *, number: int) -> None: ...

    def replay_started(self, *, number: int, label: str) -> None: ...

    def round_finished(
        self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int
    ) -> None: ...

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None: ...

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None: ...

    def trial_failed(self, *, number: int, reason: str) -> None: ...

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None: ...

    def best_so_far(self, *, number: int, score: float, settings: Mapping[str, ParamValue]) -> None:
        """The best measured trial changed (the highest score of the trials that break no constraint, the
        baseline aside); also told once at the start when the study already has one."""
        ...

    def remeasuring(self, *, metrics: list[str], extra: int) -> None: ...

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None: ...

    def search_exhausted(self, *, proposals: int) -> None: ...

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None: ...

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None: ...

    def restoring(self) -> None: ...

    def study_ended(self, *, outcome: str) -> None:
        """The run is over, while it still holds the run directory: `finished`, `interrupted` (Ctrl-C,
        SIGTERM) or `failed` (an error, which the caller reports)."""
        ...


class NullObserver:
    """Observes nothing; the base for observers that only care about some events."""

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        pass

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        pass

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        pass

    def server_starting(self, *, number: int) -> None:
        pass

    def server_ready(self, *, number: int, seconds: float) -> None:
        pass

    def warming_up(self, *, number: int) -> None:
        pass

    def probing(self, *, number: int) -> None:
        pass

    def server_reused(self, *, number: int) -> None:
        pass

    def replay_started(self, *, number: int, label: str) -> None:
        pass

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        pass

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        pass

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        pass

    def trial_failed(self, *, number: int, reason: str) -> None:
        pass

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        pass

    def best_so_far(self, *, number: int, score: float, settings: Mapping[str, ParamValue]) -> None:
        pass

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        pass

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        pass

    def search_exhausted(self, *, proposals: int) -> None:
        pass

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        pass

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        pass

    def restoring(self) -> None:
        pass

    def study_ended(self, *, outcome: str) -> None:
        pass


class Observers:
    """Tells each of several observers every event, in their order (the progress file, then the screen)."""

    def __init__(self, *observers: StudyObserver) -> None:
        self.observers = observers

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        for o in self.observers:
            o.study_started(
                name=name, run_dir=run_dir, baseline_done=baseline_done, trials_done=trials_done, budget=budget
            )

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        for o in self.observers:
            o.trial_started(number=number, settings=settings, baseline=baseline)

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        for o in self.observers:
            o.round_started(number=number, label=label, index=index, total=total)

    def server_starting(self, *, number: int) -> None:
        for o in self.observers:
            o.server_starting(number=number)

    def server_ready(self, *, number: int, seconds: float) -> None:
        for o in self.observers:
            o.server_ready(number=number, seconds=seconds)

    def warming_up(self, *, number: int) -> None:
        for o in self.observers:
            o.warming_up(number=number)

    def probing(self, *, number: int) -> None:
        for o in self.observers:
            o.probing(number=number)

    def server_reused(self, *, number: int) -> None:
        for o in self.observers:
            o.server_reused(number=number)

    def replay_started(self, *, number: int, label: str) -> None:
        for o in self.observers:
            o.replay_started(number=number, label=label)

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        for o in self.observers:
            o.round_finished(number=number, label=label, metrics=metrics, failures=failures)

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        for o in self.observers:
            o.replay_fell_behind(number=number, label=label, reason=reason)

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        for o in self.observers:
            o.trial_finished(number=number, score=score, noisy=noisy)

    def trial_failed(self, *, number: int, reason: str) -> None:
        for o in self.observers:
            o.trial_failed(number=number, reason=reason)

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        for o in self.observers:
            o.trial_pruned(number=number, reason=reason, saved_s=saved_s)

    def best_so_far(self, *, number: int, score: float, settings: Mapping[str, ParamValue]) -> None:
        for o in self.observers:
            o.best_so_far(number=number, score=score, settings=settings)

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        for o in self.observers:
            o.remeasuring(metrics=metrics, extra=extra)

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        for o in self.observers:
            o.trial_skipped(settings=settings, reason=reason)

    def search_exhausted(self, *, proposals: int) -> None:
        for o in self.observers:
            o.search_exhausted(proposals=proposals)

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        for o in self.observers:
            o.confirm_started(number=number, settings=settings, pairs=pairs)

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        for o in self.observers:
            o.confirm_finished(number=number, mean=mean, low=low, high=high)

    def restoring(self) -> None:
        for o in self.observers:
            o.restoring()

    def study_ended(self, *, outcome: str) -> None:
        for o in self.observers:
            o.study_ended(outcome=outcome)
