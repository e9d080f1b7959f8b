"""`progress.json`: the document a run writes of where it stands (`Progress`), the name of each controller's
file, and reading one back.

The writer is `tuner.progress` (`ProgressTracker`, an observer of the study); the readers are `tuner status`
(`tuner.status`), the live display and the morning report. A reader never opens the journal, whose lock
belongs to the run. Pure: no rich, no optuna; pydantic alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.config import NAME_PATTERN, ParamValue
from tuner.errors import StudyError

__all__ = [
    "PHASES",
    "PROGRESS_FILE",
    "PROGRESS_VERSION",
    "BestTrial",
    "CurrentRound",
    "Progress",
    "RunState",
    "controller_files",
    "controller_hosts",
    "progress_file",
    "read_progress",
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


def controller_files(run_path: Path) -> list[Path]:
    """The controllers' progress files: named as `progress_file` names them, regular files (not links)."""
    return sorted(
        path
        for path in run_path.glob(f"{_CONTROLLER_PREFIX}*.json")
        if path.is_file() and not path.is_symlink() and all(map(_HOST_NAME.match, controller_hosts(path)))
    )


def controller_hosts(path: Path) -> tuple[str, ...]:
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


# The phases a run's time is counted in, in the order a round goes through them.
PHASES = (
    "stopping and starting the server",
    "clearing the running server's slots",
    "warm-up",
    "correctness probes",
    "replaying the workload",
    "between rounds: scoring, storage, the sampler",
)


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
