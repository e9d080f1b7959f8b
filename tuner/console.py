"""Rich rendering: a line-per-event observer of the study, and the leaderboard table.

Line-per-event rather than a live display, because overnight runs end up in log files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuner.observers import FLEET_HOST, NullObserver
from tuner.text import settings_text

# Types only: the CLI makes its consoles here for every command, `tuner kinds` and an error line
# included, and those need neither the reports (pandas, scipy) nor the engines and metrics (numpy).
if TYPE_CHECKING:
    from tuner.config import ParamValue
    from tuner.metrics import MetricInfo
    from tuner.prediction_record import PredictedFigures
    from tuner.report import Leaderboard, LeaderboardRow
    from tuner.study_record import Confirmation
    from tuner.workloads import TraceSummary

__all__ = ["ConsoleObserver", "make_console", "render_leaderboard", "render_trace_summary"]

_ROUND_METRICS = ("ttft_p95_s", "stall_tok_s", "prefill_tok_s", "itl_max_s")
_LORA_METRICS = ("lora_wait_p95_s", "lora_switch_ms")  # shown when the workload mixes LoRA settings
_TABLE_METRICS = (
    "stall_tok_s",
    "unstalled_tok_s",
    "prefill_tok_s",
    "ttft_p95_s",
    "itl_max_s",
    "output_tok_s",
    "failures",
)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _metric_info(name: str) -> MetricInfo | None:
    """A common metric, or one an engine's counters add (each engine declares its own)."""
    from tuner.engines import ENGINES
    from tuner.metrics import METRICS

    if name in METRICS:
        return METRICS[name]
    engines = [ENGINES.get(kind) for kind in ENGINES.kinds()]
    return next((engine.metrics[name] for engine in engines if name in engine.metrics), None)


def _label(name: str) -> str:
    info = _metric_info(name)
    short = name.removesuffix("_s").removesuffix("_ms").removesuffix("_tok").replace("_", " ")
    return f"{short} ({info.unit})" if info and info.unit else short


def _settings(settings: Mapping[str, ParamValue]) -> str:
    return settings_text(settings, empty="(baseline)")


