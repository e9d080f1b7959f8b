"""A capacity level's figures from its requests, its verdict against the SLO, and the capacity of a sweep.

Seed 004's definitions, which an operator can check by hand: the level's requests are those sent inside the
measured window; total output is the tokens that arrived inside the window over its length (whichever
request they belong to); a user's speed is a request's (tokens - 1) over its first to last token, the
median over the window's requests (queueing left out); TTFT is from send to first token (queueing in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.config import SloSpec
from tuner.models import RequestRecord

__all__ = ["VERDICT_MARKS", "LevelFigures", "Verdict", "capacity", "climb_stops", "level_figures"]

Verdict = Literal["pass", "fail", "too few"]


class LevelFigures(BaseModel):
    """One round of one level of concurrent users."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    users: int
    round: int  # from 1
    requests: int  # sent inside the window
    errors: int  # of those, failed (HTTP error, timeout, no output)
    total_tok_s: float
    per_user_tok_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    verdict: Verdict
    why: str  # what broke the SLO, or why the level cannot be judged; "" when it passed
    # The level's length, warm-up and drain included (None in a sweep stored before it was kept): the next
    # sweep's estimate of its own length reads it.
    seconds: float | None = None

    @property
    def cell(self) -> str:
        """The level as a table's cell shows it, in the terminal and the report alike:
        `total tok/s / per-user tok/s / TTFT p95 s mark`."""
        per_user = "-" if self.per_user_tok_s is None else f"{self.per_user_tok_s:.1f}"
        p95 = "-" if self.ttft_p95_s is None else f"{self.ttft_p95_s:.2f}"
        return f"{self.total_tok_s:.1f} / {per_user} / {p95} s {VERDICT_MARKS[self.verdict]}"


VERDICT_MARKS: dict[Verdict, str] = {"pass": "ok", "fail": "FAIL", "too few": "?"}


def level_figures(
    records: Sequence[RequestRecord],
    *,
    users: int,
    round_: int,
    window: tuple[float, float],
    slo: SloSpec,
    seconds: float | None = None,
) -> LevelFigures:
    """The level's figures from every request of its run (warm-up and drain included), on one clock."""
    start, end = window
    measured = [r for r in records if start <= r.send_s < end]
    ok = [r for r in measured if r.ok]
    arrived = sum(1 for r in records for t in r.token_s if start <= t < end)
    speeds = [
        (len(r.token_s) - 1) / (r.token_s[-1] - r.token_s[0])
        for r in ok
        if len(r.token_s) >= 2 and r.token_s[-1] > r.token_s[0]
    ]
    ttfts = [r.token_s[0] - r.send_s for r in ok]
    per_user = float(np.median(speeds)) if speeds else None
    p50 = float(np.percentile(ttfts, 50)) if ttfts else None
    p95 = float(np.percentile(ttfts, 95)) if ttfts else None
    errors = len(measured) - len(ok)
    if len(measured) >= slo.min_requests:
        verdict, why = _judge(len(measured), errors, per_user, p95, slo)
    else:
        verdict, why = _judge_few(measured, errors=errors, ttfts=ttfts, speeds=speeds, window=window, slo=slo)
    return LevelFigures(
        users=users, round=round_, requests=len(measured), errors=errors, total_tok_s=arrived / (end - start),
        per_user_tok_s=per_user, ttft_p50_s=p50, ttft_p95_s=p95, verdict=verdict, why=why, seconds=seconds,
    )  # fmt: skip


def _judge(requests: int, errors: int, per_user: float | None, p95: float | None, slo: SloSpec) -> tuple[Verdict, str]:
    broken = []
    if errors:
        broken.append(f"{errors} of {requests} requests failed")
    if p95 is not None and p95 > slo.ttft_p95_s:
        broken.append(f"TTFT p95 {p95:.2f} s > {slo.ttft_p95_s:g} s")
    if per_user is not None and per_user < slo.decode_tok_s:
        broken.append(f"{per_user:.1f} tok/s per user < {slo.decode_tok_s:g}")
    if broken:
        return "fail", "; ".join(broken)
    if p95 is None or per_user is None:
        return "too few", "no request of the window was answered"
    return "pass", ""


# A level of fewer requests than metrics.slo.min_requests fails only on evidence: a failed request, or so
# many requests over a line that the SLO could hold with them by a chance of at most 1 in 20 (TTFT: a p95
# within the line leaves each request over it at most a 5% chance; per-user speed: a median within it, 50%).
_EVIDENCE = 0.05


def _judge_few(
    measured: Sequence[RequestRecord],
    *,
    errors: int,
    ttfts: Sequence[float],
    speeds: Sequence[float],
    window: tuple[float, float],
    slo: SloSpec,
) -> tuple[Verdict, str]:
    requests = len(measured)
    broken = [f"{errors} of {requests} requests failed"] if errors else []
    slow = sum(1 for t in ttfts if t > slo.ttft_p95_s)
    if slow and _binomial_tail(slow, len(ttfts), 0.05) <= _EVIDENCE:
        broken.append(f"{slow} of {len(ttfts)} TTFTs over {slo.ttft_p95_s:g} s")
    crawling = sum(1 for s in speeds if s < slo.decode_tok_s)
    if crawling and _binomial_tail(crawling, len(speeds), 0.5) <= _EVIDENCE:
        broken.append(f"{crawling} of {len(speeds)} users under {slo.decode_tok_s:g} tok/s")
    if broken:
        return "fail", "; ".join(broken) + f" (of fewer requests than metrics.slo.min_requests = {slo.min_requests})"
    longest = max((r.end_s - r.send_s for r in measured), default=0.0)
    hint = (
        f"; a request took up to {longest:.0f} s: lengthen the window or lower metrics.slo.min_requests"
        if longest > (window[1] - window[0]) / max(slo.min_requests, 1)
        else "; lengthen the window or lower metrics.slo.min_requests"
    )
    return (
        "too few",
        f"{requests} requests in the window, fewer than metrics.slo.min_requests = {slo.min_requests}{hint}",
    )


def _binomial_tail(at_least: int, trials: int, share: float) -> float:
    """The chance of `at_least` or more successes in `trials`, each of chance `share`."""
    return sum(math.comb(trials, k) * share**k * (1 - share) ** (trials - k) for k in range(at_least, trials + 1))


def climb_stops(figures: Sequence[LevelFigures]) -> bool:
    """Whether a climb stops: the last two levels it measured failed (a level too short to judge between two
    failed ones keeps the climb going)."""
    return len(figures) >= 2 and all(f.verdict == "fail" for f in figures[-2:])


def capacity(figures: Sequence[LevelFigures], rounds: int) -> int | None:
    """The most users that held the SLO in every one of the `rounds` rounds; None if no level did."""
    held: dict[int, int] = {}
    for f in figures:
        if f.verdict == "pass":
            held[f.users] = held.get(f.users, 0) + 1
    passed = [users for users, count in held.items() if count >= rounds]
    return max(passed) if passed else None
