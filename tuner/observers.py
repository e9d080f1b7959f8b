"""Progress hooks: the study reports what happens, observers show it. The study never imports rich.

A round of a trial is reported as it goes: `round_started`, then `server_starting` (a restart; `server_ready`
once healthy, then `warming_up` or the correctness `probing`) or `server_reused`, then `replay_started`, and
`round_finished`. Each event is defined once, as a method of `StudyObserver` that does nothing: an observer
subclasses it (or `NullObserver`) and overrides the events it cares about, and the fan-out `Observers` is
made from the same definitions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the console's observer subclasses these: a console needs no pydantic
    from tuner.config import ParamValue
    from tuner.study_record import Confirmation

__all__ = ["EVENTS", "FLEET_HOST", "NullObserver", "Observers", "StudyObserver"]

# The host whose loop reports an event, where one controller drives several hosts of a fleet (each loop is
# an asyncio task of its own, with its own value): their lines interleave, and the console names the host.
FLEET_HOST: ContextVar[str | None] = ContextVar("fleet_host", default=None)


class StudyObserver:
    """What the study reports, one method per event; each does nothing, so an observer overrides only the
    events it cares about."""

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        pass

    def baseline_read(self, *, values: list[str]) -> None:
        """The operator's server was read: each searched knob's value in the baseline, and where from."""

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        pass

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        """Round `index` of `total` of trial `number` begins (a confirmation's rounds count over all its pairs)."""

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
        """The best measured trial changed (the highest score of the trials that break no constraint, the
        baseline aside); also told once at the start when the study already has one."""

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        pass

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        pass

    def search_exhausted(self, *, proposals: int) -> None:
        pass

    def predicting(self, *, log: str) -> None:
        """The study's prediction (`search.predicted_from`) is being made: seconds, minutes for 200 configs."""

    def predicted(self, *, log: str, best: Mapping[str, ParamValue] | None, queued: bool, note: str | None) -> None:
        """The study's prediction, made now or read back from its run directory; whether its best was queued
        now (a resume finds it measured or queued already); `note`, what a person should know of it."""

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        pass

    def confirm_finished(self, *, number: int, result: Confirmation) -> None:
        """The re-measurement of trial `number` ended, after the pairs its sequential test needed."""

    def restoring(self) -> None:
        pass

    def study_ended(self, *, outcome: str) -> None:
        """The run is over, while it still holds the run directory: `finished`, `interrupted` (Ctrl-C,
        SIGTERM) or `failed` (an error, which the caller reports)."""


class NullObserver(StudyObserver):
    """Observes nothing; the base for observers that only care about some events."""


# The events by name, in the order they are declared above: what `Observers` forwards.
EVENTS: tuple[str, ...] = tuple(
    name for name, member in vars(StudyObserver).items() if callable(member) and not name.startswith("_")
)


class Observers(StudyObserver):
    """Tells each of several observers every event, in their order (the progress file, then the screen).
    Its event methods are made from `EVENTS` below, so a new event is written once, in `StudyObserver`."""

    def __init__(self, *observers: StudyObserver) -> None:
        self.observers = observers


def _told_to_each(event: str) -> Callable[..., None]:
    @functools.wraps(getattr(StudyObserver, event))  # the event's own signature, for `inspect` and the docs
    def tell(self: Observers, **arguments: Any) -> None:
        for observer in self.observers:
            getattr(observer, event)(**arguments)

    return tell


for _event in EVENTS:
    setattr(Observers, _event, _told_to_each(_event))