def make_console(*, stderr: bool = False) -> Console:
    """A console that does not wrap tables at 80 columns when the output goes to a log file."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=200)
    return console


class ConsoleObserver(NullObserver):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()

    def _say(self, line: str, *, style: str | None = None) -> None:
        """One line; named by its host where one controller drives several (their lines interleave)."""
        host = FLEET_HOST.get()
        if host is not None:
            indent = line[: len(line) - len(line.lstrip(" "))]
            line = f"{indent}{escape(f'[{host}]')} {line[len(indent) :]}"
        self.console.print(line, style=style)

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        resumed = f", resuming: baseline and {trials_done} trials already measured" if baseline_done else ""
        self._say(f"[bold]study {name}[/]  in {run_dir}  budget {budget} trials after the baseline{resumed}")

    def predicting(self, *, log: str) -> None:
        self._say(f"predicting from {escape(log)} on the simulated server ...")

    def predicted(self, *, log: str, best: Mapping[str, ParamValue] | None, queued: bool, note: str | None) -> None:
        if best is None:
            said = "no config is predicted to beat the baseline: the search starts as usual"
        else:
            said = f"predicted best {_settings(best)}" + (", queued first after the baseline" if queued else "")
        self._say(f"prediction from {escape(log)}: {escape(said)}" + (f" ({escape(note)})" if note else ""))

    def baseline_read(self, *, values: list[str]) -> None:
        self._say(f"the baseline is the server as it runs: {escape('; '.join(values))}")

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        what = "baseline (the server's own settings)" if baseline else _settings(settings)
        self._say(f"[bold cyan]trial {number}[/]  {what}")

    def server_ready(self, *, number: int, seconds: float) -> None:
        self._say(f"  trial {number}: server healthy after {seconds:.1f} s", style="dim")

    def server_reused(self, *, number: int) -> None:
        self._say(f"  trial {number}: on the running server, its slots cleared (same server settings)", style="dim")

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        parts = [f"{_label(n)} {_fmt(metrics.get(n))}" for n in _ROUND_METRICS]
        if metrics.get("server_stall_tok_s") is not None:
            parts[1] += f" (server log {_fmt(metrics['server_stall_tok_s'])})"
        failed = f"  [red]{failures} failed[/]" if failures else ""
        self._say(f"  trial {number} {label}  " + "  ".join(parts) + failed)

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        self._say(f"  trial {number} {label}  [yellow]{reason}[/]")

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        flag = f"  [yellow]rounds differ by 20%+ on {', '.join(noisy)}[/]" if noisy else ""
        self._say(f"  trial {number} score {score:+.2f}{flag}")

    def trial_failed(self, *, number: int, reason: str) -> None:
        # The reason quotes the server (an error body, its log): its brackets are text, not markup.
        self._say(f"  trial {number} [red]FAIL[/] {escape(reason)}")

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        self._say(f"  trial {number} [yellow]PRUNED[/] {reason}; saved about {saved_s:.0f} s")

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        self._say(f"  [yellow]rounds differ by 20%+ on {', '.join(metrics)}: {extra} more round(s)[/]")

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        self._say(f"[dim]skip      {_settings(settings)}: {reason}[/]")

    def search_exhausted(self, *, proposals: int) -> None:
        self._say(
            f"the sampler proposed only measured or invalid settings {proposals} times in a row: the search space "
            "looks exhausted, so the search ends here"
        )

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        self._say(
            f"[bold cyan]re-measuring trial {number}[/] ({_settings(settings)}) against the baseline: "
            f"up to {pairs} pairs in alternating order, fewer once the answer is clear"
        )

    def confirm_finished(self, *, number: int, result: Confirmation) -> None:
        low, high = result.ci
        self._say(
            f"  paired score difference {result.mean:+.2f}, 95% interval {low:+.2f}..{high:+.2f}, "
            f"over {result.pairs_told()}"
        )

    def restoring(self) -> None:
        self._say("restoring the baseline ...")


# The leaderboard's metric columns from the most important to the least: on a narrow terminal the last
# ones go first. Stall speed, prefill speed and TTFT are what the default objectives trade.
_IMPORTANCE = (
    "stall_tok_s",
    "prefill_tok_s",
    "ttft_p95_s",
    "failures",
    "lora_wait_p95_s",
    "itl_max_s",
    "unstalled_tok_s",
    "output_tok_s",
    "lora_switch_ms",
)
# Headers short enough that the demo's table fits 80 columns; the legend under the table spells them out.
_SHORT_HEADERS = {
    "stall_tok_s": "stall t/s",
    "unstalled_tok_s": "unstalled t/s",
    "prefill_tok_s": "prefill t/s",
    "ttft_p95_s": "TTFT p95 s",
    "itl_max_s": "ITL max s",
    "output_tok_s": "out t/s",
    "failures": "fail",
    "lora_wait_p95_s": "LoRA wait s",
    "lora_switch_ms": "LoRA sw ms",
    "wait_p95_s": "wait p95 s",
}
_SETTINGS_HEADER = "settings (changed from baseline)"
_PREDICTED_HEADER = {False: "stall tok/s predicted", True: "predicted"}
# Narrower than this, the settings wrap onto more lines than a row is worth: a metric column goes instead.
_SETTINGS_MIN_WIDTH = 20
# Each column's one space of padding either side, and the vertical lines of the default box.
_PADDING = 2


@dataclass(frozen=True, kw_only=True)
class _Layout:
    """What one rendering of the leaderboard shows."""

    metrics: tuple[str, ...]  # the metric columns, in table order
    short_headers: bool
    metric_ranges: bool
    score_range: bool


@dataclass(frozen=True, kw_only=True)
class _Column:
    header: str
    cells: list[Text]

    def width(self) -> int:
        return max([cell_len(self.header), *(cell.cell_len for cell in self.cells)]) + _PADDING


def _layouts(available: tuple[str, ...]) -> Iterator[_Layout]:
    """From the most detail to the least: full headers, then short ones; then without the metrics' [min-max]
    ranges, then without the score's; then without the least important metrics, one at a time."""
    yield _Layout(metrics=available, short_headers=False, metric_ranges=True, score_range=True)
    yield _Layout(metrics=available, short_headers=True, metric_ranges=True, score_range=True)
    yield _Layout(metrics=available, short_headers=True, metric_ranges=False, score_range=True)
    # An objective outside the usual columns ranks first: the score was made of it.
    by_importance = sorted(available, key=lambda name: _IMPORTANCE.index(name) if name in _IMPORTANCE else -1)
    for keep in range(len(available), -1, -1):
        kept = set(by_importance[:keep])
        metrics = tuple(name for name in available if name in kept)
        yield _Layout(metrics=metrics, short_headers=True, metric_ranges=False, score_range=False)


