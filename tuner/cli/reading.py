"""The commands that only read a run directory: `tuner status`, `leaderboard` and `report`; and the
leaderboard as `tuner run` shows it at the end."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.cli.outputs import (
    STUDY_FILES,
    check_not_in_run_directory,
    check_output_in_existing_directory,
    check_report_path,
)
from tuner.errors import ConfigError, StudyError
from tuner.files import check_output, write_atomic

if TYPE_CHECKING:
    from rich.console import Console

    from tuner.report import Leaderboard

__all__ = ["holds_study", "leaderboard", "report", "show", "status", "use_storage"]


def use_storage(args: argparse.Namespace) -> str | None:
    """`--storage URL` of the commands that read a run directory, read instead of the storage it records;
    its password becomes a secret at once."""
    url: str | None = getattr(args, "storage", None)
    if url:
        from tuner.storage import remember_url

        remember_url(url)
    return url or None


def holds_study(run_path: Path, storage_url: str | None = None) -> bool:
    from tuner.storage import holds_study as stored_study

    return stored_study(run_path, storage_url)


def status(args: argparse.Namespace, console: Console) -> int:
    import json

    from tuner.status import controller_statuses, run_status

    storage_url = use_storage(args)
    status = run_status(args.run_dir)
    # A fleet's controllers sharing the directory (`--host`): each one's own progress, beside the directory's
    # one controller's where a run without --host left it.
    controllers = controller_statuses(args.run_dir, now=status.now)
    fleet = _fleet_status(args.run_dir, storage_url)
    if args.json:
        own = status.as_json()
        if controllers and status.progress is None and not status.running:
            # Only `--host` controllers wrote here: the run is running while one of them is.
            running = [c for c in controllers if c.running]
            own["running"] = bool(running)
            own["status"] = f"{len(running)} of {len(controllers)} controllers running; see controllers"
        shown = {
            **own,
            **({"controllers": [c.as_json() for c in controllers]} if controllers else {}),
            **({"fleet": fleet} if fleet is not None else {}),
        }
        print(json.dumps(shown, indent=2))
        return 0
    from tuner.live import render_status

    if status.progress is not None or status.running or not controllers:
        render_status(status, console)
    for controller in controllers:
        render_status(controller, console)
    for host in fleet or []:
        now = f", measuring trial {host['running']}" if host["running"] is not None else ""
        gone = f"; dropped: {host['dropped']}" if host["dropped"] else ""
        base = "baseline measured" if host["baseline"] is not None else "no baseline yet"
        console.print(f"host {host['host']}: {base}, {host['trials']} trials{now}{gone}", highlight=False)
    return 0


def _fleet_status(run_path: Path, storage_url: str | None) -> list[dict[str, Any]] | None:
    """A fleet's hosts, read from the storage the run directory records (None: not a fleet's run)."""
    from tuner.runs import RunDirectory

    spec = RunDirectory(run_path).read_spec()
    if spec is None or not spec.get("hosts"):
        return None
    from tuner.fleet import fleet_summary
    from tuner.storage import open_optuna_study_readonly

    try:
        return fleet_summary(open_optuna_study_readonly(RunDirectory(run_path), storage_url))
    except StudyError:
        return None


def show(
    run_path: Path,
    console: Console,
    *,
    csv: Path | None = None,
    parquet: Path | None = None,
    wide: bool = False,
    as_json: bool = False,
    show_all: str = "--wide shows all",
    storage_url: str | None = None,
) -> Leaderboard:
    """Shows the leaderboard (a table, or JSON on stdout) and writes the report files asked for; their
    paths are checked before the study is read, so a bad one is refused with nothing shown or written."""
    from tuner.console import make_console, render_leaderboard
    from tuner.report import build_leaderboard, leaderboard_document, leaderboard_frame, leaderboard_parquet
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly
    from tuner.study_view import StudyView

    study_files = [run_path / name for name in STUDY_FILES]  # never to be overwritten by a report
    for flag, path in (("--csv", csv), ("--parquet", parquet)):
        if path is not None:
            check_report_path(flag, path, study_files=study_files)
            check_not_in_run_directory(path, run_path, flag=flag, own="leaderboard." + flag.removeprefix("--"))
    if csv is not None and parquet is not None and check_output(csv) == check_output(parquet):
        raise ConfigError(f"--csv and --parquet both name {csv}: one would replace the other; pass two file names")
    run_dir = RunDirectory(run_path)
    board = build_leaderboard(StudyView.of(open_optuna_study_readonly(run_dir, storage_url), run_dir))
    if as_json:
        console.file.write(leaderboard_document(board).model_dump_json(indent=2) + "\n")
    else:
        render_leaderboard(board, console, wide=wide, show_all=show_all)
    notes = make_console(stderr=True) if as_json else console  # stdout holds the JSON document alone
    if csv is not None:
        write_atomic(csv, leaderboard_frame(board).to_csv(index=False).encode(), inputs=study_files)
        notes.print(f"wrote {csv}", highlight=False)
    if parquet is not None:
        write_atomic(parquet, leaderboard_parquet(board), inputs=study_files)
        notes.print(f"wrote {parquet}", highlight=False)
    return board


def leaderboard(args: argparse.Namespace, console: Console) -> int:
    storage_url = use_storage(args)
    if not holds_study(args.run_dir, storage_url):
        raise ConfigError(f"{args.run_dir} holds no study; pass a directory made by `tuner run`, e.g. runs/stall-demo")
    show(
        args.run_dir,
        console,
        csv=args.csv,
        parquet=args.parquet,
        wide=args.wide,
        as_json=args.json,
        storage_url=storage_url,
    )
    return 0


def report(args: argparse.Namespace, console: Console) -> int:
    storage_url = use_storage(args)
    if not holds_study(args.run_dir, storage_url):
        raise ConfigError(f"{args.run_dir} holds no study; pass a directory made by `tuner run`, e.g. runs/stall-demo")
    out = args.out if args.out is not None else args.run_dir / "report.html"
    study_files = [args.run_dir / name for name in STUDY_FILES]  # never to be overwritten by a report
    check_output_in_existing_directory("--out", out, example="report.html")
    check_output(out, inputs=study_files)
    check_not_in_run_directory(out, args.run_dir)
    from tuner.morning_report import write_report

    console.print(f"wrote {write_report(args.run_dir, out, inputs=study_files, storage_url=storage_url)}", markup=False)
    return 0
