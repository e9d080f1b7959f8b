"""Runs the study's search loop against the simulated server on its own clock (`SimulatedTrialRunner`).

The loop, the sampler, the scoring and the leaderboard are the real ones; only the measuring is simulated.
A study of the demo's size takes a fraction of a second, so a test can run hundreds of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.config import load_study
from tuner.observers import NullObserver, StudyObserver
from tuner.report import Leaderboard, build_leaderboard
from tuner.runs import RunDirectory
from tuner.sim.model import NoiseModel
from tuner.sim.runner import SimulatedTrialRunner, parse_faults
from tuner.study import PreparedStudy, open_optuna_study, prepare_study, run_search

__all__ = ["DEMO", "SimulatedStudy", "prepare_simulated", "run_simulated"]

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "studies" / "stall-demo.toml"
DATA = Path(__file__).resolve().parent / "data"

# Run-to-run noise of the order seen on a shared 2-core machine: a few percent per server start and
# 10% per forward pass.
NOISE = NoiseModel(restart=0.05, iteration=0.10)


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
