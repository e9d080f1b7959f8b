"""Small static SVG charts for the morning report: lines, steps and points on linear or log axes.

Static SVG rather than a plotting library's scripts: the report must read without JavaScript and
without any request to another host, and a chart of a few hundred points is a few kilobytes of text.
Every number drawn is also in the chart's `<title>` tooltips, so a reader (or a test) can check it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Literal

__all__ = ["PALETTE", "Band", "Series", "chart", "nice_ticks"]

# Colour-blind-safe (Okabe-Ito), in the order series are usually given: baseline first.
PALETTE = ("#666666", "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9", "#f0e442")


@dataclass(frozen=True, kw_only=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    color: str = PALETTE[1]
    kind: Literal["line", "step", "points"] = "line"
    # Per point, the tooltip text; defaults to "label: x, y".
    tips: Sequence[str] | None = None
    # Points drawn larger and outlined (the Pareto front, the recommended trial).
    emphasised: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True, kw_only=True)
class Band:
    """A shaded span of the x axis (another request's prefill), with its label."""

    start: float
    end: float
    label: str
    color: str = "#d55e00"


_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 64, 16, 28, 46


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round numbers (1, 2 or 5 times a power of ten) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _log_ticks(low: float, high: float) -> list[float]:
    ticks = [2.0**k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]
    ticks = [t for t in ticks if low * 0.999 <= t <= high * 1.001]
    while len(ticks) > 8:
        ticks = ticks[::2]
    return ticks or [low]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}" if value == round(value) else f"{value:.1f}"
    return f"{value:.3g}"


class _Axis:
    def __init__(self, values: Sequence[float], *, log: bool, start: float, length: float, flip: bool) -> None:
        finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
        self.log = log
        if not finite:
            finite = [1.0]
        low, high = min(finite), max(finite)
        if low == high:
            low, high = (low / 2, high * 2) if log else (low - 1, high + 1)
        elif not log:
            pad = (high - low) * 0.05
            low, high = (0.0 if low >= 0 and low - pad < 0 else low - pad), high + pad
        self.ticks = _log_ticks(low, high) if log else nice_ticks(low, high)
        if not log and self.ticks:
            low, high = min(low, self.ticks[0]), max(high, self.ticks[-1])
        self.low, self.high = low, high
        self.start, self.length, self.flip = start, length, flip

    def __call__(self, value: float) -> float:
        if self.log:
            share = (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        else:
            share = (value - self.low) / (self.high - self.low)
        share = min(1.0, max(0.0, share))
        return self.start + (1 - share if self.flip else share) * self.length


def chart(
    *,
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[Series],
    bands: Sequence[Band] = (),
    width: int = 560,
    height: int = 300,
    x_log: bool = False,
    y_log: bool = False,
    x_ticks: Sequence[tuple[float, str]] | None = None,
) -> str:
    """One chart as an inline `<svg>` element, with a legend of its series under the title."""
    xs = [x for s in series for x, _ in s.points] + [b.start for b in bands] + [b.end for b in bands]
    ys = [y for s in series for _, y in s.points]
    if x_ticks:
        xs += [x for x, _ in x_ticks]
    plot_w = width - _MARGIN_LEFT - _MARGIN_RIGHT
    plot_h = height - _MARGIN_TOP - _MARGIN_BOTTOM
    x_axis = _Axis(xs, log=x_log, start=_MARGIN_LEFT, length=plot_w, flip=False)
    y_axis = _Axis(ys, log=y_log, start=_MARGIN_TOP, length=plot_h, flip=True)
    out = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{_MARGIN_LEFT}" y="{_MARGIN_TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for band in bands:
        left, right = x_axis(band.start), x_axis(band.end)
        out.append(
            f'<rect class="band" x="{left:.1f}" y="{_MARGIN_TOP}" width="{max(1.0, right - left):.1f}" '
            f'height="{plot_h}" fill="{band.color}" fill-opacity="0.15"><title>{escape(band.label)}: '
            f"{_fmt(band.start)} to {_fmt(band.end)}</title></rect>"
        )
    for tick in y_axis.ticks:
        y = y_axis(tick)
        out.append(
            f'<line x1="{_MARGIN_LEFT}" x2="{_MARGIN_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{_MARGIN_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>'
        )
    for x_value, text in x_ticks if x_ticks is not None else [(t, _fmt(t)) for t in x_axis.ticks]:
        x = x_axis(x_value)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_MARGIN_TOP + plot_h}" y2="{_MARGIN_TOP + plot_h + 4}" '
            f'stroke="#888"/><text x="{x:.1f}" y="{_MARGIN_TOP + plot_h + 16}" text-anchor="middle">'
            f"{escape(text)}</text>"
        )
    out.append(
        f'<text x="{_MARGIN_LEFT + plot_w / 2:.0f}" y="{height - 8}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate(14 {_MARGIN_TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    for s in series:
        out.extend(_draw(s, x_axis, y_axis))
    legend_x = _MARGIN_LEFT
    for s in series:
        if not s.label:  # drawn, and named by an earlier series of its colour (a second round of one config)
            continue
        out.append(
            f'<rect x="{legend_x}" y="8" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{legend_x + 14}" y="17">{escape(s.label)}</text>'
        )
        legend_x += 24 + 7 * len(s.label)
    out.append("</svg>")
    return "".join(out)


def _draw(s: Series, x_axis: _Axis, y_axis: _Axis) -> list[str]:
    usable = [
        (i, x, y)
        for i, (x, y) in enumerate(s.points)
        if math.isfinite(x) and math.isfinite(y) and (x > 0 or not x_axis.log) and (y > 0 or not y_axis.log)
    ]
    out = []
    if s.kind in ("line", "step") and len(usable) >= 2:
        coords = []
        previous_y: float | None = None
        for _, x, y in usable:
            if s.kind == "step" and previous_y is not None:
                coords.append(f"{x_axis(x):.1f},{previous_y:.1f}")
            previous_y = y_axis(y)
            coords.append(f"{x_axis(x):.1f},{previous_y:.1f}")
        out.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="1.8" points="{" ".join(coords)}"/>')
    if s.kind == "points":
        for i, x, y in usable:
            tip = s.tips[i] if s.tips is not None else f"{s.label}: {_fmt(x)}, {_fmt(y)}"
            big = i in s.emphasised
            outline = ' stroke="#000" stroke-width="1.5"' if big else ""
            out.append(
                f'<circle cx="{x_axis(x):.1f}" cy="{y_axis(y):.1f}" r="{5 if big else 3.5}" fill="{s.color}" '
                f'fill-opacity="0.8"{outline}>'
                f"<title>{escape(tip)}</title></circle>"
            )
    return out
