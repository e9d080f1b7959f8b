"""Where a run stands, for the live display and for `tuner status` in another shell.

`ProgressTracker` is an observer of the study that folds its events into one state: the trial and the
phase under way, the rounds done and left, the time a round takes and so an estimate of the time left
(new trials stop at the budget's hours), and the best trial so far. At each event it writes that state
as `runs/<study>/progress.json` (`Progress`, atomically: a reader sees the last whole state), so that
another process reads it without opening the journal, whose lock belongs to the run. Controllers of a
fleet that share a run directory (`tuner run --host NAME`) each write their own file,
`progress-<host>.json` (`progress_file`), and `tuner status` shows each.

Pure: no rich, no optuna; `tuner status` reads the file with pydantic alone.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.config import NAME_PATTERN, ParamValue
from tuner.errors import ConfigError, StudyError, TunerError
from tuner.files import write_atomic
from tuner.observers import NullObserver

if TYPE_CHECKING:
    from tuner.config import StudySpec

__all__ = [
    "PROGRESS_FILE",
    "PROGRESS_VERSION",
    "BestTrial",
    "CurrentRound",
    "Plan",
    "Progress",
    "ProgressTracker",
    "RunStatus",
    "controller_statuses",
    "duration_text",
    "held_by",
    "progress_file",
    "read_progress",
    "run_status",
]

PROGRESS_FILE = "progress.json"
PROGRESS_VERSION = 1

RunState = Literal["running", "finished", "interrupted", "failed"]


_CONTROLLER_PREFIX = "progress-"


# A file name has at most 255 bytes; a controller of many long host names is named by its first and how
# many more ("=N", a character no host name has): a host is held by one controller at a time.
_NAMED_HOSTS_MAX = 200
_HOST_NAME = re.compile(NAME_PATTERN)


def progress_file(hosts: Sequence[str] = ()) -> str:
    """The progress file of a controller: `progress.json` for a run directory's one controller (a one-host
    study, or a fleet's driving every host), `progress-<host>[+<host>...].json` for one of the controllers
    that share it, each running the hosts it was given (`--host`): one file would be the last writer's."""
    if not hosts:
        return PROGRESS_FILE
    named = sorted(set(hosts))
    joined = "+".join(named)
    if len(joined) > _NAMED_HOSTS_MAX:
        joined = f"{named[0]}+={len(named) - 1}"
    return f"{_CONTROLLER_PREFIX}{joined}.json"


def _controller_files(run_path: Path) -> list[Path]:
    """The controllers' progress files: named as `progress_file` names them, regular files (not links)."""
    return sorted(
        path
        for path in run_path.glob(f"{_CONTROLLER_PREFIX}*.json")
        if path.is_file() and not path.is_symlink() and all(map(_HOST_NAME.match, _controller_hosts(path)))
    )


def _controller_hosts(path: Path) -> tuple[str, ...]:
    """The hosts a controller's progress file is named after (`progress_file`'s inverse; "=N": N more)."""
    parts = path.name.removeprefix(_CONTROLLER_PREFIX).removesuffix(".json").split("+")
    return tuple(part for part in parts if not (part.startswith("=") and part[1:].isdigit() and len(parts) == 2))


class _Strict(BaseModel):
    # Written by this module only: strict, unknown keys refused, so a damaged file or a newer writer's
    # is refused with one line instead of being shown wrongly.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class BestTrial(_Strict):
    number: int
    score: float
    settings: dict[str, ParamValue]


class CurrentRound(_Strict):
    """The round under way and its phase."""

    number: int = Field(description="The trial the round measures (the baseline's in a confirmation's pair).")
    baseline: bool
    settings: dict[str, ParamValue] = Field(description="What the trial sets; empty for the baseline.")
    label: str = Field(description="As the study names the round: 'round 2/3', 'pair 1/4 (baseline)'.")
    index: int = Field(description="The round's place, from 1, in its trial (or in the confirmation's pairs).")
    total: int
    phase: str = Field(description="What the round is doing: 'starting the server', 'replaying the workload', ...")
    phase_since: float = Field(description="When the phase began (seconds since the epoch).")


