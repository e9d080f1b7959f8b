"""`tuner capacity`: how many closed-loop users the baseline and a study's trial each serve within the SLO.

The configs go on the host as the study's trials do (through its deployer, which restores the baseline at
the end, whatever happens), under the run directory's lock, so a sweep never runs beside the study's own
run on the same host. The sweep is stored in the run directory after every level.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.capacity.closed_loop import LevelRun, run_closed_loop
from tuner.capacity.record import CapacitySweep, SweptConfig, read_sweep, write_sweep
from tuner.capacity.shapes import SUMMARY_OUTPUT_TOKENS, CapacityRequests
from tuner.capacity.sweep import run_sweep
from tuner.config import CapacitySpec, ParamValue, StudySpec
from tuner.errors import ConfigError, StudyError
from tuner.runs import RunDirectory
from tuner.text import count_text, duration_text, settings_text
from tuner.trial_runner import PreparedStudy, ServerTrialRunner

__all__ = [
    "CapacityPlan",
    "SweepLength",
    "after_study_length",
    "budget_left_for_trials",
    "measure_capacity",
    "plan_capacity",
    "server_text",
    "sweep_length",
]


@dataclass(frozen=True, kw_only=True)
class CapacityPlan:
    """What a sweep will measure, checked before any host is touched."""

    spec: StudySpec
    prepared: PreparedStudy
    host: str | None
    configs: list[SweptConfig]
    options: CapacitySpec


def plan_capacity(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    *,
    trial: int | None,
    baseline_only: bool,
    host: str | None,
    options: CapacitySpec,
    storage_url: str | None = None,
) -> CapacityPlan:
    """The configs to sweep: the baseline alone (`baseline_only`), trial `trial` alone, or by default the
    baseline and the study's recommendation side by side."""
    from tuner.report import build_leaderboard, row_to_apply
    from tuner.search import fleet_hosts, prepare_study
    from tuner.study_view import StudyView

    if spec.hosts:
        if host is None:
            names = ", ".join(h.name for h in spec.hosts)
            raise ConfigError(f"a sweep measures one host: name one of the study's hosts with --host ({names})")
        spec = spec.for_host(fleet_hosts(spec, [host])[0])
    elif host is not None:
        fleet_hosts(spec, [host])  # refused: the study has no [[hosts]]
    prepared = prepare_study(spec, base_dir)
    configs: list[SweptConfig] = []
    if trial is None:
        configs.append(SweptConfig(trial=None, settings={}))
    if not baseline_only:
        if trial is None:
            board = build_leaderboard(StudyView.open(RunDirectory(run_path), storage_url))
            row = board.recommendation.row
            if row is None:
                raise StudyError(
                    f"no recommendation to sweep ({board.recommendation.message}); pass --trial N to sweep a trial, or "
                    "--baseline"
                )
        else:
            row = row_to_apply(run_path, trial, storage_url)
        settings: dict[str, ParamValue] = dict(row.settings)
        prepared.engine.check_settings(settings)
        prepared.engine.launch_spec(_server(prepared, settings))  # a bad setting is refused before the host
        if row.number == 0:
            if trial is None:
                raise ConfigError("the study recommends its baseline: pass --baseline to measure it alone")
            configs.append(SweptConfig(trial=None, settings={}))
        else:
            configs.append(SweptConfig(trial=row.number, settings=settings))
    return CapacityPlan(spec=spec, prepared=prepared, host=host, configs=configs, options=options)


def server_text(spec: StudySpec) -> str:
    """The server a sweep measured, as its record names it: the engine, its binary and the settings every
    config shares (a sweep run with `--set` over the study says so here)."""
    options = spec.engine.options()
    binary = options.get("binary", "auto")
    settings = options.get("settings", {})
    shared = settings_text(settings, separator=", ") if isinstance(settings, dict) else ""
    return f"{spec.engine.kind}{'' if binary == 'auto' else f' ({binary})'}" + (f": {shared}" if shared else "")


