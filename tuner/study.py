"""The ask/tell loop: the baseline first, then batches of trials with interleaved rounds, then a
re-measurement of the best against the baseline; restore in `finally`.

Optuna only proposes settings; this module owns trial execution. Trial 0 is the baseline (the
engine's base settings with nothing tuned) and exists once across resumes. A trial that was RUNNING
when a previous controller died is marked FAIL on the next start. The trial budget counts trials
that were deployed, across resumes. docs/metrics.md describes each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import statistics
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.config import (
    HostEntry,
    ParamSpec,
    ParamValue,
    SearchSpace,
    StudySpec,
    load_search_space,
    validate_options,
)
from tuner.deployers.base import DEPLOYERS, RecoveringDeployer, check_launch, create_deployer, server_command
from tuner.engines.base import Engine, create_engine
from tuner.engines.llama_server import SIMULATED
from tuner.errors import ConfigError, DeployError, MeasurementError, StudyError, TransportError
from tuner.faults import crash_point
from tuner.fleet import (
    fail_own_interrupted_trials,
    fail_stale_trials,
    fleet_seed,
    hosts_checking,
    requeue,
    write_host_check,
    write_lease,
)
from tuner.gate import judge, lora_answer_changes
from tuner.metrics import engine_metrics
from tuner.models import LaunchSpec
from tuner.observers import FLEET_HOST, NullObserver, StudyObserver
from tuner.redact import redact
from tuner.runs import RunDirectory
from tuner.sampling import SpaceFillingStart
from tuner.scoring import difference_ci, median_metrics, min_effect, noisy_metrics, objective_terms, score_round
from tuner.sim.server import CommandLineError, parse_command_line
from tuner.snapshots import SnapshotStorage, snapshot
from tuner.storage import has_measured_trials, open_storage, stored_spec
from tuner.study_record import (
    INTERRUPTED,
    Confirmation,
    HostRecord,
    StudyRecord,
    TrialRecord,
    new_trial_attrs,
    update_host_record,
    update_study_record,
    update_trial_record,
)
from tuner.transports.base import TRANSPORTS, Transport, create_transport
from tuner.trial_runner import PreparedStudy, ServerTrialRunner, TrialRunner
from tuner.workloads import load_trace, thin_sessions

__all__ = [
    "FleetHost",
    "PreparedStudy",
    "fleet_hosts",
    "fleet_loops",
    "run_fleet",
    "open_optuna_study",
    "prepare_study",
    "run_search",
    "run_study",
]

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Consecutive proposals that are skipped (constraint violated, already measured) before we decide
# the sampler has nothing new to offer.
_MAX_SKIPPED_PROPOSALS = 200
# A fleet's host whose trials fail this many times in a row starts its baseline settings again: if they no
# longer start either, the host is at fault and is dropped (its failed trials queued for the others); if they
# do, the settings were, and it goes on.
HOST_CHECK_AFTER_FAILURES = 3
GATE_FAILURE = "correctness gate"  # how a trial the gate failed starts its reason

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


_SAMPLERS: dict[str, _MakeSampler] = {
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


def _check_sampler(name: str) -> None:
    missing = [package for package in _SAMPLER_NEEDS.get(name, ()) if importlib.util.find_spec(package) is None]
    if missing:
        raise ConfigError(
            f"search.sampler {name!r} needs {', '.join(missing)}: .venv/bin/pip install {' '.join(missing)}, "
            'or use sampler = "tpe"'
        )


def _check_plugin_options(spec: StudySpec) -> None:
    """The `[host]` and `[deploy]` tables are validated by their plugins' own models here, with the rest
    of the study, not when the host is reached: a mistake in them must not leave a run directory."""
    validate_options(TRANSPORTS.get(spec.host.kind).options_model, spec.host.options(), where="host")
    validate_options(DEPLOYERS.get(spec.deploy.kind).options_model, spec.deploy.options(), where="deploy")


def _check_space_against_knobs(space: SearchSpace, engine: Engine, space_path: Path) -> None:
    """Every value a search space can propose is one its knob takes: found here, not at the first trial."""
    for name, param in space.params.items():
        if name not in engine.knobs:
            raise ConfigError(
                f"search space knob {name!r} is not a {engine.kind} knob; valid: {', '.join(sorted(engine.knobs))}"
            )
        bounds = [("choices", c) for c in param.choices or []] + [("low", param.low), ("high", param.high)]
        for key, value in bounds:
            if value is None:
                continue
            try:
                engine.knobs[name].check(value)
            except ConfigError as exc:
                raise ConfigError(
                    f"{space_path}: params.{name}.{key}: {exc}; fix the range in the search space"
                ) from None


def _check_settings_consistency(full_space: SearchSpace, base_settings: Mapping[str, ParamValue]) -> None:
    """engine.settings must satisfy the space's constraints (n_ubatch <= n_batch) where it sets a knob;
    the knobs it leaves out count at the space's defaults."""
    values = {n: p.default for n, p in full_space.params.items() if p.default is not None} | dict(base_settings)
    for constraint in full_space.constraints:
        names = constraint.names()
        if not any(n in base_settings for n in names) or not all(n in values for n in names):
            continue
        if not constraint.holds(values):
            shown = ", ".join(f"{n} = {values[n]!r}" + ("" if n in base_settings else " (the default)") for n in names)
            raise ConfigError(
                f"engine.settings breaks the search space's constraint {constraint.text!r} ({shown}); "
                "change engine.settings so that it holds"
            )


def prepare_study(spec: StudySpec, base_dir: Path) -> PreparedStudy:
    _check_sampler(spec.search.sampler)
    _check_plugin_options(spec)
    engine = create_engine(spec.engine, command=server_command(spec.deploy, local_host=spec.host.kind == "local"))
    full_space = load_search_space(base_dir / spec.search.space)
    space = full_space.restricted_to(spec.search.params)
    if space.engine != engine.kind:
        raise ConfigError(
            f"search space {spec.search.space} is for {space.engine!r}, the study's engine is {engine.kind!r}"
        )
    _check_space_against_knobs(space, engine, base_dir / spec.search.space)
    _check_settings_consistency(full_space, engine.base_settings)
    known = engine_metrics(engine.metrics)
    for objective in spec.objectives:
        if objective.metric not in known:
            valid = ", ".join(sorted(known))
            raise ConfigError(f"objective metric {objective.metric!r} is unknown for {engine.kind}; valid: {valid}")
    for constraint in spec.constraints:
        if constraint.metric not in known:
            valid = ", ".join(sorted(known))
            raise ConfigError(f"constraint metric {constraint.metric!r} is unknown for {engine.kind}; valid: {valid}")
    base_settings = engine.base_settings
    baseline: dict[str, ParamValue] = {}
    for name, param in space.params.items():
        value = base_settings.get(name, param.default)
        if value is None:
            raise ConfigError(
                f"knob {name!r} has no default in the search space; set engine.settings.{name} so the baseline is known"
            )
        if not param.allows(value):
            raise ConfigError(
                f"the baseline value {value!r} of {name!r} is outside its search space; add it to choices"
            )
        baseline[name] = value
    trace = load_trace(base_dir / spec.workload.path)
    if spec.workload.keep_concurrency:
        trace = thin_sessions(trace, keep=spec.workload.time_scale, seed=spec.workload.seed)
    adapters = {adapter for uses in trace.lora_mix() for adapter, _ in uses}
    if adapters:
        engine.check_lora_adapters(adapters)
    return PreparedStudy(spec=spec, engine=engine, space=space, baseline_settings=baseline, trace=trace)


