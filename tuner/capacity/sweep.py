"""The sweep: each config's levels of closed-loop users, round by round, on a target that can start a config
and run a level (a real server through the study's deployer, or the simulated one on its own clock).

Round 1 climbs each config's levels until two in a row fail (or the list ends); round 2 comes back down
over the levels round 1 measured, round 3 climbs them again, and so on; the configs swap order every
round (A B, B A, ...). A slow drift of the machine then spreads over levels and configs instead of landing
on the last ones, as the confirmation's alternating pairs do. Each round starts its config's server afresh,
so the rounds of one config differ by a restart as a trial's rounds do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tuner.capacity.closed_loop import LevelRun
from tuner.capacity.levels import LevelFigures, capacity, climb_stops, level_figures
from tuner.capacity.record import CapacitySweep, SweptConfig
from tuner.capacity.shapes import SUMMARY_OUTPUT_TOKENS, CapacityRequests, shape_trace
from tuner.text import count_text
from tuner.trial_runner import PreparedStudy

__all__ = ["CapacityTarget", "level_line", "run_sweep"]


class CapacityTarget(Protocol):
    async def start(self, config: SweptConfig, *, round_: int) -> None:
        """The config's server started afresh (`DeployError` if it does not come up)."""
        ...

    async def run_level(self, users: int, requests: CapacityRequests, *, warm_up_s: float, window_s: float) -> LevelRun:
        """One level of closed-loop users on the running server."""
        ...


def level_line(config: SweptConfig, figures: LevelFigures) -> str:
    per_user = "-" if figures.per_user_tok_s is None else f"{figures.per_user_tok_s:.1f}"
    p95 = "-" if figures.ttft_p95_s is None else f"{figures.ttft_p95_s:.2f} s"
    verdict = figures.verdict if not figures.why else f"{figures.verdict} ({figures.why})"
    return (
        f"{config.label}, round {figures.round}: {count_text(figures.users, 'user')}: "
        f"{figures.total_tok_s:.1f} tok/s in all, "
        f"{per_user} tok/s per user, TTFT p95 {p95}, {count_text(figures.requests, 'request')}: {verdict}"
    )


async def run_sweep(
    sweep: CapacitySweep,
    target: CapacityTarget,
    prepared: PreparedStudy,
    *,
    save: Callable[[CapacitySweep], None],
    say: Callable[[str], None],
) -> CapacitySweep:
    """Measures every config of `sweep` (its levels empty) and fills them in, saving after every level."""
    slo = prepared.spec.metrics.slo.model_copy(
        update={"ttft_p95_s": sweep.slo_ttft_p95_s, "decode_tok_s": sweep.slo_decode_tok_s,
                "min_requests": sweep.slo_min_requests}
    )  # fmt: skip
    trace = shape_trace(prepared, sweep.shape)
    output = SUMMARY_OUTPUT_TOKENS if sweep.shape == "summary" else None
    climbed: dict[int, list[int]] = {}
    for round_ in range(1, sweep.rounds + 1):
        order: Sequence[int] = range(len(sweep.configs))
        if round_ % 2 == 0:
            order = list(reversed(order))
        for index in order:
            config = sweep.configs[index]
            await target.start(config, round_=round_)
            levels = sweep.users if round_ == 1 else climbed[index]
            if round_ > 1 and round_ % 2 == 0:
                levels = list(reversed(levels))
            measured: list[LevelFigures] = []
            for users in levels:
                requests = CapacityRequests(
                    prepared, trace, config.settings, users=users, round_=round_, output_tokens=output
                )
                run = await target.run_level(users, requests, warm_up_s=sweep.warm_up_s, window_s=sweep.window_s)
                figures = level_figures(
                    run.records, users=users, round_=round_, window=run.window, slo=slo, seconds=run.elapsed_s
                )
                measured.append(figures)
                config.levels.append(figures)
                say(level_line(config, figures))
                save(sweep)
                if round_ == 1 and climb_stops(measured):
                    break
            if round_ == 1:
                climbed[index] = [f.users for f in measured]
    for config in sweep.configs:
        config.capacity = capacity(config.levels, sweep.rounds)
    sweep.finished = True
    save(sweep)
    return sweep
