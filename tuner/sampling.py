"""The start of the study's model-based samplers: a walk along the space's line, or a space-filling design.

A space that names a `line` (llama-server's: n_ubatch = n_batch) starts with a walk along it, the other
knobs at the baseline's values (`_line_point` says why the best config lies near it), from the line's middle
or, in a study that starts from a prediction, beside the predicted best; then the line's far end from the
best (and, should that end win, the other); then steps of one knob at a time from the best config
measured, until its neighbours are measured; then TPE models the rest
(bench/search_efficiency.py measures it against the design below, grid and random search:
docs/benchmarks.md). A space without a line starts with the design.

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
from tuner.study_record import INTERRUPTED, TrialRecord

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
        """The next config of the walk, or None when it is done and the model proposes.

        The walk starts on the space's line: its `line` knobs at one shared value, the others at the
        baseline's (for llama-server, n_ubatch = n_batch). A streaming user gets about one token per loop
        iteration while a long prompt is prefilled, and an iteration carries n_batch prompt tokens, so stall
        speed is about prefill speed / n_batch; prefill speed only grows with the micro-batch, so for each
        n_batch the largest micro-batch is never worse, and along the line the score rises as n_batch falls
        until prefill falls off its knee. The walk first measures the line's middle (or the predicted best's
        place on it) and both its neighbours (a batch of three needs no feedback), then the unmeasured
        neighbours of the best config measured: one step along the line, the line's far end from it (a second
        peak there is walked from; should it win, the other end follows), then one step of each other knob (the
        next choice either way of an ascending knob, every other choice of another), until every neighbour of
        the best is measured.
        Neighbours are proposed while others are being measured: a batch's trials are asked together.
        """
        names = sorted(self._space.params)
        trials = study.get_trials(deepcopy=False)
        baseline = next((t for t in trials if TrialRecord.of(t).baseline and t.params), None)
        if baseline is None or any(n not in search_space for n in names):
            return None
        values = self._measured(trials, names)
        base = self._space.decode(baseline.params)
        line = self._space.line
        choices = [self._space.params[n].choices or [] for n in line]
        ladder = [v for v in choices[0] if all(v in other for other in choices[1:])]

        def untried(settings: dict[str, ParamValue]) -> bool:
            encoded = self._space.encode(settings)
            return tuple(sorted(settings.items())) not in values and self._valid(encoded)

        def farther_first(positions: list[int], toward: int) -> list[int]:
            return sorted(positions, key=lambda i: -abs(i - toward))

        # The line's middle and its neighbours, the one farther from the baseline first: it tells more. A study
        # that starts from a prediction (its predicted best queued after the baseline) walks from there instead.
        middle = (len(ladder) - 1) // 2
        predicted = next((t for t in trials if t.params and TrialRecord.of(t).predicted), None)
        if predicted is not None and (at := self._space.decode(predicted.params)[line[0]]) in ladder:
            middle = ladder.index(at)
        at_base = ladder.index(base[line[0]]) if base[line[0]] in ladder else len(ladder) - 1
        for index in [middle, *farther_first([middle - 1, middle + 1], at_base)]:
            point = {**base, **dict.fromkeys(line, ladder[index])} if 0 <= index < len(ladder) else None
            if point is not None and untried(point):
                return self._space.encode(point)
        scored = {config: v for config, v in values.items() if v is not None and v > -math.inf}
        if not scored:
            return None
        best = dict(max(scored.items(), key=lambda item: item[1])[0])
        steps: list[dict[str, ParamValue]] = []
        if best[line[0]] in ladder and all(best[n] == best[line[0]] for n in line):
            here = ladder.index(best[line[0]])
            around = [i for i in farther_first([here - 1, here + 1], at_base) if 0 <= i < len(ladder)]
            # Then the line's far end from the best: the score need not have one peak along the line
            # (a GPU whose passes wider than the baseline's micro-batch are cheaper per token has a second
            # one at the top: bench/search_efficiency.py's knee at 1024), and a better end is walked from.
            far = 0 if here >= len(ladder) / 2 else len(ladder) - 1
            steps += [{**best, **dict.fromkeys(line, ladder[i])} for i in [*around, far]]
        for name in names:
            param = self._space.params[name]
            if name in line or param.choices is None:
                continue
            if param.ordinal:
                here, start = param.choices.index(best[name]), param.choices.index(base[name])
                around = [i for i in farther_first([here - 1, here + 1], start) if 0 <= i < len(param.choices)]
                steps += [{**best, name: param.choices[i]} for i in around]
            else:
                steps += [{**best, name: choice} for choice in param.choices if choice != best[name]]
        return next((self._space.encode(step) for step in steps if untried(step)), None)

    def _measured(
        self, trials: Sequence[FrozenTrial], names: Sequence[str]
    ) -> dict[tuple[tuple[str, Any], ...], float | None]:
        """Each config's best measured score: -inf when it failed, was pruned, broke a constraint or was
        skipped as one that cannot run (it would not fit), None while it is being measured. A trial the
        controller's stop interrupted says nothing of its config: a resumed study proposes it again."""
        values: dict[tuple[tuple[str, Any], ...], float | None] = {}
        for trial in trials:
            record = TrialRecord.of(trial)
            interrupted = trial.state == TrialState.FAIL and (record.fail_reason or "").startswith(INTERRUPTED)
            if record.duplicate_of is not None or interrupted or not all(n in trial.params for n in names):
                continue
            config = tuple(sorted(self._space.decode(trial.params).items()))
            if record.skip_reason:
                # A repeat skipped for a trial of the same settings is that trial's; any other skip is final.
                if not record.skip_reason.startswith("same settings as trial"):
                    values.setdefault(config, -math.inf)
                continue
            earlier = values.get(config)
            if trial.state == TrialState.COMPLETE and record.score is not None and not record.violates:
                values[config] = record.score if earlier is None else max(record.score, earlier)
            elif trial.state in (TrialState.RUNNING, TrialState.WAITING):
                values.setdefault(config, None)
            elif earlier is None:
                values[config] = -math.inf
        return values

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
