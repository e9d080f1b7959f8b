"""Progress hooks: the study reports what happens, observers show it. The study never imports rich."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the console's observer subclasses these: a console needs no pydantic
    from tuner.config import ParamValue

__all__ = ["NullObserver", "ObserverGroup", "StudyObserver"]


class StudyObserver(Protocol):
    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None: ...

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None: ...

    def server_ready(self, *, number: int, seconds: float) -> None: ...

    def server_reused(self, *, number: int) -> None: ...

    def round_finished(
        self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int
    ) -> None: ...

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None: ...

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None: ...

    def trial_failed(self, *, number: int, reason: str) -> None: ...

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None: ...

    def remeasuring(self, *, metrics: list[str], extra: int) -> None: ...

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None: ...

    def search_exhausted(self, *, proposals: int) -> None: ...

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None: ...

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None: ...

    def restoring(self) -> None: ...


class NullObserver:
    """Observes nothing; the base for observers that only care about some events."""

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        pass

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        pass

    def server_ready(self, *, number: int, seconds: float) -> None:
        pass

    def server_reused(self, *, number: int) -> None:
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


class ObserverGroup:
    """Tells every one of its observers each event, in order (the console, the morning report, ...)."""

    def __init__(self, *observers: StudyObserver) -> None:
        self.observers = observers

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        for observer in self.observers:
            observer.study_started(
                name=name, run_dir=run_dir, baseline_done=baseline_done, trials_done=trials_done, budget=budget
            )

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        for observer in self.observers:
            observer.trial_started(number=number, settings=settings, baseline=baseline)

    def server_ready(self, *, number: int, seconds: float) -> None:
        for observer in self.observers:
            observer.server_ready(number=number, seconds=seconds)

    def server_reused(self, *, number: int) -> None:
        for observer in self.observers:
            observer.server_reused(number=number)

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        for observer in self.observers:
            observer.round_finished(number=number, label=label, metrics=metrics, failures=failures)

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        for observer in self.observers:
            observer.replay_fell_behind(number=number, label=label, reason=reason)

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        for observer in self.observers:
            observer.trial_finished(number=number, score=score, noisy=noisy)

    def trial_failed(self, *, number: int, reason: str) -> None:
        for observer in self.observers:
            observer.trial_failed(number=number, reason=reason)

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        for observer in self.observers:
            observer.trial_pruned(number=number, reason=reason, saved_s=saved_s)

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        for observer in self.observers:
            observer.remeasuring(metrics=metrics, extra=extra)

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        for observer in self.observers:
            observer.trial_skipped(settings=settings, reason=reason)

    def search_exhausted(self, *, proposals: int) -> None:
        for observer in self.observers:
            observer.search_exhausted(proposals=proposals)

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        for observer in self.observers:
            observer.confirm_started(number=number, settings=settings, pairs=pairs)

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        for observer in self.observers:
            observer.confirm_finished(number=number, mean=mean, low=low, high=high)

    def restoring(self) -> None:
        for observer in self.observers:
            observer.restoring()
