"""How settings, durations and counts are written for people: one formatter for each, shared by every output.

The outputs that existed before this module differ (a table's `n_batch=512 n_ubatch=256`, a sentence's
`n_batch=512, n_ubatch=256`; `3m05s` in progress lines, `3 min` in the report, `1h02m03s` in a diagnosis,
`75m03s` for how long `tuner run` took, `0m45s` in `--check`'s estimate):
each keeps its text through the parameters, so that one rule decides how a value is spelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["DurationStyle", "count_text", "duration_text", "settings_text"]


def count_text(count: int, noun: str) -> str:
    """`1 user`, `2 users`: a count and its noun (plurals made with s)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def settings_text(settings: Mapping[str, object], *, separator: str = " ", equals: str = "=", empty: str = "") -> str:
    """`n_batch=512 n_ubatch=256`: each knob and its value, sorted by knob, as the leaderboard's table writes
    them; `separator=", "` in a sentence (the report's page: `equals=" = "` too); `empty` stands for no
    setting (the baseline)."""
    return separator.join(f"{name}{equals}{value}" for name, value in sorted(settings.items())) or empty


DurationStyle = Literal["clock", "exact", "rough", "estimate", "stopwatch"]


def duration_text(seconds: float, *, style: DurationStyle = "clock") -> str:
    """`clock` (progress, status): `45 s`, `3m05s`, `2h04m`; `exact` (a diagnosis's times, to the second):
    `3.2s`, `3m05s`, `1h02m03s`; `rough` (the report's totals): `45 s`, `90 min`, `2.5 h`; `estimate` (`tuner
    run --check`'s): `clock`'s but `0m45s` under a minute; `stopwatch` (how long `tuner run` took): minutes and
    seconds however long, `0m45s`, `75m03s`."""
    if style == "rough":
        if seconds < 120:
            return f"{seconds:.0f} s"
        minutes = seconds / 60
        return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
    if style == "exact":
        seconds = max(0.0, seconds)
        hours, rest = divmod(round(seconds), 3600)
        minutes, secs = divmod(rest, 60)
        if hours:
            return f"{hours}h{minutes:02d}m{secs:02d}s"
        return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
    whole = round(seconds)
    minutes, secs = divmod(whole, 60)
    if style == "stopwatch":
        return f"{minutes}m{secs:02d}s"
    if whole < 60 and style == "clock":
        return f"{whole} s"
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
