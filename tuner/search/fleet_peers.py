"""A fleet host's peers: its own baseline, the leases of its running trials, the silent peers' trials failed
and re-queued, the proposals its peers are measuring, the host's check after failures in a row, and the
wait for the peers' trials at the end (the other implementation of `tuner.search.peers.Peers`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.errors import DeployError, MeasurementError, TransportError
from tuner.fleet import (
    fail_own_interrupted_trials,
    fail_stale_trials,
    hosts_checking,
    requeue,
    write_host_check,
    write_lease,
)
from tuner.search.ending import skip_trial
from tuner.search.gates import GATE_FAILURE
from tuner.search.peers import Pending
from tuner.search.queries import claimed_trials, over_budget
from tuner.search.samplers import distribution
from tuner.server_reuse import Servers
from tuner.snapshots import snapshot
from tuner.study_record import INTERRUPTED, HostRecord, TrialRecord, new_trial_attrs, update_host_record
from tuner.trial_runner import PreparedStudy

__all__ = ["HOST_CHECK_AFTER_FAILURES", "FleetHost", "FleetPeers"]

# A fleet's host whose trials fail this many times in a row starts its baseline settings again: if they no
# longer start either, the host is at fault and is dropped (its failed trials queued for the others); if they
# do, the settings were, and it goes on.
HOST_CHECK_AFTER_FAILURES = 3


@dataclass(frozen=True, kw_only=True)
class FleetHost:
    """The loop of one host of a fleet: its name, and how its controller keeps its trials' leases."""

    name: str
    heartbeat_s: float = 10.0
    grace_s: float = 120.0
    # The hosts this controller drives (their RUNNING trials are its own, never a stale peer's).
    own: frozenset[str] = frozenset()
    say: Callable[[str], None] = lambda _line: None


@dataclass(frozen=True)
class _Failed:
    """A fleet host's failed trial, as `check_host` queues it again if the host is at fault."""

    number: int
    params: dict[str, Any]
    settings: dict[str, ParamValue]
    reason: str


