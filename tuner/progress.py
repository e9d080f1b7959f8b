"""Where a run stands, as it goes: `ProgressTracker` is an observer of the study that folds its events into
one state: the trial and the phase under way, the rounds done and left, the time a round takes and so an
estimate of the time left (new trials stop at the budget's hours), and the best trial so far. At each event
it writes that state as `runs/<study>/progress.json` (`Progress`, `tuner.progress_file`; atomically: a reader
sees the last whole state). Controllers of a fleet that share a run directory (`tuner run --host NAME`) each
write their own file, `progress-<host>.json` (`progress_file`). `tuner status` reads them (`tuner.status`).

Pure: no rich, no optuna.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.config import ParamValue
from tuner.errors import StudyError, TunerError
from tuner.files import write_atomic
from tuner.observers import NullObserver
from tuner.progress_file import PHASES, BestTrial, CurrentRound, Progress, RunState, read_progress
from tuner.text import settings_text

if TYPE_CHECKING:
    from tuner.config import StudySpec
    from tuner.study_record import Confirmation

__all__ = ["Plan", "ProgressTracker"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the study file says about the run's length."""

    budget_trials: int
    budget_hours: float | None
    rounds_per_trial: int
    confirm_top: int
    confirm_pairs: int

    @classmethod
    def of(cls, spec: StudySpec) -> Plan:
        return cls(
            budget_trials=spec.budget.trials,
            budget_hours=spec.budget.hours,
            rounds_per_trial=spec.rounds,
            confirm_top=spec.confirm.top,
            confirm_pairs=spec.confirm.pairs,
        )


@dataclass(kw_only=True)
class _Trial:
    baseline: bool
    settings: dict[str, ParamValue]
    planned: int
    done: int = 0


