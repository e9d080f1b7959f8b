"""The pieces the morning report's page is made of: cells, charts (static SVG, `tuner/svg.py`), numbers and
durations as text, the spec with its secrets redacted, and the page's one style sheet and one script.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from tuner import text
from tuner.config import ParamValue
from tuner.models import RequestRecord
from tuner.morning_report.compute import Distribution, Window
from tuner.redact import REDACTED, redact
from tuner.report import LeaderboardRow
from tuner.svg import PALETTE, Band, Series, chart

__all__ = [
    "SCRIPT",
    "SCRIPT_HASH",
    "STYLE",
    "TABLE_METRICS",
    "USER_TERMS",
    "distribution_text",
    "duration",
    "fmt",
    "in_flight_chart",
    "metric_cell",
    "ratio_text",
    "redact_spec",
    "score_cell",
    "section",
    "settings_text",
    "timeline_chart",
]


USER_TERMS = (
    ("stall_tok_s", "a streaming user's speed while someone else's long prompt is prefilled", "tok/s", True),
    ("itl_max_s", "the longest gap between two of a streaming user's tokens", "s", False),
    ("ttft_p95_s", "time to first token, 95th percentile", "s", False),
    ("wait_p95_s", "time a request waited before its prompt was read (queued), 95th percentile", "s", False),
    ("prefill_tok_s", "prefill speed of long prompts", "tok/s", True),
)
TABLE_METRICS = (
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


def section(anchor: str, title: str, body: str) -> str:
    return f"<section id='{anchor}'><h2>{escape(title)}</h2>{body}</section>"


def settings_text(settings: Mapping[str, ParamValue]) -> str:
    return text.settings_text(settings, separator=", ", equals=" = ")


def fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-" if value is None else str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def ratio_text(ratio: float) -> str:
    if ratio >= 1.995:
        return f"{ratio:.1f}x"
    return f"{(ratio - 1) * 100:+.0f}%"


def duration(seconds: float) -> str:
    return text.duration_text(seconds, style="rough")


def distribution_text(values: Distribution | None) -> str:
    if values is None:
        return "-"
    return f"mean {values.mean:.0f}, median {values.median:.0f}, p95 {values.p95}, max {values.max}"


def score_cell(row: LeaderboardRow) -> str:
    if row.score is None:
        return "<td class='num' data-value=''>-</td>"
    spread = ""
    if row.score_range and row.score_range[0] != row.score_range[1]:
        spread = f"<br><small>[{row.score_range[0]:+.2f}..{row.score_range[1]:+.2f}]</small>"
    return f"<td class='num' data-value='{row.score:.6g}'>{row.score:+.2f}{spread}</td>"


def metric_cell(row: LeaderboardRow, metric: str) -> str:
    if metric not in row.metrics:
        return "<td class='num' data-value=''>-</td>"
    median, low, high = row.metrics[metric]
    spread = f"<br><small>[{fmt(low)}-{fmt(high)}]</small>" if fmt(low) != fmt(high) else ""
    mark = " <span class='flag warn' title='rounds differ by 20% or more'>!</span>" if metric in row.noisy else ""
    return f"<td class='num' data-metric='{metric}' data-value='{median:.6g}'>{fmt(median)}{mark}{spread}</td>"


def timeline_chart(label: str, stream: RequestRecord, window: Window, round_name: str) -> str:
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
        f"<figcaption><b>{escape(label)}</b> ({escape(round_name)}): {fmt(window.rate)} tok/s while "
        f"{escape(window.request_id)}'s {window.prompt_tokens}-token prompt was prefilled ({overlap:.2f} s "
        f"beside it); longest gap between two tokens {longest:.2f} s</figcaption>{svg}</figure>"
    )


def in_flight_chart(records: Sequence[RequestRecord]) -> str:
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


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 40px;
color:#1d1d1d;line-height:1.4}
h1{margin:18px 0 2px;font-size:26px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.muted{color:#666;font-size:13px;margin:2px 0}.absent{color:#8a6d00;font-style:italic}
.verdict{font-size:22px;font-weight:600;padding:10px 14px;border-radius:6px;margin:12px 0}
.verdict.win{background:#e3f4ea;color:#0b5d2a}.verdict.keep{background:#fdf3d8;color:#6b5000}
#prediction-outcome.held{color:#0b5d2a;font-weight:600}#prediction-outcome.missed{color:#b00020;font-weight:600}
.good{color:#0b7a3a;font-weight:600}.bad{color:#b00020;font-weight:600}
table{border-collapse:collapse;font-size:13px}td,th{padding:4px 8px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top}
.num{text-align:right;font-variant-numeric:tabular-nums}
table.board th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}
tr.baseline{background:#f7f7f7}td.pass{background:#e3f4ea}td.fail{background:#fbe9e7}tr.chosen{background:#e3f4ea}tr.failed{color:#777}
small{color:#777}.flag{display:inline-block;border-radius:3px;padding:0 4px;background:#eee;font-size:12px}
.flag.win{background:#0b7a3a;color:#fff}.flag.bad{background:#b00020;color:#fff}.flag.warn{background:#e69f00;color:#000}
pre{background:#f4f4f4;padding:8px 10px;border-radius:4px;overflow-x:auto}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-size:13px;max-width:440px}
.wide{overflow-x:auto}.bar{display:inline-block;height:10px;background:#0072b2}table.facts th{width:190px;color:#444}
"""

# Sorting only: the page is complete without it. Each table sorts its own rows by the clicked column.
SCRIPT = """
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

SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