def _cell(row: LeaderboardRow, name: str, *, ranges: bool) -> Text:
    if name not in row.metrics:
        return Text("-")
    median, low, high = row.metrics[name]
    text = Text(_fmt(median))
    if ranges and _fmt(high) != _fmt(low):
        text.append(f" [{_fmt(low)}-{_fmt(high)}]", style="dim")
    if name in row.noisy:
        text.append(" !", style="yellow")
    return text


def _settings_cell(row: LeaderboardRow, shown: tuple[str, ...]) -> Text:
    """The settings and every flag of the row: why it failed or was pruned, a broken constraint, changed
    answers, and noise on a metric that has no column here (its `!` would be lost with the column)."""
    if row.score is None:
        label = Text(_settings(row.changed or row.settings))
        label.append(f"  {row.state}: {row.reason or ''}", style="yellow" if row.state == "PRUNED" else "red")
    else:
        label = Text("baseline", style="bold") if row.baseline else Text(_settings(row.changed) or "same as baseline")
    if row.violates:
        label.append(f"  violates {'; '.join(row.violates)}", style="red")
    if row.answers_changed:
        label.append(f"  changes ~{row.answers_changed:.0%} of answers", style="magenta")
    unseen_noise = [name for name in row.noisy if name not in shown]
    if unseen_noise:
        label.append(f"  ! on {', '.join(unseen_noise)}", style="yellow")
    return label


def _score_cell(row: LeaderboardRow, *, ranges: bool) -> Text:
    if row.score is None:
        return Text("-")
    score = Text(f"{row.score:+.2f}")
    if ranges and row.score_range and row.score_range[0] != row.score_range[1]:
        score.append(f" [{row.score_range[0]:+.2f}..{row.score_range[1]:+.2f}]", style="dim")
    return score


def _columns(board: Leaderboard, layout: _Layout) -> list[_Column]:
    """The columns beside the settings: the trial, the score and the metrics."""
    rows = board.rows
    columns = [
        _Column(header="trial", cells=[Text(f"{row.number} *" if row.pareto else str(row.number)) for row in rows]),
        _Column(header="score", cells=[_score_cell(row, ranges=layout.score_range) for row in rows]),
    ]
    if any(row.host for row in rows):  # a fleet: which host measured each trial (its score is against that host's)
        columns.insert(1, _Column(header="host", cells=[Text(row.host or "") for row in rows]))
    for name in layout.metrics:
        header = _SHORT_HEADERS.get(name, _label(name)) if layout.short_headers else _label(name)
        columns.append(_Column(header=header, cells=[_cell(row, name, ranges=layout.metric_ranges) for row in rows]))
        if name == "stall_tok_s" and board.prediction is not None:  # the prediction beside what was measured
            predicted = board.prediction.predicted
            cells = [
                _predicted_cell(predicted.get(row.number), row.number == board.prediction.best_trial) for row in rows
            ]
            columns.append(_Column(header=_PREDICTED_HEADER[layout.short_headers], cells=cells))
    return columns


def _predicted_cell(figures: PredictedFigures | None, best: bool) -> Text:
    """The predicted stall speed; `*` marks the predicted best, `x` a config not eligible to be it (one that breaks
    the study's constraints, or, ranked by stall speed, loses too much prefill)."""
    if figures is None:
        return Text("-")
    cell = Text(_fmt(figures.median.get("stall_tok_s")))
    if best:
        cell.append(" *", style="green")
    elif not figures.eligible:
        cell.append(" x", style="yellow")
    return cell


