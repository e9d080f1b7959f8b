"""The ask/tell loop: the baseline first (trial 0, once across resumes), then batches of trials with
interleaved rounds, then the confirmation of the best against the baseline. Optuna only proposes settings;
the loop owns trial execution, a fleet's other controllers are behind `Peers`, and every trial ends in
`end_trial`. docs/metrics.md describes each step.
"""

from __future__ import annotations

import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.errors import DeployError, MeasurementError, StudyError
from tuner.observers import StudyObserver
from tuner.redact import redact
from tuner.runs import RunDirectory
from tuner.scoring import median_metrics, min_effect, noisy_metrics, score_round
from tuner.search import queries
from tuner.search.confirm import Confirmation
from tuner.search.ending import end_trial, finish_measured, skip_trial
from tuner.search.gates import Gates
from tuner.search.peers import Peers, Pending, SoloPeers
from tuner.search.prediction import start_from_prediction
from tuner.search.queries import BestSoFar, claimed_trials, is_baseline
from tuner.search.samplers import distribution
from tuner.server_reuse import Servers
from tuner.snapshots import snapshot
from tuner.study_record import INTERRUPTED, TrialRecord, update_study_record, update_trial_record
from tuner.trial_runner import PreparedStudy, TrialRunner

__all__ = ["StudyRun"]

# Consecutive proposals skipped (constraint violated, already measured): the sampler has nothing new.
_MAX_SKIPPED_PROPOSALS = 200


