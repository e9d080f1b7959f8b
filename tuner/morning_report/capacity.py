"""The morning report's capacity section: the latest `tuner capacity` sweep of the run, as seed 004 drew
its own: the sentence to pass on, a table of users by config and round, and two charts against the number
of users (per-user speed and TTFT p95) with the SLO's lines."""

from __future__ import annotations

from html import escape

from tuner.capacity.record import CapacitySweep, SweptConfig, capacity_sentence
from tuner.morning_report.gather import Gathered
from tuner.morning_report.pieces import section
from tuner.svg import PALETTE, Series, chart
from tuner.text import count_text

__all__ = ["capacity_section"]


def capacity_section(g: Gathered) -> str:
    """Nothing for a run without a sweep; a line for a latest sweep that cannot be read, above the one shown."""
    problem = "" if g.capacity_unreadable is None else f"<p class='muted'>{escape(g.capacity_unreadable)}</p>"
    sweep = g.capacity
    if sweep is None:
        return section("capacity-section", "How many users each config serves", problem) if problem else ""
    slo = f"TTFT p95 at most {sweep.slo_ttft_p95_s:g} s and at least {sweep.slo_decode_tok_s:g} tok/s per user"
    sentence = capacity_sentence(sweep)
    rounds = count_text(sweep.rounds, "round")
    others = (
        f" The run directory holds {count_text(g.capacity_others, 'other sweep')} in capacity/: this one is the "
        "latest that measured the baseline and a trial with the study's own [capacity] table (else the latest "
        "of both, else the latest)."
        if g.capacity_others
        else ""
    )
    body = (
        f"{problem}<p id='capacity-sentence'>{escape(sentence[0].upper() + sentence[1:])}.</p>"
        f"<p class='muted'>{escape(sweep.server)}. Closed-loop users ({escape(sweep.shape)} requests: each user "
        f"sends its next request as soon as its answer is in); the window of {sweep.window_s:g} s opens "
        f"{sweep.warm_up_s:g} s after a level begins, once every user has its first answer; {rounds}, started "
        f"{escape(sweep.started)}. The SLO: {slo}, no failed request, at least {sweep.slo_min_requests} requests "
        "(fewer: ?). Each cell: total tok/s / per-user tok/s / TTFT p95; in the charts, a line per config and "
        f"round.{escape(others)}</p>" + _table(sweep) + _charts(sweep)
    )
    return section("capacity-section", "How many users each config serves", body)


def _table(sweep: CapacitySweep) -> str:
    head = "".join(
        f"<th>{escape(config.label)}, round {r}</th>" for config in sweep.configs for r in range(1, sweep.rounds + 1)
    )
    rows = []
    for users in sweep.users:
        cells = []
        for config in sweep.configs:
            for round_ in range(1, sweep.rounds + 1):
                figures = config.level(users, round_)
                if figures is None:
                    cells.append("<td></td>")
                    continue
                cells.append(
                    f"<td class='{figures.verdict.replace(' ', '-')}' title='{escape(figures.why)}'>"
                    f"{escape(figures.cell)}</td>"
                )
        if any(cell != "<td></td>" for cell in cells):
            rows.append(f"<tr><td class='num'>{users}</td>{''.join(cells)}</tr>")
    capacities = "".join(f"<td>{'-' if c.capacity is None else c.capacity}</td>" * sweep.rounds for c in sweep.configs)
    return (
        f"<table id='capacity' class='board'><thead><tr><th class='num'>users</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}<tr><th>capacity</th>{capacities}</tr></tbody></table>"
    )


def _series(config: SweptConfig, metric: str, color: str, rounds: int) -> list[Series]:
    out = []
    for round_ in range(1, rounds + 1):
        points = sorted(
            (float(f.users), value)
            for f in config.levels
            if f.round == round_ and (value := getattr(f, metric)) is not None
        )
        if points:  # a line per round, the config named once in the legend
            label = config.label if round_ == 1 else ""
            out.append(Series(label=label, points=points, color=color, kind="line"))
    return out


def _charts(sweep: CapacitySweep) -> str:
    measured = [f.users for c in sweep.configs for f in c.levels]
    if not measured:
        return ""
    span = [float(min(measured)), float(max(measured))]
    colors = {i: PALETTE[1 + i % (len(PALETTE) - 1)] for i in range(len(sweep.configs))}
    charts = []
    for metric, label, line in (
        ("per_user_tok_s", "per-user tok/s (median)", sweep.slo_decode_tok_s),
        ("ttft_p95_s", "TTFT p95 (s)", sweep.slo_ttft_p95_s),
    ):
        series = [s for i, c in enumerate(sweep.configs) for s in _series(c, metric, colors[i], sweep.rounds)]
        series.append(Series(label="SLO", points=[(x, line) for x in span], color=PALETTE[0], kind="line"))
        charts.append(chart(title=label, x_label="concurrent users", y_label=label, series=series, x_log=True))
    return "<div class='charts'>" + "".join(charts) + "</div>"