def _settings_min_width(cells: list[Text]) -> int:
    """The narrowest the settings column may wrap to: no word split, and not a sliver either."""
    natural = max([cell_len(_SETTINGS_HEADER), *(cell.cell_len for cell in cells)])
    longest_word = max(cell_len(word) for cell in [Text(_SETTINGS_HEADER), *cells] for word in cell.plain.split())
    return min(natural, max(longest_word, _SETTINGS_MIN_WIDTH)) + _PADDING


def _fits(columns: list[_Column], settings: list[Text], width: int) -> bool:
    borders = len(columns) + 2  # one line left of each column, the settings' included, and one at the right
    return sum(column.width() for column in columns) + _settings_min_width(settings) + borders <= width


class _AtWidth:
    """Renders at a set width, wider than the console's: `--wide` lets the table run past the terminal's
    edge (the terminal or a pager wraps it) rather than have rich cut its cells down to fit."""

    def __init__(self, renderable: Table, width: int) -> None:
        self.renderable = renderable
        self.width = width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.renderable, options.update_width(self.width))


def render_leaderboard(
    board: Leaderboard, console: Console | None = None, *, wide: bool = False, show_all: str = "--wide shows all"
) -> None:
    """The leaderboard as a table that fits the console's width: short headers with a legend, and what
    does not fit left out and named, with `show_all` saying how to see it. `wide`: every column with its
    full header and ranges, however wide."""
    console = console or make_console()
    # A column no trial has a value for (no long prompts: no stall figures) only takes room.
    # An objective the usual columns lack (the Ollama demo's wait_p95_s) is shown too: it made the score.
    extra = tuple(n for n in board.objectives if n not in _TABLE_METRICS + _LORA_METRICS)
    shown = _TABLE_METRICS + _LORA_METRICS + extra
    available = tuple(n for n in shown if any(n in row.metrics for row in board.rows))
    full = _Layout(metrics=available, short_headers=False, metric_ranges=True, score_range=True)
    if wide:
        layout = full
    else:
        # The least detailed layout is the fallback on a terminal too narrow even for it.
        candidates = list(_layouts(available))
        layout = next(
            (c for c in candidates if _fits(_columns(board, c), _settings_cells(board, c), console.width)),
            candidates[-1],
        )
    columns = _columns(board, layout)
    settings = _settings_cells(board, layout)
    ranges = " [min-max]" if layout.metric_ranges else ""
    table = Table(title=escape(f"leaderboard: {board.study_name} (median{ranges} over rounds)"), title_justify="left")
    table.add_column(columns[0].header, justify="right", no_wrap=True)
    # Wrapped, never cut: a failure's reason or a broken constraint can be longer than the terminal.
    table.add_column(_SETTINGS_HEADER, no_wrap=wide, overflow="fold")
    for column in columns[1:]:
        table.add_column(column.header, justify="right", no_wrap=True)
    for index, settings_cell in enumerate(settings):
        table.add_row(columns[0].cells[index], settings_cell, *(column.cells[index] for column in columns[1:]))
    if wide:
        settings_width = max([cell_len(_SETTINGS_HEADER), *(cell.cell_len for cell in settings)]) + _PADDING
        width = sum(column.width() for column in columns) + settings_width + len(columns) + 2
        console.print(_AtWidth(table, width), crop=False)
    else:
        console.print(table)
    _render_notes(board, console, layout, available, show_all)


def _settings_cells(board: Leaderboard, layout: _Layout) -> list[Text]:
    return [_settings_cell(row, layout.metrics) for row in board.rows]


