"""Progress hooks: the study reports what happens, observers show it. The study never imports rich."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the console's observer subclasses these: a console needs no pydantic
    from tuner.config import ParamValue

__all__ = ["NullObserver", "StudyObserver"]


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
