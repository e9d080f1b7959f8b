"""The `tuner diagnose` findings on the terminal. Text that came from the log (quoted lines, notes) is
escaped for rich and was redacted when it was read, so a log line can neither restyle the output nor
show a key."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.markup import escape

from tuner.diagnose import Diagnosis, Figure, format_duration
from tuner.diagnose.report import counted
from tuner.predict import PredictedConfig, Prediction

__all__ = ["render_diagnosis"]


def _value(figure: Figure) -> str:
    if figure.value is None:
        return "absent"
    value = figure.value
    if figure.unit == "" and 0 < abs(value) < 1 and figure.name.endswith("share"):
        return f"{value:.0%}"
    text = f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.2f}"
    return f"{text} {figure.unit}".rstrip()


def render_diagnosis(diagnosis: Diagnosis, console: Console) -> None:
    server = diagnosis.server
    facts = [counted(diagnosis.lines, "line"), counted(diagnosis.tasks, "request"), format_duration(diagnosis.span_s)]
    if server.n_slots:
        facts.append(counted(server.n_slots, "slot"))
    if server.n_batch:
        facts.append(f"n_batch {server.n_batch} (from its prefill chunks)")
    if len(server.models) == 1:
        facts.append(f"model {server.models[0]}")
    kind = "Ollama (its runner's llama-server lines)" if server.engine == "ollama" else diagnosis.log_kind
    console.print(f"[bold]{escape(diagnosis.source)}[/bold]: {kind} log, " + escape(", ".join(facts)))
    if not diagnosis.findings:
        console.print(
            "no finding: nothing in this log cost the users time that a setting could give back"
            + (" (see the notes below)" if diagnosis.notes else "")
        )
    for number, finding in enumerate(diagnosis.findings, start=1):
        lost = (
            f" ({counted(round(finding.user_seconds_lost), 'user-second')})"
            if finding.user_seconds_lost is not None
            else ""
        )
        console.print()
        console.print(f"[bold]{number}. {escape(finding.title)}[/bold]{lost}")
        console.print(f"   {escape(finding.summary)}")
        group = None
        for figure in finding.figures:
            if figure.group is not None and figure.value in (None, 0.0) and figure.name.endswith("_count"):
                continue
            if figure.group != group and figure.group is not None:
                console.print(f"   [italic]{escape(figure.group)}[/italic]")
            group = figure.group
            indent = "     " if figure.group else "   "
            console.print(f"{indent}{escape(figure.label)}: {escape(_value(figure))}")
        for evidence in finding.evidence:
            where = f"{format_duration(evidence.start_s)}" if evidence.start_s is not None else ""
            lines = ", ".join(str(n) for n in evidence.lines[:6])
            console.print(f"   [dim]at {where}, lines {lines}:[/dim] {escape(evidence.note)}")
            if evidence.quote:
                console.print(f"     [dim]{escape(evidence.quote)}[/dim]")
        for fix in finding.fixes:
            knob = f"[bold]{escape(fix.knob)}[/bold]: " if fix.knob else ""
            console.print(f"   fix: {knob}{escape(fix.action)}")
            if fix.estimate:
                console.print(f"        {escape(fix.estimate)}")
            console.print(f"        trade-off: {escape(fix.trade_off)}")
    if diagnosis.profile:
        console.print()
        group = None
        for figure in diagnosis.profile:
            if figure.group != group:
                console.print(f"[italic]{escape(figure.group or '')}[/italic]")
                group = figure.group
            console.print(f"   {escape(figure.label)}: {escape(_value(figure))}")
    for note in diagnosis.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def render_prediction(prediction: Prediction, console: Console, *, top: int = 5) -> None:
    """The predicted leaderboard: the best configs and the baseline, each figure the median over the
    simulator's seeds with their range, then where the calibration came from."""
    console.print()
    console.print(
        f"predicted on the simulated llama-server: {prediction.requests} requests of this log, "
        f"{len(prediction.configs)} configs x {counted(prediction.seeds, 'seed')}",
        markup=False,
        highlight=False,
    )

    def cell(config: PredictedConfig, metric: str, digits: int) -> str:
        median, spread = config.median[metric], config.spread[metric]
        if median is None or spread is None:
            return "-"
        return f"{median:.{digits}f} ({spread[0]:.{digits}f}-{spread[1]:.{digits}f})"

    shown = [c for c in prediction.configs[:top]]
    shown += [c for c in prediction.configs if c.baseline and c not in shown]
    for config in shown:
        settings = _settings_text(config.settings)
        mark = " (baseline)" if config.baseline else "" if config.eligible else " (prefill under 80% of the baseline's)"
        console.print(
            f"   {settings}{mark}: stall {cell(config, 'stall_tok_s', 2)} tok/s, TTFT p95 "
            f"{cell(config, 'ttft_p95_s', 2)} s, prefill {cell(config, 'prefill_tok_s', 0)} tok/s",
            markup=False,
            highlight=False,
        )
    if prediction.best is None:
        faster = any(not c.eligible for c in prediction.configs)
        why = "no config that keeps 80% of its prefill gives the streams more" if faster else "no config gives more"
        console.print(f"   predicted best: the baseline ({why})", markup=False)
    else:
        best = _settings_text(prediction.best.settings)
        console.print(f"   predicted best: {best}", markup=False, highlight=False)
    calibration = prediction.calibration
    console.print(
        f"   calibration: the shipped costs x {calibration.prefill_factor:.2f} for prefill, "
        f"x {calibration.decode_factor:.2f} for decode, from",
        markup=False,
    )
    for line in calibration.fitted or ["no figure of this log"]:
        console.print(f"     {line}", markup=False, highlight=False)
    console.print("   kept, which the log cannot determine:", markup=False)
    for line in calibration.kept:
        console.print(f"     {line}", markup=False, highlight=False)


def _settings_text(settings: Mapping[str, object]) -> str:
    return ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items())
