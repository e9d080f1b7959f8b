"""The live display of a run on a terminal, and `tuner status`: one panel drawn from a `Progress`.

While `tuner run` writes to a terminal, `LiveDisplay` keeps the panel at the bottom of the screen and
prints every line the plain observer prints above it (failures, scores, the confirmation), so nothing
the log would hold is lost; on anything else the run prints those lines alone, as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tuner.console import ConsoleObserver
from tuner.observers import Observers, StudyObserver
from tuner.progress_file import Progress
from tuner.status import RunStatus
from tuner.text import duration_text, settings_text

if TYPE_CHECKING:  # the writer is `tuner run`'s: `tuner status` shows a panel without loading it
    from tuner.progress import ProgressTracker

__all__ = ["LiveDisplay", "progress_panel", "render_status", "run_observer"]


def _settings(settings: Mapping[str, object]) -> str:
    return settings_text(settings)


def _now_line(p: Progress, now: float) -> str:
    current = p.current
    if current is None:
        if p.state != "running":
            return {"finished": "done", "interrupted": "interrupted", "failed": "stopped on an error"}[p.state]
        return p.last if p.last == "restoring the baseline" else "between rounds"
    what = "baseline" if current.baseline else _settings(current.settings)
    since = duration_text(max(0.0, now - current.phase_since))
    if p.confirming is not None:
        return (
            f"re-measuring trial {p.confirming} against the baseline: {current.label}, round {current.index} of "
            f"{current.total}, {current.phase} ({since})"
        )
    return f"trial {current.number} ({what}): round {current.index} of {current.total}, {current.phase} ({since})"


def _time_line(p: Progress, now: float, *, live: bool) -> str:
    elapsed = duration_text(p.elapsed_s(now, running=live))
    if not live:
        return f"{elapsed} (this run)"
    left = p.remaining_s(now)
    if left is None:
        return f"{elapsed} so far; time left: known once a round is measured"
    cap = f" (no new trial after the budget's {p.budget_hours:g} h)" if p.eta_capped else ""
    return f"{elapsed} so far, about {duration_text(left)} left{cap}"


def _trials_line(p: Progress) -> str:
    baseline = "measured" if p.baseline_done else "being measured" if 0 in p.trials_running else "not measured yet"
    parts = [f"{p.trials_done} of {p.budget_trials} done after the baseline (trial 0: {baseline})"]
    ended = [f"{n} {what}" for n, what in ((p.failed, "failed"), (p.pruned, "pruned")) if n]
    if ended:
        parts.append(", ".join(ended) + " in this run")
    running = [n for n in p.trials_running if n != 0]
    if running:
        parts.append(("measuring trial " if len(running) == 1 else "measuring trials ") + ", ".join(map(str, running)))
    return "; ".join(parts)


def _rounds_line(p: Progress, *, live: bool) -> str:
    text = f"{p.rounds_done} done in this run"
    if live:
        text += f", about {p.rounds_left} left (the confirmation's pairs included)"
    if p.round_s is not None:
        text += f"; a round takes about {duration_text(p.round_s)}"
    return text


def progress_panel(p: Progress, *, now: float | None = None, live: bool = True, expand: bool = False) -> RenderableType:
    """The panel: study, time, trials, what runs now, rounds, best so far, the last event. `live`: the run is
    going on, so the time runs on and the estimate is shown; `expand`: as wide as the console (a live panel
    that keeps its width as its lines change)."""
    now = time.time() if now is None else now
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("time", _time_line(p, now, live=live))
    grid.add_row("trials", _trials_line(p))
    grid.add_row("now", Text(_now_line(p, now), style="cyan" if p.current is not None else ""))
    grid.add_row("rounds", _rounds_line(p, live=live))
    if p.best is not None:
        best = Text(f"trial {p.best.number}: score {p.best.score:+.2f}", style="green")
        best.append(f"  {_settings(p.best.settings)}")
        grid.add_row("best so far", best)
    else:
        grid.add_row("best so far", "none yet")
    grid.add_row("last", Text(p.last))
    return Panel(grid, title=escape(f"study {p.study}"), title_align="left", expand=expand)


def render_status(status: RunStatus, console: Console) -> None:
    """`tuner status`: whether the run goes on, then its panel."""
    style = "bold green" if status.live else "bold yellow" if status.running else "bold"
    console.print(Text(f"{status.who}: {status.headline()}", style=style), soft_wrap=True)
    if status.progress is not None:
        console.print(progress_panel(status.progress, now=status.now, live=status.live))


class LiveDisplay(ConsoleObserver):
    """The plain observer's lines, printed above a panel that follows the run (a context manager: the
    panel shows while inside it)."""

    def __init__(
        self, console: Console, tracker: ProgressTracker, *, refresh_per_second: float = 2, auto_refresh: bool = True
    ) -> None:
        super().__init__(console)
        self.tracker = tracker
        self.live = Live(
            console=console,
            get_renderable=self.panel,
            auto_refresh=auto_refresh,
            refresh_per_second=refresh_per_second,
            transient=True,  # the leaderboard follows; the lines above stay
        )

    def panel(self) -> RenderableType:
        snapshot = self.tracker.snapshot()
        if not snapshot.study:  # before the study began: its checks, the host reached
            return Group(Text("starting ...", style="dim"))
        return progress_panel(snapshot, now=snapshot.updated_at, expand=True)

    def refresh(self) -> None:
        self.live.refresh()

    def __enter__(self) -> LiveDisplay:
        self.live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.stop()


@contextlib.contextmanager
def run_observer(console: Console, tracker: ProgressTracker) -> Iterator[StudyObserver]:
    """What `tuner run` reports to: the tracker (the progress file), then the live panel on a terminal or
    a line per event anywhere else (a log file keeps every line, as before)."""
    if not console.is_terminal:
        yield Observers(tracker, ConsoleObserver(console))
        return
    with LiveDisplay(console, tracker) as display:
        yield Observers(tracker, display)
