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

A storage URL may carry a password: it is remembered as a secret (redacted from every line and log), never
written into the run directory (spec.json keeps the URL without it), and never printed.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import time
import zlib
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ParamValue
from tuner.errors import ConfigError, StudyError
from tuner.redact import redact, remember_secret
from tuner.study_record import (
    INTERRUPTED,
    LEASE_KEY,
    TrialRecord,
    new_trial_attrs,
    update_trial_record,
)

__all__ = [
    "fail_own_interrupted_trials",
    "fail_stale_trials",
    "fleet_seed",
    "fleet_summary",
    "holds_study",
    "open_storage",
    "override_storage",
    "remember_url",
    "recorded_storage",
    "requeue",
    "shown_url",
    "stored_spec",
    "write_lease",
]

_FIX = "e.g. postgresql://tuner@db.example:5432/tuner"
_POSTGRES_DRIVERS = ("psycopg", "psycopg2")  # SQLAlchemy 2.1 assumes psycopg (3) for postgresql://
_CONNECT_TIMEOUT_S = 10
_SCHEMA_TRIES = 5


# The full URLs this process was given (the study file's, --storage), by their password-free form: what the
# run directory records is the latter, and a reader in this process (the leaderboard at the end of a run,
# the morning report rewritten after each trial) opens the storage with the former. Memory only.
_KNOWN_URLS: dict[str, str] = {}
# `--storage URL` of leaderboard, report and status: read instead of the URL the run directory records.
_OVERRIDE: list[str] = []


def remember_url(url: str) -> str:
    """Registers a storage URL given to this process (its password as a secret); returns it without it."""
    shown = shown_url(url)
    _KNOWN_URLS[shown] = url
    return shown


def override_storage(url: str) -> None:
    """The storage that readers of a run directory open instead of the one it records (`--storage URL`)."""
    remember_url(url)
    _OVERRIDE[:] = [url]


def _parse(url: str) -> Any:
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError:
        raise ConfigError(
            "storage.url needs SQLAlchemy and a database driver, which are not installed: "
            ".venv/bin/pip install -e '.[fleet]' in the clone"
        ) from None
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"storage.url is not a database URL; give one such as {_FIX}") from None
    if parsed.password:
        remember_secret(str(parsed.password))
    return parsed


def shown_url(url: str) -> str:
    """The URL without its password: what is shown, and what the run directory keeps."""
    parsed = _parse(url)
    return str(parsed._replace(password=None).render_as_string(hide_password=False))  # set() keeps a None


def stored_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as spec.json keeps it: a storage URL without its password."""
    storage = spec.get("storage")
    if not isinstance(storage, dict) or not isinstance(storage.get("url"), str):
        return spec
    return {**spec, "storage": {**storage, "url": shown_url(storage["url"])}}


def _with_driver(parsed: Any) -> Any:
    """`postgresql://` with whichever PostgreSQL driver is installed."""
    if parsed.drivername != "postgresql":
        return parsed
    installed = [m for m in _POSTGRES_DRIVERS if importlib.util.find_spec(m) is not None]
    if not installed:
        raise ConfigError(
            "storage.url names PostgreSQL, and no driver for it is installed (psycopg2 or psycopg): "
            ".venv/bin/pip install -e '.[fleet]' in the clone"
        )
    return parsed.set(drivername=f"postgresql+{installed[0]}")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna's RDBStorage on `url`. A bad URL or a missing driver: ConfigError (exit 2); a database that does
    not answer: StudyError (exit 1); either is one line, without the password."""
    shown = shown_url(url)
    parsed = _with_driver(_parse(_KNOWN_URLS.get(url, url)))
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": _CONNECT_TIMEOUT_S}
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(_SCHEMA_TRIES):
        try:
            return optuna.storages.RDBStorage(
                parsed.render_as_string(hide_password=False), engine_kwargs=kwargs, skip_compatibility_check=False
            )
        except (IntegrityError, ProgrammingError):
            # Controllers starting together on an empty database each create Optuna's tables; one wins, the
            # others see its tables half-made: a moment later they are whole.
            if attempt + 1 == _SCHEMA_TRIES:
                raise StudyError(
                    f"cannot create the study's tables in {shown}: another controller kept creating them; run again"
                ) from None
            time.sleep(0.5 * (attempt + 1))
        except ImportError as exc:
            raise ConfigError(f"storage.url {shown}: {exc}; .venv/bin/pip install -e '.[fleet]' in the clone") from None
        except Exception as exc:
            # SQLAlchemy's OperationalError and the driver's own: the first line names the cause
            # (connection refused, no such database, password authentication failed).
            text = str(getattr(exc, "orig", None) or exc).strip()
            first = redact(text.splitlines()[0]) if text else type(exc).__name__
            raise StudyError(
                f"cannot open the study's storage {shown}: {first}; check that the database runs and accepts "
                "this user (a password comes from the URL, PGPASSWORD or ~/.pgpass)"
            ) from None
    raise AssertionError("unreachable")


def fleet_seed(seed: int, hosts: Iterable[str]) -> int:
    """A sampler seed of its own for each controller of a fleet: controllers with the same seed would propose
    the same first settings to their hosts."""
    names = ",".join(hosts)
    return seed if not names else (seed + zlib.crc32(names.encode())) % (2**32)


def write_lease(trial: optuna.Trial, host: str | None, *, now: float | None = None) -> None:
    trial.set_user_attr(LEASE_KEY, {"host": host, "at": time.time() if now is None else now})


# A fleet host checking whether it is at fault (`_Peers.check_host`): {"at": time}, or {"at": None} once done.
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
        update_trial_record(live, fail_reason=reason)
        study.tell(live, state=TrialState.FAIL)
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


def recorded_storage(run_path: Path) -> tuple[str | None, str | None]:
    """The storage URL (without a password) and the study name the run directory's spec.json records."""
    try:
        stored = json.loads((run_path / "spec.json").read_bytes())
    except (OSError, ValueError):
        return None, None
    if not isinstance(stored, dict):
        return None, None
    storage = stored.get("storage")
    name = stored.get("name") if isinstance(stored.get("name"), str) else None
    url = storage.get("url") if isinstance(storage, dict) and isinstance(storage.get("url"), str) else None
    return (_OVERRIDE[0] if _OVERRIDE else url), name


def holds_study(run_path: Path) -> bool:
    """Whether a run directory holds a study: its journal, or a spec.json naming the storage that holds it."""
    return (run_path / "optuna.journal").is_file() or recorded_storage(run_path)[0] is not None


def fleet_summary(study: optuna.Study) -> list[dict[str, Any]]:
    """Per host of a fleet's study: its trials, the one it measures now, and why it was dropped."""
    hosts: dict[str, dict[str, Any]] = {}
    for trial in study.get_trials(deepcopy=False):
        record = TrialRecord.of(trial)
        if record.host is None:
            continue
        entry = hosts.setdefault(
            record.host, {"host": record.host, "trials": 0, "baseline": None, "running": None, "dropped": None}
        )
        if record.baseline and trial.state == TrialState.COMPLETE:
            entry["baseline"] = trial.number
        elif record.deployed and not record.baseline:
            entry["trials"] += 1
        if trial.state == TrialState.RUNNING:
            entry["running"] = trial.number
    from tuner.study_record import host_records

    for host, host_record in host_records(study).items():
        hosts.setdefault(host, {"host": host, "trials": 0, "baseline": None, "running": None, "dropped": None})
        hosts[host]["dropped"] = host_record.dropped
    return [hosts[name] for name in sorted(hosts)]


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
