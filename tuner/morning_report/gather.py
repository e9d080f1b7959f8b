"""Gathering the morning report's facts: everything it reads, and nothing else reads.

The study comes from its storage opened read-only (`tuner.storage`, never the search loop) and is read once into
a `StudyView`, which every later question about its trials asks; the rest comes from the
run directory: `spec.json`, `host.json`, the progress file, the round files (whole, for the pictures; their
spans only, for the time spent) and the server logs' paths. What a file cannot give is gathered as absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import optuna
from pydantic import ValidationError

from tuner.capacity.record import CapacitySweep, read_sweep
from tuner.config import CapacitySpec
from tuner.errors import StudyError, TunerError
from tuner.models import RequestRecord
from tuner.redact import redact
from tuner.report import Leaderboard, build_leaderboard
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly
from tuner.study_view import StudyView, TrialView

__all__ = ["MAX_PICTURED_BYTES", "FileMemo", "Gathered", "ReportMemo", "RoundFile", "RoundSpan", "gather_run"]

# The stall picture reads a round whole; past this size it is left out (said as absent), as is the
# workload table: the page must come in a second or two, after every trial of a long night.
MAX_PICTURED_BYTES = 32 * 1024 * 1024

T = TypeVar("T")


class FileMemo(Generic[T]):
    """What was made of each file, keyed by path, size and modification time: a file that changes is read
    again. It lives as long as its owner: one page for `tuner report`, one run for `ReportWriter`, whose
    rewrite after every trial then reads only the new files."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, int, int], T] = {}

    def get(self, path: Path, make: Callable[[Path], T]) -> T | None:
        """`make(path)`, made once per version of the file; None when the file cannot be looked at."""
        try:
            stat = path.stat()
        except OSError:
            return None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self._made:
            self._made[key] = make(path)
        return self._made[key]


@dataclass(kw_only=True)
class ReportMemo:
    """The reading and computing that one page, or a run's rewrites of its page, need do once per file."""

    spans: FileMemo[float | None] = field(default_factory=FileMemo)  # each round file's span
    diagnoses: FileMemo[list[tuple[str, str]]] = field(default_factory=FileMemo)  # each server log's findings


@dataclass(frozen=True, kw_only=True)
class RoundFile:
    name: str
    records: list[RequestRecord]


@dataclass(frozen=True, kw_only=True)
class RoundSpan:
    """A round file's first send to last end, and when it was written."""

    confirm: bool  # a confirmation's measurement, not a search round
    span_s: float
    mtime: float


# Why the baseline's first round, the workload's source, is not shown.
Absent = Literal["too big", "unreadable", "missing"]


@dataclass(frozen=True, kw_only=True)
class Gathered:
    """What the run directory holds, read once; the methods read round files and name server logs on demand."""

    run_path: Path
    study: optuna.Study  # for Optuna's parameter importances; everything else reads `view`
    view: StudyView
    trials: dict[int, TrialView]  # the view's trials by number
    board: Leaderboard  # built from `view`
    spec: dict[str, Any]  # spec.json as written; {} when missing or not an object
    host_facts: dict[str, str | None]  # host.json, redacted; {} for older runs
    phase_seconds: dict[str, float]  # as the progress file counted them; {} without one
    round_spans: list[RoundSpan]  # every round file of every trial, in the order of the trials
    version: str  # the serve-tuner making the page
    memo: ReportMemo
    capacity: CapacitySweep | None = None  # the `tuner capacity` sweep shown (`_latest_sweep`)
    capacity_unreadable: str | None = None  # why that sweep could not be read
    capacity_others: int = 0  # the run directory's other sweeps, not shown

    def server_log(self, number: int) -> Path:
        return RunDirectory(self.run_path).server_log_path(number)

    def pictured_rounds(self, number: int) -> Iterator[RoundFile]:
        """The trial's search rounds in order, read one at a time (the caller stops at the one it needs);
        those too big to read whole, torn or foreign are passed over."""
        for path in RunDirectory(self.run_path).round_paths(number):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > MAX_PICTURED_BYTES:
                continue  # a round of tens of thousands of requests: read whole, it would stall the run between trials
            round_file = _read_round(path)
            if round_file is not None:
                yield round_file

    def workload_round(self) -> tuple[RoundFile | None, Absent | None, int]:
        """The baseline's first round with its records, else why it is absent; and the file's size."""
        first = next((t.number for t in self.view.trials if t.baseline), 0)
        path = RunDirectory(self.run_path).round_path(first, 1)
        size = path.stat().st_size if path.is_file() else 0
        too_big = path.is_file() and size > MAX_PICTURED_BYTES
        round_file = None if too_big else _read_round(path)
        if round_file is not None and round_file.records:
            return round_file, None, size
        return None, ("too big" if too_big else "unreadable" if path.exists() else "missing"), size