class FleetPeers:
    """A fleet host's loop among its peers (docs/architecture.md, "The peers protocol")."""

    def __init__(self, study: optuna.Study, prepared: PreparedStudy, fleet: FleetHost) -> None:
        self.study = study
        self.prepared = prepared
        self.fleet = fleet
        self.host: str | None = fleet.name
        self.name = fleet.name
        self.leased: dict[int, optuna.Trial] = {}  # the trials this loop has running, whose leases it renews
        self.checked_at = -math.inf  # when silent peers were last looked for
        self.failed_in_a_row: list[_Failed] = []  # this host's trials that failed since its last measured one
        self.checking = False  # `check_host` under way

    def begin(self) -> None:
        # This host's RUNNING trials were left by a controller of it that died (we hold its lock now); a peer
        # host's are failed only once its lease is stale (`fail_stale`, before each ask).
        fail_own_interrupted_trials(self.study, {self.name}, requeue=True, say=self.fleet.say)

    def record(self) -> HostRecord:
        return HostRecord.of(self.study, self.name)  # each host's baseline answers are its own trials' reference

    def update_record(self, **changes: Any) -> None:
        update_host_record(self.study, self.name, **changes)

    def fail_stale(self) -> None:
        """Silent peers' trials failed and re-queued; looked for at most once per heartbeat (a lease is only
        stale after grace_s, at least two heartbeats)."""
        if time.monotonic() - self.checked_at >= self.fleet.heartbeat_s:
            fail_stale_trials(self.study, self.fleet.own, grace_s=self.fleet.grace_s, say=self.fleet.say)
            self.checked_at = time.monotonic()

    def before_asking(self, baseline: FrozenTrial | None) -> Pending | None:
        """Silent peers' trials failed and re-queued; this host's baseline, if it has none measured yet."""
        self.fail_stale()
        return self.new_baseline() if baseline is None else None

    def took(self, trial: optuna.Trial) -> str | None:
        """A trial just asked, for this host (a re-queued one has a fresh record: it is measured anew here).
        Returns why it is skipped instead: one over the study's budget, which a peer's controller took."""
        write_lease(trial, self.name)
        self.leased[trial.number] = trial
        budget = self.prepared.spec.budget.trials
        if over_budget(self.study, trial.number, budget):
            reason = f"over the study's budget of {budget} trials (another host took the last)"
            return skip_trial(self.study, trial, reason)
        return None

    def done(self, batch: list[Pending]) -> None:
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

    async def check_host(self, servers: Servers, baseline_of: Callable[[], FrozenTrial | None]) -> None:
        """After HOST_CHECK_AFTER_FAILURES failed trials in a row the host's baseline settings are started
        again: a host whose baseline no longer starts is dropped (`DeployError`) and its failed trials are
        queued for the others; one whose baseline starts goes on. The check is in the storage meanwhile, so
        that a peer with nothing left to measure waits for it."""
        if len(self.failed_in_a_row) < HOST_CHECK_AFTER_FAILURES:
            return
        failed, self.failed_in_a_row = self.failed_in_a_row, []
        baseline = baseline_of()
        assert baseline is not None, "trials are measured only after the host's baseline"
        numbers = ", ".join(str(f.number) for f in failed)
        self.fleet.say(f"note: host {self.name}: trials {numbers} failed in a row; starting its baseline again")
        self.checking = True
        write_host_check(self.study, self.name)
        # Started afresh: a running server reused (a LoRA-policy trial's, whose failure left it up) would say
        # nothing of whether the baseline settings still start.
        servers.forget()
        try:
            await servers.deploy({}, number=baseline.number, log_name=f"host-check-{failed[-1].number}.log")
        except (DeployError, MeasurementError, TransportError) as exc:
            servers.forget()
            for one in failed:
                requeue(self.study, one.number, one.params, one.settings)
            raise DeployError(
                f"trials {numbers} failed in a row (the last: {failed[-1].reason}) and the host's baseline "
                f"settings no longer start either ({exc}); those trials are queued for the other hosts"
            ) from None
        finally:
            self.checking = False
            write_host_check(self.study, self.name, done=True)
        self.fleet.say(f"note: host {self.name}: its baseline settings start; the failures were the settings'")

    @contextlib.asynccontextmanager
    async def leases(self) -> AsyncIterator[None]:
        """Renews the lease of each trial this loop runs every heartbeat_s, so that its peers see it alive."""

        async def beat() -> None:
            while True:
                for number, trial in list(self.leased.items()):
                    try:
                        write_lease(trial, self.name)
                    except (ValueError, RuntimeError):  # told meanwhile
                        self.leased.pop(number, None)
                if self.checking:
                    write_host_check(self.study, self.name)
                await asyncio.sleep(self.fleet.heartbeat_s)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait(self, deadline: float | None, *, exhausted: bool) -> bool:
        """Before the confirmation picks the best trial: the other hosts' trials finished (or found dead and
        failed). True: there is a trial to measure again (a dead peer's, re-queued, within the budget)."""
        poll_s = min(1.0, self.fleet.heartbeat_s)
        while True:
            with snapshot(self.study):
                self.fail_stale()
                trials = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
                waiting = [t for t in trials if t.state == TrialState.WAITING]
                within = deadline is None or time.monotonic() < deadline
                budget = self.prepared.spec.budget.trials
                if waiting and within and not exhausted and claimed_trials(self.study) < budget:
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
                return skip_trial(
                    self.study, trial, f"same settings as trial {other.number}, being measured on {record.host}"
                )
        return None

    def new_baseline(self) -> Pending:
        """This host's baseline trial, created RUNNING (never queued: a peer's `ask` would take it) and measured
        on this host before anything else."""
        settings = self.prepared.baseline_settings
        params = self.prepared.space.encode(settings)
        record = TrialRecord(baseline=True, settings=dict(settings), host=self.name)
        distributions = {name: distribution(self.prepared.space.params[name]) for name in params}
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.RUNNING, params=params, distributions=distributions, user_attrs=new_trial_attrs(record)
            )
        )
        # The newest trial with this record: the storage numbers trials, so it is read back.
        created = max(
            (
                t
                for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if (r := TrialRecord.of(t)).baseline and r.host == self.name
            ),
            key=lambda t: t.number,
        )
        trial = optuna.Trial(self.study, created._trial_id)
        write_lease(trial, self.name)
        self.leased[trial.number] = trial
        return Pending(trial=trial, settings=dict(settings), baseline=True, planned=self.prepared.spec.rounds)
