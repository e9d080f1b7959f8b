"""A space-filling start for the study's model-based samplers.

A night affords a handful of trials, and TPE's default start (its first trials drawn at random) spends
them unevenly: on the demo's 27 configs, five random trials miss the three in the knee about half the
time. The first `startup` trials here are instead a maximin design on the space's grid: each is the valid,
unmeasured config farthest from every config tried so far (the baseline included), distances measured on
each knob's normalized position (an ordinal knob's index, a categorical knob's match), ties broken by the
seed. This is the usual space-filling initial design of Bayesian optimisation, restricted to what the
space's constraints allow, so no proposal of the start is wasted on a config that is then skipped. After
the start, the wrapped sampler (TPE) models what scored well. A space with a continuous range, or one
larger than `_MAX_GRID` configs, keeps the wrapped sampler's own start.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.config import SearchSpace
from tuner.study_record import TrialRecord

__all__ = ["SpaceFillingStart"]

_MAX_GRID = 20_000


class SpaceFillingStart(optuna.samplers.BaseSampler):
    def __init__(self, model: optuna.samplers.BaseSampler, space: SearchSpace, *, startup: int, seed: int) -> None:
        self._model = model
        self._space = space
        self._startup = startup
        self._random = random.Random(seed)

    def _in_startup(self, study: optuna.Study) -> bool:
        scored = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        return sum(1 for t in scored if TrialRecord.of(t).deployed) < self._startup + 1  # + the baseline

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._in_startup(study):
            return optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False)) or {}
        return self._model.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not self._in_startup(study):
            return self._model.sample_relative(study, trial, search_space)
        point = self._design_point(study, search_space)
        return point if point is not None else {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._model.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._model.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._model.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._model.reseed_rng()

    def _design_point(self, study: optuna.Study, search_space: dict[str, BaseDistribution]) -> dict[str, Any] | None:
        names = sorted(search_space)
        axes: list[list[Any]] = []
        ordered: list[bool] = []  # an index axis (an ordinal knob): distance by position, else by match
        for name in names:
            distribution = search_space[name]
            if isinstance(distribution, CategoricalDistribution):
                axes.append(list(distribution.choices))
                ordered.append(False)
            elif isinstance(distribution, IntDistribution) and not distribution.log:
                axes.append(list(range(distribution.low, distribution.high + 1, distribution.step)))
                ordered.append(True)
            else:
                return None
        if not names or math.prod(len(axis) for axis in axes) > _MAX_GRID:
            return None
        tried = [
            tuple(t.params[n] for n in names)
            for t in study.get_trials(deepcopy=False)
            if all(n in t.params for n in names)
        ]
        best: list[tuple[Any, ...]] = []
        best_distance = -1.0
        for point in itertools.product(*axes):
            if point in tried or not self._valid(dict(zip(names, point, strict=True))):
                continue
            distance = min((_distance(point, other, axes, ordered) for other in tried), default=math.inf)
            if distance > best_distance + 1e-12:
                best, best_distance = [point], distance
            elif abs(distance - best_distance) <= 1e-12:
                best.append(point)
        if not best:
            return None
        return dict(zip(names, self._random.choice(best), strict=True))

    def _valid(self, sampled: dict[str, Any]) -> bool:
        settings = self._space.decode(sampled)
        return all(c.holds(settings) for c in self._space.constraints if all(n in settings for n in c.names()))


def _distance(a: tuple[Any, ...], b: tuple[Any, ...], axes: list[list[Any]], ordered: list[bool]) -> float:
    total = 0.0
    for x, y, axis, by_position in zip(a, b, axes, ordered, strict=True):
        if by_position:
            total += ((x - y) / max(1, len(axis) - 1)) ** 2
        else:
            total += 0.0 if x == y else 1.0
    return math.sqrt(total)
