"""`tuner status`: whether a run directory's run goes on and where it stands, read without disturbing it:
the run's locks (tried shared and let go at once, never taken) and its progress files (`tuner.progress_file`),
the directory's own and each of a fleet's controllers' that share it.

Pure: no rich, no optuna.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError, StudyError
from tuner.progress_file import PROGRESS_FILE, Progress, controller_files, controller_hosts, read_progress
from tuner.runs import RunDirectory, lock_holder
from tuner.text import duration_text

__all__ = ["RunStatus", "controller_statuses", "duration_text", "held_by", "run_status"]


def held_by(run_path: Path, lock: str = ".lock") -> str | None:
    """The pid (as the run wrote it) of the `tuner run` holding the run directory's lock (`lock`: a fleet
    host's, `.lock-<host>`); None when no run holds it or the lock cannot be read (status reads, never
    refuses)."""
    try:
        return lock_holder(run_path, lock)
    except OSError:
        return None


def _clock_text(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """What `tuner status` says about a run directory, read without disturbing a run that holds it."""

    run_dir: Path
    holder: str | None  # the pid of the run holding the directory's lock, None when none does
    progress: Progress | None
    now: float
    hosts: tuple[str, ...] = ()  # one of a fleet's controllers sharing the directory: the hosts it runs
    # The holder is sweeping capacity (a sweep holds the run directory's lock as a study does, and writes no
    # progress): its record, and when it was last written (after every level).
    sweep: tuple[Path, float] | None = None

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
        if self.running and self.sweep is not None:
            path, written = self.sweep
            return (
                f"running (pid {self.holder}): a capacity sweep (`tuner capacity`, or `[capacity] after_study` at "
                f"the study's end), its record {path} last written {duration_text(self.now - written)} ago"
            )
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
    if not own and not controller_files(run_path):
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
    return RunStatus(
        run_dir=run_path, holder=holder, progress=progress, now=time.time() if now is None else now,
        sweep=None if holder is None else _sweep_of_the_holder(run_path),
    )  # fmt: skip


def _sweep_of_the_holder(run_path: Path) -> tuple[Path, float] | None:
    """The capacity sweep record written since the lock's holder took it (it writes its pid into the lock
    then), and when it was last written; None where the holder wrote none (a study)."""
    written = []
    try:
        since = (run_path / ".lock").stat().st_mtime
        for path in RunDirectory(run_path).capacity_paths():
            written.append((path.stat().st_mtime, path))
    except OSError:  # removed between the listing and the look
        return None
    at, path = max(written, default=(0.0, run_path))
    return (path, at) if written and at >= since else None


def _host_lock_holders(run_path: Path) -> set[str]:
    """The pids holding a fleet host's lock (`.lock-<host>`) in the run directory."""
    holders = (held_by(run_path, lock.name) for lock in run_path.glob(".lock-*"))
    return {holder for holder in holders if holder is not None}


def controller_statuses(run_path: Path, *, now: float | None = None) -> list[RunStatus]:
    """The status of each of a fleet's controllers that share the run directory (`tuner run --host NAME`),
    each from its own progress file and its hosts' lock, in the order of their hosts' names."""
    now = time.time() if now is None else now
    statuses = []
    for path in controller_files(run_path):
        hosts = controller_hosts(path)
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