class Progress(_Strict):
    """A run's progress as of `updated_at`: `runs/<study>/progress.json`."""

    version: int = Field(default=PROGRESS_VERSION, ge=1)
    study: str
    pid: int = Field(description="The process running the study.")
    state: RunState = Field(description="'running' until the run ends; a run killed outright leaves 'running'.")
    started_at: float = Field(description="When this run (this resume) began, seconds since the epoch.")
    updated_at: float = Field(description="When this state was written.")
    budget_trials: int = Field(description="Trials after the baseline, across resumes.")
    budget_hours: float | None = Field(description="No new trial starts after this long (of this run).")
    rounds_per_trial: int
    confirm_top: int
    confirm_pairs: int
    baseline_done: bool
    trials_done: int = Field(description="Trials after the baseline that ended (scored, pruned or failed).")
    trials_running: list[int] = Field(description="Trials of the batch under way (measured round by round).")
    failed: int = Field(description="Trials that failed in this run.")
    pruned: int = Field(description="Trials pruned in this run.")
    confirming: int | None = Field(description="The trial being re-measured against the baseline, if any.")
    rounds_done: int = Field(description="Rounds measured in this run, trials' and confirmation's.")
    rounds_left: int = Field(description="Rounds still to come, the one under way included (an estimate).")
    round_s: float | None = Field(description="The mean time of a round in this run, failed attempts included.")
    eta_s: float | None = Field(description="Time left as of `updated_at`; None until a round was measured.")
    eta_capped: bool = Field(description="The budget's hours cut the trials the estimate counts.")
    current: CurrentRound | None
    best: BestTrial | None
    last: str = Field(description="The last thing that happened, in words.")
    phase_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="Where the run's time went, in seconds per phase (PHASES), over every session of the run.",
    )

    def elapsed_s(self, now: float, *, running: bool) -> float:
        """This run's time so far: up to `now` while it runs, up to its last update once it stopped."""
        return max(0.0, (now if running else self.updated_at) - self.started_at)

    def remaining_s(self, now: float) -> float | None:
        """The estimate of time left, less the time since it was made."""
        if self.eta_s is None:
            return None
        return max(0.0, self.eta_s - max(0.0, now - self.updated_at))


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


# The phases a run's time is counted in, in the order a round goes through them.
PHASES = (
    "stopping and starting the server",
    "clearing the running server's slots",
    "warm-up",
    "correctness probes",
    "replaying the workload",
    "between rounds: scoring, storage, the sampler",
)

_ENDINGS: dict[str, tuple[RunState, str]] = {
    "finished": ("finished", "the run finished"),
    "interrupted": ("interrupted", "the run was interrupted (the baseline restored)"),
    "failed": ("failed", "the run stopped on an error (the baseline restored)"),
}


def _settings_text(settings: Mapping[str, ParamValue]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "baseline"


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
        rounds_left, eta_s, capped = self._estimate(now)
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
            round_s=self._round_s(),
            eta_s=eta_s,
            eta_capped=capped,
            current=s.current,
            best=s.best,
            last=s.last,
            phase_seconds=self._phase_seconds(now),
        )

    def _phase_seconds(self, now: float) -> dict[str, float]:
        s = self._state
        seconds = dict(s.phase_seconds)
        if s.counting is not None:  # the phase under way, so far
            seconds[s.counting] = seconds.get(s.counting, 0.0) + max(0.0, now - s.counting_since)
        return {phase: round(seconds[phase], 3) for phase in PHASES if phase in seconds}

    def _round_s(self) -> float | None:
        s = self._state
        return s.round_time_s / s.rounds_done if s.rounds_done else None

    def _estimate(self, now: float) -> tuple[int, float | None, bool]:
        """Rounds left, time left and whether the budget's hours cut it.

        Rounds left: those of the batch under way (each trial's planned rounds, extra ones for noisy rounds
        included), the baseline's if it is not measured yet, every trial the budget still allows, and the
        confirmation's pairs (assumed to happen: it does when a trial beats the baseline). Each takes the
        mean round time so far; no new batch starts after the budget's hours, so the trials it would bring
        count only as far as the time left reaches. Once the search is over with no trial above the
        baseline, no confirmation is counted."""
        s, plan = self._state, self.plan
        if s.over or s.state != "running":
            return 0, (0.0 if s.rounds_done else None), False
        must = sum(max(0, t.planned - t.done) for t in s.batch.values())
        if not s.baseline_done and not any(t.baseline for t in s.batch.values()):
            must += plan.rounds_per_trial
        searching = s.confirming is None and s.confirm_started == 0 and not s.exhausted
        future = max(0, plan.budget_trials - s.started_trials) * plan.rounds_per_trial if searching else 0
        confirm = s.confirm_left + max(0, plan.confirm_top - s.confirm_started) * 2 * plan.confirm_pairs
        if s.confirm_started == 0 and not (must or future) and (s.best is None or s.best.score <= 0):
            confirm = 0  # the search is over and no trial beat the baseline: nothing to confirm
        round_s = self._round_s()
        if round_s is None:
            return must + future + confirm, None, False
        in_round = 0.0 if s.round_began is None else min(round_s, max(0.0, now - s.round_began))
        capped = False
        if plan.budget_hours is not None and future:
            time_left = s.started_at + plan.budget_hours * 3600 - now
            affordable = max(0.0, time_left - must * round_s)
            if future * round_s > affordable:
                capped = True
                future = math.ceil(affordable / round_s) if round_s > 0 else 0
        rounds = must + future + confirm
        return rounds, max(0.0, rounds * round_s - in_round), capped

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

    def _end_round(self, s: _State, now: float, *, measured: bool) -> None:
        if s.round_began is not None:
            s.round_time_s += now - s.round_began
            s.round_began = None
        if measured:
            s.rounds_done += 1

    def _end_trial(self, s: _State, number: int, *, scored: bool = False) -> _Trial | None:
        trial = s.batch.pop(number, None)
        if trial is not None and trial.baseline:
            s.baseline_done = s.baseline_done or scored  # a failed baseline ends the run unmeasured
        elif trial is not None:
            s.trials_done += 1
        if s.current is not None and s.current.number == number:
            s.current = None
        return trial

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
            self._end_round(s, now, measured=True)
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
            self._end_trial(s, number, scored=True)
            s.last = f"trial {number} scored {score:+.2f}"

        self._event(change)

    def trial_failed(self, *, number: int, reason: str) -> None:
        def change(s: _State, now: float) -> None:
            if s.current is not None and s.current.number == number:
                self._end_round(s, now, measured=False)
            trial = self._end_trial(s, number)
            if trial is not None and not trial.baseline:
                s.failed += 1
            s.last = f"trial {number} FAILED: {reason}"

        self._event(change)

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        def change(s: _State, now: float) -> None:
            self._end_trial(s, number)
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
            s.last = f"re-measuring trial {number} against the baseline in {pairs} pairs"

        self._event(change)

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        def change(s: _State, now: float) -> None:
            s.confirming, s.confirm_left, s.current = None, 0, None
            s.last = f"trial {number} against the baseline: {mean:+.2f}, 95% interval {low:+.2f}..{high:+.2f}"

        self._event(change)

    def restoring(self) -> None:
        def change(s: _State, now: float) -> None:
            s.over, s.current, s.round_began, s.batch = True, None, None, {}
            s.last = "restoring the baseline"

        self._event(change)