def _distribution(param: ParamSpec) -> BaseDistribution:
    if param.ordinal and param.choices is not None:
        return IntDistribution(0, len(param.choices) - 1)
    if param.choices is not None:
        return CategoricalDistribution(param.choices)
    assert param.low is not None and param.high is not None
    if isinstance(param.low, int) and isinstance(param.high, int) and not isinstance(param.step, float):
        return IntDistribution(param.low, param.high, log=param.log, step=int(param.step or 1))
    return FloatDistribution(float(param.low), float(param.high), log=param.log, step=param.step)


_PRUNERS: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
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
        sampler=_SAMPLERS[spec.search.sampler](spec.seed if seed is None else seed, space, bool(spec.hosts)),
        pruner=_PRUNERS[spec.search.pruner](),
        directions=["maximize"] * (len(spec.objectives) if spec.combine == "pareto" else 1),
        load_if_exists=True,
    )


def _is_baseline(trial: FrozenTrial | optuna.Trial) -> bool:
    return TrialRecord.of(trial).baseline


def _fail_interrupted_trials(study: optuna.Study) -> None:
    """A trial left RUNNING by a controller that died is marked FAIL, as interrupted."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        update_trial_record(optuna.Trial(study, trial._trial_id), fail_reason=INTERRUPTED)
        study.tell(trial.number, state=TrialState.FAIL)


def _record_study(study: optuna.Study, spec: StudySpec) -> None:
    """What every controller of the study writes alike (a fleet's too: the same values from each)."""
    update_study_record(
        study,
        min_effect=min_effect(spec.objectives),
        allow_answer_changes=spec.gate.allow_answer_changes,
        objectives=[o.metric for o in spec.objectives],
    )


def _ensure_baseline_queued(study: optuna.Study, prepared: PreparedStudy) -> None:
    trials = study.get_trials(deepcopy=False)
    done = any(_is_baseline(t) and t.state == TrialState.COMPLETE for t in trials)
    queued = any(_is_baseline(t) and t.state == TrialState.WAITING for t in trials)
    if not done and not queued:
        study.enqueue_trial(
            prepared.space.encode(prepared.baseline_settings), user_attrs=new_trial_attrs(TrialRecord(baseline=True))
        )


class _BestSoFar:
    """Tells the observer the best measured trial whenever it changes: the highest finite score of the
    completed trials that break no constraint, the baseline aside (what the confirmation picks from)."""

    def __init__(self, study: optuna.Study, observer: StudyObserver) -> None:
        self.study = study
        self.observer = observer
        self.best: tuple[float, int, dict[str, ParamValue]] | None = None

    def tell_stored(self) -> None:
        """The best of the trials the study already holds (a resume's), read once."""
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            record = TrialRecord.of(trial)
            if record.deployed and not record.baseline and not record.violates and record.score is not None:
                self.consider(trial.number, record.score, record.settings or {}, tell=False)
        if self.best is not None:
            self.observer.best_so_far(number=self.best[1], score=self.best[0], settings=self.best[2])

    def consider(self, number: int, score: float, settings: Mapping[str, ParamValue], *, tell: bool = True) -> None:
        """A trial just scored (one that breaks no constraint, not the baseline)."""
        if math.isfinite(score) and (self.best is None or score > self.best[0]):
            self.best = (score, number, dict(settings))
            if tell:
                self.observer.best_so_far(number=number, score=score, settings=self.best[2])


@dataclass(kw_only=True)
class _Pending:
    """A trial being measured in the current batch."""

    trial: optuna.Trial
    settings: dict[str, ParamValue]
    baseline: bool
    planned: int
    rounds: list[dict[str, float | None]] = field(default_factory=list)
    pruned: bool = False


@dataclass(kw_only=True)
class _RunningServer:
    """The server the last start left running: its server settings and the trials it measured a round of."""

    settings: dict[str, ParamValue]
    trials: set[int]


@dataclass(frozen=True, kw_only=True)
class FleetHost:
    """The loop of one host of a fleet: its name, and how its controller keeps its trials' leases."""

    name: str
    heartbeat_s: float = 10.0
    grace_s: float = 120.0
    # The hosts this controller drives (their RUNNING trials are its own, never a stale peer's).
    own: frozenset[str] = frozenset()
    say: Callable[[str], None] = lambda _line: None


class _StudyRun:
    def __init__(
        self,
        prepared: PreparedStudy,
        run_dir: RunDirectory,
        study: optuna.Study,
        observer: StudyObserver,
        fleet: FleetHost | None = None,  # a fleet's host, among the peers driving the study's other hosts
    ) -> None:
        self.host = None if fleet is None else fleet.name
        self.prepared = prepared
        self.spec = prepared.spec
        self.run_dir = run_dir
        self.study = study
        self.observer = observer
        self._runner: TrialRunner | None = None  # set once the host is reached
        self.exhausted = False  # the sampler had nothing new to offer
        self.distributions = {name: _distribution(p) for name, p in prepared.space.params.items()}
        self.servers = _Servers(self)
        self.best = _BestSoFar(study, observer)
        self.peers = None if fleet is None else _Peers(self, fleet)
        self._baseline: FrozenTrial | None = None

    @property
    def runner(self) -> TrialRunner:
        assert self._runner is not None, "the runner is set once the host is reached"
        return self._runner

    def begin(self) -> None:
        """What a (re)start does before the host is reached: interrupted trials marked, the baseline queued."""
        spec, study = self.spec, self.study
        with snapshot(study):
            _record_study(study, spec)
            if self.peers is None:
                _fail_interrupted_trials(study)
                _ensure_baseline_queued(study, self.prepared)
            else:
                self.peers.begin()
            self.observer.study_started(
                name=spec.name,
                run_dir=str(self.run_dir.path),
                baseline_done=self.baseline_trial() is not None,
                trials_done=_deployed_trials(study),
                budget=spec.budget.trials,
            )
            self.best.tell_stored()  # a resumed study's best so far

    async def search(self, runner: TrialRunner, deadline: float | None) -> None:
        self._runner = runner  # a fleet's host goes on until its peers' trials are done (a dead one's re-queued)
        async with contextlib.nullcontext() if self.peers is None else self.peers.leases():
            await self.run(deadline)
            while self.peers is not None and await self.peers.wait(deadline):
                await self.run(deadline)
            await _Confirmation(self).run()

    def baseline_trial(self) -> FrozenTrial | None:
        self._baseline = self._baseline or _own_baseline(self.study, self.host)  # once COMPLETE, it stays so
        return self._baseline

    def measured_settings(self) -> dict[tuple[tuple[str, Any], ...], FrozenTrial]:
        measured: dict[tuple[tuple[str, Any], ...], FrozenTrial] = {}
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        for trial in sorted(trials, key=lambda t: t.state != TrialState.COMPLETE):  # a whole measurement first
            record = TrialRecord.of(trial)
            if record.deployed and record.settings is not None:
                measured.setdefault(tuple(sorted(record.settings.items())), trial)
        return measured

    async def run(self, deadline: float | None) -> None:
        while True:
            with snapshot(self.study):  # a step: the study's trials read once, and again after each write
                if self.baseline_trial() is not None and _claimed_trials(self.study) >= self.spec.budget.trials:
                    return
                if deadline is not None and time.monotonic() >= deadline and self.baseline_trial() is not None:
                    return
                batch = self.ask_batch()
            if batch:
                await self.run_batch(batch)
            if self.exhausted or not batch:
                return

    def ask_batch(self) -> list[_Pending]:
        """The next configs to measure together. The baseline goes alone and first: every later score is
        relative to it."""
        if self.peers is not None and (baseline := self.peers.before_asking()) is not None:
            return [baseline]
        size = (
            1
            if self.baseline_trial() is None
            else min(self.spec.interleave, self.spec.budget.trials - _claimed_trials(self.study))
        )
        batch: list[_Pending] = []
        skipped = 0
        while len(batch) < size:
            trial = self.study.ask(self.distributions)
            settings = self.prepared.space.decode(trial.params)
            update_trial_record(trial, settings=settings, host=self.host)  # a re-queued trial's record is new
            if self.peers is not None and (over := self.peers.took(trial)) is not None:
                self.observer.trial_skipped(settings=settings, reason=over)
                break
            reason = self.skip_reason(trial, settings, pending=batch)
            if reason is not None:
                skipped += 1
                self.observer.trial_skipped(settings=settings, reason=reason)
                if skipped >= _MAX_SKIPPED_PROPOSALS:
                    # A space smaller than the budget: what was measured is confirmed and reported as usual.
                    self.exhausted = True
                    self.observer.search_exhausted(proposals=skipped)
                    break
                continue
            skipped = 0
            batch.append(
                _Pending(trial=trial, settings=settings, baseline=_is_baseline(trial), planned=self.spec.rounds)
            )
            if batch[-1].baseline:
                break
        return batch

    def skip_reason(
        self, trial: optuna.Trial, settings: dict[str, ParamValue], *, pending: list[_Pending]
    ) -> str | None:
        """Settings that need no deployment: invalid ones, and ones measured before or about to be."""
        if _is_baseline(trial):
            return None
        for constraint in self.prepared.space.constraints:
            if not constraint.holds(settings):
                return self.skip(trial, f"violates {constraint.text}")
        too_big = self.prepared.engine.memory_check(settings)
        if too_big is not None:
            return self.skip(trial, f"would not fit: {too_big}")
        earlier = self.measured_settings().get(tuple(sorted(settings.items())))
        if earlier is not None and earlier.state == TrialState.PRUNED:  # a restart would measure it again
            return self.skip(trial, f"same settings as trial {earlier.number}, pruned after its first round")
        if earlier is not None and earlier.values is not None:
            # Telling the earlier values keeps the sampler informed without spending a restart.
            update_trial_record(trial, duplicate_of=earlier.number)
            self.study.tell(trial, earlier.values)
            return f"same settings as trial {earlier.number}"
        twin = next((p for p in pending if p.settings == settings), None)
        if twin is not None:
            return self.skip(trial, f"same settings as trial {twin.trial.number}, being measured")
        return None if self.peers is None else self.peers.measuring(trial, settings)

    def skip(self, trial: optuna.Trial, reason: str) -> str:
        update_trial_record(trial, skip_reason=reason)
        self.study.tell(trial, state=TrialState.PRUNED)
        return reason

    async def run_batch(self, batch: list[_Pending]) -> None:
        """Round 1 of every config, then round 2 of every config, and so on; the server restarts for each
        round, so that no config keeps a warm state from its previous round and a slow drift of the
        machine spreads over all configs instead of landing on one."""
        for pending in batch:
            self.observer.trial_started(
                number=pending.trial.number, settings=pending.settings, baseline=pending.baseline
            )
        active = list(batch)
        try:
            round_index = 0
            while any(round_index < p.planned for p in active):
                for pending in [p for p in active if round_index < p.planned]:
                    try:
                        await self.measure_pending(pending, round_index)
                    except (DeployError, MeasurementError) as exc:
                        self.servers.forget()  # the server may have died, or a failed step changed what it holds
                        active.remove(pending)
                        self.fail(pending, str(exc))
                        continue
                    if pending.pruned:
                        active.remove(pending)
                round_index += 1
            for pending in list(active):
                try:
                    self.finish_trial(pending.trial, pending.rounds, baseline=pending.baseline)
                except MeasurementError as exc:
                    # Out of `active` before it is told FAIL: a baseline's failure raises StudyError, and a
                    # told trial must not be told again as interrupted.
                    active.remove(pending)
                    self.fail(pending, str(exc))
                else:
                    active.remove(pending)
        except BaseException:
            # Ctrl-C, SIGTERM or a bug: no partial score reaches Optuna and no trial is left RUNNING.
            for pending in active:
                update_trial_record(pending.trial, fail_reason=INTERRUPTED)
                self.study.tell(pending.trial, state=TrialState.FAIL)
            raise
        finally:
            if self.peers is not None:
                self.peers.done(batch)
        if self.peers is not None:
            await self.peers.check_host()

    async def measure_pending(self, pending: _Pending, round_index: int) -> None:
        trial, label = pending.trial, f"round {round_index + 1}/{pending.planned}"
        self.observer.round_started(number=trial.number, label=label, index=round_index + 1, total=pending.planned)
        round_started = time.monotonic()
        settings = {} if pending.baseline else pending.settings
        if round_index == 0:
            # Counted against the budget from its first start: a trial of the batch that an interruption
            # kept from starting was never deployed, and a resumed study measures it.
            update_trial_record(trial, deployed=True)
        gates = _Gates(self)
        probing = round_index == 0 and gates.probes(pending.settings, baseline=pending.baseline)
        variant = await self.servers.deploy(settings, number=trial.number, probing=probing)
        if round_index == 0:
            await gates.check(trial, pending.settings, baseline=pending.baseline, probing=probing)
        measured = await self.runner.measure_round(
            settings=settings,
            number=trial.number,
            prompts_index=round_index,
            prompts_variant=variant,
            label=label,
            records_name=f"round-{round_index + 1}",
        )
        metrics = measured.metrics
        pending.rounds.append(metrics)
        if round_index == 0 and not pending.baseline:
            pruned_score = self.prune_after_first_round(trial, metrics)
            if pruned_score is not None:
                saved_s = (pending.planned - 1) * (time.monotonic() - round_started)
                self.prune(trial, pending.rounds, score=pruned_score, saved_s=saved_s)
                pending.pruned = True
                return
        if round_index + 1 == self.spec.rounds and self.noisy(pending.rounds):
            pending.planned += self.spec.extra_rounds_if_noisy

    def fail(self, pending: _Pending, reason: str) -> None:
        # Stored in the journal and shown: whatever server text the reason quotes is scrubbed here too,
        # also text from a deployer that did not scrub it (a systemd journal line).
        reason = redact(reason)
        update_trial_record(pending.trial, fail_reason=reason, rounds=pending.rounds)
        self.study.tell(pending.trial, state=TrialState.FAIL)
        self.observer.trial_failed(number=pending.trial.number, reason=reason)
        if pending.baseline:
            raise StudyError(f"the baseline could not be measured: {reason}")

    def noisy(self, rounds: list[dict[str, float | None]]) -> bool:
        """True if the rounds differ by 20% or more on an objective metric: such a trial is measured more."""
        flagged = noisy_metrics(rounds, [o.metric for o in self.spec.objectives])
        if flagged and self.spec.extra_rounds_if_noisy:
            self.observer.remeasuring(metrics=flagged, extra=self.spec.extra_rounds_if_noisy)
        return bool(flagged)

    def prune_after_first_round(self, trial: optuna.Trial, metrics: dict[str, float | None]) -> float | None:
        """Reports round 1's score to the pruner; returns the score if the trial is not worth finishing."""
        reference_trial = self.baseline_trial()
        if reference_trial is None or self.spec.combine == "pareto":  # Optuna prunes single-objective studies only
            return None
        score = score_round(metrics, median_metrics(TrialRecord.of(reference_trial).rounds), self.spec.objectives)
        trial.report(score, step=0)
        return score if trial.should_prune() else None

    def prune(
        self, trial: optuna.Trial, rounds: list[dict[str, float | None]], *, score: float, saved_s: float
    ) -> None:
        reason = f"pruned after round 1: score {score:+.2f} is below the median of earlier trials"
        update_trial_record(trial, rounds=rounds, prune_reason=reason, saved_s=saved_s)
        self.study.tell(trial, state=TrialState.PRUNED)
        self.observer.trial_pruned(number=trial.number, reason=reason, saved_s=saved_s)

    def finish_trial(self, trial: optuna.Trial, rounds: list[dict[str, float | None]], *, baseline: bool) -> None:
        """Scores the rounds and tells Optuna; `MeasurementError` if an objective metric had no data."""
        objectives = self.spec.objectives
        reference_trial = None if baseline else self.baseline_trial()
        reference = median_metrics(rounds if reference_trial is None else TrialRecord.of(reference_trial).rounds)
        try:
            scores = [score_round(metrics, reference, objectives) for metrics in rounds]
        except MeasurementError as exc:
            failed = sum(int(m.get("failures") or 0) for m in rounds)
            if not failed:
                raise
            raise MeasurementError(
                f"{exc}; {failed} requests failed, see {self.run_dir.trial_dir(trial.number)}/round-*.jsonl"
            ) from None
        noisy = noisy_metrics(rounds, [o.metric for o in objectives])
        amounts, broken = record_constraints(trial, self.spec, median_metrics(rounds), reference)
        value = statistics.median(scores)
        # One write of the whole outcome: each write appends the record, rounds included, to the journal.
        update_trial_record(
            trial,
            rounds=rounds,
            round_scores=scores,
            noisy=noisy,
            score=value,
            constraint_violations=amounts,
            violates=broken,
        )
        crash_point("before-tell")
        if self.spec.combine == "pareto":
            terms = [objective_terms(metrics, reference, objectives) for metrics in rounds]
            self.study.tell(trial, [statistics.median(column) for column in zip(*terms, strict=True)])
        else:
            if baseline:
                trial.report(value, step=0)  # the pruner compares later first rounds with it
            self.study.tell(trial, value if math.isfinite(value) else None)
        self.observer.trial_finished(number=trial.number, score=value, noisy=noisy)
        if not baseline and not broken:
            self.best.consider(trial.number, value, TrialRecord.of(trial).settings or {})


def _own_baseline(study: optuna.Study, host: str | None) -> FrozenTrial | None:
    """The host's measured baseline (a one-host study's: host None): every score of a trial on that host is
    relative to its median."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (record := TrialRecord.of(trial)).baseline and record.host == host:  # this host's own
            return trial
    return None


def _deployed_trials(study: optuna.Study) -> int:
    """Trials after the baseline that were deployed, on any host."""
    records = map(TrialRecord.of, study.get_trials(deepcopy=False))
    return sum(1 for record in records if record.deployed and not record.baseline)


def _claimed_trials(study: optuna.Study) -> int:
    """Deployed trials and those running but not deployed yet (a peer's batch waiting for its turn), on any
    host (the budget is the study's). A trial a dead controller left, re-queued, counts once: as its copy,
    once a host takes it."""
    return len(_claimed(study.get_trials(deepcopy=False)))


def _claimed(trials: Sequence[FrozenTrial]) -> dict[int, TrialRecord]:
    """The trials `_claimed_trials` counts, by number, in order, with their records."""
    records = {trial.number: (trial, TrialRecord.of(trial)) for trial in trials}
    requeued = {record.requeued_from for _, record in records.values() if record.requeued_from is not None}
    return {
        number: record
        for number, (trial, record) in sorted(records.items())
        if not (record.baseline or number in requeued) and (record.deployed or trial.state == TrialState.RUNNING)
    }


def over_budget(study: optuna.Study, number: int, budget: int) -> bool:
    """Whether a trial just asked is one more than the study's budget: two hosts' controllers may both see
    one trial left and ask at once. Trial numbers order them, and the later of the two sees the earlier
    one's trial (created before its own), so exactly the later one is over. A re-queued trial's copy takes
    its original's place and is never over."""
    claimed = _claimed(study.get_trials(deepcopy=False))
    record = claimed.get(number)
    return record is not None and record.requeued_from is None and list(claimed).index(number) >= budget


@dataclass(frozen=True)
class _Failed:
    """A fleet host's failed trial, as `check_host` queues it again if the host is at fault."""

    number: int
    params: dict[str, Any]
    settings: dict[str, ParamValue]
    reason: str


class _Peers:
    """A fleet host's loop among its peers: its own baseline, the leases of its running trials, the silent
    peers' trials failed and re-queued, the proposals its peers are measuring, the wait for them at the end."""

    def __init__(self, loop: _StudyRun, fleet: FleetHost) -> None:
        self.loop = loop
        self.fleet = fleet
        self.host = fleet.name
        self.study = loop.study
        self.leased: dict[int, optuna.Trial] = {}  # the trials this loop has running, whose leases it renews
        self.checked_at = -math.inf  # when silent peers were last looked for
        self.failed_in_a_row: list[_Failed] = []  # this host's trials that failed since its last measured one
        self.checking = False  # `check_host` under way

    def begin(self) -> None:
        # This host's RUNNING trials were left by a controller of it that died (we hold its lock now); a peer
        # host's are failed only once its lease is stale (`fail_stale`, before each ask).
        fail_own_interrupted_trials(self.study, {self.host}, requeue=True, say=self.fleet.say)

    def fail_stale(self) -> None:
        """Silent peers' trials failed and re-queued; looked for at most once per heartbeat (a lease is only
        stale after grace_s, at least two heartbeats)."""
        if time.monotonic() - self.checked_at >= self.fleet.heartbeat_s:
            fail_stale_trials(self.study, self.fleet.own, grace_s=self.fleet.grace_s, say=self.fleet.say)
            self.checked_at = time.monotonic()

    def before_asking(self) -> _Pending | None:
        """Silent peers' trials failed and re-queued; this host's baseline, if it has none measured yet."""
        self.fail_stale()
        return self.new_baseline() if self.loop.baseline_trial() is None else None

    def took(self, trial: optuna.Trial) -> str | None:
        """A trial just asked, for this host (a re-queued one has a fresh record: it is measured anew here).
        Returns why it is skipped instead: one over the study's budget, which a peer's controller took."""
        write_lease(trial, self.host)
        self.leased[trial.number] = trial
        budget = self.loop.spec.budget.trials
        if over_budget(self.study, trial.number, budget):
            return self.loop.skip(trial, f"over the study's budget of {budget} trials (another host took the last)")
        return None

    def done(self, batch: list[_Pending]) -> None:
        """A batch is over: its leases end, a trial the controller's stop cut short is queued again, for
        another host (or this one, when it comes back), and the host's failures in a row are counted (the
        correctness gate's are the settings' by definition, and an interruption is neither's)."""
        trials = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        for pending in batch:
            self.leased.pop(pending.trial.number, None)
            trial = trials[pending.trial.number]
            reason = TrialRecord.of(trial).fail_reason or "failed"
            if trial.state == TrialState.FAIL and not pending.baseline and reason == INTERRUPTED:
                requeue(self.study, trial.number, dict(trial.params), pending.settings)
            elif trial.state == TrialState.FAIL and not pending.baseline:
                if not reason.startswith(("interrupted:", GATE_FAILURE)):
                    self.failed_in_a_row.append(_Failed(trial.number, dict(trial.params), pending.settings, reason))
            elif trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
                self.failed_in_a_row.clear()

    async def check_host(self) -> None:
        """After HOST_CHECK_AFTER_FAILURES failed trials in a row: the host's baseline settings, started again,
        tell the host's fault from the settings'. A host whose baseline no longer starts is dropped
        (`DeployError`, which `run_fleet` reports) and its failed trials are queued for the other hosts; one
        whose baseline starts goes on. Meanwhile the host's check is in the storage (renewed with the
        leases), so that a peer with nothing left to measure waits for it instead of ending the search
        before the failed trials are queued again."""
        if len(self.failed_in_a_row) < HOST_CHECK_AFTER_FAILURES:
            return
        failed, self.failed_in_a_row = self.failed_in_a_row, []
        baseline = self.loop.baseline_trial()
        assert baseline is not None, "trials are measured only after the host's baseline"
        numbers = ", ".join(str(f.number) for f in failed)
        self.fleet.say(f"note: host {self.host}: trials {numbers} failed in a row; starting its baseline again")
        self.checking = True
        write_host_check(self.study, self.host)
        # Started afresh: a running server reused (a LoRA-policy trial's, whose failure left it up) would say
        # nothing of whether the baseline settings still start.
        self.loop.servers.forget()
        try:
            await self.loop.servers.deploy({}, number=baseline.number, log_name=f"host-check-{failed[-1].number}.log")
        except (DeployError, MeasurementError, TransportError) as exc:
            self.loop.servers.forget()
            for one in failed:
                requeue(self.study, one.number, one.params, one.settings)
            raise DeployError(
                f"trials {numbers} failed in a row (the last: {failed[-1].reason}) and the host's baseline "
                f"settings no longer start either ({exc}); those trials are queued for the other hosts"
            ) from None
        finally:
            self.checking = False
            write_host_check(self.study, self.host, done=True)
        self.fleet.say(f"note: host {self.host}: its baseline settings start; the failures were the settings'")

    @contextlib.asynccontextmanager
    async def leases(self) -> AsyncIterator[None]:
        """Renews the lease of each trial this loop runs every heartbeat_s, so that its peers see it alive."""

        async def beat() -> None:
            while True:
                for number, trial in list(self.leased.items()):
                    try:
                        write_lease(trial, self.host)
                    except (ValueError, RuntimeError):  # told meanwhile
                        self.leased.pop(number, None)
                if self.checking:
                    write_host_check(self.study, self.host)
                await asyncio.sleep(self.fleet.heartbeat_s)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait(self, deadline: float | None) -> bool:
        """Before the confirmation picks the best trial: the other hosts' trials finished (or found dead and
        failed). True: there is a trial to measure again (a dead peer's, re-queued, within the budget)."""
        poll_s = min(1.0, self.fleet.heartbeat_s)
        while True:
            with snapshot(self.study):
                self.fail_stale()
                trials = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
                waiting = [t for t in trials if t.state == TrialState.WAITING]
                within = deadline is None or time.monotonic() < deadline
                budget = self.loop.spec.budget.trials
                if waiting and within and not self.loop.exhausted and _claimed_trials(self.study) < budget:
                    return True
                if not any(t.state == TrialState.RUNNING and not TrialRecord.of(t).baseline for t in trials) and not (
                    hosts_checking(self.study, grace_s=self.fleet.grace_s)
                ):
                    return False
            await asyncio.sleep(poll_s)

    def measuring(self, trial: optuna.Trial, settings: dict[str, ParamValue]) -> str | None:
        """Across controllers: another host's RUNNING trial with these settings is being measured there (the
        proposal is skipped, as the reason says)."""
        for other in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            record = TrialRecord.of(other)
            if other.number != trial.number and not record.baseline and record.settings == settings:
                return self.loop.skip(trial, f"same settings as trial {other.number}, being measured on {record.host}")
        return None

    def new_baseline(self) -> _Pending:
        """This host's baseline trial, created RUNNING (never queued: a peer's `ask` would take it) and measured
        on this host before anything else."""
        loop = self.loop
        settings = loop.prepared.baseline_settings
        params = loop.prepared.space.encode(settings)
        record = TrialRecord(baseline=True, settings=dict(settings), host=self.host)
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params=params,
                distributions={name: loop.distributions[name] for name in params},
                user_attrs=new_trial_attrs(record),
            )
        )
        # The newest trial with this record: the storage numbers trials, so it is read back.
        created = max(
            (
                t
                for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if (r := TrialRecord.of(t)).baseline and r.host == self.host
            ),
            key=lambda t: t.number,
        )
        trial = optuna.Trial(self.study, created._trial_id)
        write_lease(trial, self.host)
        self.leased[trial.number] = trial
        return _Pending(trial=trial, settings=dict(settings), baseline=True, planned=loop.spec.rounds)


def record_constraints(
    trial: optuna.Trial, spec: StudySpec, medians: Mapping[str, float | None], reference: Mapping[str, float | None]
) -> tuple[list[float], list[str]]:
    """Tells the sampler by how much the trial breaks each metric constraint, and returns the amounts and
    the broken constraints as text, for its record; the baseline is its own reference."""
    amounts, broken = [], []
    for constraint in spec.constraints:
        violations = constraint.violations(medians.get(constraint.metric), reference.get(constraint.metric))
        amounts.append(max((amount for _, amount in violations), default=0.0))
        broken += [text for text, _ in violations]
    # For the samplers (TPE and GP steer away from infeasible trials); named "0", "1", ... as the
    # deprecated constraints_func stored them, so a study begun with it reads the same on resume.
    for index, amount in enumerate(amounts):
        trial.set_constraint(str(index), amount)
    return amounts, broken


class _Servers:
    """Which server a round runs on: the running one where that measures the same as a restart (`deploy`)."""

    def __init__(self, loop: _StudyRun) -> None:
        self.loop = loop
        self.running: _RunningServer | None = None  # None: the next round restarts the server

    def forget(self) -> None:
        """The running server is not reused (it may have died, or a failed step left it in another state)."""
        self.running = None

    async def deploy(
        self, settings: Mapping[str, ParamValue], *, number: int, log_name: str = "server.log", probing: bool = False
    ) -> int:
        """Readies a server for a round of trial `number`: the running one where that measures the same as a
        restart, else a restart; returns the round's prompts variant, 0 on a restarted server, else how many
        rounds the reused one measured before. `probing`: the correctness probes come next, and warm a new
        server as the warm-up would, so it gets none.

        A restart per round is what keeps one round from being served from another's cached prompts (round k
        of every trial replays the same prompts) and gives each of a trial's rounds its own start. A running
        server is reused for a round only if:
        - its server settings equal the trial's (a trial differing only in request-scope knobs, such as a
          LoRA policy, or a confirmation's baseline after its candidate with equal server settings);
        - it has not measured a round of this trial yet: the rounds of one trial, and a confirmation's pairs,
          keep their restart-to-restart spread, which the noise flag and the paired interval rest on;
        - the engine can clear what a restart would (`Engine.reuse_refusal`: llama-server's slots, by
          requests that replace each slot's prompt), and the runner saw in the server's log that every slot
          was cleared.
        What no request clears (llama-server's host-RAM prompt cache) is left useless instead: the reused
        round replays a variant of its prompts (`round_sessions`), the same shape in tokens that nothing it
        cached from its earlier rounds begins with.
        """
        engine, log_path = self.loop.prepared.engine, str(self.loop.run_dir.trial_dir(number) / log_name)
        server = engine.server_settings(settings)
        running, self.running = self.running, None  # a failed reuse or start leaves nothing to reuse
        if running is not None and running.settings == server and number not in running.trials:
            refusal = engine.reuse_refusal(settings)
            if refusal is None:
                refusal = await self.loop.runner.reuse(settings, number=number, log_path=log_path)
            if refusal is None:
                variant = len(running.trials)
                running.trials.add(number)
                self.running = running
                self.loop.observer.server_reused(number=number)
                return variant
        warm_up = not (probing and self.loop.spec.gate.enabled)
        self.loop.observer.server_starting(number=number)
        await self.loop.runner.start(settings, number=number, log_path=log_path, warm_up=warm_up)
        self.running = _RunningServer(settings=server, trials={number})
        return 0


class _Gates:
    """What a trial's answers say before it is measured: the correctness gate (the baseline's answers are
    the reference; `MeasurementError` when a trial's differ too much) and, for a LoRA policy, the share of
    the workload's requests whose answers it would change."""

    def __init__(self, loop: _StudyRun) -> None:
        self.loop = loop
        self.gate = loop.spec.gate
        self.study = loop.study

    def probes(self, settings: Mapping[str, ParamValue], *, baseline: bool) -> bool:
        """Whether the trial's first round asks the correctness probes: the baseline's give the reference; a
        trial whose server settings equal the baseline's (one differing only in request-scope knobs, such as
        a LoRA policy) would get the baseline's answers back, since the probes set no request-scope knob."""
        if not self.gate.enabled:
            return False
        engine = self.loop.prepared.engine
        return baseline or engine.server_settings(settings) != engine.server_settings({})

    async def check(
        self, trial: optuna.Trial, settings: Mapping[str, ParamValue], *, baseline: bool, probing: bool
    ) -> None:
        if probing:
            await self.correctness(trial, baseline=baseline)
        if not baseline:
            prepared = self.loop.prepared
            changed = await lora_answer_changes(
                self.loop.runner, prepared.trace, prepared.engine, settings, tokens=self.gate.tokens
            )
            if changed is not None:
                update_trial_record(trial, answers_changed=changed[0], answers_changed_note=changed[1])

    async def correctness(self, trial: optuna.Trial, *, baseline: bool) -> None:
        self.loop.observer.probing(number=trial.number)
        # The baseline's reference one at a time, as a single user gets its answers; a trial's together (one
        # batch, a second saved a trial), asked again one at a time before it is failed.
        answers = await self.loop.runner.probe_answers(tokens=self.gate.tokens, together=not baseline)
        host = self.loop.host
        if baseline:
            # Each host's baseline answers are its own trials' reference (hosts may differ in their last bits).
            if host is None:
                update_study_record(self.study, reference_answers=[list(a) for a in answers])
            else:
                update_host_record(self.study, host, reference_answers=[list(a) for a in answers])
            return
        reference = (StudyRecord.of(self.study) if host is None else HostRecord.of(self.study, host)).reference_answers
        if reference is None:
            return
        result = judge(answers, reference, min_agreement=self.gate.min_agreement)
        if not result.passed:
            answers = await self.loop.runner.probe_answers(tokens=self.gate.tokens, together=False)
            result = judge(answers, reference, min_agreement=self.gate.min_agreement)
        update_trial_record(trial, answer_agreement=result.agreement)
        if not result.passed:
            raise MeasurementError(f"{GATE_FAILURE}: {result.reason}")


class _Confirmation:
    """Re-measures the best trials against the baseline, alternating B C C B B C ..., and stores the paired
    score differences with their 95% interval in the study's user attributes.

    Alternating the order keeps a slow drift of the machine from favouring either side, and both members
    of a pair replay the same prompts.
    """

    def __init__(self, loop: _StudyRun) -> None:
        self.loop = loop
        self.spec = loop.spec
        self.study = loop.study

    async def run(self) -> None:
        baseline = self.loop.baseline_trial()
        if baseline is None or self.spec.confirm.top == 0:
            return
        reference = median_metrics(TrialRecord.of(baseline).rounds)
        for candidate in self.candidates():
            settings = dict(TrialRecord.of(candidate).settings or {})
            self.loop.observer.confirm_started(
                number=candidate.number, settings=settings, pairs=self.spec.confirm.pairs
            )
            differences = []
            for pair in range(self.spec.confirm.pairs):
                order = [(baseline.number, {}), (candidate.number, settings)]
                if pair % 2:
                    order.reverse()
                scores: dict[int, float] = {}
                for position, (number, trial_settings) in enumerate(order):
                    metrics = await self.measure(
                        number,
                        trial_settings,
                        candidate=candidate.number,
                        pair=pair,
                        baseline=baseline,
                        position=position,
                    )
                    scores[number] = score_round(metrics, reference, self.spec.objectives)
                differences.append(scores[candidate.number] - scores[baseline.number])
            low, high = difference_ci(differences)
            mean = statistics.fmean(differences)
            confirmed = Confirmation(differences=differences, mean=mean, ci=[low, high])
            host = self.loop.host
            if host is None:
                confirmations = StudyRecord.of(self.study).confirmations
                update_study_record(self.study, confirmations={**confirmations, candidate.number: confirmed})
            else:  # on this host, against this host's baseline
                confirmations = HostRecord.of(self.study, host).confirmations
                update_host_record(self.study, host, confirmations={**confirmations, candidate.number: confirmed})
            self.loop.observer.confirm_finished(number=candidate.number, mean=mean, low=low, high=high)

    async def measure(
        self,
        number: int,
        settings: Mapping[str, ParamValue],
        *,
        candidate: int,
        pair: int,
        baseline: FrozenTrial,
        position: int,
    ) -> dict[str, float | None]:
        """One round of a pair; `position` (0 or 1) is its place in the pair, for the round's count."""
        runner, pairs = self.loop.runner, self.spec.confirm.pairs
        label = f"pair {pair + 1}/{pairs}" + (" (baseline)" if number == baseline.number else "")
        self.loop.observer.round_started(number=number, label=label, index=2 * pair + position + 1, total=2 * pairs)
        # A fleet's hosts each confirm the same candidate: their files are told apart by the host's name.
        name = f"confirm-{candidate}" if self.loop.host is None else f"confirm-{candidate}-{self.loop.host}"
        variant = await self.loop.servers.deploy(settings, number=number, log_name=f"{name}-server.log")
        measured = await runner.measure_round(
            settings=settings,
            number=number,
            prompts_index=self.spec.rounds + pair,
            prompts_variant=variant,
            label=label,
            records_name=f"{name}-{pair + 1}",
        )
        return measured.metrics

    def candidates(self) -> list[FrozenTrial]:
        """The best measured trials that scored above the baseline and were not re-measured yet."""
        measured: list[tuple[float, FrozenTrial]] = []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            record = TrialRecord.of(trial)
            if record.deployed and not record.baseline and (record.score or 0.0) > 0 and not record.violates:
                measured.append((record.score or 0.0, trial))
        best = [t for _, t in sorted(measured, key=lambda st: -st[0])][: self.spec.confirm.top]
        host = self.loop.host
        confirmed = (StudyRecord.of(self.study) if host is None else HostRecord.of(self.study, host)).confirmations
        return [t for t in best if t.number not in confirmed]


def _check_simulated_server(spec: StudySpec, launch: LaunchSpec) -> None:
    """The simulated llama-server runs as this machine's child process, and reads its --sim- options when
    it starts; a mistake in them is refused here, before a run directory exists, not by a failed baseline."""
    if spec.engine.kind != "llama-server" or spec.engine.options().get("binary") != SIMULATED:
        return
    if spec.host.kind != "local" or spec.deploy.kind != "process":
        raise ConfigError(
            f'engine.binary = "simulated" runs on this machine only: set host.kind = "local" and deploy.kind = '
            f'"process" (the study has {spec.host.kind!r} and {spec.deploy.kind!r})'
        )
    try:
        parse_command_line(launch.args, launch.env)
    except CommandLineError as exc:
        raise ConfigError(f"engine.extra_args: {exc}; tuner-sim-llama-server --help lists its options") from None


async def host_has_file(transport: Transport, path: str) -> bool:
    """Whether `path` is a file on the host: as the login, else as root (sudo's `sh`), since the server's
    user may read what the login cannot (a model under /srv)."""
    for privileged in (False, True):
        found = await transport.run(
            ["sh", "-c", 'test -f "$1"', "test", path], timeout_s=30, check=False, privileged=privileged
        )
        if found.exit_status == 0:
            return True
    return False


async def check_host_files(spec: StudySpec, engine: Engine) -> None:
    """The files the engine's options name exist on the host, looked at before anything is changed."""
    files = engine.host_files()
    if not files:
        return
    async with create_transport(spec.host) as transport:
        for key, path in files.items():
            if not await host_has_file(transport, path):
                raise ConfigError(f"{path} does not exist on the host; fix {key} in the study file")


@contextlib.contextmanager
def _telling_the_end(observer: StudyObserver) -> Iterator[None]:
    """Tells the observer how the run ended, before the run directory's lock is let go: whoever sees the
    lock free sees the end told."""
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError):
        observer.study_ended(outcome="interrupted")
        raise
    except BaseException:
        observer.study_ended(outcome="failed")
        raise
    observer.study_ended(outcome="finished")


