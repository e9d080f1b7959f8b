"""A fleet: one study over several hosts, in one storage that every controller of the study shares.

What is shared and what is not:
- the Optuna study (its storage: a database named by `[storage] url`, or the run directory's journal when
  the controllers share a machine); each trial records the host that measured it;
- each host has its own baseline trial, measured first on that host, and every score of a trial is relative
  to its own host's baseline: hosts of one model differ by about 10%, more than many effects tuned for;
- each host is driven by one controller at a time (the run directory's per-host lock, and a host's own lock
  where the deployer has one), so a host never runs two trials at once.

Dead controllers are found by a lease, not by Optuna's heartbeat (see `fail_stale_trials`): while a trial
runs, its controller rewrites the trial's lease (a user attribute: host, wall-clock time) every
`storage.heartbeat_s`; a peer that finds a RUNNING trial of another host silent for `storage.grace_s` marks it
FAIL with the reason, and queues its settings again for any host (a baseline is not re-queued: it belongs to
its host, whose next start measures a new one).

Opening the storage, and the password a URL may carry: `tuner.storage`.
"""

from __future__ import annotations

import datetime
import time
import zlib
from collections.abc import Callable, Collection, Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.study_record import (
    INTERRUPTED,
    LEASE_KEY,
    TrialRecord,
    end_trial,
    new_trial_attrs,
)
from tuner.study_view import StudyView

__all__ = [
    "fail_own_interrupted_trials",
    "fail_stale_trials",
    "fleet_seed",
    "fleet_summary",
    "requeue",
    "write_lease",
]


def fleet_seed(seed: int, hosts: Iterable[str]) -> int:
    """A sampler seed of its own for each controller of a fleet: controllers with the same seed would propose
    the same first settings to their hosts."""
    names = ",".join(hosts)
    return seed if not names else (seed + zlib.crc32(names.encode())) % (2**32)


def write_lease(trial: optuna.Trial, host: str | None, *, now: float | None = None) -> None:
    trial.set_user_attr(LEASE_KEY, {"host": host, "at": time.time() if now is None else now})


# A fleet host checking whether it is at fault (`FleetPeers.check_host`): {"at": time}, or {"at": None} once done.
_CHECK_KEY_PREFIX = "serve_tuner:host-check:"


def write_host_check(study: optuna.Study, host: str, *, done: bool = False) -> None:
    """Tells the peers that `host` is checking itself (renewed with its leases), or that it is done."""
    study.set_user_attr(_CHECK_KEY_PREFIX + host, {"at": None if done else time.time()})


def hosts_checking(study: optuna.Study, *, grace_s: float, now: float | None = None) -> list[str]:
    """The hosts checking themselves now: their check renewed within `grace_s` (a dead one's goes stale)."""
    now = time.time() if now is None else now
    checking = []
    for key, value in study.user_attrs.items():
        at = value.get("at") if key.startswith(_CHECK_KEY_PREFIX) and isinstance(value, dict) else None
        if isinstance(at, (int, float)) and now - at <= grace_s:
            checking.append(key.removeprefix(_CHECK_KEY_PREFIX))
    return checking


def _lease_time(trial: FrozenTrial) -> float:
    lease = trial.user_attrs.get(LEASE_KEY)
    if isinstance(lease, dict) and isinstance(lease.get("at"), (int, float)):
        return float(lease["at"])
    start = trial.datetime_start or datetime.datetime.now()
    return start.timestamp()


def _fail(study: optuna.Study, trial: FrozenTrial, reason: str, *, again: bool) -> bool:
    """Fails one RUNNING trial with `reason`; True if this call did (a peer may have been first)."""
    live = optuna.Trial(study, trial._trial_id)
    try:
        end_trial(study, live, state=TrialState.FAIL, fail_reason=reason)
    except (ValueError, RuntimeError):  # finished meanwhile, by its controller or by a peer
        return False
    record = TrialRecord.of(trial)
    if again and not record.baseline and record.settings is not None:
        requeue(study, trial.number, dict(trial.params), record.settings)
    return True


def requeue(study: optuna.Study, number: int, params: dict[str, Any], settings: dict[str, ParamValue]) -> None:
    """Queues a failed trial's settings again, for whichever host asks next, with a fresh record: the one who
    measures it writes its own host, rounds and score."""
    study.enqueue_trial(params, user_attrs=new_trial_attrs(TrialRecord(settings=dict(settings), requeued_from=number)))


def fleet_summary(study: optuna.Study | StudyView) -> list[dict[str, Any]]:
    """Per host of a fleet's study: its trials, the one it measures now, and why it was dropped."""
    view = study if isinstance(study, StudyView) else StudyView.of(study)
    baselines = view.baselines
    names = {t.host for t in view.trials if t.host is not None} | set(view.hosts)
    summary = []
    for host in sorted(names):
        running = [t.number for t in view.in_state(TrialState.RUNNING) if t.host == host]
        baseline = baselines.get(host)
        summary.append(
            {
                "host": host,
                "trials": view.trials_done(host),
                "baseline": None if baseline is None else baseline.number,
                "running": running[-1] if running else None,
                "dropped": view.hosts[host].dropped if host in view.hosts else None,
            }
        )
    return summary


def fail_own_interrupted_trials(
    study: optuna.Study, hosts: Collection[str | None], *, requeue: bool, say: Callable[[str], None]
) -> list[int]:
    """At a start: the RUNNING trials of the hosts this controller now holds were left by a controller of
    theirs that died (the host's lock says no other one runs it). A one-host study (host None) is today's:
    every RUNNING trial is its own."""
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if TrialRecord.of(trial).host in hosts and _fail(study, trial, INTERRUPTED, again=requeue):
            failed.append(trial.number)
    if failed and requeue:
        say(f"note: trial(s) {', '.join(map(str, failed))} were cut short by a controller that stopped; failed")
    return failed


def fail_stale_trials(
    study: optuna.Study,
    own_hosts: Collection[str | None],
    *,
    grace_s: float,
    now: float | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> list[int]:
    """Fails the RUNNING trials of other hosts whose controller has been silent for more than `grace_s`
    (its lease expired) and queues their settings again; returns their numbers. A live peer's trial, whose
    lease is fresh, is never touched.

    Why a lease of our own and not Optuna's heartbeat (RDBStorage's heartbeat_interval, fail_stale_trials,
    RetryFailedTrialCallback): Optuna's is only in RDBStorage, so the one-machine journal and the in-memory
    storage of the fast tests would have none; its `fail_stale_trials` finishes the trial before the callback
    runs, and a finished trial's attributes cannot be written, so the reason (which host, silent how long)
    would be lost; and its retry copies the user attributes as they were (our record says deployed, with the
    dead host's rounds), and would re-queue a host's baseline for any host to take."""
    now = time.time() if now is None else now
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = TrialRecord.of(trial)
        if record.host in own_hosts or record.host is None:
            continue
        silent = now - _lease_time(trial)
        if silent <= grace_s:
            continue
        reason = (
            f"interrupted: the controller of host {record.host} was silent for {silent:.0f} s (over storage.grace_s "
            f"= {grace_s:g}); failed by a peer" + ("" if record.baseline else ", its settings queued for another host")
        )
        if _fail(study, trial, reason, again=True):
            failed.append(trial.number)
            say(f"note: trial {trial.number} on {record.host}: {reason}")
    return failed
