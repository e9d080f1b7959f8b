"""Optuna's side of a study: the samplers and pruners a study file names, a knob's distribution, and the
study opened on its storage with them."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.config import ParamSpec, SearchSpace, StudySpec
from tuner.errors import ConfigError
from tuner.runs import RunDirectory
from tuner.sampling import SpaceFillingStart
from tuner.snapshots import SnapshotStorage

__all__ = ["PRUNERS", "SAMPLERS", "check_sampler", "distribution", "open_optuna_study"]

optuna.logging.set_verbosity(optuna.logging.WARNING)

# TPE's first trials: a space-filling design (tuner.sampling), then the model.
_TPE_STARTUP = 3

# Samplers whose Optuna implementation needs a package serve-tuner does not depend on.
_SAMPLER_NEEDS = {"gp": ("torch",)}


def _qmc_sampler(seed: int) -> optuna.samplers.BaseSampler:
    # The study file chose qmc knowingly: Optuna's note that the class is experimental concerns the code
    # that calls it (ours, held below optuna 6 in pyproject.toml), not the person running the study.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="QMCSampler is experimental", category=optuna.exceptions.ExperimentalWarning
        )
        return optuna.samplers.QMCSampler(seed=seed)


# The samplers read a trial's constraints from the trial itself (`Trial.set_constraint`, called when a
# trial is scored); their `constraints_func` argument is deprecated since Optuna 5 and warned about in
# every run that passed it.
# `liar`: trials run in parallel (a fleet); TPE then counts the running ones as bad (constant_liar), so that
# proposals made while others are measured do not pile onto one region.
class _MakeSampler(Protocol):
    def __call__(self, seed: int, space: SearchSpace, liar: bool = False) -> optuna.samplers.BaseSampler: ...


SAMPLERS: dict[str, _MakeSampler] = {
    "tpe": lambda seed, space, liar=False: SpaceFillingStart(_tpe(seed, liar), space, startup=_TPE_STARTUP, seed=seed),
    "random": lambda seed, _space, _liar=False: optuna.samplers.RandomSampler(seed=seed),
    "qmc": lambda seed, _space, _liar=False: _qmc_sampler(seed),
    "gp": lambda seed, _space, _liar=False: optuna.samplers.GPSampler(seed=seed),
}


def _tpe(seed: int, liar: bool) -> optuna.samplers.BaseSampler:
    if not liar:
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=_TPE_STARTUP)
    with warnings.catch_warnings():  # experimental in Optuna 5: our code, held below optuna 6, calls it
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=_TPE_STARTUP, constant_liar=True)


def check_sampler(name: str) -> None:
    missing = [package for package in _SAMPLER_NEEDS.get(name, ()) if importlib.util.find_spec(package) is None]
    if missing:
        raise ConfigError(
            f"search.sampler {name!r} needs {', '.join(missing)}: .venv/bin/pip install {' '.join(missing)}, "
            'or use sampler = "tpe"'
        )


def distribution(param: ParamSpec) -> BaseDistribution:
    if param.ordinal and param.choices is not None:
        return IntDistribution(0, len(param.choices) - 1)
    if param.choices is not None:
        return CategoricalDistribution(param.choices)
    assert param.low is not None and param.high is not None
    if isinstance(param.low, int) and isinstance(param.high, int) and not isinstance(param.step, float):
        return IntDistribution(param.low, param.high, log=param.log, step=int(param.step or 1))
    return FloatDistribution(float(param.low), float(param.high), log=param.log, step=param.step)


PRUNERS: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
    # At least three first rounds reported (the baseline's included) before anything is pruned.
    # n_min_trials, not n_startup_trials, is the guard: proposals we skip as repeats are told to Optuna
    # as COMPLETE and would count as started trials without having reported a first round.
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0, n_min_trials=3),
    "none": optuna.pruners.NopPruner,
}


def open_optuna_study(
    run_dir: RunDirectory,
    spec: StudySpec,
    space: SearchSpace,
    *,
    storage: optuna.storages.BaseStorage | None = None,
    seed: int | None = None,
) -> optuna.Study:
    """The run directory's study (its journal), or one in `storage` (a fleet's database, the simulated studies'
    memory), read once per step of the loop where it takes a snapshot (`tuner.snapshots`). `seed`: the
    sampler's, where it is not the study's (each controller of a fleet has its own)."""
    # As create_study would take it (a database's storage behind Optuna's cache of the finished trials), wrapped.
    backend = optuna.storages.get_storage(storage if storage is not None else run_dir.storage())
    return optuna.create_study(
        study_name=spec.name,
        storage=SnapshotStorage(backend),
        sampler=SAMPLERS[spec.search.sampler](spec.seed if seed is None else seed, space, bool(spec.hosts)),
        pruner=PRUNERS[spec.search.pruner](),
        directions=["maximize"] * (len(spec.objectives) if spec.combine == "pareto" else 1),
        load_if_exists=True,
    )