async def run_search(
    prepared: PreparedStudy,
    run_dir: RunDirectory,
    study: optuna.Study,
    runner: TrialRunner,
    *,
    observer: StudyObserver | None = None,
    deadline: float | None = None,
) -> None:
    """The search loop on an open study: baseline, batches of trials, confirmation; `runner` measures."""
    observer = observer or NullObserver()
    with _telling_the_end(observer):
        loop = _StudyRun(prepared, run_dir, study, observer)
        loop.begin()
        await loop.search(runner, deadline)


# What drops a fleet's host (the others go on): it stayed unreachable, its server could not be deployed or
# restored, or its baseline could not be measured.
_DROPS_HOST = (TransportError, DeployError, StudyError, MeasurementError)


def _to_stderr(line: str) -> None:
    print(redact(line), file=sys.stderr, flush=True)


async def run_fleet(
    loops: Sequence[_StudyRun],
    drive: Callable[[_StudyRun], Awaitable[None]],
) -> dict[str, str]:
    """Drives each host's loop concurrently (`drive` reaches the host and runs `loop.search`); a host that
    fails as `_DROPS_HOST` says is dropped with the reason, in the study too, and the others go on. Returns
    the dropped hosts' reasons; raises StudyError when every host was dropped."""
    dropped: dict[str, str] = {}

    async def one(loop: _StudyRun) -> None:
        assert loop.peers is not None and loop.host is not None
        if len(loops) > 1:
            FLEET_HOST.set(loop.host)  # this loop's task only: its console lines name their host
        try:
            await drive(loop)
        except _DROPS_HOST as exc:
            reason = redact(str(exc))
            dropped[loop.host] = reason
            update_host_record(loop.study, loop.host, dropped=reason)
            loop.peers.fleet.say(f"host {loop.host} dropped: {reason}; the study goes on without it")

    async with asyncio.TaskGroup() as group:
        for loop in loops:
            group.create_task(one(loop))
    if loops and len(dropped) == len(loops):
        shown = "; ".join(f"{host}: {reason}" for host, reason in dropped.items())
        raise StudyError(f"every host was dropped ({shown})")
    return dropped