def read_progress(run_path: Path, name: str = PROGRESS_FILE) -> Progress | None:
    """The run directory's progress file (`name`: a controller's, `progress_file`); None when there is none.
    `StudyError` naming the file and the way on when it is not one this version wrote."""
    path = run_path / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StudyError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(data)
    except ValueError:
        raw = None
    if isinstance(raw, dict) and isinstance(raw.get("version"), int) and raw["version"] > PROGRESS_VERSION:
        raise StudyError(f"{path} was written by a newer serve-tuner (version {raw['version']}); upgrade to read it")
    try:
        return Progress.model_validate_json(data)
    except ValidationError:
        raise StudyError(
            f"{path} is not a progress file this serve-tuner wrote; the run rewrites it at its next step, and "
            f"`tuner leaderboard {run_path}` reads the study itself"
        ) from None


def held_by(run_path: Path, lock: str = ".lock") -> str | None:
    """The pid (as the run wrote it) of the `tuner run` holding the run directory's lock (`lock`: a fleet
    host's, `.lock-<host>`); None when no run holds it. Reads only: the lock file is opened read-only and a
    shared lock tried and let go at once."""
    try:
        handle = (run_path / lock).open("r")
    except OSError:  # no lock file: no run ever held this directory
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def _clock_text(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def duration_text(seconds: float) -> str:
    """45 s, 3m05s, 2h04m."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """What `tuner status` says about a run directory, read without disturbing a run that holds it."""

    run_dir: Path
    holder: str | None  # the pid of the run holding the directory's lock, None when none does
    progress: Progress | None
    now: float
    hosts: tuple[str, ...] = ()  # one of a fleet's controllers sharing the directory: the hosts it runs

    @property
    def who(self) -> str:
        """The run directory, and which of its controllers this is where several share it."""
        return f"{self.run_dir}" + (f" (controller of {', '.join(self.hosts)})" if self.hosts else "")

    @property
    def running(self) -> bool:
        return self.holder is not None

    @property
    def current(self) -> bool:
        """Whether the progress shown is the holder's own (a resume that is starting shows the last run's)."""
        p = self.progress
        return p is not None and (not self.running or str(p.pid) == self.holder)

    def headline(self) -> str:
        hosts = "".join(f" --host {host}" for host in self.hosts)
        p, resume = self.progress, f"`tuner run` with its study file{' and' + hosts if hosts else ''} resumes it"
        if self.running:
            if p is None:
                return f"running (pid {self.holder}): its study has not begun yet, so no progress is written"
            if not self.current:
                return (
                    f"running (pid {self.holder}), starting: what follows is the previous run's state, as of "
                    f"{_clock_text(p.updated_at)}"
                )
            if p.state != "running":
                return f"running (pid {self.holder}), ending: {p.state}"
            return f"running (pid {self.holder}); last update {duration_text(self.now - p.updated_at)} ago"
        if p is None:
            return (
                "not running; no progress file (made by an earlier serve-tuner, or stopped before its study "
                f"began): `tuner leaderboard {self.run_dir}` shows its trials"
            )
        at = _clock_text(p.updated_at)
        if p.state == "finished":
            return f"not running: finished at {at}"
        if p.state == "interrupted":
            return f"not running: interrupted at {at} (Ctrl-C or SIGTERM); {resume}"
        if p.state == "failed":
            return f"not running: stopped on an error at {at} (the run's output names it); {resume}"
        return f"not running: it stopped after {at} without finishing (killed, or the machine went down); {resume}"

    @property
    def live(self) -> bool:
        """The run is going on and the progress is its own: elapsed time and the estimate run on."""
        return self.running and self.current and self.progress is not None and self.progress.state == "running"

    def as_json(self) -> dict[str, object]:
        p = self.progress
        return {
            "run_dir": str(self.run_dir),
            **({"hosts": list(self.hosts)} if self.hosts else {}),
            "running": self.running,
            "pid": int(self.holder) if self.holder is not None and self.holder.isdigit() else None,
            "status": self.headline(),
            "elapsed_s": None if p is None else p.elapsed_s(self.now, running=self.live),
            "remaining_s": p.remaining_s(self.now) if p is not None and self.live else None,
            "updated_s_ago": None if p is None else max(0.0, self.now - p.updated_at),
            "progress": None if p is None else p.model_dump(mode="json"),
        }


def run_status(run_path: Path, *, now: float | None = None) -> RunStatus:
    """A run directory's status (its one controller's; `controller_statuses` where several share it).
    `ConfigError` (exit 2) for a path that is not one; reads only."""
    if not run_path.is_dir():
        what = "does not exist" if not run_path.exists() else "is not a directory"
        raise ConfigError(f"{run_path} {what}; pass a run directory made by `tuner run`, e.g. runs/stall-demo")
    own = any((run_path / name).is_file() for name in (PROGRESS_FILE, "optuna.journal"))
    if not own and not _controller_files(run_path):
        raise ConfigError(
            f"{run_path} is not a run directory (no {PROGRESS_FILE} or optuna.journal in it); pass one made by "
            "`tuner run`, e.g. runs/stall-demo"
        )
    # The locks first: a run tells its end before it lets the lock go, so a run that ends between the two
    # reads shows as ending, never as stopped without a word.
    holder = held_by(run_path)
    # A fleet's controller holds the directory's lock shared (its peers may join) and its hosts' locks alone:
    # the directory's one controller, without --host, is the holder of a host lock that wrote progress.json.
    host_holders = set() if holder is not None else _host_lock_holders(run_path)
    progress = read_progress(run_path)
    if holder is None and progress is not None and str(progress.pid) in host_holders:
        holder = str(progress.pid)
    return RunStatus(run_dir=run_path, holder=holder, progress=progress, now=time.time() if now is None else now)


def _host_lock_holders(run_path: Path) -> set[str]:
    """The pids holding a fleet host's lock (`.lock-<host>`) in the run directory."""
    holders = (held_by(run_path, lock.name) for lock in run_path.glob(".lock-*"))
    return {holder for holder in holders if holder is not None}


def controller_statuses(run_path: Path, *, now: float | None = None) -> list[RunStatus]:
    """The status of each of a fleet's controllers that share the run directory (`tuner run --host NAME`),
    each from its own progress file and its hosts' lock, in the order of their hosts' names."""
    now = time.time() if now is None else now
    statuses = []
    for path in _controller_files(run_path):
        hosts = _controller_hosts(path)
        try:
            progress = read_progress(run_path, path.name)
        except StudyError:  # not one a controller wrote: it says nothing of the run, and hides nothing else
            continue
        # The controller holds each of its hosts' locks; a file left by an earlier grouping of hosts is
        # running only while one process holds them all.
        holders = {held_by(run_path, f".lock-{host}") for host in hosts}
        holder = holders.pop() if len(holders) == 1 else None
        statuses.append(RunStatus(run_dir=run_path, holder=holder, progress=progress, now=now, hosts=hosts))
    return statuses