@dataclass(kw_only=True)
class _State:
    study: str = ""
    started_at: float = 0.0
    state: RunState = "running"
    baseline_done: bool = False
    trials_done: int = 0
    started_trials: int = 0  # trials after the baseline deployed, across resumes (the budget's count)
    batch: dict[int, _Trial] = field(default_factory=dict)
    failed: int = 0
    pruned: int = 0
    exhausted: bool = False
    confirm_started: int = 0  # candidates whose re-measurement began
    confirming: int | None = None
    confirm_settings: dict[str, ParamValue] = field(default_factory=dict)
    confirm_left: int = 0  # rounds left in the current candidate's re-measurement
    over: bool = False  # restoring: no round is left
    rounds_done: int = 0
    round_time_s: float = 0.0  # every round attempt's time, from its start to its end
    round_began: float | None = None
    current: CurrentRound | None = None
    best: BestTrial | None = None
    last: str = "starting"
    phase_seconds: dict[str, float] = field(default_factory=dict)
    counting: str | None = None  # the phase the clock runs for now (one of PHASES)
    counting_since: float = 0.0

    def count(self, phase: str | None, now: float) -> None:
        """Ends the phase being counted and starts counting `phase` (None: nothing, the run is over)."""
        if self.counting is not None:
            elapsed = max(0.0, now - self.counting_since)
            self.phase_seconds[self.counting] = self.phase_seconds.get(self.counting, 0.0) + elapsed
        self.counting, self.counting_since = phase, now

    def phase_seconds_at(self, now: float) -> dict[str, float]:
        seconds = dict(self.phase_seconds)
        if self.counting is not None:  # the phase under way, so far
            seconds[self.counting] = seconds.get(self.counting, 0.0) + max(0.0, now - self.counting_since)
        return {phase: round(seconds[phase], 3) for phase in PHASES if phase in seconds}

    def round_s(self) -> float | None:
        return self.round_time_s / self.rounds_done if self.rounds_done else None

    def estimate(self, plan: Plan, now: float) -> tuple[int, float | None, bool]:
        """Rounds left, time left and whether the budget's hours cut it.

        Rounds left: those of the batch under way (each trial's planned rounds, extra ones for noisy rounds
        included), the baseline's if it is not measured yet, every trial the budget still allows, and the
        confirmation's pairs (assumed to happen: it does when a trial beats the baseline). Each takes the
        mean round time so far; no new batch starts after the budget's hours, so the trials it would bring
        count only as far as the time left reaches. Once the search is over with no trial above the
        baseline, no confirmation is counted."""
        if self.over or self.state != "running":
            return 0, (0.0 if self.rounds_done else None), False
        must = sum(max(0, t.planned - t.done) for t in self.batch.values())
        if not self.baseline_done and not any(t.baseline for t in self.batch.values()):
            must += plan.rounds_per_trial
        searching = self.confirming is None and self.confirm_started == 0 and not self.exhausted
        future = max(0, plan.budget_trials - self.started_trials) * plan.rounds_per_trial if searching else 0
        confirm = self.confirm_left + max(0, plan.confirm_top - self.confirm_started) * 2 * plan.confirm_pairs
        if self.confirm_started == 0 and not (must or future) and (self.best is None or self.best.score <= 0):
            confirm = 0  # the search is over and no trial beat the baseline: nothing to confirm
        round_s = self.round_s()
        if round_s is None:
            return must + future + confirm, None, False
        in_round = 0.0 if self.round_began is None else min(round_s, max(0.0, now - self.round_began))
        capped = False
        if plan.budget_hours is not None and future:
            time_left = self.started_at + plan.budget_hours * 3600 - now
            affordable = max(0.0, time_left - must * round_s)
            if future * round_s > affordable:
                capped = True
                future = math.ceil(affordable / round_s) if round_s > 0 else 0
        rounds = must + future + confirm
        return rounds, max(0.0, rounds * round_s - in_round), capped

    def end_round(self, now: float, *, measured: bool) -> None:
        if self.round_began is not None:
            self.round_time_s += now - self.round_began
            self.round_began = None
        if measured:
            self.rounds_done += 1

    def end_trial(self, number: int, *, scored: bool = False) -> _Trial | None:
        trial = self.batch.pop(number, None)
        if trial is not None and trial.baseline:
            self.baseline_done = self.baseline_done or scored  # a failed baseline ends the run unmeasured
        elif trial is not None:
            self.trials_done += 1
        if self.current is not None and self.current.number == number:
            self.current = None
        return trial


_ENDINGS: dict[str, tuple[RunState, str]] = {
    "finished": ("finished", "the run finished"),
    "interrupted": ("interrupted", "the run was interrupted (the baseline restored)"),
    "failed": ("failed", "the run stopped on an error (the baseline restored)"),
}


def _settings_text(settings: Mapping[str, ParamValue]) -> str:
    return settings_text(settings, empty="baseline")