def fleet_loops(
    prepared: Mapping[str, PreparedStudy],
    run_dir: RunDirectory,
    study: optuna.Study,
    observer: StudyObserver,
    *,
    heartbeat_s: float,
    grace_s: float,
    say: Callable[[str], None] = _to_stderr,
) -> list[_StudyRun]:
    """One loop per host of this controller, on one study, begun (their interrupted trials marked)."""
    own = frozenset(prepared)
    loops = [
        _StudyRun(
            host_prepared,
            run_dir,
            study,
            observer,
            fleet=FleetHost(name=name, heartbeat_s=heartbeat_s, grace_s=grace_s, own=own, say=say),
        )
        for name, host_prepared in prepared.items()
    ]
    for loop in loops:
        named = FLEET_HOST.set(loop.host) if len(loops) > 1 else None
        try:
            loop.begin()
        finally:
            if named is not None:
                FLEET_HOST.reset(named)
    return loops


def fleet_hosts(spec: StudySpec, only: Sequence[str] | None) -> list[HostEntry]:
    """The fleet's hosts that `--host` names (every one without it), in the study's order; ConfigError for a
    name the study does not have."""
    if not only:
        return list(spec.hosts)
    names = [h.name for h in spec.hosts]
    unknown = [name for name in only if name not in names]
    if not spec.hosts:
        raise ConfigError("--host names a host of the study's [[hosts]], and the study has none")
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 100 else unknown[0][:100] + "..."
        raise ConfigError(f"--host {shown!r} is not a host of the study; its hosts: {', '.join(names)}")
    return [h for h in spec.hosts if h.name in only]


