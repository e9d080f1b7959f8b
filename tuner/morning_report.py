"""The morning report: one self-contained HTML page that says what an overnight study found.

Everything comes from the run directory alone (the study's storage, its spec and the round files), so
the page can be made at any time: by `tuner report`, by `tuner run` after every trial, for a run made
by an earlier version (what it lacks is shown as absent). The page makes no request to any other host:
its styles, charts (static SVG, `tuner/svg.py`) and data are inline, and the one script only sorts the
leaderboard; everything essential reads without it.

Order of the page, most important first: the verdict and what it buys, the exact change to apply,
the leaderboard, the stall picture (one streaming user's tokens while another prompt is prefilled),
the spread of the rounds and the objectives, the workload, and how the night was spent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from tuner.config import ParamValue
from tuner.errors import TunerError
from tuner.files import write_atomic
from tuner.models import RequestRecord
from tuner.observers import NullObserver
from tuner.redact import REDACTED, redact
from tuner.report import Leaderboard, LeaderboardRow, build_leaderboard
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly
from tuner.study_record import StudyRecord, TrialRecord
from tuner.svg import PALETTE, Band, Series, chart

__all__ = ["REPORT_NAME", "ReportWriter", "redact_spec", "render_report", "write_report"]

REPORT_NAME = "report.html"

# What a user feels, baseline -> recommended, in this order; (metric, label, unit, higher is better).
_USER_TERMS = (
    ("stall_tok_s", "a streaming user's speed while someone else's long prompt is prefilled", "tok/s", True),
    ("itl_max_s", "the longest gap between two of a streaming user's tokens", "s", False),
    ("ttft_p95_s", "time to first token, 95th percentile", "s", False),
    ("prefill_tok_s", "prefill speed of long prompts", "tok/s", True),
)
_TABLE_METRICS = (
    ("stall_tok_s", "stall tok/s"),
    ("unstalled_tok_s", "unstalled tok/s"),
    ("prefill_tok_s", "prefill tok/s"),
    ("ttft_p95_s", "TTFT p95 s"),
    ("itl_max_s", "longest gap s"),
    ("output_tok_s", "output tok/s"),
    ("failures", "failed requests"),
    ("lora_wait_p95_s", "LoRA wait p95 s"),
    ("lora_switch_ms", "LoRA switch ms"),
)
_MIN_TRIALS_FOR_IMPORTANCE = 5  # below this, an importance ranks noise


def write_report(run_path: Path, out: Path | None = None, *, inputs: Iterable[Path] = ()) -> Path:
    """Writes the report atomically (a reader never sees half a page) and returns its path."""
    target = out if out is not None else run_path / REPORT_NAME
    write_atomic(target, render_report(run_path).encode(), inputs=inputs)
    return target


def render_report(run_path: Path) -> str:
    study = open_optuna_study_readonly(RunDirectory(run_path))
    report = _Report(run_path, study)
    return report.page()


@dataclass(frozen=True, kw_only=True)
class _Window:
    """A long prompt's prefill as the stall metric sees it, and a stream's speed during it."""

    request_id: str
    prompt_tokens: int
    start_s: float
    end_s: float
    overlap: tuple[float, float]  # the part of the window the stream was decoding in
    rate: float  # the stream's tokens per second in the overlap, as `stall_tok_s` counts them


class ReportWriter(NullObserver):
    """Rewrites the run's report after every trial and confirmation, so a half-finished night can be read.

    A report that cannot be written is said once and the run goes on: the study's storage, not the
    page, is what the night must not lose."""

    def __init__(self, run_path: Path, *, say: Callable[[str], None]) -> None:
        self.run_path = run_path
        self.say = say
        self.failed = False

    def write(self) -> None:
        try:
            write_report(self.run_path)
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

    def confirm_finished(self, *, number: int, mean: float, low: float, high: float) -> None:
        self.write()


@dataclass(frozen=True, kw_only=True)
class _RoundFile:
    name: str
    records: list[RequestRecord]


def _read_round(path: Path) -> _RoundFile | None:
    """A round's records; None for a torn or foreign file (the report shows what it can without it)."""
    records = []
    try:
        with path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    records.append(RequestRecord.model_validate_json(line))
    except (OSError, ValidationError, ValueError, RecursionError):
        return None
    return _RoundFile(name=path.stem, records=records)


# Each trial's server log diagnosed once per process (`tuner diagnose`'s analyses), keyed as the spans are:
# (kind, one-line summary) of each finding, worst first.
_DIAGNOSES: dict[tuple[str, int, int], list[tuple[str, str]]] = {}
# What a trial's settings change in its log, and so explain its score: waits before prefill (a LoRA
# policy, the slots), queueing for a slot, the cost of switching adapters. Where the long prefills come
# from is the workload's, the same for every trial: said once, from the baseline's log. Stalls are left
# to the client's measurement (stall_tok_s and the picture): a log's rate lines come seconds apart, too
# coarse to place a stream's few tokens within a prefill.
_TRIAL_FINDINGS = ("waits", "queueing", "lora_switch")


def _diagnosed(path: Path, *, long_prompt_tokens: int, min_overlap_s: float) -> list[tuple[str, str]]:
    """Why the trial's server was slow, from its own log: the findings' summaries, worst first; [] where
    the log says nothing or cannot be read (the report goes on without)."""
    from tuner.diagnose import diagnose_log

    try:
        stat = path.stat()
    except OSError:
        return []
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIAGNOSES:
        try:
            diagnosis = diagnose_log(
                path,
                long_prompt_tokens=long_prompt_tokens,
                min_overlap_s=min_overlap_s,
                # A wait is worth naming at twice the overlap a stall must have (1 s at the default 0.5 s).
                min_wait_s=2 * min_overlap_s,
            )
        except TunerError:
            _DIAGNOSES[key] = []
        else:
            _DIAGNOSES[key] = [(f.kind, redact(f.summary)) for f in diagnosis.findings]
    return _DIAGNOSES[key]