def _render_notes(
    board: Leaderboard, console: Console, layout: _Layout, available: tuple[str, ...], show_all: str
) -> None:
    abbreviated = [name for name in layout.metrics if layout.short_headers and name in _SHORT_HEADERS]
    if abbreviated:
        legend = Table.grid(padding=(0, 2))
        legend.add_column(no_wrap=True)
        legend.add_column()  # wraps on a narrow terminal: the descriptions are sentences
        for name in abbreviated:
            info = _metric_info(name)
            unit = f" ({info.unit})" if info and info.unit else ""
            description = f"{name}{unit}: {info.description if info else ''}"
            legend.add_row(Text(_SHORT_HEADERS.get(name, name)), Text(description))
        console.print(legend)
    left_out = [name for name in available if name not in layout.metrics]
    parts = []
    if left_out:
        parts.append(f"{len(left_out)} column{'s' if len(left_out) > 1 else ''} ({', '.join(left_out)})")
    if not layout.score_range:
        parts.append("the [min-max] ranges")
    elif not layout.metric_ranges:
        parts.append("the metrics' [min-max] ranges")
    if parts:
        console.print(Text(f"left out to fit a width of {console.width}: {' and '.join(parts)}; {show_all}"))
    if board.pruning_saved_s > 0:
        console.print(
            f"pruning stopped {board.pruned} trials after their first round and saved about "
            f"{board.pruning_saved_s:.0f} s of measurement"
        )
    if any(row.pareto for row in board.rows):
        console.print("* = on the Pareto front: no other trial is better on every objective")
    console.print(
        "score: weighted log-ratio against the baseline's median (0 = baseline, +0.69 = twice as good); "
        "! = rounds differ by 20% or more"
    )
    if board.hosts is not None:
        console.print(Text(board.hosts.line()))
    if board.prediction is not None and "stall_tok_s" in layout.metrics:
        console.print(
            f"predicted: the stall speed the simulated server, calibrated from {board.prediction.record.log}, "
            f"expected for the trial's config (median of {board.prediction.record.seeds} simulated rounds); "
            "* = the predicted best, x = "
            + (
                "predicted to break the study's constraints, or not scored"
                if board.prediction.record.ranked_by == "score"
                else "predicted to prefill under 80% of the baseline's speed"
            ),
            markup=False,
            highlight=False,
        )
    style = "bold green" if board.recommendation.row is not None else "bold yellow"
    console.print(Text(board.recommendation.message, style=style))
    if board.prediction is not None:
        console.print(Text(board.prediction.message, style="green" if board.prediction.held else "yellow"))


def render_trace_summary(summary: TraceSummary, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(f"[bold]{escape(summary.name)}[/]  {escape(summary.description)}")
    rate = f", {summary.arrivals_per_min:.1f} arrivals/min" if summary.arrivals_per_min is not None else ""
    console.print(
        f"{summary.requests} requests in {summary.sessions} sessions over {summary.span_s:.1f} s{rate}; "
        f"{summary.long_prompts} long prompts"
    )
    console.print(
        f"prompt tokens the server can reuse: {summary.prefix_reuse:.0%} in shared prefixes, "
        f"{summary.history_reuse:.0%} in session history (only what an earlier request computed; "
        "assumes a cache that never evicts, so a real server may reuse less)"
    )
    concurrency = summary.concurrency
    console.print(
        f"in flight ({concurrency.basis}): peak {concurrency.peak}, mean {concurrency.mean:.1f}", highlight=False
    )
    console.print(f"  in flight {_sparkline(concurrency.in_flight_peak)} peak {concurrency.peak}", highlight=False)
    console.print(
        f"  arrivals  {_sparkline(concurrency.arrivals)} max {max(concurrency.arrivals)} per "
        f"{concurrency.bucket_s:.3g} s",
        highlight=False,
    )
    table = Table(title="tokens per request", title_justify="left")
    for column in ("", "mean", "p50", "p95", "max", "total"):
        table.add_column(column, justify="right" if column else "left")
    for label, dist in (
        ("prompt", summary.prompt_tokens),
        ("new prompt", summary.new_tokens),
        ("output", summary.output_tokens),
    ):
        table.add_row(
            label, f"{dist.mean:.0f}", f"{dist.p50:.0f}", f"{dist.p95:.0f}", f"{dist.max:.0f}", f"{dist.total}"
        )
    console.print(table)
    console.print("tags: " + ", ".join(f"{tag} {count}" for tag, count in summary.tags.items()))
    console.print("LoRA: " + ", ".join(f"{label} {count}" for label, count in summary.lora.items()))


def _sparkline(values: Sequence[int]) -> str:
    """One character per bucket, from a blank for 0 to a full block for the largest value."""
    top = max(values) or 1
    levels = " ▁▂▃▄▅▆▇█"
    return "".join(levels[0] if v == 0 else levels[max(1, round(v / top * (len(levels) - 1)))] for v in values)
