"""The start of the study's model-based samplers: a walk along the space's line, or a space-filling design.

A space that names a `line` (llama-server's: n_ubatch = n_batch) starts with a walk along it, the other
knobs at the baseline's values (`_line_point` says why the best config lies there); on the demo's space
and the five-knob space it finds the best config within the first three trials, where the design below
needed a median of 9 and 49 (bench/search_efficiency.py, docs/benchmarks.md). A space without a line
starts with the design.

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

from tuner.config import ParamValue, SearchSpace
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
        if self._space.line:
            known = optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False)) or {}
            return (
                known
                if self._line_point(study, known) is not None
                else self._model.infer_relative_search_space(study, trial)
            )
        if self._in_startup(study):
            return optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False)) or {}
        return self._model.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._space.line:
            point = self._line_point(study, search_space)
            return point if point is not None else self._model.sample_relative(study, trial, search_space)
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

    def _line_point(self, study: optuna.Study, search_space: dict[str, BaseDistribution]) -> dict[str, Any] | None:
        """The next config of the line search, or None when the line is done and the model proposes.

        The line is the space's `line` knobs at one shared value, the others at the baseline's: for
        llama-server, n_ubatch = n_batch. A streaming user gets about one token per loop iteration while a
        long prompt is prefilled, and an iteration carries n_batch prompt tokens, so stall speed is about
        prefill speed / n_batch; prefill speed only grows with the micro-batch, so for each n_batch the
        largest micro-batch is never worse. The best config is then on that line, and its score rises as
        n_batch falls until prefill falls off its knee: one peak, which a walk finds in few trials. The walk
        measures the line's middle and both its neighbours (one batch of three needs no feedback), then
        the unmeasured neighbour of the best point measured, until the best has measured neighbours.
        """
        names = sorted(self._space.params)
        trials = study.get_trials(deepcopy=False)
        baseline = next((t for t in trials if TrialRecord.of(t).baseline and t.params), None)
        if baseline is None or any(n not in search_space for n in names):
            return None
        lead = self._space.line[0]
        choices = [self._space.params[n].choices or [] for n in self._space.line]
        ladder = [v for v in choices[0] if all(v in other for other in choices[1:])]
        base = self._space.decode(baseline.params)
        # A line point the constraints forbid stays in the list as None, so that positions stay neighbours.
        points: list[dict[str, ParamValue] | None] = []
        for value in ladder:
            point = {**base, **dict.fromkeys(self._space.line, value)}
            points.append(point if self._valid(self._space.encode(point)) else None)
        if not any(points):
            return None
        # Each line point's best measured score: -inf when it failed, was pruned or broke a constraint,
        # None while it is being measured, absent when never proposed. A skipped proposal measured nothing.
        values: dict[int, float | None] = {}
        for trial in trials:
            record = TrialRecord.of(trial)
            if record.skip_reason or record.duplicate_of is not None or not all(n in trial.params for n in names):
                continue
            settings = self._space.decode(trial.params)
            if settings not in points:
                continue
            index = points.index(settings)
            if trial.state == TrialState.COMPLETE and record.score is not None and not record.violates:
                earlier = values.get(index)
                values[index] = record.score if earlier is None else max(record.score, earlier)
            elif trial.state in (TrialState.RUNNING, TrialState.WAITING):
                values.setdefault(index, None)
            elif values.get(index) is None:
                values[index] = -math.inf
        middle = (len(points) - 1) // 2
        toward = ladder.index(base[lead]) if base[lead] in ladder else len(ladder) - 1
        # The middle's neighbours, the one farther from the baseline first: it tells more.
        stencil = [middle, *sorted((middle - 1, middle + 1), key=lambda i: -abs(i - toward))]
        untried = [i for i in stencil if 0 <= i < len(points) and points[i] is not None and i not in values]
        if untried:
            return self._space.encode(points[untried[0]] or {})
        if any(v is None for v in values.values()):
            return None  # the walk waits for what is being measured; the model proposes meanwhile
        scored = {i: v for i, v in values.items() if v is not None}
        best = max(scored, key=lambda i: scored[i])
        if scored[best] == -math.inf:
            return None
        step = [i for i in (best - 1, best + 1) if 0 <= i < len(points) and points[i] is not None and i not in values]
        return self._space.encode(points[step[0]] or {}) if step else None

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