# The stall picture reads a round whole; past this size it is left out (said as absent), as is the
# workload table: the page must come in a second or two, after every trial of a long night.
_MAX_PICTURED_BYTES = 32 * 1024 * 1024

# Each round file's span (first send to last end), read once per process: `tuner run` rewrites the
# report after every trial, and then only the new files need reading. Keyed by path, size and
# modification time; a span, not the records, so that a long night's rounds are not all kept in memory.
_SPANS: dict[tuple[str, int, int], float | None] = {}


def _round_span_s(path: Path) -> float | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _SPANS:
        first: float | None = None
        last: float | None = None
        try:
            with path.open("rb") as handle:
                for line in handle:
                    if not line.strip():
                        continue
                    record = json.loads(line)
                    send, end = float(record["send_s"]), float(record["end_s"])
                    first = send if first is None else min(first, send)
                    last = end if last is None else max(last, end)
            _SPANS[key] = None if first is None or last is None else last - first
        except (OSError, ValueError, KeyError, TypeError, RecursionError):  # whatever the file holds
            _SPANS[key] = None
    return _SPANS[key]


class _Report:
    def __init__(self, run_path: Path, study: optuna.Study) -> None:
        self.run_path = run_path
        self.study = study
        self.board: Leaderboard = build_leaderboard(study)
        self.record = StudyRecord.of(study)
        self.trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        self.records = {n: TrialRecord.of(t) for n, t in self.trials.items()}
        self.spec = self._spec()
        self.baseline = next((r for r in self.board.rows if r.baseline and r.score is not None), None)
        recommended = self.board.recommendation.row
        self.chosen = recommended
        # Without a recommendation, the pictures compare the best candidate, said as such: the one the
        # confirmation re-measured, else the best scored trial that breaks no constraint.
        confirmed = [r for r in self.board.rows if r.number in self.record.confirmations]
        self.compared = recommended or next(
            (
                r
                for r in confirmed + self.board.rows
                if not r.baseline and r.score is not None and r.changed and not r.violates
            ),
            None,
        )

    def _spec(self) -> dict[str, Any]:
        try:
            loaded = json.loads((self.run_path / "spec.json").read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def page(self) -> str:
        name = escape(self.board.study_name)
        sections = [
            self._verdict(),
            self._apply(),
            self._leaderboard(),
            self._timeline(),
            self._spread(),
            self._workload(),
            self._run_facts(),
        ]
        return (
            "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            # No request to anything, this page's own file aside: a policy the browser enforces.
            # The one script allowed by its hash: markup that got in (it must not) could run nothing.
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
            f"script-src '{_SCRIPT_HASH}'; img-src data:\">"
            f"<title>serve-tuner: {name}</title><style>{_STYLE}</style></head><body>"
            f"<header><h1>{name}</h1><p class='muted'>{escape(str(self.spec.get('description', '')))}</p>"
            f"<p class='muted'>{escape(self._when())}</p></header>" + "".join(sections) + f"<script>{_SCRIPT}</script>"
            "</body></html>\n"
        )

    def _when(self) -> str:
        starts = [t.datetime_start for t in self.trials.values() if t.datetime_start is not None]
        ends = [t.datetime_complete for t in self.trials.values() if t.datetime_complete is not None]
        running = any(t.state == TrialState.RUNNING for t in self.trials.values())
        done = sum(1 for r in self.records.values() if r.deployed and not r.baseline)
        budget = self.spec.get("budget", {}).get("trials") if isinstance(self.spec.get("budget"), dict) else None
        parts = [f"{done} trials after the baseline" + (f" of a budget of {budget}" if budget else "")]
        if starts:
            parts.append(f"started {min(starts):%Y-%m-%d %H:%M}")
        if ends:
            parts.append(f"last trial ended {max(ends):%Y-%m-%d %H:%M}")
        if running:
            parts.append("still running: this page is rewritten after every trial")
        parts.append(f"made by serve-tuner {_own_version()}")
        return "; ".join(parts)

    # --- the verdict -------------------------------------------------------------------------------

    def _verdict(self) -> str:
        recommendation = self.board.recommendation
        row = recommendation.row
        if row is None:
            head = "<p class='verdict keep'>Keep the current settings.</p>"
        else:
            head = f"<p class='verdict win'>Change {escape(_settings_text(row.changed))}.</p>"
        body = [head, f"<p id='recommendation'>{escape(recommendation.message)}</p>"]
        confirmation = self.record.confirmations.get(row.number) if row is not None else None
        if confirmation is not None:
            low, high = confirmation.ci
            body.append(
                "<p>Paired difference in score against the baseline (re-measured in alternating pairs): "
                f"<b data-value='{confirmation.mean:.6g}'>{confirmation.mean:+.2f}</b>, 95% interval "
                f"{low:+.2f} to {high:+.2f} over {len(confirmation.differences)} pairs. A score of +0.69 is "
                "twice as good on the weighted objectives.</p>"
            )
        compared = self.compared
        if self.baseline is not None and compared is not None:
            title = "What it buys" if row is not None else f"What the best candidate (trial {compared.number}) would do"
            body.append(f"<h3>{escape(title)}</h3>{self._user_terms(self.baseline, compared)}")
        return _section("verdict", "The verdict", "".join(body))

    def _user_terms(self, baseline: LeaderboardRow, other: LeaderboardRow) -> str:
        lines = []
        for metric, label, unit, higher_better in _USER_TERMS:
            if metric not in baseline.metrics or metric not in other.metrics:
                continue
            before, after = baseline.metrics[metric][0], other.metrics[metric][0]
            change = ""
            if before:
                ratio = after / before
                better = (ratio > 1) == higher_better and ratio != 1
                change = f"<span class='{'good' if better else 'bad'}'>{_ratio_text(ratio)}</span>"
            lines.append(
                f"<tr><td>{escape(label)}</td><td class='num'>{_fmt(before)} {unit}</td>"
                f"<td class='num' data-metric='{metric}'>{_fmt(after)} {unit}</td><td>{change}</td></tr>"
            )
        if not lines:
            return "<p class='absent'>absent: the rounds measured none of these metrics</p>"
        return (
            "<table class='terms'><thead><tr><th></th><th>baseline</th>"
            f"<th>trial {other.number}</th><th></th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
            "<p class='muted'>Medians over each trial's rounds; the leaderboard below gives their min-max.</p>"
        )

    # --- the change to apply -----------------------------------------------------------------------

    def _apply(self) -> str:
        row = self.chosen
        if row is None:
            return _section(
                "apply", "The change to apply", f"<p>Nothing: {escape(self.board.recommendation.message)}.</p>"
            )
        engine_kind = (
            str(self.spec.get("engine", {}).get("kind", "")) if isinstance(self.spec.get("engine"), dict) else ""
        )
        deploy = self.spec.get("deploy", {}) if isinstance(self.spec.get("deploy"), dict) else {}
        knobs = _engine_knobs(engine_kind)
        server = {k: v for k, v in row.changed.items() if k not in knobs or knobs[k].scope == "server"}
        request = {k: v for k, v in row.changed.items() if k in knobs and knobs[k].scope == "request"}
        parts = []
        if server:
            parts.append(_server_change(server, knobs, str(deploy.get("kind", "")), deploy))
        if request:
            parts.append(
                "<p>Request-scope settings (what the clients send, not the server's configuration): "
                f"<code>{escape(_settings_text(request))}</code>.</p>"
            )
        # The run does not record where its study file was; the convention's path is a guess, said as one.
        study_file = f"studies/{self.board.study_name}.toml"
        if str(deploy.get("kind", "")) == "systemd":
            parts.append(
                "<p>To make it the host's own after a verification run: <code>tuner apply STUDY_FILE</code> with "
                f"the study file this run was made with (by the usual layout <code>{escape(study_file)}</code>), "
                "and <code>tuner restore STUDY_FILE</code> to undo it.</p>"
            )
        else:
            parts.append(
                f"<p><code>tuner apply</code> writes a systemd unit's configuration; with deploy.kind = "
                f"{escape(str(deploy.get('kind', '')))} set these where the server is started.</p>"
            )
        return _section("apply", "The change to apply", "".join(parts))

    # --- the leaderboard ---------------------------------------------------------------------------

    def _leaderboard(self) -> str:
        rows = self.board.rows
        if not rows:
            return _section("leaderboard", "Leaderboard", "<p class='absent'>no trial has been measured yet</p>")
        shown = [(m, label) for m, label in _TABLE_METRICS if any(m in r.metrics for r in rows)]
        head = "".join(f"<th class='num' data-sort='num'>{escape(label)}</th>" for _, label in shown)
        lines = []
        fleet = any(r.host for r in rows)  # which host measured each trial; its score is against that host's baseline
        for row in rows:
            cells = [
                f"<td class='num' data-value='{row.number}'>{row.number}</td>",
                f"<td>{self._settings_cell(row)}</td>",
                *([f"<td class='host'>{escape(row.host or '')}</td>"] if fleet else []),
                _score_cell(row),
            ]
            for metric, _ in shown:
                cells.append(_metric_cell(row, metric))
            cells.append(f"<td>{self._flags(row)}</td>")
            classes = " ".join(
                c
                for c, on in (("baseline", row.baseline), ("chosen", row is self.chosen), ("failed", row.score is None))
                if on
            )
            lines.append(f"<tr class='{classes}' data-trial='{row.number}'>{''.join(cells)}</tr>")
        skipped = [
            (n, r)
            for n, r in self.records.items()
            if r.skip_reason and not r.deployed and self.trials[n].state != TrialState.RUNNING
        ]
        skipped_html = ""
        if skipped:
            items = "".join(
                f"<li>{escape(_settings_text(r.settings or dict(self.trials[n].params)))}: "
                f"{escape(r.skip_reason or '')}</li>"
                for n, r in skipped
            )
            skipped_html = (
                f"<details><summary>{len(skipped)} proposals skipped without a run</summary><ul>{items}</ul></details>"
            )
        pruned = ""
        if self.board.hosts is not None:
            pruned += f"<p id='host-spread'>{escape(self.board.hosts.line())}</p>"
        if self.board.pruning_saved_s > 0:
            pruned += (
                f"<p>Pruning stopped {self.board.pruned} trials after their first round and saved about "
                f"{self.board.pruning_saved_s:.0f} s of measurement.</p>"
            )
        body = (
            "<p class='muted'>Median over rounds, [min-max] beneath; click a header to sort (the page reads "
            "without it). Score: weighted log-ratio against the baseline's median (0 = baseline).</p>"
            "<table id='leaderboard' class='board'><thead><tr><th class='num' data-sort='num'>trial</th>"
            "<th data-sort='text'>settings changed</th>"
            + ("<th data-sort='text'>host</th>" if fleet else "")
            + "<th class='num' data-sort='num'>score</th>"
            f"{head}<th data-sort='text'>flags</th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
            f"{pruned}{skipped_html}{self._every_metric()}"
        )
        return _section("leaderboard-section", "Leaderboard", body)

    def _every_metric(self) -> str:
        """Every metric of every trial, the server's own and the load generator's included: folded away,
        since the table above shows the ones the study is about."""
        rows = self.board.rows
        names = sorted({name for row in rows for name in row.metrics})
        if not names:
            return ""
        head = "".join(f"<th class='num' data-sort='num'>{escape(name)}</th>" for name in names)
        lines = "".join(
            f"<tr data-trial='{row.number}'><td class='num' data-value='{row.number}'>{row.number}</td>"
            + "".join(_metric_cell(row, name) for name in names)
            + "</tr>"
            for row in rows
        )
        return (
            f"<details id='every-metric'><summary>every metric of every trial ({len(names)} metrics; "
            "docs/metrics.md says what each is)</summary><div class='wide'><table class='board'><thead><tr>"
            f"<th class='num' data-sort='num'>trial</th>{head}</tr></thead><tbody>{lines}</tbody></table></div>"
            "</details>"
        )

    def _settings_cell(self, row: LeaderboardRow) -> str:
        if row.baseline:
            return "<b>baseline</b>"
        return escape(_settings_text(row.changed or row.settings) or "same as baseline")

    def _diagnosis_of(self, number: int) -> list[tuple[str, str]]:
        """Trial `number`'s server log diagnosed: (kind, summary) of each finding, worst first."""
        metrics = self.spec.get("metrics")
        overlap = metrics.get("min_overlap_s") if isinstance(metrics, dict) else None
        return _diagnosed(
            self.run_path / "trials" / f"{number:04d}" / "server.log",
            long_prompt_tokens=_long_prompt_tokens(self.spec),
            min_overlap_s=overlap if isinstance(overlap, int | float) and overlap > 0 else 0.5,
        )

    def _why(self, row: LeaderboardRow) -> list[str]:
        """What the trial's server log says its settings did, worst first (`_TRIAL_FINDINGS`)."""
        return [summary for kind, summary in self._diagnosis_of(row.number) if kind in _TRIAL_FINDINGS]

    def _flags(self, row: LeaderboardRow) -> str:
        flags = []
        if row is self.chosen:
            flags.append("<span class='flag win'>recommended</span>")
        if row.state == "FAIL":
            flags.append(f"<span class='flag bad'>FAIL</span> {escape(row.reason or '')}")
        elif row.state == "PRUNED":
            flags.append(f"<span class='flag warn'>pruned</span> {escape(row.reason or '')}")
        if row.noisy:
            flags.append(
                f"<span class='flag warn'>noisy</span> rounds differ by 20%+ on {escape(', '.join(row.noisy))}"
            )
        if row.violates:
            flags.append(f"<span class='flag bad'>violates</span> {escape('; '.join(row.violates))}")
        if row.answers_changed:
            note = f" ({row.answers_changed_note})" if row.answers_changed_note else ""
            flags.append(
                f"<span class='flag bad'>changes answers</span> of about {row.answers_changed:.0%} of requests"
                + escape(note)
            )
        agreement = self.records[row.number].answer_agreement if row.number in self.records else None
        if agreement and not row.baseline and min(agreement) < 1:
            flags.append(
                f"<span class='flag'>answers</span> agree {statistics.fmean(agreement):.0%} with the baseline's "
                "(greedy, before the first divergence)"
            )
        if row.pareto:
            flags.append("<span class='flag'>Pareto</span>")
        why = self._why(row)
        if why:
            more = f" (and {len(why) - 1} more: <code>tuner diagnose</code> on its server.log)" if len(why) > 1 else ""
            flags.append(f"<span class='flag why'>its log</span> {escape(why[0])}{more}")
        return "<br>".join(flags)

    # --- the stall picture -------------------------------------------------------------------------

    def _timeline(self) -> str:
        title = "A streaming user during someone else's long prefill"
        if self.baseline is None:
            return _section("timeline", title, "<p class='absent'>absent: no baseline measured yet</p>")
        long_tokens = _long_prompt_tokens(self.spec)
        charts = []
        pictured = [self.baseline] + ([self.compared] if self.compared is not None else [])
        for row in pictured:
            found = self._stall_example(row.number, long_tokens)
            label = "baseline" if row.baseline else f"trial {row.number}: {_settings_text(row.changed)}"
            if found is None:
                charts.append(
                    f"<div class='absent'>{escape(label)}: absent: no round file of this trial shows a streaming "
                    f"request beside a prompt of {long_tokens}+ tokens</div>"
                )
                continue
            stream, window, round_name = found
            charts.append(_timeline_chart(label, stream, window, round_name))
        note = (
            "<p class='muted'>Tokens one streaming user received over time (client clock, from the trial's "
            "round file); shaded: another request's long prompt being prefilled (from the server's prompt "
            "time back from its first token), the window the stall speed is measured in. Flat stretches "
            "are the stall.</p>"
        )
        return _section("timeline", title, note + "<div class='charts'>" + "".join(charts) + "</div>")

    def _stall_example(self, number: int, long_tokens: int) -> tuple[RequestRecord, _Window, str] | None:
        """The stream that saw the most of a long prefill, in the trial's first round that has one: the
        windows and the speed the `stall_tok_s` metric uses."""
        from tuner.metrics import long_prefill_windows, tokens_between

        for path in sorted((self.run_path / "trials" / f"{number:04d}").glob("round-*.jsonl")):
            if path.name.endswith(".server.jsonl"):
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > _MAX_PICTURED_BYTES:
                continue  # a round of tens of thousands of requests: read whole, it would stall the run between trials
            round_file = _read_round(path)
            if round_file is None:
                continue
            ok = [r for r in round_file.records if r.ok]
            by_id = {r.request_id: r for r in ok}
            best: tuple[float, RequestRecord, _Window] | None = None
            for window in long_prefill_windows(ok, long_prompt_tokens=long_tokens):
                for stream in ok:
                    if stream.request_id == window.request_id or len(stream.token_s) < 2:
                        continue
                    start, end = max(stream.token_s[0], window.start_s), min(stream.token_s[-1], window.end_s)
                    if end - start > 0 and (best is None or end - start > best[0]):
                        long_request = by_id[window.request_id]
                        rate = tokens_between(stream.token_s, start, end) / (end - start)
                        best = (
                            end - start,
                            stream,
                            _Window(
                                request_id=window.request_id,
                                prompt_tokens=long_request.prompt_tokens,
                                start_s=window.start_s,
                                end_s=window.end_s,
                                overlap=(start, end),
                                rate=rate,
                            ),
                        )
            if best is not None:
                return best[1], best[2], round_file.name
        return None

    # --- rounds, objectives, parameters ------------------------------------------------------------

    def _spread(self) -> str:
        scored = [r for r in self.board.rows if r.score is not None]
        if not scored:
            return _section(
                "spread", "Rounds, objectives and parameters", "<p class='absent'>absent: no trial scored yet</p>"
            )
        charts = [self._rounds_chart(scored)]
        objectives = [
            str(o["metric"]) for o in self.spec.get("objectives", []) if isinstance(o, dict) and o.get("metric")
        ]
        if len(objectives) >= 2:
            charts.append(self._objectives_chart(scored, objectives[0], objectives[1]))
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
        return _section(
            "spread",
            "Rounds, objectives and parameters",
            "<div class='charts'>" + "".join(charts) + "</div>" + self._importances(),
        )

    def _rounds_chart(self, scored: Sequence[LeaderboardRow]) -> str:
        ordered = sorted(scored, key=lambda r: r.number)
        positions = {r.number: i for i, r in enumerate(ordered)}
        points, tips = [], []
        for row in ordered:
            for k, score in enumerate(self.records[row.number].round_scores):
                points.append((float(positions[row.number]), score))
                tips.append(f"trial {row.number} round {k + 1}: score {score:+.2f}")
        medians = Series(
            label="median",
            points=[(float(positions[r.number]), r.score or 0.0) for r in ordered],
            color=PALETTE[2],
            kind="points",
            tips=[f"trial {r.number}: median {r.score:+.2f}" for r in ordered],
            emphasised=frozenset(positions[r.number] for r in ordered if r is self.chosen),
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

    def _objectives_chart(self, scored: Sequence[LeaderboardRow], x_metric: str, y_metric: str) -> str:
        rows = [r for r in scored if x_metric in r.metrics and y_metric in r.metrics]
        directions = {
            str(o.get("metric")): o.get("direction") for o in self.spec.get("objectives", []) if isinstance(o, dict)
        }
        front = _pareto(rows, x_metric, y_metric, directions)
        points = [(r.metrics[x_metric][0], r.metrics[y_metric][0]) for r in rows]
        tips = [
            f"trial {r.number}{' (baseline)' if r.baseline else ''}: {x_metric} {_fmt(x)}, {y_metric} {_fmt(y)}"
            + (" - on the Pareto front" if r.number in front else "")
            for r, (x, y) in zip(rows, points, strict=True)
        ]
        front_points = sorted((p for r, p in zip(rows, points, strict=True) if r.number in front))
        return chart(
            title=f"{y_metric} against {x_metric}",
            x_label=f"{x_metric} ({directions.get(x_metric, '')})",
            y_label=f"{y_metric} ({directions.get(y_metric, '')})",
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

    def _importances(self) -> str:
        complete = [
            t
            for t in self.trials.values()
            if t.state == TrialState.COMPLETE
            and self.records[t.number].deployed
            and not self.records[t.number].baseline
        ]  # measured ones: a repeat told with an earlier trial's values adds no evidence
        if len(complete) < _MIN_TRIALS_FOR_IMPORTANCE or len(self.study.directions) != 1:
            return (
                f"<p class='absent'>Parameter importances: absent: they need at least {_MIN_TRIALS_FOR_IMPORTANCE} "
                f"completed trials after the baseline ({len(complete)} so far).</p>"
            )
        try:
            from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

            importances = get_param_importances(self.study, evaluator=PedAnovaImportanceEvaluator())
        except (ValueError, RuntimeError) as exc:
            return f"<p class='absent'>Parameter importances: absent: {escape(str(exc))}</p>"
        if not importances:
            return "<p class='absent'>Parameter importances: absent: no parameter varied</p>"
        bars = "".join(
            f"<tr><td>{escape(name)}</td><td><span class='bar' style='width:{max(1.0, 200 * share):.0f}px'></span> "
            f"{share:.0%}</td></tr>"
            for name, share in importances.items()
        )
        return (
            "<h3>Parameter importances</h3><p class='muted'>Optuna's PED-ANOVA over the completed trials: how "
            "much of the score's variation among the better trials each parameter explains.</p>"
            f"<table class='terms'>{bars}</table>"
        )

    # --- the workload and the run ------------------------------------------------------------------

    def _workload(self) -> str:
        title = "The workload as replayed"
        path = self.run_path / "trials" / "0000" / "round-1.jsonl"
        too_big = path.is_file() and path.stat().st_size > _MAX_PICTURED_BYTES
        round_file = None if too_big else _read_round(path)
        if round_file is None or not round_file.records:
            if too_big:
                why = f"the baseline's first round file is {path.stat().st_size // 2**20} MB, more than the page reads"
            elif path.exists():
                why = "the baseline's first round file is unreadable (not the records serve-tuner writes)"
            else:
                why = "the baseline's first round file is missing"
            return _section("workload", title, f"<p class='absent'>absent: {escape(why)}</p>")
        records = round_file.records
        sends = [r.send_s for r in records]
        span = max(sends) - min(sends)
        sessions = len({r.session for r in records})
        tags: dict[str, int] = {}
        for r in records:
            tags[r.tag] = tags.get(r.tag, 0) + 1
        lora: dict[str, int] = {}
        for r in records:
            key = ", ".join(f"{name}:{scale:g}" for name, scale in r.lora) or "none"
            lora[key] = lora.get(key, 0) + 1
        rows = [
            ("requests", f"{len(records)} in {sessions} sessions"),
            ("sent over", f"{span:.1f} s" + (f" ({len(records) / span * 60:.0f} arrivals/min)" if span > 0 else "")),
            ("prompt tokens", _distribution_text([r.prompt_tokens for r in records])),
            ("answer tokens asked", _distribution_text([r.output_tokens_requested for r in records])),
            ("answer tokens received", _distribution_text([len(r.token_s) for r in records])),
            ("tags", ", ".join(f"{escape(k)} {v}" for k, v in sorted(tags.items()))),
            ("LoRA settings", ", ".join(f"{escape(k)} {v}" for k, v in sorted(lora.items()))),
        ]
        workload = self.spec.get("workload", {}) if isinstance(self.spec.get("workload"), dict) else {}
        if workload.get("path"):
            rows.insert(0, ("trace", f"<code>{escape(str(workload['path']))}</code> (relative to the study file)"))
        if workload.get("time_scale") not in (None, 1, 1.0):
            rows.insert(
                1, ("time scale", f"{escape(str(workload['time_scale']))} (arrivals this much closer together)")
            )
        sources = [summary for kind, summary in self._diagnosis_of(0) if kind == "long_prefills"]
        if sources:
            rows.append(("long prefills (the baseline's log)", escape(sources[0])))
        table = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
        return _section(
            "workload",
            title,
            "<p class='muted'>From the baseline's first round: what was really sent.</p>"
            f"<table class='facts'>{table}</table>{_in_flight_chart(records)}",
        )

    def _run_facts(self) -> str:
        rows: list[tuple[str, str]] = []
        host = self.spec.get("host", {}) if isinstance(self.spec.get("host"), dict) else {}
        deploy = self.spec.get("deploy", {}) if isinstance(self.spec.get("deploy"), dict) else {}
        engine = self.spec.get("engine", {}) if isinstance(self.spec.get("engine"), dict) else {}
        rows.append(
            ("host", escape(f"{host.get('kind', 'absent')}" + (f" {host['host']}" if host.get("host") else "")))
        )
        rows.append(("deploy", escape(str(deploy.get("kind", "absent")))))
        rows.append(("engine", escape(str(engine.get("kind", "absent")))))
        facts = _host_facts(self.run_path)
        served = facts.get("operator_server")
        if served:
            rows.append(("the unit's own server", escape(served)))
        for key, label in (("engine_build", "engine build"), ("host", "host system")):
            value = facts.get(key)
            absent = f"<span class='absent'>absent: {_absent_fact(facts, key)}</span>"
            rows.append((label, escape(value) if value else absent))
        rows.append(("serve-tuner", escape(_own_version())))
        rows.extend(self._time_spent())
        table = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
        spec_text = json.dumps(redact_spec(self.spec), indent=2, sort_keys=True) if self.spec else ""
        spec_html = (
            f"<details><summary>the study as run (spec.json)</summary><pre>{escape(spec_text)}</pre></details>"
            if spec_text
            else "<p class='absent'>absent: the run has no spec.json</p>"
        )
        return _section("run", "The run", f"<table class='facts'>{table}</table>{spec_html}")

    def _phase_seconds(self) -> dict[str, float]:
        """Where the run's time went by phase, as `tuner run`'s progress file counted it; {} without one."""
        from tuner.progress import read_progress

        try:
            progress = read_progress(self.run_path)
        except TunerError:
            return {}
        return dict(progress.phase_seconds) if progress is not None else {}

    def _time_spent(self) -> list[tuple[str, str]]:
        starts = [t.datetime_start for t in self.trials.values() if t.datetime_start is not None]
        ends = [t.datetime_complete for t in self.trials.values() if t.datetime_complete is not None]
        if not starts or not ends:
            return [("time spent", "<span class='absent'>absent: no trial has ended yet</span>")]
        search = confirm = 0.0
        rounds = pairs = 0
        newest = max(ends).timestamp()
        for directory in sorted((self.run_path / "trials").glob("[0-9][0-9][0-9][0-9]")):
            for path in directory.glob("*.jsonl"):
                if path.name.endswith(".server.jsonl"):
                    continue
                span = _round_span_s(path)
                if span is None:
                    continue
                # Confirmations end after the last trial did: their files say when.
                newest = max(newest, path.stat().st_mtime)
                if path.name.startswith("confirm-"):
                    confirm += span
                    pairs += 1
                else:
                    search += span
                    rounds += 1
        wall = newest - min(starts).timestamp()
        other = max(0.0, wall - search - confirm)
        result = [
            ("time spent", f"{_duration(wall)} from the baseline's start to the last measurement's end"),
            ("measuring the search", f"{_duration(search)} in {rounds} rounds"),
            ("measuring confirmations", f"{_duration(confirm)} in {pairs} measurements"),
        ]
        phases = self._phase_seconds()
        if phases:
            total = sum(phases.values()) or 1.0
            result.append(("time by phase", f"{_duration(total)} counted while `tuner run` ran (its progress file)"))
            result.extend(
                (f"phase: {phase}", f"{_duration(seconds)} ({seconds / total:.0%})")
                for phase, seconds in phases.items()
            )
        else:
            result.append(
                (
                    "everything else",
                    f"{_duration(other)}: server restarts and loads, warm-up, correctness probes and the controller "
                    "(this run kept no progress file to split it by phase)",
                )
            )
        if self.board.pruning_saved_s > 0:
            result.append(("pruning saved", f"about {_duration(self.board.pruning_saved_s)} of measurement"))
        return result


# --- pieces ---------------------------------------------------------------------------------------


_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|password|secret|auth)[\w-]*$", re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(://[^:/@\s]+):([^@/\s]+)@")


def redact_spec(spec: Mapping[str, Any]) -> Any:
    """The spec as the page shows it: every string through `redact` (the secrets this process knows, tokens
    of known shapes), a URL's password, and the value of any command-line flag named like a secret
    (`--api-key VALUE`, `--api-key=VALUE` in `engine.extra_args`)."""

    def text(value: str) -> str:
        flag, equals, _ = value.partition("=")
        if equals and _SECRET_FLAG.match(flag):
            return f"{flag}={REDACTED}"
        return _URL_CREDENTIALS.sub(rf"\1:{REDACTED}@", redact(value))

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            shown: list[Any] = []
            for item in value:
                after_flag = bool(shown) and isinstance(shown[-1], str) and bool(_SECRET_FLAG.match(shown[-1]))
                shown.append(REDACTED if after_flag and isinstance(item, str) else walk(item))
            return shown
        return value

    return walk(spec)


def _section(anchor: str, title: str, body: str) -> str:
    return f"<section id='{anchor}'><h2>{escape(title)}</h2>{body}</section>"


def _settings_text(settings: Mapping[str, ParamValue]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in sorted(settings.items()))


def _fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-" if value is None else str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ratio_text(ratio: float) -> str:
    if ratio >= 1.995:
        return f"{ratio:.1f}x"
    return f"{(ratio - 1) * 100:+.0f}%"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h"


def _distribution_text(values: Sequence[int]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return (
        f"mean {statistics.fmean(ordered):.0f}, median {statistics.median(ordered):.0f}, p95 {p95}, max {ordered[-1]}"
    )


def _own_version() -> str:
    try:
        return package_version("serve-tuner")
    except PackageNotFoundError:
        return "(not installed)"


def _long_prompt_tokens(spec: Mapping[str, Any]) -> int:
    metrics = spec.get("metrics")
    value = metrics.get("long_prompt_tokens") if isinstance(metrics, dict) else None
    return value if isinstance(value, int) and value > 0 else 1000


def _host_facts(run_path: Path) -> dict[str, str | None]:
    """host.json, which a run writes when its baseline's server first comes up; {} for older runs."""
    try:
        loaded = json.loads((run_path / "host.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): redact(v) if isinstance(v, str) else None for k, v in loaded.items()}


def _absent_fact(facts: Mapping[str, str | None], key: str) -> str:
    if not facts:
        return "this run recorded no host facts (made by an earlier version, or its baseline never started)"
    return "the server or the host did not say"


def _engine_knobs(kind: str) -> Mapping[str, Any]:
    from tuner.engines import ENGINES

    try:
        factory = ENGINES.get(kind)
    except TunerError:
        return {}
    knobs = getattr(factory, "knobs", {})
    return knobs if isinstance(knobs, Mapping) else {}


def _server_change(
    server: Mapping[str, ParamValue], knobs: Mapping[str, Any], deploy_kind: str, deploy: Mapping[str, Any]
) -> str:
    from tuner.deployers.systemd import APPLIED_NAME
    from tuner.engines.base import render_env_value

    env: list[tuple[str, str]] = []
    flags: list[str] = []
    for name, value in sorted(server.items()):
        knob = knobs.get(name)
        if knob is None:
            flags.append(f"{name}={value}")
        elif knob.env:
            env.append((knob.env, render_env_value(knob, value)))
        elif knob.flag:
            flags.append(f"{knob.flag} {render_env_value(knob, value)}")
    if deploy_kind == "systemd":
        unit = str(deploy.get("unit", "UNIT.service"))
        lines = ["[Service]"] + [f"Environment={name}={value}" for name, value in env]
        text = "\n".join(lines)
        extra = f"<p>Add to the unit's command line: <code>{escape(' '.join(flags))}</code></p>" if flags else ""
        return (
            f"<p>As a systemd drop-in, <code>/etc/systemd/system/{escape(unit)}.d/{APPLIED_NAME}</code> "
            "(what <code>tuner apply</code> writes), then <code>systemctl daemon-reload</code> and a restart:</p>"
            f"<pre id='drop-in'>{escape(text)}</pre>{extra}"
        )
    if deploy_kind == "container":
        words = [f"-e {name}={value}" for name, value in env] + flags
        return (
            f"<p>As container arguments (added to the container's run command):</p><pre>{escape(' '.join(words))}</pre>"
        )
    words = [f"{name}={value}" for name, value in env]
    text = " ".join(words + (["llama-server ..."] if env else []) + flags)
    return f"<p>As the server's environment and flags:</p><pre>{escape(text)}</pre>"


def _score_cell(row: LeaderboardRow) -> str:
    if row.score is None:
        return "<td class='num' data-value=''>-</td>"
    spread = ""
    if row.score_range and row.score_range[0] != row.score_range[1]:
        spread = f"<br><small>[{row.score_range[0]:+.2f}..{row.score_range[1]:+.2f}]</small>"
    return f"<td class='num' data-value='{row.score:.6g}'>{row.score:+.2f}{spread}</td>"


def _metric_cell(row: LeaderboardRow, metric: str) -> str:
    if metric not in row.metrics:
        return "<td class='num' data-value=''>-</td>"
    median, low, high = row.metrics[metric]
    spread = f"<br><small>[{_fmt(low)}-{_fmt(high)}]</small>" if _fmt(low) != _fmt(high) else ""
    mark = " <span class='flag warn' title='rounds differ by 20% or more'>!</span>" if metric in row.noisy else ""
    return f"<td class='num' data-metric='{metric}' data-value='{median:.6g}'>{_fmt(median)}{mark}{spread}</td>"


def _pareto(rows: Sequence[LeaderboardRow], x: str, y: str, directions: Mapping[str, Any]) -> set[int]:
    def oriented(row: LeaderboardRow, metric: str) -> float:
        value = row.metrics[metric][0]
        return -value if directions.get(metric) == "minimize" else value

    front = set()
    for row in rows:
        dominated = any(
            oriented(o, x) >= oriented(row, x)
            and oriented(o, y) >= oriented(row, y)
            and (oriented(o, x) > oriented(row, x) or oriented(o, y) > oriented(row, y))
            for o in rows
        )
        if not dominated:
            front.add(row.number)
    return front


def _timeline_chart(label: str, stream: RequestRecord, window: _Window, round_name: str) -> str:
    start, end = window.start_s, window.end_s
    origin = min(stream.send_s, start)
    shown_until = min(max(end + (end - start) * 0.5, stream.token_s[-1]), end + max(2.0, (end - start) * 2))
    points = [(stream.send_s - origin, 0.0)]
    for count, at in enumerate(stream.token_s, start=1):
        if at > shown_until:
            break
        points.append((at - origin, float(count)))
    gaps = [b - a for a, b in zip(stream.token_s, stream.token_s[1:], strict=False)]
    longest = max(gaps) if gaps else 0.0
    svg = chart(
        title=f"{label}: {stream.request_id}",
        x_label="seconds",
        y_label="tokens received",
        series=[Series(label=f"{stream.request_id} ({stream.tag})", points=points, kind="step")],
        bands=[
            Band(
                start=start - origin,
                end=end - origin,
                label=f"{window.request_id}: {window.prompt_tokens}-token prompt prefilled",
            )
        ],
        width=440,
        height=260,
    )
    overlap = window.overlap[1] - window.overlap[0]
    return (
        f"<figure class='timeline' data-longest-gap='{longest:.6g}' data-rate-during='{window.rate:.6g}'>"
        f"<figcaption><b>{escape(label)}</b> ({escape(round_name)}): {_fmt(window.rate)} tok/s while "
        f"{escape(window.request_id)}'s {window.prompt_tokens}-token prompt was prefilled ({overlap:.2f} s "
        f"beside it); longest gap between two tokens {longest:.2f} s</figcaption>{svg}</figure>"
    )


def _in_flight_chart(records: Sequence[RequestRecord]) -> str:
    events = sorted([(r.send_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    origin = events[0][0] if events else 0.0
    level, points = 0, []
    for at, step in events:
        level += step
        points.append((at - origin, float(level)))
    return chart(
        title="requests in flight",
        x_label="seconds from the first send",
        y_label="in flight",
        series=[Series(label="requests in flight", points=points, kind="step", color=PALETTE[3])],
        width=560,
        height=200,
    )


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 40px;
color:#1d1d1d;line-height:1.4}
h1{margin:18px 0 2px;font-size:26px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.muted{color:#666;font-size:13px;margin:2px 0}.absent{color:#8a6d00;font-style:italic}
.verdict{font-size:22px;font-weight:600;padding:10px 14px;border-radius:6px;margin:12px 0}
.verdict.win{background:#e3f4ea;color:#0b5d2a}.verdict.keep{background:#fdf3d8;color:#6b5000}
.good{color:#0b7a3a;font-weight:600}.bad{color:#b00020;font-weight:600}
table{border-collapse:collapse;font-size:13px}td,th{padding:4px 8px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top}
.num{text-align:right;font-variant-numeric:tabular-nums}
table.board th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}
tr.baseline{background:#f7f7f7}tr.chosen{background:#e3f4ea}tr.failed{color:#777}
small{color:#777}.flag{display:inline-block;border-radius:3px;padding:0 4px;background:#eee;font-size:12px}
.flag.win{background:#0b7a3a;color:#fff}.flag.bad{background:#b00020;color:#fff}.flag.warn{background:#e69f00;color:#000}
pre{background:#f4f4f4;padding:8px 10px;border-radius:4px;overflow-x:auto}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-size:13px;max-width:440px}
.wide{overflow-x:auto}.bar{display:inline-block;height:10px;background:#0072b2}table.facts th{width:190px;color:#444}
"""

# Sorting only: the page is complete without it. Each table sorts its own rows by the clicked column.
_SCRIPT = """
document.querySelectorAll('table.board th').forEach(function (th) {
  th.addEventListener('click', function () {
    var column = th.cellIndex;
    var body = th.closest('table').tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var numeric = th.dataset.sort === 'num';
    var descending = th.dataset.order !== 'desc';
    th.dataset.order = descending ? 'desc' : 'asc';
    rows.sort(function (a, b) {
      var x = a.cells[column], y = b.cells[column];
      var u = numeric ? x.dataset.value : x.textContent, v = numeric ? y.dataset.value : y.textContent;
      if (numeric) {
        if (u === '' || u === undefined) return 1;
        if (v === '' || v === undefined) return -1;
        u = parseFloat(u); v = parseFloat(v);
      }
      return (u < v ? -1 : u > v ? 1 : 0) * (descending ? -1 : 1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""

_SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