class StudyRun:
    def __init__(
        self,
        prepared: PreparedStudy,
        run_dir: RunDirectory,
        study: optuna.Study,
        observer: StudyObserver,
        peers: Peers | None = None,  # a fleet host's peers; a single host has none (`SoloPeers`)
    ) -> None:
        self.peers: Peers = peers if peers is not None else SoloPeers(study, prepared)
        self.host = self.peers.host
        self.prepared = prepared
        self.spec = prepared.spec
        self.run_dir = run_dir
        self.study = study
        self.observer = observer
        self.exhausted = False  # the sampler had nothing new to offer
        self.distributions = {name: distribution(p) for name, p in prepared.space.params.items()}
        self.best = BestSoFar(study, observer)
        self._baseline: FrozenTrial | None = None
        # Set once the host is reached (`search`): what measures, and the servers it measures on.
        self.runner: TrialRunner
        self.servers: Servers
        self.gates: Gates

    def begin(self) -> None:
        """What a (re)start does before the host is reached: interrupted trials marked, the baseline queued."""
        spec, study = self.spec, self.study
        with snapshot(study):
            # What every controller of the study writes alike (a fleet's too: the same values from each).
            update_study_record(
                study,
                min_effect=min_effect(spec.objectives),
                allow_answer_changes=spec.gate.allow_answer_changes,
                objectives=[o.metric for o in spec.objectives],
            )
            self.peers.begin()
            start_from_prediction(study, self.prepared, self.run_dir, self.observer)
            self.observer.study_started(
                name=spec.name,
                run_dir=str(self.run_dir.path),
                baseline_done=self.baseline_trial() is not None,
                trials_done=queries.deployed_trials(study),
                budget=spec.budget.trials,
            )
            self.best.tell_stored()  # a resumed study's best so far

    async def search(self, runner: TrialRunner, deadline: float | None) -> None:
        prepared, observer = self.prepared, self.observer
        self.runner = runner
        self.servers = Servers(runner, prepared.engine, self.run_dir, observer, gate=self.spec.gate.enabled)
        self.gates = Gates(prepared, runner, self.peers, observer)
        async with self.peers.leases():  # a fleet's host goes on until its peers' trials are done
            await self.run(deadline)
            while await self.peers.wait(deadline, exhausted=self.exhausted):
                await self.run(deadline)
            confirmation = Confirmation(
                self.spec, study=self.study, observer=observer, runner=runner, servers=self.servers, peers=self.peers
            )
            await confirmation.run(self.baseline_trial())

    def baseline_trial(self) -> FrozenTrial | None:
        self._baseline = self._baseline or queries.own_baseline(self.study, self.host)  # once COMPLETE, it stays so
        return self._baseline

    async def run(self, deadline: float | None) -> None:
        while True:
            with snapshot(self.study):  # a step: the study's trials read once, and again after each write
                if self.baseline_trial() is not None and claimed_trials(self.study) >= self.spec.budget.trials:
                    return
                if deadline is not None and time.monotonic() >= deadline and self.baseline_trial() is not None:
                    return
                batch = self.ask_batch()
            if batch:
                await self.run_batch(batch)
            if self.exhausted or not batch:
                return

    def ask_batch(self) -> list[Pending]:
        """The next configs to measure together. The baseline goes alone and first: every later score is
        relative to it."""
        if (baseline := self.peers.before_asking(self.baseline_trial())) is not None:
            return [baseline]
        size = (
            1
            if self.baseline_trial() is None
            else min(self.spec.interleave, self.spec.budget.trials - claimed_trials(self.study))
        )
        batch: list[Pending] = []
        skipped = 0
        while len(batch) < size:
            trial = self.study.ask(self.distributions)
            settings = self.prepared.space.decode(trial.params)  # the baseline's: what its server runs (entry.py)
            update_trial_record(trial, settings=settings, host=self.host)  # a re-queued trial's record is new
            if (over := self.peers.took(trial)) is not None:
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
            batch.append(Pending(trial=trial, settings=settings, baseline=is_baseline(trial), planned=self.spec.rounds))
            if batch[-1].baseline:
                break
        return batch

    def skip_reason(
        self, trial: optuna.Trial, settings: dict[str, ParamValue], *, pending: list[Pending]
    ) -> str | None:
        """Settings that need no deployment: invalid ones, and ones measured before or about to be."""
        if is_baseline(trial):
            return None
        for constraint in self.prepared.space.constraints:
            if not constraint.holds(settings):
                return skip_trial(self.study, trial, f"violates {constraint.text}")
        too_big = self.prepared.engine.memory_check(settings)
        if too_big is not None:
            return skip_trial(self.study, trial, f"would not fit: {too_big}")
        earlier = queries.measured_settings(self.study).get(tuple(sorted(settings.items())))
        if earlier is not None and earlier.state == TrialState.PRUNED:  # a restart would measure it again
            return skip_trial(
                self.study, trial, f"same settings as trial {earlier.number}, pruned after its first round"
            )
        if earlier is not None and earlier.values is not None:
            # Telling the earlier values keeps the sampler informed without spending a restart.
            end_trial(self.study, trial, earlier.values, duplicate_of=earlier.number)
            return f"same settings as trial {earlier.number}"
        twin = next((p for p in pending if p.settings == settings), None)
        if twin is not None:
            return skip_trial(self.study, trial, f"same settings as trial {twin.trial.number}, being measured")
        return self.peers.measuring(trial, settings)

    async def run_batch(self, batch: list[Pending]) -> None:
        """Round 1 of every config, then round 2 of every config, and so on: a slow drift of the machine
        spreads over all configs instead of landing on one (docs/architecture.md)."""
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
                end_trial(self.study, pending.trial, state=TrialState.FAIL, fail_reason=INTERRUPTED)
            raise
        finally:
            self.peers.done(batch)
        await self.peers.check_host(self.servers, self.baseline_trial)

    async def measure_pending(self, pending: Pending, round_index: int) -> None:
        trial, label = pending.trial, f"round {round_index + 1}/{pending.planned}"
        self.observer.round_started(number=trial.number, label=label, index=round_index + 1, total=pending.planned)
        round_started = time.monotonic()
        settings = {} if pending.baseline else pending.settings
        if round_index == 0:
            # Counted against the budget from its first start: a trial of the batch that an interruption
            # kept from starting was never deployed, and a resumed study measures it.
            update_trial_record(trial, deployed=True)
        probing = round_index == 0 and self.gates.probes(pending.settings, baseline=pending.baseline)
        variant = await self.servers.deploy(settings, number=trial.number, probing=probing)
        if round_index == 0:
            await self.gates.check(trial, pending.settings, baseline=pending.baseline, probing=probing)
        measured = await self.runner.measure_round(
            settings=settings,
            number=trial.number,
            prompts_index=round_index,
            prompts_variant=variant,
            label=label,
            records_name=RunDirectory.round_name(round_index + 1),
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

    def fail(self, pending: Pending, reason: str) -> None:
        # Stored in the journal and shown: whatever server text the reason quotes is scrubbed here too,
        # also text from a deployer that did not scrub it (a systemd journal line).
        reason = redact(reason)
        end_trial(self.study, pending.trial, state=TrialState.FAIL, fail_reason=reason, rounds=pending.rounds)
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
        end_trial(self.study, trial, state=TrialState.PRUNED, rounds=rounds, prune_reason=reason, saved_s=saved_s)
        self.observer.trial_pruned(number=trial.number, reason=reason, saved_s=saved_s)

    def finish_trial(self, trial: optuna.Trial, rounds: list[dict[str, float | None]], *, baseline: bool) -> None:
        """Scores the rounds and tells Optuna; `MeasurementError` if an objective metric had no data."""
        reference_trial = None if baseline else self.baseline_trial()
        reference = median_metrics(rounds if reference_trial is None else TrialRecord.of(reference_trial).rounds)
        where = self.run_dir.trial_dir(trial.number)
        finished = finish_measured(
            self.study, trial, rounds, spec=self.spec, reference=reference, baseline=baseline, trial_dir=where
        )
        self.observer.trial_finished(number=trial.number, score=finished.score, noisy=finished.noisy)
        if not baseline and not finished.broken:
            self.best.consider(trial.number, finished.score, TrialRecord.of(trial).settings or {})
