"""Where a command may write a file the user named: checked before the work, so a bad path is refused with
nothing shown or written. These look at the file system; the checks that need no I/O are in `checks`."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.errors import ConfigError
from tuner.files import check_output

__all__ = ["STUDY_FILES", "check_not_in_run_directory", "check_output_in_existing_directory", "check_report_path"]

# What a run directory holds of the study itself: no report may be written over one of them.
STUDY_FILES = ("optuna.journal", "spec.json")


def check_report_path(flag: str, path: Path, *, study_files: list[Path]) -> None:
    """`--csv` or `--parquet` names a file in a directory that exists, and none of the study's own."""
    example = "leaderboard." + flag.removeprefix("--")
    check_output_in_existing_directory(flag, path, example=example)
    check_output(path, inputs=study_files)


def check_output_in_existing_directory(flag: str, path: Path, *, example: str) -> None:
    """A report file goes into a directory the user already has: a typo in it must not create directories."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; name a file in it, e.g. {path / example}")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: directory {path.parent} does not exist; create it or pick another path")


def check_not_in_run_directory(out: Path, run_dir: Path, *, flag: str = "--out", own: str = "report.html") -> None:
    """Inside the run directory a command may only write its own file there (`own`: the report, the leaderboard):
    every other file is the run's evidence or its lock, which the command reads or a running controller holds."""
    target, run = Path(os.path.realpath(out)), Path(os.path.realpath(run_dir))
    if run in target.parents and target != run / own:
        report = own == "report.html"
        where = f"the report to {run_dir / own} (the default)" if report else f"the leaderboard to {run_dir / own}"
        raise ConfigError(
            f"{flag} {out} is inside the run directory {run_dir}, whose files are the run's own; write {where} "
            "or outside it"
        )
