"""Rich rendering: a line-per-event observer of the study, and the leaderboard table.

Line-per-event rather than a live display, because overnight runs end up in log files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuner.observers import NullObserver

# Types only: the CLI makes its consoles here for every command, `tuner kinds` and an error line
# included, and those need neither the reports (pandas, scipy) nor the engines and metrics (numpy).
if TYPE_CHECKING:
    from tuner.config import ParamValue
    from tuner.metrics import MetricInfo
    from tuner.report import Leaderboard, LeaderboardRow
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
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "(baseline)"


def make_console(*, stderr: bool = False) -> Console:
    """A console that does not wrap tables at 80 columns when the output goes to a log file."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=200)
    return console


class ConsoleObserver(NullObserver):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()

    def study_started(self, *, name: str, run_dir: str, baseline_done: bool, trials_done: int, budget: int) -> None:
        resumed = f", resuming: baseline and {trials_done} trials already measured" if baseline_done else ""
        self.console.print(f"[bold]study {name}[/]  in {run_dir}  budget {budget} trials after the baseline{resumed}")

    def trial_started(self, *, number: int, settings: Mapping[str, ParamValue], baseline: bool) -> None:
        what = "baseline (the server's own settings)" if baseline else _settings(settings)
        self.console.print(f"[bold cyan]trial {number}[/]  {what}")

    def server_ready(self, *, number: int, seconds: float) -> None:
        self.console.print(f"  trial {number}: server healthy after {seconds:.1f} s", style="dim")

    def server_reused(self, *, number: int) -> None:
        self.console.print(
            f"  trial {number}: on the running server, its slots cleared (same server settings)", style="dim"
        )

    def round_finished(self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int) -> None:
        parts = [f"{_label(n)} {_fmt(metrics.get(n))}" for n in _ROUND_METRICS]
        if metrics.get("server_stall_tok_s") is not None:
            parts[1] += f" (server log {_fmt(metrics['server_stall_tok_s'])})"
        failed = f"  [red]{failures} failed[/]" if failures else ""
        self.console.print(f"  trial {number} {label}  " + "  ".join(parts) + failed)

    def replay_fell_behind(self, *, number: int, label: str, reason: str) -> None:
        self.console.print(f"  trial {number} {label}  [yellow]{reason}[/]")

    def trial_finished(self, *, number: int, score: float, noisy: list[str]) -> None:
        flag = f"  [yellow]rounds differ by 20%+ on {', '.join(noisy)}[/]" if noisy else ""
        self.console.print(f"  trial {number} score {score:+.2f}{flag}")

    def trial_failed(self, *, number: int, reason: str) -> None:
        # The reason quotes the server (an error body, its log): its brackets are text, not markup.
        self.console.print(f"  trial {number} [red]FAIL[/] {escape(reason)}")

    def trial_pruned(self, *, number: int, reason: str, saved_s: float) -> None:
        self.console.print(f"  trial {number} [yellow]PRUNED[/] {reason}; saved about {saved_s:.0f} s")

    def remeasuring(self, *, metrics: list[str], extra: int) -> None:
        self.console.print(f"  [yellow]rounds differ by 20%+ on {', '.join(metrics)}: {extra} more round(s)[/]")

    def trial_skipped(self, *, settings: Mapping[str, ParamValue], reason: str) -> None:
        self.console.print(f"[dim]skip      {_settings(settings)}: {reason}[/]")

    def search_exhausted(self, *, proposals: int) -> None:
        self.console.print(
            f"the sampler proposed only measured or invalid settings {proposals} times in a row: the search space "
            "looks exhausted, so the search ends here"
        )

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        self.console.print(
            f"[bold cyan]re-measuring trial {number}[/] ({_settings(settings)}) against the baseline: "
            f"{pairs} pairs in alternating order"
        )

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        self.console.print(f"  paired score difference {mean:+.2f}, 95% interval {low:+.2f}..{high:+.2f}")

    def restoring(self) -> None:
        self.console.print("restoring the baseline ...")


def _cell(row: LeaderboardRow, name: str) -> Text:
    if name not in row.metrics:
        return Text("-")
    median, low, high = row.metrics[name]
    text = Text(_fmt(median))
    if _fmt(high) != _fmt(low):
        text.append(f" [{_fmt(low)}-{_fmt(high)}]", style="dim")
    if name in row.noisy:
        text.append(" !", style="yellow")
    return text


def render_leaderboard(board: Leaderboard, console: Console | None = None) -> None:
    console = console or make_console()
    table = Table(title=escape(f"leaderboard: {board.study_name} (median [min-max] over rounds)"), title_justify="left")
    table.add_column("trial", justify="right", no_wrap=True)
    table.add_column("settings (changed from baseline)", no_wrap=True, max_width=60)
    table.add_column("score", justify="right", no_wrap=True)
    # A column no trial has a value for (no long prompts: no stall figures) only takes room.
    shown = tuple(n for n in _TABLE_METRICS + _LORA_METRICS if any(n in row.metrics for row in board.rows))
    for name in shown:
        table.add_column(_label(name), justify="right", no_wrap=True)
    for row in board.rows:
        if row.score is None:
            settings = Text(_settings(row.changed or row.settings))
            settings.append(f"  {row.state}: {row.reason or ''}", style="yellow" if row.state == "PRUNED" else "red")
            table.add_row(str(row.number), settings, "-", *[_cell(row, n) for n in shown])
            continue
        label = Text("baseline", style="bold") if row.baseline else Text(_settings(row.changed) or "same as baseline")
        if row.violates:
            label.append(f"  violates {'; '.join(row.violates)}", style="red")
        if row.answers_changed:
            label.append(f"  changes ~{row.answers_changed:.0%} of answers", style="magenta")
        score = Text(f"{row.score:+.2f}")
        if row.score_range and row.score_range[0] != row.score_range[1]:
            score.append(f" [{row.score_range[0]:+.2f}..{row.score_range[1]:+.2f}]", style="dim")
        number = f"{row.number} *" if row.pareto else str(row.number)
        table.add_row(number, label, score, *[_cell(row, n) for n in shown])
    console.print(table)
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
    style = "bold green" if board.recommendation.row is not None else "bold yellow"
    console.print(Text(board.recommendation.message, style=style))


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
