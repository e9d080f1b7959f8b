"""The morning report: one self-contained HTML page that says what an overnight study found.

Everything comes from the run directory alone (the study's storage, its spec and the round files), so
the page can be made at any time: by `tuner report`, by `tuner run` after every trial, for a run made
by an earlier version (what it lacks is shown as absent). The page makes no request to any other host:
its styles, charts (static SVG, `tuner/svg.py`) and data are inline, and the one script only sorts the
leaderboard; everything essential reads without it.

Made in three steps: `gather` reads (the study through `tuner.storage`, never the search loop or the
deployers), `compute` works out what the page says, `render` writes the HTML; `pieces` holds what the
page is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from tuner.files import write_atomic
from tuner.morning_report.compute import compute_report
from tuner.morning_report.gather import ReportMemo, gather_run
from tuner.morning_report.pieces import redact_spec
from tuner.morning_report.render import page
from tuner.observers import NullObserver
from tuner.study_record import Confirmation

__all__ = ["REPORT_NAME", "ReportMemo", "ReportWriter", "redact_spec", "render_report", "write_report"]

REPORT_NAME = "report.html"


def write_report(
    run_path: Path,
    out: Path | None = None,
    *,
    inputs: Iterable[Path] = (),
    memo: ReportMemo | None = None,
    storage_url: str | None = None,
) -> Path:
    """Writes the report atomically (a reader never sees half a page) and returns its path. `memo`: what an
    earlier page of the same run already read (`ReportWriter` keeps one); `storage_url`: `--storage`, read
    instead of the storage the run directory records."""
    target = out if out is not None else run_path / REPORT_NAME
    write_atomic(target, render_report(run_path, memo=memo, storage_url=storage_url).encode(), inputs=inputs)
    return target


def render_report(run_path: Path, *, memo: ReportMemo | None = None, storage_url: str | None = None) -> str:
    return page(compute_report(gather_run(run_path, memo if memo is not None else ReportMemo(), storage_url)))


class ReportWriter(NullObserver):
    """Rewrites the run's report after every trial and confirmation, so a half-finished night can be read.

    A report that cannot be written is said once and the run goes on: the study's storage, not the
    page, is what the night must not lose."""

    def __init__(self, run_path: Path, *, say: Callable[[str], None]) -> None:
        self.run_path = run_path
        self.say = say
        self.failed = False
        self.memo = ReportMemo()  # for the run's life: each rewrite reads only the files that are new or changed

    def write(self) -> None:
        try:
            write_report(self.run_path, memo=self.memo)
        except Exception as exc:  # whatever it is, it must not end an overnight run
            if not self.failed:
                self.say(f"the report could not be written ({type(exc).__name__}: {exc}); the run goes on")
            self.failed = True

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        self.write()

    def trial_failed(self, *, number: int, reason: str) -> None:
        self.write()

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        self.write()

    def confirm_finished(self, *, number: int, result: Confirmation) -> None:
        self.write()
