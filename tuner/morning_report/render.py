"""Rendering the morning report: the page, a section at a time, from what was computed. No reading and no
computing of its own beyond formatting; the one write is the caller's (`write_report`).

Order of the page, most important first: the verdict and what it buys, the exact change to apply, the
leaderboard, the stall picture (one streaming user's tokens while another prompt is prefilled), the spread
of the rounds and the objectives, the workload, and how the night was spent.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from html import escape

from tuner.catalog import SYSTEMD_APPLIED_DROP_IN
from tuner.morning_report.capacity import capacity_section
from tuner.morning_report.compute import MIN_TRIALS_FOR_IMPORTANCE, Change, Computed, directions, objectives
from tuner.morning_report.pieces import (
    SCRIPT,
    SCRIPT_HASH,
    STYLE,
    TABLE_METRICS,
    USER_TERMS,
    distribution_text,
    duration,
    fmt,
    in_flight_chart,
    metric_cell,
    ratio_text,
    redact_spec,
    score_cell,
    section,
    settings_text,
    timeline_chart,
)
from tuner.report import LeaderboardRow
from tuner.svg import PALETTE, Series, chart

__all__ = ["page"]


def page(c: Computed) -> str:
    name = escape(c.g.board.study_name)
    sections = [
        _verdict(c),
        _apply(c),
        _leaderboard(c),
        _prediction(c),
        capacity_section(c.g),
        _timeline(c),
        _spread(c),
        _workload(c),
        _run_facts(c),
    ]
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        # No request to anything, this page's own file aside: a policy the browser enforces.
        # The one script allowed by its hash: markup that got in (it must not) could run nothing.
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src '{SCRIPT_HASH}'; img-src data:\">"
        f"<title>serve-tuner: {name}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{name}</h1><p class='muted'>{escape(str(c.g.spec.get('description', '')))}</p>"
        f"<p class='muted'>{escape(_when(c))}</p></header>" + "".join(sections) + f"<script>{SCRIPT}</script>"
        "</body></html>\n"
    )


def _when(c: Computed) -> str:
    when = c.when
    parts = [f"{when.done} trials after the baseline" + (f" of a budget of {when.budget}" if when.budget else "")]
    if when.started is not None:
        parts.append(f"started {when.started:%Y-%m-%d %H:%M}")
    if when.ended is not None:
        parts.append(f"last trial ended {when.ended:%Y-%m-%d %H:%M}")
    if when.running:
        parts.append("still running: this page is rewritten after every trial")
    parts.append(f"made by serve-tuner {c.g.version}")
    return "; ".join(parts)


# --- the verdict -------------------------------------------------------------------------------


def _verdict(c: Computed) -> str:
    recommendation = c.g.board.recommendation
    row = recommendation.row
    if row is None:
        head = "<p class='verdict keep'>Keep the current settings.</p>"
    else:
        head = f"<p class='verdict win'>Change {escape(settings_text(row.changed))}.</p>"
    body = [head, f"<p id='recommendation'>{escape(recommendation.message)}</p>"]
    confirmation = c.g.view.confirmations().get(row.number) if row is not None else None
    if confirmation is not None:
        low, high = confirmation.ci
        body.append(
            "<p>Paired difference in score against the baseline (re-measured in alternating pairs): "
            f"<b data-value='{confirmation.mean:.6g}'>{confirmation.mean:+.2f}</b>, 95% interval "
            f"{low:+.2f} to {high:+.2f} over {escape(confirmation.pairs_told())}. A score of +0.69 is "
            "twice as good on the weighted objectives.</p>"
        )
    compared = c.compared
    if c.baseline is not None and compared is not None:
        title = "What it buys" if row is not None else f"What the best candidate (trial {compared.number}) would do"
        body.append(f"<h3>{escape(title)}</h3>{_user_terms(c.baseline, compared)}")
    return section("verdict", "The verdict", "".join(body))


def _user_terms(baseline: LeaderboardRow, other: LeaderboardRow) -> str:
    lines = []
    for metric, label, unit, higher_better in USER_TERMS:
        if metric not in baseline.metrics or metric not in other.metrics:
            continue
        before, after = baseline.metrics[metric][0], other.metrics[metric][0]
        change = ""
        if before:
            ratio = after / before
            better = (ratio > 1) == higher_better and ratio != 1
            change = f"<span class='{'good' if better else 'bad'}'>{ratio_text(ratio)}</span>"
        lines.append(
            f"<tr><td>{escape(label)}</td><td class='num'>{fmt(before)} {unit}</td>"
            f"<td class='num' data-metric='{metric}'>{fmt(after)} {unit}</td><td>{change}</td></tr>"
        )
    if not lines:
        return "<p class='absent'>absent: the rounds measured none of these metrics</p>"
    return (
        "<table class='terms'><thead><tr><th></th><th>baseline</th>"
        f"<th>trial {other.number}</th><th></th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
        "<p class='muted'>Medians over each trial's rounds; the leaderboard below gives their min-max.</p>"
    )


# --- the change to apply -----------------------------------------------------------------------


def _apply(c: Computed) -> str:
    change = c.change
    if change is None:
        return section("apply", "The change to apply", f"<p>Nothing: {escape(c.g.board.recommendation.message)}.</p>")
    parts = _apply_parts(change)
    # The run does not record where its study file was; the convention's path is a guess, said as one.
    study_file = f"studies/{c.g.board.study_name}.toml"
    if change.deploy_kind == "systemd":
        parts.append(
            "<p>To make it the host's own after a verification run: <code>tuner apply STUDY_FILE</code> with "
            f"the study file this run was made with (by the usual layout <code>{escape(study_file)}</code>), "
            "and <code>tuner restore STUDY_FILE</code> to undo it.</p>"
        )
    else:
        parts.append(
            f"<p><code>tuner apply</code> writes a systemd unit's configuration; with deploy.kind = "
            f"{escape(change.deploy_kind)} set these where the server is started.</p>"
        )
    return section("apply", "The change to apply", "".join(parts))


def _apply_parts(change: Change) -> list[str]:
    """The server's part of the change (its environment and flags, as the deployment takes them), then the
    request-side settings with how to keep each."""
    parts = []
    if change.server:
        parts.append(_server_change(change))
    if change.request:
        items = "".join(f"<li>{escape(advice)}</li>" for advice in change.request_advice)
        parts.append(f"<p>Settings the host's configuration cannot carry, and how to keep them:</p><ul>{items}</ul>")
    return parts


def _server_change(change: Change) -> str:
    env, flags = change.env, change.flags
    if change.deploy_kind == "systemd":
        lines = ["[Service]"] + [f"Environment={name}={value}" for name, value in env]
        text = "\n".join(lines)
        extra = f"<p>Add to the unit's command line: <code>{escape(' '.join(flags))}</code></p>" if flags else ""
        return (
            f"<p>As a systemd drop-in, <code>/etc/systemd/system/{escape(change.unit)}.d/"
            f"{SYSTEMD_APPLIED_DROP_IN}</code> "
            "(what <code>tuner apply</code> writes), then <code>systemctl daemon-reload</code> and a restart:</p>"
            f"<pre id='drop-in'>{escape(text)}</pre>{extra}"
        )
    if change.deploy_kind == "container":
        words = [f"-e {name}={value}" for name, value in env] + flags
        return (
            f"<p>As container arguments (added to the container's run command):</p><pre>{escape(' '.join(words))}</pre>"
        )
    words = [f"{name}={value}" for name, value in env]
    text = " ".join(words + ([change.command] if env else []) + flags)
    return f"<p>As the server's environment and flags:</p><pre>{escape(text)}</pre>"


# --- the leaderboard ---------------------------------------------------------------------------


def _leaderboard(c: Computed) -> str:
    rows = c.g.board.rows
    if not rows:
        return section("leaderboard", "Leaderboard", "<p class='absent'>no trial has been measured yet</p>")
    shown = [(m, label) for m, label in TABLE_METRICS if any(m in r.metrics for r in rows)]
    head = "".join(f"<th class='num' data-sort='num'>{escape(label)}</th>" for _, label in shown)
    lines = []
    fleet = any(r.host for r in rows)  # which host measured each trial; its score is against that host's baseline
    for row in rows:
        cells = [
            f"<td class='num' data-value='{row.number}'>{row.number}</td>",
            f"<td>{_settings_cell(row)}</td>",
            *([f"<td class='host'>{escape(row.host or '')}</td>"] if fleet else []),
            score_cell(row),
        ]
        for metric, _ in shown:
            cells.append(metric_cell(row, metric))
        cells.append(f"<td>{_flags(c, row)}</td>")
        classes = " ".join(
            name
            for name, on in (("baseline", row.baseline), ("chosen", row is c.chosen), ("failed", row.score is None))
            if on
        )
        lines.append(f"<tr class='{classes}' data-trial='{row.number}'>{''.join(cells)}</tr>")
    skipped = c.skipped
    skipped_html = ""
    if skipped:
        items = "".join(f"<li>{escape(settings_text(settings))}: {escape(reason)}</li>" for settings, reason in skipped)
        skipped_html = (
            f"<details><summary>{len(skipped)} proposals skipped without a run</summary><ul>{items}</ul></details>"
        )
    pruned = ""
    if c.g.board.hosts is not None:
        pruned += f"<p id='host-spread'>{escape(c.g.board.hosts.line())}</p>"
    if c.g.board.pruning_saved_s > 0:
        pruned += (
            f"<p>Pruning stopped {c.g.board.pruned} trials after their first round and saved about "
            f"{c.g.board.pruning_saved_s:.0f} s of measurement.</p>"
        )
    body = (
        "<p class='muted'>Median over rounds, [min-max] beneath; click a header to sort (the page reads "
        "without it). Score: weighted log-ratio against the baseline's median (0 = baseline).</p>"
        "<table id='leaderboard' class='board'><thead><tr><th class='num' data-sort='num'>trial</th>"
        "<th data-sort='text'>settings changed</th>"
        + ("<th data-sort='text'>host</th>" if fleet else "")
        + "<th class='num' data-sort='num'>score</th>"
        f"{head}<th data-sort='text'>flags</th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
        f"{pruned}{skipped_html}{_every_metric(c)}"
    )
    return section("leaderboard-section", "Leaderboard", body)


_PREDICTED_METRICS = (("stall_tok_s", "stall tok/s"), ("ttft_p95_s", "TTFT p95 s"), ("prefill_tok_s", "prefill tok/s"))


def _prediction(c: Computed) -> str:
    """The prediction the study started from (`search.predicted_from`), each trial's predicted figures beside
    its measured ones; nothing for a study that started from none."""
    outcome = c.g.board.prediction
    if outcome is None:
        return ""
    record = outcome.record
    head = "".join(
        f"<th class='num'>{escape(label)} predicted</th><th class='num'>measured</th>"
        for _, label in _PREDICTED_METRICS
    )
    lines = []
    for row in c.g.board.rows:
        figures = outcome.predicted.get(row.number)
        if figures is None:
            continue
        cells = [f"<td class='num'>{row.number}</td>", f"<td>{_settings_cell(row)}</td>"]
        for metric, _ in _PREDICTED_METRICS:
            median, spread = figures.median.get(metric), figures.spread.get(metric)
            between = ""
            if spread is not None and fmt(spread[0]) != fmt(spread[1]):
                between = f"<br><small>[{fmt(spread[0])}-{fmt(spread[1])}]</small>"
            cells += [f"<td class='num'>{fmt(median)}{between}</td>", metric_cell(row, metric)]
        lines.append(f"<tr data-trial='{row.number}'>{''.join(cells)}</tr>")
    fitted = "".join(f"<li>{escape(line)}</li>" for line in record.fitted) or "<li>nothing: the shipped costs</li>"
    kept = "".join(f"<li>{escape(line)}</li>" for line in record.kept)
    verdict = "held" if outcome.held else "open" if outcome.held is None else "missed"
    body = (
        f"<p id='prediction-outcome' class='{verdict}'>{escape(outcome.message)}</p>"
        "<p class='muted'>Before the first restart, the simulated llama-server replayed this study's workload for "
        f"every config of its space, {record.seeds} rounds each, at a calibration from "
        f"{escape(record.log)}: its prefill costs {record.prefill_factor:.2f} times the shipped ones, its decode "
        f"costs {record.decode_factor:.2f} times (median [lowest-highest] over the simulated rounds; the measured "
        "figures as in the leaderboard).</p>"
        f"<table id='prediction' class='board'><thead><tr><th class='num'>trial</th><th>settings changed</th>{head}"
        f"</tr></thead><tbody>{''.join(lines)}</tbody></table>"
        f"<details><summary>The calibration</summary><p>Fitted from the log:</p><ul>{fitted}</ul>"
        f"<p>Kept, as the log cannot determine it:</p><ul>{kept}</ul></details>"
    )
    return section("prediction-section", "The prediction against the measurement", body)


def _every_metric(c: Computed) -> str:
    """Every metric of every trial, the server's own and the load generator's included: folded away,
    since the table above shows the ones the study is about."""
    rows = c.g.board.rows
    names = sorted({name for row in rows for name in row.metrics})
    if not names:
        return ""
    head = "".join(f"<th class='num' data-sort='num'>{escape(name)}</th>" for name in names)
    lines = "".join(
        f"<tr data-trial='{row.number}'><td class='num' data-value='{row.number}'>{row.number}</td>"
        + "".join(metric_cell(row, name) for name in names)
        + "</tr>"
        for row in rows
    )
    return (
        f"<details id='every-metric'><summary>every metric of every trial ({len(names)} metrics; "
        "docs/metrics.md says what each is)</summary><div class='wide'><table class='board'><thead><tr>"
        f"<th class='num' data-sort='num'>trial</th>{head}</tr></thead><tbody>{lines}</tbody></table></div>"
        "</details>"
    )


def _settings_cell(row: LeaderboardRow) -> str:
    if row.baseline:
        return "<b>baseline</b>"
    return escape(settings_text(row.changed or row.settings) or "same as baseline")


def _flags(c: Computed, row: LeaderboardRow) -> str:
    flags = []
    if row is c.chosen:
        flags.append("<span class='flag win'>recommended</span>")
    if row.state == "FAIL":
        flags.append(f"<span class='flag bad'>FAIL</span> {escape(row.reason or '')}")
    elif row.state == "PRUNED":
        flags.append(f"<span class='flag warn'>pruned</span> {escape(row.reason or '')}")
    if row.noisy:
        flags.append(f"<span class='flag warn'>noisy</span> rounds differ by 20%+ on {escape(', '.join(row.noisy))}")
    if row.violates:
        flags.append(f"<span class='flag bad'>violates</span> {escape('; '.join(row.violates))}")
    if row.answers_changed:
        note = f" ({row.answers_changed_note})" if row.answers_changed_note else ""
        flags.append(
            f"<span class='flag bad'>changes answers</span> of about {row.answers_changed:.0%} of requests"
            + escape(note)
        )
    agreement = c.g.trials[row.number].record.answer_agreement if row.number in c.g.trials else None
    if agreement and not row.baseline and min(agreement) < 1:
        flags.append(
            f"<span class='flag'>answers</span> agree {statistics.fmean(agreement):.0%} with the baseline's "
            "(greedy, before the first divergence)"
        )
    if row.pareto:
        flags.append("<span class='flag'>Pareto</span>")
    why = c.why(row)
    if why:
        more = f" (and {len(why) - 1} more: <code>tuner diagnose</code> on its server.log)" if len(why) > 1 else ""
        flags.append(f"<span class='flag why'>its log</span> {escape(why[0])}{more}")
    return "<br>".join(flags)


# --- the stall picture -------------------------------------------------------------------------


def _timeline(c: Computed) -> str:
    title = "A streaming user during someone else's long prefill"
    if c.baseline is None:
        return section("timeline", title, "<p class='absent'>absent: no baseline measured yet</p>")
    long_tokens = c.long_prompt_tokens
    charts = []
    for row, found in c.stalls:
        label = "baseline" if row.baseline else f"trial {row.number}: {settings_text(row.changed)}"
        if found is None:
            charts.append(
                f"<div class='absent'>{escape(label)}: absent: no round file of this trial shows a streaming "
                f"request beside a prompt of {long_tokens}+ tokens</div>"
            )
            continue
        charts.append(timeline_chart(label, found.stream, found.window, found.round_name))
    note = (
        "<p class='muted'>Tokens one streaming user received over time (client clock, from the trial's "
        "round file); shaded: another request's long prompt being prefilled (from the server's prompt "
        "time back from its first token), the window the stall speed is measured in. Flat stretches "
        "are the stall.</p>"
    )
    return section("timeline", title, note + "<div class='charts'>" + "".join(charts) + "</div>")


# --- rounds, objectives, parameters ------------------------------------------------------------


def _spread(c: Computed) -> str:
    scored = [r for r in c.g.board.rows if r.score is not None]
    if not scored:
        return section(
            "spread", "Rounds, objectives and parameters", "<p class='absent'>absent: no trial scored yet</p>"
        )
    charts = [_rounds_chart(c, scored)]
    names = objectives(c.g.spec)
    if len(names) >= 2:
        charts.append(_objectives_chart(c, scored, names[0], names[1]))
    params = sorted({k for r in scored for k in r.settings})
    for name in params:
        values = [(r.settings[name], r.score) for r in scored if isinstance(r.settings.get(name), (int, float))]
        if len({v for v, _ in values}) < 2:
            continue
        positive = all(float(v) > 0 for v, _ in values)
        charts.append(
            chart(
                title=f"score against {name}",
                x_label=name,
                y_label="score",
                series=[
                    Series(
                        label="trials",
                        points=[(float(v), float(s or 0.0)) for v, s in values],
                        kind="points",
                        tips=[f"{name}={v}: score {s:+.2f}" for v, s in values if s is not None],
                    )
                ],
                x_log=positive and max(float(v) for v, _ in values) / min(float(v) for v, _ in values) >= 8,
                width=360,
                height=240,
            )
        )
    return section(
        "spread",
        "Rounds, objectives and parameters",
        "<div class='charts'>" + "".join(charts) + "</div>" + _importances(c),
    )


def _rounds_chart(c: Computed, scored: Sequence[LeaderboardRow]) -> str:
    ordered = sorted(scored, key=lambda r: r.number)
    positions = {r.number: i for i, r in enumerate(ordered)}
    points, tips = [], []
    for row in ordered:
        for k, score in enumerate(c.g.trials[row.number].record.round_scores):
            points.append((float(positions[row.number]), score))
            tips.append(f"trial {row.number} round {k + 1}: score {score:+.2f}")
    medians = Series(
        label="median",
        points=[(float(positions[r.number]), r.score or 0.0) for r in ordered],
        color=PALETTE[2],
        kind="points",
        tips=[f"trial {r.number}: median {r.score:+.2f}" for r in ordered],
        emphasised=frozenset(positions[r.number] for r in ordered if r is c.chosen),
    )
    return chart(
        title="each trial's rounds",
        x_label="trial",
        y_label="score per round",
        series=[Series(label="a round", points=points, kind="points", tips=tips), medians],
        x_ticks=[(float(i), str(r.number)) for i, r in enumerate(ordered)],
        width=max(360, min(900, 40 * len(ordered) + 120)),
        height=260,
    )


def _objectives_chart(c: Computed, scored: Sequence[LeaderboardRow], x_metric: str, y_metric: str) -> str:
    rows = [r for r in scored if x_metric in r.metrics and y_metric in r.metrics]
    ways = directions(c.g.spec)
    front = c.pareto
    points = [(r.metrics[x_metric][0], r.metrics[y_metric][0]) for r in rows]
    tips = [
        f"trial {r.number}{' (baseline)' if r.baseline else ''}: {x_metric} {fmt(x)}, {y_metric} {fmt(y)}"
        + (" - on the Pareto front" if r.number in front else "")
        for r, (x, y) in zip(rows, points, strict=True)
    ]
    front_points = sorted((p for r, p in zip(rows, points, strict=True) if r.number in front))
    return chart(
        title=f"{y_metric} against {x_metric}",
        x_label=f"{x_metric} ({ways.get(x_metric, '')})",
        y_label=f"{y_metric} ({ways.get(y_metric, '')})",
        series=[
            Series(
                label="trials (front outlined)",
                points=points,
                kind="points",
                tips=tips,
                emphasised=frozenset(i for i, r in enumerate(rows) if r.number in front),
            ),
            Series(label="Pareto front", points=front_points, kind="line", color=PALETTE[3]),
        ],
        width=420,
        height=300,
    )


def _importances(c: Computed) -> str:
    found = c.importances
    if not found.enough:
        return (
            f"<p class='absent'>Parameter importances: absent: they need at least {MIN_TRIALS_FOR_IMPORTANCE} "
            f"completed trials after the baseline ({found.completed} so far).</p>"
        )
    if found.error is not None:
        return f"<p class='absent'>Parameter importances: absent: {escape(found.error)}</p>"
    if not found.shares:
        return "<p class='absent'>Parameter importances: absent: no parameter varied</p>"
    bars = "".join(
        f"<tr><td>{escape(name)}</td><td><span class='bar' style='width:{max(1.0, 200 * share):.0f}px'></span> "
        f"{share:.0%}</td></tr>"
        for name, share in found.shares.items()
    )
    return (
        "<h3>Parameter importances</h3><p class='muted'>Optuna's PED-ANOVA over the completed trials: how "
        "much of the score's variation among the better trials each parameter explains.</p>"
        f"<table class='terms'>{bars}</table>"
    )


# --- the workload and the run ------------------------------------------------------------------


def _workload(c: Computed) -> str:
    title = "The workload as replayed"
    shown = c.workload
    if shown is None:
        assert c.workload_absent is not None
        absent, size = c.workload_absent
        why = {
            "too big": f"the baseline's first round file is {size // 2**20} MB, more than the page reads",
            "unreadable": "the baseline's first round file is unreadable (not the records serve-tuner writes)",
            "missing": "the baseline's first round file is missing",
        }[absent]
        return section("workload", title, f"<p class='absent'>absent: {escape(why)}</p>")
    records, span = shown.records, shown.span_s
    rows = [
        ("requests", f"{len(records)} in {shown.sessions} sessions"),
        ("sent over", f"{span:.1f} s" + (f" ({len(records) / span * 60:.0f} arrivals/min)" if span > 0 else "")),
        ("prompt tokens", distribution_text(shown.prompt_tokens)),
        ("answer tokens asked", distribution_text(shown.asked_tokens)),
        ("answer tokens received", distribution_text(shown.received_tokens)),
        ("tags", ", ".join(f"{escape(k)} {v}" for k, v in sorted(shown.tags.items()))),
        ("LoRA settings", ", ".join(f"{escape(k)} {v}" for k, v in sorted(shown.lora.items()))),
    ]
    workload = c.g.spec.get("workload", {}) if isinstance(c.g.spec.get("workload"), dict) else {}
    if workload.get("path"):
        rows.insert(0, ("trace", f"<code>{escape(str(workload['path']))}</code> (relative to the study file)"))
    if workload.get("time_scale") not in (None, 1, 1.0):
        rows.insert(1, ("time scale", f"{escape(str(workload['time_scale']))} (arrivals this much closer together)"))
    if shown.long_prefills:
        rows.append(("long prefills (the baseline's log)", escape(shown.long_prefills)))
    table = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return section(
        "workload",
        title,
        "<p class='muted'>From the baseline's first round: what was really sent.</p>"
        f"<table class='facts'>{table}</table>{in_flight_chart(records)}",
    )


def _run_facts(c: Computed) -> str:
    rows: list[tuple[str, str]] = []
    host = c.g.spec.get("host", {}) if isinstance(c.g.spec.get("host"), dict) else {}
    deploy = c.g.spec.get("deploy", {}) if isinstance(c.g.spec.get("deploy"), dict) else {}
    engine = c.g.spec.get("engine", {}) if isinstance(c.g.spec.get("engine"), dict) else {}
    rows.append(("host", escape(f"{host.get('kind', 'absent')}" + (f" {host['host']}" if host.get("host") else ""))))
    rows.append(("deploy", escape(str(deploy.get("kind", "absent")))))
    rows.append(("engine", escape(str(engine.get("kind", "absent")))))
    facts = c.g.host_facts
    served = facts.get("operator_server")
    if served:
        rows.append(("the unit's own server", escape(served)))
    for key, label in (("engine_build", "engine build"), ("host", "host system")):
        value = facts.get(key)
        absent = f"<span class='absent'>absent: {_absent_fact(facts, key)}</span>"
        rows.append((label, escape(value) if value else absent))
    rows.append(("serve-tuner", escape(c.g.version)))
    rows.extend(_time_spent(c))
    table = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    spec_text = json.dumps(redact_spec(c.g.spec), indent=2, sort_keys=True) if c.g.spec else ""
    spec_html = (
        f"<details><summary>the study as run (spec.json)</summary><pre>{escape(spec_text)}</pre></details>"
        if spec_text
        else "<p class='absent'>absent: the run has no spec.json</p>"
    )
    return section("run", "The run", f"<table class='facts'>{table}</table>{spec_html}")


def _time_spent(c: Computed) -> list[tuple[str, str]]:
    spent = c.time_spent
    if spent is None:
        return [("time spent", "<span class='absent'>absent: no trial has ended yet</span>")]
    result = [
        ("time spent", f"{duration(spent.wall_s)} from the baseline's start to the last measurement's end"),
        ("measuring the search", f"{duration(spent.search_s)} in {spent.rounds} rounds"),
        ("measuring confirmations", f"{duration(spent.confirm_s)} in {spent.pairs} measurements"),
    ]
    phases = spent.phases
    if phases:
        total = sum(phases.values()) or 1.0
        result.append(("time by phase", f"{duration(total)} counted while `tuner run` ran (its progress file)"))
        result.extend(
            (f"phase: {phase}", f"{duration(seconds)} ({seconds / total:.0%})") for phase, seconds in phases.items()
        )
    else:
        result.append(
            (
                "everything else",
                f"{duration(spent.other_s)}: server restarts and loads, warm-up, correctness probes and the "
                "controller (this run kept no progress file to split it by phase)",
            )
        )
    if c.g.board.pruning_saved_s > 0:
        result.append(("pruning saved", f"about {duration(c.g.board.pruning_saved_s)} of measurement"))
    return result


def _absent_fact(facts: Mapping[str, str | None], key: str) -> str:
    if not facts:
        return "this run recorded no host facts (made by an earlier version, or its baseline never started)"
    return "the server or the host did not say"
