"""A prediction's costs fitted again from the study's own trials (issue 28, point 5). The baseline's log
times the server's passes at one width, its n_ubatch, so a calibration made of it keeps the shipped curve
of cost by width and can only scale it: on a server whose curve has another shape (a GPU whose passes cost
a fixed 0.1 s whatever their width, a server whose narrow passes cost no more per token than wide ones) it
names the shipped calibration's winner. Each trial's log times the passes of that trial's n_ubatch; two or
more widths show the curve's shape, and the prediction made again with it names the next config to try.

Each trial is replayed on the simulated server at its own settings, and the cost of a pass at its width is
scaled until the replay's prefill takes, per token, what the trial's log shows; the streams that decoded
beside it are in the replay, so their share of each pass is not laid on the width. A trial's prefill is
timed against its own decode: a server start that ran slow on everything (another process, a hot CPU) does
not read as a width that costs more. Between the widths measured, a pass's cost is interpolated; beyond
them, the line through the nearest two (a fixed cost per pass and a cost per token) is extended, so a
narrower or a wider pass than any measured is expected to cost what that line says, and the study's next
trial measures it."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tuner.config import ParamValue
from tuner.diagnose import diagnose_log
from tuner.engines.llama_server_log import parse_llama_server_log
from tuner.sim.inputs import NARROW_PASS, CostModel

__all__ = ["PassWidthFit", "TrialLog", "fit_pass_widths", "timed_widths"]

# The widths the curve gets points at: llama-server's n_ubatch ladder.
_LADDER = (32, 64, 128, 256, 512, 1024, 2048)
# A prompt this long times the server's prefill (a shorter one, mostly its fixed costs).
_TIMED_PROMPT_TOKENS = 256
# Scalings of the widths' costs until the replays agree with the logs within 1%: each changes the others'
# replays a little (a prompt's last pass is narrower than its n_ubatch).
_ROUNDS = 6
_AGREED = 0.01
# No pass costs less than this per token: a line extended below its points can reach zero.
_MIN_TOKEN_S = 1e-7


@dataclass(frozen=True, kw_only=True)
class TrialLog:
    """A measured trial's server log, with the server's settings while it ran."""

    number: int
    settings: Mapping[str, ParamValue]  # every knob the simulated server models, the baseline's where unset
    lines: Sequence[str]


@dataclass(frozen=True, kw_only=True)
class PassWidthFit:
    cost: CostModel
    trials: list[int]  # the trials whose logs it was fitted from
    widths: dict[int, float]  # a pass's cost at each measured width, seconds, without attention
    fitted: list[str]  # one line each, for the prediction's account of its calibration


# A replay of the study's round at a trial's settings, on the simulated server at these costs: its log.
Replay = Callable[[Mapping[str, ParamValue], CostModel], Sequence[str]]


def width_of(settings: Mapping[str, ParamValue]) -> int:
    """The widest pass a server of these settings runs: its n_ubatch, at most its n_batch."""
    return min(int(str(settings["n_ubatch"])), int(str(settings["n_batch"])))


def timed_widths(logs: Sequence[TrialLog]) -> set[int]:
    """The pass widths these logs time a prefill at."""
    return {width_of(log.settings) for log in logs if _timed(log.lines)[0] is not None}


def fit_pass_widths(base: CostModel, logs: Sequence[TrialLog], replay: Replay) -> PassWidthFit | None:
    """`base` with the cost of a prefill pass by width fitted from the logs; None where they time fewer than
    two widths (one width shows no shape: `base` stands)."""
    measured = [(log, *_timed(log.lines)) for log in logs]
    measured = [(log, prefill, decode) for log, prefill, decode in measured if prefill is not None]
    widths = sorted({width_of(log.settings) for log, _, _ in measured})
    if len([w for w in widths if w > NARROW_PASS]) < 2:
        return None
    points = {width: base.forward_s(width, 0.0) for width in widths if width > NARROW_PASS}
    cost = _curve(base, points)
    for _ in range(_ROUNDS):
        # Per trial: its width, its prefill's time over the replay's, and its decode's.
        compared: list[tuple[int, float, float | None]] = []
        for log, prefill, decode in measured:
            replayed_prefill, replayed_decode = _timed(replay(log.settings, cost))
            if prefill is None or replayed_prefill is None or width_of(log.settings) not in points:
                continue
            decode_ratio = _decode_ratio(decode, replayed_decode)
            compared.append((width_of(log.settings), prefill / replayed_prefill, decode_ratio))
        known = [decode_ratio for _, _, decode_ratio in compared if decode_ratio is not None]
        level = statistics.median(known) if known else 1.0
        # Each trial's prefill against its own decode, at the level of the trials' decode together.
        ratios: dict[int, list[float]] = {}
        for width, prefill_ratio, decode_ratio in compared:
            ratios.setdefault(width, []).append(prefill_ratio * (level / decode_ratio if decode_ratio else 1.0))
        scale = {width: statistics.median(r) for width, r in ratios.items()}
        for width, factor in scale.items():
            points[width] *= factor
        cost = _curve(base, points)
        if all(abs(factor - 1.0) < _AGREED for factor in scale.values()):
            break
    fitted = [
        "prefill passes by width, from the study's trials "
        + ", ".join(str(log.number) for log, _, _ in measured)
        + ": "
        + ", ".join(f"{width} tokens {points[width] * 1000:.0f} ms" for width in sorted(points))
    ]
    low, high = sorted(points)[:2], sorted(points)[-2:]
    for side, (a, b) in (("narrower", low), ("wider", high)):
        fixed, per_token = _line(points, a, b)
        fitted.append(
            f"passes {side} than the trials ran: the line through {a} and {b} tokens extended "
            f"({fixed * 1000:.1f} ms a pass + {per_token * 1000:.2f} ms a token)"
        )
    return PassWidthFit(
        cost=cost, trials=[log.number for log, _, _ in measured], widths=dict(sorted(points.items())), fitted=fitted
    )


def _timed(lines: Sequence[str]) -> tuple[float | None, dict[int, float]]:
    """Seconds a token of the long prompts' prefill took over all of them (None: no such prompt), and the
    decode speed by how many slots decoded together, outside long prefills (the log's rate lines)."""
    tasks = parse_llama_server_log(lines)
    prompts = [t for t in tasks if t.prompt_n and t.prompt_ms and t.prompt_n >= _TIMED_PROMPT_TOKENS]
    prefill = sum(t.prompt_ms or 0.0 for t in prompts) / sum(t.prompt_n or 0 for t in prompts) if prompts else None
    decode = {
        int(figure.name.rsplit("_", 1)[1]): figure.value
        for figure in diagnose_log(lines).profile
        if figure.name.startswith("decode_tok_s_width_") and figure.value
    }
    return prefill, decode


def _decode_ratio(measured: Mapping[int, float], replayed: Mapping[int, float]) -> float | None:
    """How much slower the trial's server decoded than the replay, at the batch widths both show."""
    common = sorted(set(measured) & set(replayed))
    return statistics.median(replayed[width] / measured[width] for width in common) if common else None


def _line(points: Mapping[int, float], a: int, b: int) -> tuple[float, float]:
    """The fixed cost of a pass and its cost per token on the line through the points at widths a < b."""
    per_token = (points[b] - points[a]) / (b - a)
    return points[a] - a * per_token, per_token


def _pass_s(points: Mapping[int, float], width: int) -> float:
    """A prefill pass's cost at `width`: interpolated between the measured widths, the nearest two's line
    beyond them; where that line has no physical reading (a negative fixed cost, or a wider pass costing
    less than a narrower one), the nearest width's cost per token."""
    widths = sorted(points)
    if width in points:
        return points[width]
    if widths[0] < width < widths[-1]:
        right = next(w for w in widths if w > width)
        left = max(w for w in widths if w < width)
        return points[left] + (width - left) * (points[right] - points[left]) / (right - left)
    a, b = (widths[0], widths[1]) if width < widths[0] else (widths[-2], widths[-1])
    nearest = a if width < widths[0] else b
    fixed, per_token = _line(points, a, b)
    if per_token <= 0 or fixed < 0:
        return points[nearest] * width / nearest
    return fixed + per_token * width


def _curve(base: CostModel, points: Mapping[int, float]) -> CostModel:
    """`base` with its wide passes (over NARROW_PASS tokens, prefill's) at the costs the points give; its
    narrow ones (decode's) as they are."""
    narrow = {w: c for w, c in base.token_points if w <= NARROW_PASS}
    narrow[NARROW_PASS] = base.token_s(NARROW_PASS)
    widths = sorted({w for w in _LADDER if w > NARROW_PASS} | set(points) | {NARROW_PASS + 1})
    wide = [(w, max(_MIN_TOKEN_S, (_pass_s(points, w) - base.pass_s) / w)) for w in widths]
    return dataclasses.replace(base, token_points=(*sorted(narrow.items()), *wide))