def _server(prepared: PreparedStudy, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
    return {k: v for k, v in settings.items() if prepared.engine.knobs[k].scope == "server"}


@dataclass(frozen=True)
class SweepLength:
    """A sweep's shortest length (round 1's climb stops after two levels) and its longest (every level in
    every round), and where the levels' lengths came from; `floor`: some level's length is a floor (no sweep
    measured it, and its users may wait for a free slot)."""

    shortest_s: float
    longest_s: float
    source: str
    floor: bool = True

    def text(self, options: CapacitySpec, *, start_s: float) -> str:
        """`at least 4m52s to 9m24s: 2 rounds of up to 4 levels (...) and a server start ...; <source>`."""
        shortest, longest = (duration_text(s, style="estimate") for s in (self.shortest_s, self.longest_s))
        return (
            f"{'at least ' if self.floor else 'about '}{shortest} to {longest}: {count_text(options.rounds, 'round')} "
            f"of up to {count_text(len(options.users), 'level')} ({options.warm_up_s:g} s warm-up, "
            f"{options.window_s:g} s window) and a server start of {start_s:g} s a round; {self.source}"
        )


def sweep_length(
    prepared: PreparedStudy, options: CapacitySpec, run_path: Path, *, configs: int, start_s: float
) -> SweepLength:
    """How long a sweep takes: per config and round, a server start and the levels. A level a sweep of this
    study measured before (same warm-up and window) is taken at its measured length; any other at its
    warm-up or its users' first answers, whichever is later, then its window, then the answers in flight at
    the window's end, one answer each: at least that, more where users wait for a free slot."""
    measured = _measured_level_s(run_path, options)
    answer_s = _answer_s(prepared, options.shape)
    per_level = [
        measured.get(users, max(options.warm_up_s, answer_s) + options.window_s + answer_s) for users in options.users
    ]
    shortest = configs * options.rounds * (start_s + sum(per_level[:2]))
    longest = configs * options.rounds * (start_s + sum(per_level))
    known = [users for users in options.users if users in measured]
    if len(known) == len(options.users):
        return SweepLength(shortest, longest, "each level as long as the last sweep of this study measured it", False)
    source = (
        f"a level not yet measured taken as its warm-up, its window and an answer of {answer_s:.2g} s at each end; "
        "it takes longer where its users outnumber the server's slots and wait their turn (the demo's sweep took "
        "1.4 times this on a quiet machine), and the next --check reads this sweep's own lengths"
    )
    if known:
        source += f"; {', '.join(map(str, known))} users as the last sweep of this study measured them"
    return SweepLength(shortest, longest, source)


def after_study_length(
    spec: StudySpec, prepared: PreparedStudy, run_path: Path, *, start_s: float
) -> SweepLength | None:
    """The sweep of the baseline and the recommendation a one-host `tuner run` ends with (`[capacity]
    after_study`); None where it ends with none."""
    if not spec.capacity.after_study or spec.hosts:
        return None
    return sweep_length(prepared, spec.capacity, run_path, configs=2, start_s=start_s)


def budget_left_for_trials(spec: StudySpec, sweep: SweepLength | None) -> float | None:
    """`budget.hours` in seconds less the longest after-study sweep (the budget holds the sweep too: trials
    stop starting that much earlier); None without `budget.hours`. `ConfigError` if the sweep alone fills it."""
    if spec.budget.hours is None:
        return None
    budget_s = spec.budget.hours * 3600
    if sweep is None:
        return budget_s
    if sweep.longest_s >= budget_s:
        raise ConfigError(
            f"budget.hours = {spec.budget.hours:g} leaves no time for trials: the capacity sweep after the study "
            f"takes up to {duration_text(sweep.longest_s, style='estimate')}; raise budget.hours, or set "
            "[capacity] after_study = false and run `tuner capacity` on its own"
        )
    return budget_s - sweep.longest_s


def _answer_s(prepared: PreparedStudy, shape: str) -> float:
    """One answer alone at the study check's assumed decode speed (slower than SmolLM2's on 2 cores)."""
    from tuner.check import ASSUMED_DECODE_TOK_S

    trace = prepared.trace
    if shape == "summary" or not len(trace):
        tokens = float(SUMMARY_OUTPUT_TOKENS)
    else:
        tokens = float(np.median(trace.output_tokens))
    return tokens / (ASSUMED_DECODE_TOK_S * prepared.engine.clock_speed())


def _measured_level_s(run_path: Path, options: CapacitySpec) -> dict[int, float]:
    """Users -> the mean length of that level over the latest sweep of this study with the same warm-up and
    window (an unreadable sweep is passed over: this is an estimate)."""
    for path in reversed(RunDirectory(run_path).capacity_paths()):
        try:
            sweep = read_sweep(path)
        except StudyError:
            continue
        if (sweep.warm_up_s, sweep.window_s) != (options.warm_up_s, options.window_s):
            continue
        lengths: dict[int, list[float]] = {}
        for config in sweep.configs:
            for level in config.levels:
                if level.seconds is not None:
                    lengths.setdefault(level.users, []).append(level.seconds)
        if lengths:
            return {users: sum(values) / len(values) for users, values in lengths.items()}
    return {}


class _ServerTarget:
    """The sweep's target on a real host: the config started through the study's deployer."""

    def __init__(self, runner: ServerTrialRunner, run_dir: RunDirectory, stamp: str, host: str | None) -> None:
        self._runner, self._run_dir, self._stamp, self._host = runner, run_dir, stamp, host

    async def start(self, config: SweptConfig, *, round_: int) -> None:
        log_path = self._run_dir.capacity_path(self._stamp, self._host, config.trial, round_)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        server = _server(self._runner.prepared, config.settings)
        await self._runner.start(server, number=config.trial or 0, log_path=str(log_path))

    async def run_level(self, users: int, requests: CapacityRequests, *, warm_up_s: float, window_s: float) -> LevelRun:
        prepared = self._runner.prepared
        return await run_closed_loop(
            users,
            requests.next_for,
            engine=prepared.engine,
            base_url=self._runner.base_url,
            warm_up_s=warm_up_s,
            window_s=window_s,
            request_timeout_s=prepared.spec.workload.request_timeout_s,
        )


async def measure_capacity(
    plan: CapacityPlan, run_path: Path, *, say: Callable[[str], None], saved: Callable[[Path], None]
) -> CapacitySweep:
    """Sweeps the plan's configs on the study's host, which is back on its baseline afterwards."""
    from tuner.deployers.base import RecoveringDeployer, create_deployer
    from tuner.transports.base import create_transport

    spec, options, slo = plan.spec, plan.options, plan.spec.metrics.slo
    stamp = time.strftime("%Y%m%dT%H%M%S")
    sweep = CapacitySweep(
        study=spec.name, host=plan.host, started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        shape=options.shape, users=list(options.users), warm_up_s=options.warm_up_s, window_s=options.window_s,
        rounds=options.rounds, slo_ttft_p95_s=slo.ttft_p95_s, slo_decode_tok_s=slo.decode_tok_s,
        slo_min_requests=slo.min_requests, configs=[c.model_copy(deep=True) for c in plan.configs],
        server=server_text(spec),
    )  # fmt: skip
    with RunDirectory(run_path, hosts=() if plan.host is None else (plan.host,)) as run_dir:
        path = run_dir.capacity_path(stamp, plan.host)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_sweep(path, sweep)  # before the first start: a sweep stopped there is kept as one that did not finish
        saved(path)
        async with create_transport(spec.host) as transport:
            deployer = create_deployer(spec.deploy, transport=transport)
            if isinstance(deployer, RecoveringDeployer):
                deployer.remember_in(run_dir.deployer_state_path(plan.host))
            async with deployer:
                runner = ServerTrialRunner(plan.prepared, deployer=deployer, transport=transport)
                target = _ServerTarget(runner, run_dir, stamp, plan.host)
                return await run_sweep(sweep, target, plan.prepared, save=lambda s: write_sweep(path, s), say=say)