async def _run_fleet_study(
    spec: StudySpec, base_dir: Path, run_path: Path, observer: StudyObserver, only: Sequence[str] | None
) -> optuna.Study:
    entries = fleet_hosts(spec, only)
    specs = {entry.name: spec.for_host(entry) for entry in entries}
    prepared = {name: prepare_study(host_spec, base_dir) for name, host_spec in specs.items()}
    for name, host_spec in specs.items():  # each host's launch, before any host is touched
        _check_simulated_server(host_spec, prepared[name].engine.launch_spec({}))
        check_launch(host_spec.deploy, prepared[name].engine.launch_spec({}))
    first = next(iter(prepared.values()))
    started = time.monotonic()
    deadline = started + spec.budget.hours * 3600 if spec.budget.hours else None
    storage = None if spec.storage is None else open_storage(spec.storage.url)
    heartbeat_s = 10.0 if spec.storage is None else spec.storage.heartbeat_s
    grace_s = 120.0 if spec.storage is None else spec.storage.grace_s
    with RunDirectory(run_path, hosts=list(specs)) as run_dir, _telling_the_end(observer):
        measured = has_measured_trials(run_dir, storage, name=spec.name)
        run_dir.check_spec(stored_spec(spec.model_dump(mode="json")), measured=measured)
        study = open_optuna_study(run_dir, spec, first.space, storage=storage, seed=fleet_seed(spec.seed, specs))
        loops = fleet_loops(prepared, run_dir, study, observer, heartbeat_s=heartbeat_s, grace_s=grace_s)

        async def drive(loop: _StudyRun) -> None:
            assert loop.host is not None
            host_spec = specs[loop.host]
            await check_host_files(host_spec, loop.prepared.engine)
            async with create_transport(host_spec.host) as transport:
                deployer = create_deployer(host_spec.deploy, transport=transport)
                if isinstance(deployer, RecoveringDeployer):
                    deployer.remember_in(run_dir.path / f"deployer-state-{loop.host}.json")
                async with deployer:
                    runner = ServerTrialRunner(
                        loop.prepared, deployer=deployer, transport=transport, run_dir=run_dir, observer=observer
                    )
                    try:
                        await loop.search(runner, deadline)
                    finally:
                        observer.restoring()

        await run_fleet(loops, drive)
        return study