def gather_run(run_path: Path, memo: ReportMemo, storage_url: str | None = None) -> Gathered:
    run_dir = RunDirectory(run_path)
    study = open_optuna_study_readonly(run_dir, storage_url)
    view = StudyView.of(study, run_dir)
    return Gathered(
        run_path=run_path,
        study=study,
        view=view,
        trials={t.number: t for t in view.trials},
        board=build_leaderboard(view),
        spec=_spec(run_path),
        host_facts=_host_facts(run_path),
        phase_seconds=_phase_seconds(run_path),
        round_spans=_round_spans(run_path, memo.spans),
        version=_own_version(),
        memo=memo,
        **_latest_sweep(run_dir),
    )


def _latest_sweep(run_dir: RunDirectory) -> dict[str, Any]:
    """The sweep to show: the latest finished sweep of the baseline and a trial made with the study's own
    `[capacity]` table, else the latest finished one of both, else the latest that can be read (a quick
    sweep with other levels or a shorter window never hides the study's own); how many others there are;
    and the problem of the latest file, where it cannot be read."""
    sweeps: list[CapacitySweep] = []
    found: dict[str, Any] = {}
    for path in reversed(run_dir.capacity_paths()):
        try:
            sweeps.append(read_sweep(path))
        except StudyError as exc:
            if not sweeps:
                found.setdefault("capacity_unreadable", str(exc))
    if not sweeps:
        return found
    try:
        own = CapacitySpec.model_validate((run_dir.read_spec() or {}).get("capacity", {}))
    except ValidationError:  # a spec.json of another version: no table to prefer
        own = None
    both = [s for s in sweeps if s.finished and len({c.trial is None for c in s.configs}) == 2]
    studys = [s for s in both if own is not None and _swept_as(s, own)]
    found["capacity"] = (studys or both or sweeps)[0]
    found["capacity_others"] = len(sweeps) - 1
    return found


def _swept_as(sweep: CapacitySweep, options: CapacitySpec) -> bool:
    return (sweep.users, sweep.shape, sweep.warm_up_s, sweep.window_s, sweep.rounds) == (
        options.users, options.shape, options.warm_up_s, options.window_s, options.rounds
    )  # fmt: skip


def _spec(run_path: Path) -> dict[str, Any]:
    return RunDirectory(run_path).read_spec() or {}


def _host_facts(run_path: Path) -> dict[str, str | None]:
    """host.json, which a run writes when its baseline's server first comes up; {} for older runs."""
    try:
        loaded = json.loads((run_path / "host.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): redact(v) if isinstance(v, str) else None for k, v in loaded.items()}


def _phase_seconds(run_path: Path) -> dict[str, float]:
    """Where the run's time went by phase, as `tuner run`'s progress file counted it; {} without one."""
    from tuner.progress_file import read_progress

    try:
        progress = read_progress(run_path)
    except TunerError:
        return {}
    return dict(progress.phase_seconds) if progress is not None else {}


def _own_version() -> str:
    try:
        return package_version("serve-tuner")
    except PackageNotFoundError:
        return "(not installed)"


def _read_round(path: Path) -> RoundFile | None:
    """A round's records; None for a torn or foreign file (the report shows what it can without it)."""
    records = []
    try:
        with path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    records.append(RequestRecord.model_validate_json(line))
    except (OSError, ValidationError, ValueError, RecursionError):
        return None
    return RoundFile(name=path.stem, records=records)


def _round_spans(run_path: Path, spans: FileMemo[float | None]) -> list[RoundSpan]:
    found = []
    for directory in RunDirectory(run_path).trial_dirs():
        for path in directory.glob("*.jsonl"):
            if path.name.endswith(".server.jsonl"):
                continue
            span = spans.get(path, _span_s)
            if span is None:
                continue
            found.append(RoundSpan(confirm=RunDirectory.is_confirmation(path), span_s=span, mtime=path.stat().st_mtime))
    return found


def _span_s(path: Path) -> float | None:
    """A round file's span, read a line at a time: a span, not the records, so that a long night's rounds are
    not all kept in memory."""
    first: float | None = None
    last: float | None = None
    try:
        with path.open("rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                record = json.loads(line)
                send, end = float(record["send_s"]), float(record["end_s"])
                first = send if first is None else min(first, send)
                last = end if last is None else max(last, end)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # whatever the file holds
        return None
    return None if first is None or last is None else last - first