class ProgressTracker(NullObserver):
    """Folds the study's events into a `Progress`, written to `path` (when given) at each event.

    Thread-safe: the live display reads `snapshot()` from its refresh thread while events arrive."""

    def __init__(self, plan: Plan, *, path: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.plan = plan
        self.path = path
        self.clock = clock
        self.write_error: str | None = None  # the last failed write: the run goes on without the file
        self._state = _State()
        self._seen_start = False
        self._lock = threading.Lock()

    # -- reading

    def snapshot(self, now: float | None = None) -> Progress:
        with self._lock:
            return self._snapshot(self.clock() if now is None else now)

    def _snapshot(self, now: float) -> Progress:
        s, plan = self._state, self.plan
        rounds_left, eta_s, capped = s.estimate(plan, now)
        return Progress(
            study=s.study,
            pid=os.getpid(),
            state=s.state,
            started_at=s.started_at,
            updated_at=now,
            budget_trials=plan.budget_trials,
            budget_hours=plan.budget_hours,
            rounds_per_trial=plan.rounds_per_trial,
            confirm_top=plan.confirm_top,
            confirm_pairs=plan.confirm_pairs,
            baseline_done=s.baseline_done,
            trials_done=s.trials_done,
            trials_running=sorted(s.batch),
            failed=s.failed,
            pruned=s.pruned,
            confirming=s.confirming,
            rounds_done=s.rounds_done,
            rounds_left=rounds_left,
            round_s=s.round_s(),
            eta_s=eta_s,
            eta_capped=capped,
            current=s.current,
            best=s.best,
            last=s.last,
            phase_seconds=s.phase_seconds_at(now),
        )

    # -- writing

    def study_ended(self, *, outcome: str) -> None:
        """`finished`, `interrupted` or `failed`. Nothing is written when the study never started (another
        run held the directory, say): the file is that run's."""
        state, said = _ENDINGS.get(outcome, _ENDINGS["failed"])
        with self._lock:
            if not self._seen_start:
                return
            s = self._state
            s.count(None, self.clock())
            s.state, s.current, s.round_began, s.last = state, None, None, said
            self._save()

    def _save(self) -> None:
        if self.path is None or not self._seen_start:
            return
        data = self._snapshot(self.clock()).model_dump_json(indent=2) + "\n"
        try:
            write_atomic(self.path, data.encode())
        except (OSError, TunerError) as exc:  # a full disk: the run matters more than its progress file
            self.write_error = str(exc)
        else:
            self.write_error = None

    def _event(self, change: Callable[[_State, float], None]) -> None:
        with self._lock:
            change(self._state, self.clock())
            self._save()

    def _phase(self, number: int, phase: str, *, counted_as: str | None = None) -> None:
        def change(s: _State, now: float) -> None:
            if counted_as is not None:
                s.count(counted_as, now)
            if s.current is not None and s.current.number == number:
                s.current = s.current.model_copy(update={"phase": phase, "phase_since": now})

        self._event(change)

    def _earlier_phase_seconds(self, name: str) -> dict[str, float]:
        """A resumed run's time so far, from the progress file its last session left."""
        if self.path is None:
            return {}
        try:
            earlier = read_progress(self.path.parent, self.path.name)
        except StudyError:
            return {}
        if earlier is None or earlier.study != name:
            return {}
        return {phase: seconds for phase, seconds in earlier.phase_seconds.items() if phase in PHASES}

    # -- the study's events

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        def change(s: _State, now: float) -> None:
            self._seen_start = True
            s.study, s.started_at = name, now
            s.phase_seconds = self._earlier_phase_seconds(name)
            s.count(PHASES[-1], now)
            s.baseline_done, s.trials_done, s.started_trials = baseline_done, trials_done, trials_done
            s.last = f"resumed: baseline and {trials_done} trials measured before" if baseline_done else "started"

        self._event(change)

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        def change(s: _State, now: float) -> None:
            s.batch[number] = _Trial(baseline=baseline, settings=dict(settings), planned=self.plan.rounds_per_trial)
            if not baseline:
                s.started_trials += 1
            s.last = f"trial {number} ({'baseline' if baseline else _settings_text(settings)}) started"

        self._event(change)

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        def change(s: _State, now: float) -> None:
            trial = s.batch.get(number)
            if s.confirming is not None:  # a pair's round: the candidate's, or the baseline's
                baseline = number != s.confirming
                settings = {} if baseline else dict(s.confirm_settings)
            else:
                baseline = trial is not None and trial.baseline
                settings = {} if trial is None or baseline else dict(trial.settings)
                if trial is not None:
                    trial.planned = max(trial.planned, total)
            s.round_began = now
            s.count(PHASES[0], now)
            s.current = CurrentRound(
                number=number,
                baseline=baseline,
                settings=settings,
                label=label,
                index=index,
                total=total,
                phase="getting the server ready",
                phase_since=now,
            )

        self._event(change)

    def server_starting(self, *, number: int) -> None:
        self._phase(number, "starting the server")

    def server_ready(self, *, number: int, seconds: float) -> None:
        self._phase(number, f"server healthy after {seconds:.1f} s")

    def warming_up(self, *, number: int) -> None:
        self._phase(number, "warming up", counted_as=PHASES[2])

    def probing(self, *, number: int) -> None:
        self._phase(number, "correctness probes", counted_as=PHASES[3])

    def server_reused(self, *, number: int) -> None:
        self._phase(number, "on the running server, its slots cleared", counted_as=PHASES[1])

    def replay_started(self, *, number: int, label: str) -> None:
        self._phase(number, "replaying the workload", counted_as=PHASES[4])

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        def change(s: _State, now: float) -> None:
            s.end_round(now, measured=True)
            s.count(PHASES[-1], now)
            trial = s.batch.get(number)
            if s.confirming is not None:
                s.confirm_left = max(0, s.confirm_left - 1)
            elif trial is not None:
                trial.done += 1
            if s.current is not None and s.current.number == number:
                s.current = s.current.model_copy(update={"phase": "round measured", "phase_since": now})
            failed = f", {failures} requests failed" if failures else ""
            s.last = f"trial {number} {label} measured{failed}"

        self._event(change)

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        def change(s: _State, now: float) -> None:
            s.last = f"trial {number} {label}: {reason}"

        self._event(change)

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        def change(s: _State, now: float) -> None:
            s.end_trial(number, scored=True)
            s.last = f"trial {number} scored {score:+.2f}"

        self._event(change)

    def trial_failed(self, *, number: int, reason: str) -> None:
        def change(s: _State, now: float) -> None:
            if s.current is not None and s.current.number == number:
                s.end_round(now, measured=False)
            trial = s.end_trial(number)
            if trial is not None and not trial.baseline:
                s.failed += 1
            s.last = f"trial {number} FAILED: {reason}"

        self._event(change)

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        def change(s: _State, now: float) -> None:
            s.end_trial(number)
            s.pruned += 1
            s.last = f"trial {number} {reason}"

        self._event(change)

    def best_so_far(self, *, number: int, score: float, settings: Mapping[str, ParamValue]) -> None:
        def change(s: _State, now: float) -> None:
            s.best = BestTrial(number=number, score=score, settings=dict(settings))

        self._event(change)

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        def change(s: _State, now: float) -> None:
            trial = s.batch.get(s.current.number) if s.current is not None else None
            if trial is not None:
                trial.planned += extra
            s.last = f"rounds differ by 20%+ on {', '.join(metrics)}: {extra} more round(s)"

        self._event(change)

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        def change(s: _State, now: float) -> None:
            s.last = f"skipped {_settings_text(settings)}: {reason}"

        self._event(change)

    def search_exhausted(self, *, proposals: int) -> None:
        def change(s: _State, now: float) -> None:
            s.exhausted = True
            s.last = "the search space looks exhausted: the search ends here"

        self._event(change)

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        def change(s: _State, now: float) -> None:
            s.batch.clear()
            s.confirming, s.confirm_left = number, 2 * pairs
            s.confirm_started += 1
            s.confirm_settings = dict(settings)
            s.last = f"re-measuring trial {number} against the baseline in up to {pairs} pairs"

        self._event(change)

    def confirm_finished(self, *, number: int, result: Confirmation) -> None:
        low, high = result.ci

        def change(s: _State, now: float) -> None:
            s.confirming, s.confirm_left, s.current = None, 0, None
            s.last = (
                f"trial {number} against the baseline: {result.mean:+.2f}, 95% interval {low:+.2f}..{high:+.2f} "
                f"over {result.pairs_told()}"
            )

        self._event(change)

    def restoring(self) -> None:
        def change(s: _State, now: float) -> None:
            s.over, s.current, s.round_began, s.batch = True, None, None, {}
            s.last = "restoring the baseline"

        self._event(change)