async def run_study(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    observer: StudyObserver | None = None,
    *,
    hosts: Sequence[str] | None = None,
) -> optuna.Study:
    """Runs (or resumes) a study and returns its Optuna study; the host ends on its baseline. A fleet
    (`[[hosts]]`) runs the hosts named in `hosts` (all of them by default), each against its own baseline."""
    observer = observer or NullObserver()
    if spec.hosts or hosts:
        return await _run_fleet_study(spec, base_dir, run_path, observer, hosts)
    prepared = prepare_study(spec, base_dir)
    baseline_launch = prepared.engine.launch_spec({})  # fails here, before the host is touched, without a build
    _check_simulated_server(spec, baseline_launch)
    check_launch(spec.deploy, baseline_launch)
    await check_host_files(spec, prepared.engine)
    started = time.monotonic()
    deadline = started + spec.budget.hours * 3600 if spec.budget.hours else None
    storage = None if spec.storage is None else open_storage(spec.storage.url)
    with RunDirectory(run_path) as run_dir, _telling_the_end(observer):
        measured = has_measured_trials(run_dir, storage, name=None if storage is None else spec.name)
        run_dir.check_spec(stored_spec(spec.model_dump(mode="json")), measured=measured)
        study = open_optuna_study(run_dir, spec, prepared.space, storage=storage)
        loop = _StudyRun(prepared, run_dir, study, observer)
        loop.begin()
        async with create_transport(spec.host) as transport:
            deployer = create_deployer(spec.deploy, transport=transport)
            if isinstance(deployer, RecoveringDeployer):
                deployer.remember_in(run_dir.path / "deployer-state.json")
            async with deployer:
                runner = ServerTrialRunner(
                    prepared, deployer=deployer, transport=transport, run_dir=run_dir, observer=observer
                )
                try:
                    await loop.search(runner, deadline)
                finally:
                    observer.restoring()
        return study
