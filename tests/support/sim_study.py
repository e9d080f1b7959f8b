"""Runs the study's search loop against the simulated server on its own clock (`SimulatedTrialRunner`).

The loop, the sampler, the scoring and the leaderboard are the real ones; only the measuring is simulated.
A study of the demo's size takes a fraction of a second, so a test can run hundreds of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.config import load_study
from tuner.errors import HostUnreachable
from tuner.observers import NullObserver, StudyObserver
from tuner.report import Leaderboard, build_leaderboard
from tuner.runs import RunDirectory
from tuner.search import PreparedStudy, StudyRun, fleet_loops, open_optuna_study, prepare_study, run_fleet, run_search
from tuner.sim.model import CostModel, NoiseModel, load_cost_model
from tuner.sim.runner import SimulatedTrialRunner, parse_faults

__all__ = [
    "DEMO",
    "SimulatedFleet",
    "SimulatedStudy",
    "fleet_overrides",
    "prepare_simulated",
    "run_simulated",
    "run_simulated_fleet",
    "slower",
]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "studies" / "stall-demo.toml"
DATA = Path(__file__).resolve().parents[1] / "data"

# Run-to-run noise of the order seen on a shared 2-core machine: a few percent per server start and
# 10% per forward pass.
NOISE = NoiseModel(restart=0.05, iteration=0.10)
# An A/A study: the demo's study whose every trial changes nothing the workload can feel (a host-RAM cache
# size on prompts that never repeat), on the smallest stall workload (two streams, one 600-token prompt), 3
# trials. A recommendation is a false win. The fast tier's test and bench/sim_search.py run the same one.
AA_OVERRIDES = (
    f'search.space="{DATA / "aa-space.toml"}"',
    'search.params=["cache_ram"]',
    f'workload.path="{DATA / "stall-small.jsonl"}"',
    "metrics.long_prompt_tokens=600",
    "budget.trials=3",
)


@dataclass(frozen=True, kw_only=True)
class SimulatedStudy:
    study: optuna.Study
    board: Leaderboard
    runner: SimulatedTrialRunner


def prepare_simulated(overrides: Sequence[str] = (), study_file: Path = DEMO) -> PreparedStudy:
    spec, base_dir = load_study(study_file, ['engine.binary="simulated"', *overrides])
    return prepare_study(spec, base_dir)


def run_simulated(
    prepared: PreparedStudy,
    run_path: Path,
    *,
    seed: int,
    noise: NoiseModel = NOISE,
    faults: Sequence[str] = (),
    in_memory: bool = True,
    observer: StudyObserver | None = None,
    save_rounds: bool = False,
) -> SimulatedStudy:
    """One study from start to recommendation; `in_memory` keeps Optuna's storage out of the run directory,
    `save_rounds` writes each round's records into it as a real run does."""
    runner = SimulatedTrialRunner(prepared, seed=seed, noise=noise, faults=parse_faults(faults), observer=observer)
    with RunDirectory(run_path, notice=lambda _line: None) as run_dir:
        if save_rounds:
            runner.run_dir = run_dir
            run_dir.check_spec(prepared.spec.model_dump(mode="json"), measured=False)
        storage = optuna.storages.InMemoryStorage() if in_memory else None
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=storage)
        asyncio.run(run_search(prepared, run_dir, study, runner, observer=observer or NullObserver()))
    return SimulatedStudy(study=study, board=build_leaderboard(study), runner=runner)


@dataclass(frozen=True, kw_only=True)
class SimulatedFleet:
    study: optuna.Study
    board: Leaderboard
    runners: dict[str, SimulatedTrialRunner]
    dropped: dict[str, str]


def slower(cost: CostModel, factor: float) -> CostModel:
    """A host whose every forward pass takes `factor` times as long (hosts of one model differ by ~10%)."""
    return dataclasses.replace(
        cost,
        pass_s=cost.pass_s * factor,
        token_points=tuple((width, seconds * factor) for width, seconds in cost.token_points),
        context_s=cost.context_s * factor,
        sample_s=cost.sample_s * factor,
    )


def fleet_overrides(hosts: Sequence[str]) -> list[str]:
    """`--set hosts=[...]`: a fleet of simulated hosts of these names."""
    return ["hosts=[" + ", ".join(f'{{name = "{name}"}}' for name in hosts) + "]"]


def run_simulated_fleet(
    prepared: PreparedStudy,
    run_path: Path,
    *,
    hosts: Mapping[str, float],
    seed: int,
    storage: optuna.storages.BaseStorage | None = None,
    noise: NoiseModel = NOISE,
    round_wall_s: float = 0.001,
    unreachable: Sequence[str] = (),
    runner_class: Mapping[str, type[SimulatedTrialRunner]] | None = None,
    observer: StudyObserver | None = None,
    grace_s: float = 120.0,
    heartbeat_s: float = 10.0,
    say: Callable[[str], None] = lambda _line: None,
) -> SimulatedFleet:
    """One fleet study on simulated hosts (name -> how much slower than the calibrated machine), driven by one
    controller with one loop per host, as `tuner run` drives a fleet; `unreachable` hosts fail to connect;
    `runner_class`: a host's runner, where it is to misbehave."""
    runners = {
        name: (runner_class or {}).get(name, SimulatedTrialRunner)(
            prepared,
            seed=seed * 1009 + index,
            noise=noise,
            cost=slower(load_cost_model(), factor),
            round_wall_s=round_wall_s,
        )
        for index, (name, factor) in enumerate(hosts.items())
    }
    with RunDirectory(run_path, notice=lambda _line: None, hosts=list(hosts)) as run_dir:
        storage = storage if storage is not None else optuna.storages.InMemoryStorage()
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=storage, seed=seed)
        loops = fleet_loops(
            dict.fromkeys(hosts, prepared),
            run_dir,
            study,
            observer or NullObserver(),
            heartbeat_s=heartbeat_s,
            grace_s=grace_s,
            say=say,
        )

        async def drive(loop: StudyRun) -> None:
            assert loop.host is not None
            if loop.host in unreachable:
                raise HostUnreachable(f"{loop.host}: the link stayed down past the reconnect window")
            await loop.search(runners[loop.host], None)

        dropped = asyncio.run(run_fleet(loops, drive))
    return SimulatedFleet(study=study, board=build_leaderboard(study), runners=runners, dropped=dropped)
