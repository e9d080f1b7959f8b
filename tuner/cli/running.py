"""`tuner run`: a study run or resumed on its hosts, then its leaderboard and report; `tuner run --check`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli.reading import show
from tuner.cli.signals import raise_if_stopped, run_stoppable, stop_on_signals
from tuner.files import write_atomic
from tuner.text import duration_text

if TYPE_CHECKING:
    from rich.console import Console

    from tuner.config import StudySpec

__all__ = ["run"]


def run(args: argparse.Namespace, console: Console) -> int:
    from tuner.config import load_study

    spec, base_dir = load_study(args.study, args.overrides)
    if args.predicted_from is not None:  # a path from here, not from the study file's directory
        search = spec.search.model_copy(update={"predicted_from": args.predicted_from.resolve()})
        spec = spec.model_copy(update={"search": search})
    if args.storage or spec.storage is not None:
        from tuner.config import StorageSpec
        from tuner.storage import remember_url

        if args.storage:
            kept = spec.storage.model_dump() if spec.storage is not None else {}
            spec = spec.model_copy(update={"storage": StorageSpec.model_validate({**kept, "url": args.storage})})
        assert spec.storage is not None
        remember_url(spec.storage.url)  # its password is a secret from here on: redacted wherever it would show
    if args.check:
        return _check(args, spec, base_dir, console)
    # The study's own modules once its file is read: a wrong path or value is refused without them.
    from tuner.live import run_observer
    from tuner.morning_report import REPORT_NAME, ReportWriter
    from tuner.observers import Observers
    from tuner.progress import Plan, ProgressTracker
    from tuner.progress_file import progress_file
    from tuner.report import leaderboard_frame
    from tuner.runs import RunDirectory
    from tuner.search import run_study

    run_path = args.runs_dir / spec.name
    plan = Plan.of(spec)
    prepared = None
    if spec.capacity.after_study and spec.budget.hours is not None and not (spec.hosts or args.hosts):
        from tuner.search import budget_for_trials, prepare_study

        # The panel's "no new trial after" is the search's own: budget.hours less the sweep it holds.
        prepared = prepare_study(spec, base_dir)
        budget_s = budget_for_trials(spec, prepared, run_path)
        plan = dataclasses.replace(plan, budget_hours=None if budget_s is None else budget_s / 3600)
    tracker = ProgressTracker(plan, path=run_path / progress_file(args.hosts or ()))

    received: list[int] = []

    report = ReportWriter(run_path, say=lambda line: console.print(line, style="yellow", markup=False))

    async def main() -> None:
        stop_on_signals(received)
        with run_observer(console, tracker) as observer:
            await run_study(
                spec, base_dir, run_path, Observers(observer, report), hosts=args.hosts or None, prepared=prepared
            )

    started = time.monotonic()
    run_stoppable(main(), received)
    if spec.capacity.after_study:
        _capacity_after_study(spec, base_dir, run_path, console, received)
    board = show(run_path, console, show_all=f"`tuner leaderboard {run_path} --wide` shows all")
    leaderboard_csv = RunDirectory(run_path).leaderboard_path
    write_atomic(leaderboard_csv, leaderboard_frame(board).to_csv(index=False).encode())
    report.write()  # as after every trial: a page that cannot be written is said, the run's outcome stands
    written = "" if report.failed else f", the report in {run_path / REPORT_NAME}"
    took = duration_text(time.monotonic() - started, style="stopwatch")
    console.print(
        f"this run took {took}; leaderboard also in {leaderboard_csv}{written}",
        markup=False,
    )
    raise_if_stopped(received)  # stopped while the leaderboard was written: still 130 or 143
    return 0


def _capacity_after_study(
    spec: StudySpec, base_dir: Path, run_path: Path, console: Console, received: list[int]
) -> None:
    """`[capacity] after_study`: the baseline and the recommendation swept once the study has ended."""
    from tuner.capacity.command import measure_capacity, plan_capacity
    from tuner.capacity.record import CapacitySweep, capacity_sentence
    from tuner.errors import TunerError

    if spec.hosts:
        console.print("no capacity sweep: a fleet's is one host's; run `tuner capacity STUDY --host NAME`")
        return
    try:
        plan = plan_capacity(
            spec, base_dir, run_path, trial=None, baseline_only=False, host=None, options=spec.capacity
        )
    except TunerError as exc:
        console.print(f"no capacity sweep: {exc}", markup=False, highlight=False)
        return
    console.print("the capacity sweep of the baseline and the recommendation ([capacity] after_study = true)")

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    async def sweep() -> CapacitySweep:
        stop_on_signals(received)
        return await measure_capacity(plan, run_path, say=say, saved=lambda path: say(f"the sweep is kept in {path}"))

    try:
        swept = run_stoppable(sweep(), received)
    except TunerError as exc:  # the study's own outcome stands: its leaderboard and report are still written
        console.print(f"the capacity sweep failed: {exc}; `tuner capacity STUDY` runs it again", markup=False,
                      highlight=False)  # fmt: skip
        return
    console.print(capacity_sentence(swept), markup=False, highlight=False)


def _check(args: argparse.Namespace, spec: StudySpec, base_dir: Path, console: Console) -> int:
    """`tuner run --check`: one line per finding; 0 if the study can run, 1 if something must be fixed first."""
    from tuner.check import check_study

    run_path = args.runs_dir / spec.name
    text = args.study.read_text(errors="replace")  # load_study read it a moment ago
    lines = asyncio.run(check_study(spec, base_dir, run_path, hosts=args.hosts or None, study_text=text))
    for line in lines:
        detail = " ".join(line.detail.split())  # a host command's stderr may hold line breaks
        shown = f"{'ok  ' if line.ok else 'FAIL'}  {line.subject}: {detail}"
        console.print(shown, markup=False, highlight=False, soft_wrap=True)  # one line each, for grep and logs
    failed = [line for line in lines if not line.ok]
    if failed:
        console.print(f"{len(failed)} of {len(lines)} checks failed: fix them before the night, then check again")
        return 1
    console.print(f"the study can run ({len(lines)} checks passed; nothing on the host was changed)")
    return 0
