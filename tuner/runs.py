"""The `runs/<study>/` layout: one controller at a time, Optuna's journal, and per-trial evidence.

runs/<study>/
  .lock               held by the running controller (flock), so a second one refuses to start; a fleet's
                      controllers share it, and each holds .lock-<host> for the hosts it drives
  spec.json           the study as first run; a resume must match it (budget aside)
  optuna.journal      Optuna storage (append-only, locked, fsynced); a last line torn by a full disk
                      is moved aside into optuna.journal.torn-<time> by the next run
  trials/0003/server.log        the server's log for that trial
  trials/0003/round-1.jsonl     one RequestRecord per line (round-1.server.jsonl: the server's account)
  trials/0003/confirm-3-1.jsonl the confirmation's pair 1 of candidate 3 (confirm-3-h1-1: on fleet host h1),
                                in the candidate's and in the baseline's directory; confirm-3-server.log
  progress.json       where the run stands, rewritten at each step (tuner.progress; `tuner status` reads it);
                      progress-<host>.json instead for each of a fleet's controllers run with --host
  host.json           which server build and host the baseline ran on (for the report)
  deployer-state.json what the deployer must restore if the controller dies (deployer-state-<host>.json)
  apply/<time>-server.log       the server's log of a `tuner apply` verification run (<time>-<host>-...)
  report.html         the morning report, rewritten after every trial
  leaderboard.csv     the last leaderboard, written at the end of a run
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from tuner.errors import ConfigError, StudyError
from tuner.files import write_atomic
from tuner.models import RequestRecord, TaskTimeline

if TYPE_CHECKING:  # optuna is imported where the journal is opened: `tuner status` reads files without it
    from optuna.storages import JournalStorage

__all__ = ["RunDirectory", "lock_holder", "spec_differences"]

# Keys of the spec that may change between runs of the same study without invalidating its trials:
# they decide what is tried next or how long we wait, not what a trial measured.
# A fleet's `hosts` and `storage` say where trials run and where the study is kept: a host may join a
# fleet's study later (each host is measured against its own baseline).
_RESUMABLE_KEYS = (
    "budget",
    "confirm",
    "capacity",
    "description",
    "interleave",
    "seed",
    "search.sampler",
    "search.pruner",
    "search.predicted_from",
    "hosts",
    "storage",
)
# In [host] and [deploy], every duration (start_timeout_s, dead_man_s, reconnect_window_s, ...) and the
# keepalive count: how long we wait for the host or the server, never what the server runs.
_RESUMABLE_PLUGIN_TABLES = ("host", "deploy")
_RESUMABLE_PLUGIN_KEYS = ("keepalive_count_max",)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A spec as dotted keys to leaf values (`engine.settings.n_parallel`), so a difference can be named."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def _resumable(key: str) -> bool:
    if any(key == k or key.startswith(k + ".") for k in _RESUMABLE_KEYS):
        return True
    table, _, option = key.partition(".")
    return table in _RESUMABLE_PLUGIN_TABLES and (option.endswith("_s") or option in _RESUMABLE_PLUGIN_KEYS)


def spec_differences(stored: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Each key whose change could alter what a measured trial measured: `key (was X, now Y)`."""
    before, after = _flatten(stored), _flatten(spec)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and not _resumable(k))
    missing = "(not set)"
    return [
        f"{key} (was {json.dumps(before.get(key, missing))}, now {json.dumps(after.get(key, missing))})"
        for key in changed
    ]


# What Optuna's journal replay can raise on a record it does not expect (it asserts on unknown ops).
_REPLAY_ERRORS = (ValueError, KeyError, IndexError, TypeError, AssertionError)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# How long a fleet's controller waits for a peer that is starting alone (its journal repair, a moment)
# before it says the directory is another run's: a single-host run holds its lock for the whole study.
_PEER_START_S = 10.0


def _flock_within(handle: IO[str], operation: int, seconds: float, poll_s: float) -> None:
    """`flock(operation)`, tried until it is granted; `BlockingIOError` if it is not within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(handle, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)


def _share_when_free(handle: IO[str]) -> None:
    """The run directory's lock, shared, once a peer that holds it alone while it starts lets go of it;
    `BlockingIOError` if it is still held alone after _PEER_START_S."""
    _flock_within(handle, fcntl.LOCK_SH, _PEER_START_S, 0.05)


# A reader (`tuner status`, `--check`) holds a lock shared for a moment to see whether a run holds it: a run
# that starts in that moment tries again for this long before it says another tuner runs the study (a
# fleet's peer that joins a running fleet waits this long once before it shares the directory's lock).
_READER_PROBE_S = 0.5


def _lock_alone(handle: IO[str]) -> None:
    """A run directory's lock (or a host's), held alone; `BlockingIOError` if another holder keeps it past
    _READER_PROBE_S."""
    _flock_within(handle, fcntl.LOCK_EX, _READER_PROBE_S, 0.02)


def _lock_owner(handle: IO[str]) -> str:
    owner = _pid_text(handle)
    handle.close()
    return owner


def _pid_text(handle: IO[str] | IO[bytes]) -> str:
    """The pid a lock's holder wrote into it: the first 32 characters, digits only, else "unknown" (a file
    this tool did not write says nothing a message should print)."""
    handle.seek(0)
    start = handle.read(32)
    text = start.decode("ascii", errors="replace") if isinstance(start, bytes) else start
    pid = text.strip()
    return pid if pid.isascii() and pid.isdigit() else "unknown"


def _own(handle: IO[str]) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()


def lock_holder(run_path: Path, lock: str = ".lock") -> str | None:
    """The pid of the tuner that holds a run directory's lock alone now (`.lock`: a study's controller or a
    capacity sweep; `.lock-<host>`: a fleet host's controller), None where none does: what `tuner run` and
    `tuner capacity` would be refused for. Reads only: the file is opened read-only, nothing is created, and
    a shared lock is tried and let go at once. An `OSError` other than a missing file (a lock that is a
    directory, or a run directory that is a file) is raised: the run could not take that lock either."""
    try:
        handle = (run_path / lock).open("rb")
    except FileNotFoundError:  # no lock file: no tuner ever ran here
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_text(handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


class RunDirectory:
    def __init__(self, path: Path, *, notice: Callable[[str], None] = _to_stderr, hosts: Sequence[str] = ()) -> None:
        """`hosts`: the fleet hosts this controller drives; it then shares the directory with the controllers
        of the study's other hosts, and a second controller of one of these hosts is refused."""
        self.path = path
        self.hosts = tuple(hosts)
        self._lock: IO[str] | None = None
        self._host_locks: list[IO[str]] = []
        self._notice = notice

    @property
    def journal(self) -> Path:
        return self.path / "optuna.journal"

    @property
    def spec_path(self) -> Path:
        return self.path / "spec.json"

    def trial_dir(self, number: int) -> Path:
        return self.path / "trials" / f"{number:04d}"

    def trial_dirs(self) -> list[Path]:
        """Every trial's directory that exists, by number."""
        return sorted((self.path / "trials").glob("[0-9][0-9][0-9][0-9]"))

    def server_log_path(self, number: int) -> Path:
        """The log of the server that measured trial `number`'s rounds."""
        return self.trial_dir(number) / "server.log"

    @staticmethod
    def round_name(index: int) -> str:
        """The records' name of a search round (`index` from 1), as `save_records` takes it."""
        return f"round-{index}"

    def round_path(self, number: int, index: int) -> Path:
        """Trial `number`'s records of search round `index` (from 1)."""
        return self.trial_dir(number) / f"{self.round_name(index)}.jsonl"

    def round_paths(self, number: int) -> list[Path]:
        """Trial `number`'s records of its search rounds, by name (the server's accounts beside them left out)."""
        return sorted(p for p in self.trial_dir(number).glob("round-*.jsonl") if not p.name.endswith(".server.jsonl"))

    @staticmethod
    def confirmation_name(candidate: int, host: str | None) -> str:
        """The stem of a confirmation's files (`-<pair>` for a pair's records, `-server.log` for its log); a
        fleet's hosts each confirm the same candidate, so their files carry the host's name."""
        return f"confirm-{candidate}" if host is None else f"confirm-{candidate}-{host}"

    @staticmethod
    def is_confirmation(path: Path) -> bool:
        """Whether a file of a trial's directory belongs to a confirmation (else to a search round or a log)."""
        return path.name.startswith("confirm-")

    def apply_log_path(self, stamp: str, host: str | None) -> Path:
        """The server log of `tuner apply`'s verification run started at `stamp`, on `host` of a fleet."""
        return self.path / "apply" / f"{stamp}{'' if host is None else '-' + host}-server.log"

    def capacity_path(self, stamp: str, host: str | None, trial: int | None = None, round_: int = 0) -> Path:
        """`tuner capacity`'s sweep started at `stamp` (on a fleet's `host`); with `round_`, the server log of that
        round of the baseline (`trial` None) or of trial `trial`."""
        name, config = stamp if host is None else f"{stamp}-{host}", "baseline" if trial is None else f"trial-{trial}"
        return self.path / "capacity" / (f"{name}-{config}-round-{round_}.log" if round_ else f"{name}.json")

    def capacity_paths(self) -> list[Path]:
        """Every sweep of `tuner capacity` in the run directory, oldest first."""
        return sorted((self.path / "capacity").glob("*.json"))

    def deployer_state_path(self, host: str | None) -> Path:
        """Where the deployer keeps what it must restore (the controller's own host, or a fleet's `host`)."""
        return self.path / ("deployer-state.json" if host is None else f"deployer-state-{host}.json")

    @property
    def prediction_path(self) -> Path:
        """The prediction the study started from (`search.predicted_from`), written once at its first start."""
        return self.path / "prediction.json"

    @property
    def leaderboard_path(self) -> Path:
        """The last leaderboard as CSV, written at the end of a run."""
        return self.path / "leaderboard.csv"

    def read_spec(self) -> dict[str, Any] | None:
        """spec.json as the readers take it: None where it is absent, unreadable or not an object (a resume
        reads it strictly, `check_spec`)."""
        try:
            stored = json.loads(self.spec_path.read_bytes())
        except (OSError, ValueError):
            return None
        return stored if isinstance(stored, dict) else None

    def __enter__(self) -> RunDirectory:
        self.path.mkdir(parents=True, exist_ok=True)
        handle = (self.path / ".lock").open("a+", errors="replace")
        alone = True
        try:
            _lock_alone(handle)
        except BlockingIOError:
            alone = False
            # A fleet's controllers share the directory: each holds the lock shared, beside its hosts' own.
            try:
                if not self.hosts:
                    raise
                _share_when_free(handle)
            except BlockingIOError:
                owner = _lock_owner(handle)
                raise StudyError(
                    f"another tuner (pid {owner}) is running the study in {self.path}; wait for it or stop it"
                ) from None
        if alone:
            _own(handle)
        self._lock = handle
        try:
            for host in self.hosts:
                self._lock_host(host)
            if alone:
                # Alone (no peer appends to the journal now): a torn tail or Optuna's stale lock is repaired.
                self._repair_journal()
                if self.hosts:
                    fcntl.flock(handle, fcntl.LOCK_SH)  # peers of the fleet may join from here on
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _lock_host(self, host: str) -> None:
        handle = (self.path / f".lock-{host}").open("a+", errors="replace")
        try:
            _lock_alone(handle)
        except BlockingIOError:
            owner = _lock_owner(handle)
            raise StudyError(
                f"another tuner (pid {owner}) is running host {host} of the study in {self.path}; a host runs one "
                "trial at a time: wait for it, stop it, or run another host (--host NAME)"
            ) from None
        _own(handle)
        self._host_locks.append(handle)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for handle in self._host_locks:
            handle.close()
        self._host_locks = []
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def storage(self) -> JournalStorage:
        """Optuna's storage on the journal. Outside `with` (the leaderboard, `tuner apply`) the journal is
        only read, never changed, also while a controller runs the study: a torn last line is left to
        the next `tuner run`, and Optuna's reader skips it."""
        if self._lock is None:
            tail = self._check_journal()
            if tail and not self._controller_running():
                self._notice(
                    f"note: the last record of {self.journal} is incomplete (a full disk?); the study is read "
                    "without it, and the next `tuner run` moves it aside"
                )
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        try:
            return JournalStorage(JournalFileBackend(str(self.journal)))
        except _REPLAY_ERRORS as exc:
            raise StudyError(
                f"{self.journal} holds records Optuna cannot replay ({type(exc).__name__}); {self._recovery()}"
            ) from None
        except OSError as exc:
            raise StudyError(f"cannot read {self.journal}: {exc.strerror or exc}; {self._recovery()}") from None

    def _recovery(self) -> str:
        return f"restore it from a backup, or move {self.path} aside to start the study over"

    def _check_journal(self) -> bytes:
        """Checks that every complete line of the journal is an Optuna record; returns the torn tail
        after the last newline (empty when the last record is whole). Raises `StudyError` naming the
        line and the way back when a complete line is not a record (a binary file, an edited one)."""
        try:
            content = self.journal.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise StudyError(f"cannot read {self.journal}: {exc.strerror or exc}; {self._recovery()}") from None
        from optuna.storages.journal._storage import JournalOperation

        whole, _, tail = content.rpartition(b"\n")
        known = {op.value for op in JournalOperation}
        for number, line in enumerate(whole.split(b"\n") if whole or content.startswith(b"\n") else [], start=1):
            try:
                record = json.loads(line)
            except ValueError:  # JSONDecodeError and UnicodeDecodeError: a torn or binary line
                record = None
            if not (isinstance(record, dict) and record.get("op_code") in known):
                if number == 1:
                    raise StudyError(f"{self.journal} is not an Optuna journal (line 1); {self._recovery()}")
                raise StudyError(
                    f"{self.journal} is damaged at line {number} (not an Optuna record); keep the {number - 1} "
                    f"records before it with `head -n {number - 1} {self.journal} > {self.journal}.fixed && "
                    f"mv {self.journal}.fixed {self.journal}`, or {self._recovery()}"
                )
        return tail

    def _repair_journal(self) -> None:
        """Moves a torn last line (a write cut short by a full disk or a crash) into a file of its own,
        so that the next record starts on a line of its own and every completed trial stays readable."""
        # Optuna's own lock (a symlink) left by a controller killed mid-append would make every append
        # wait out its 30 s grace period; only a controller holding our lock appends, and we hold it.
        stale_lock = self.journal.with_name(self.journal.name + ".lock")
        if stale_lock.is_symlink():
            stale_lock.unlink()
        tail = self._check_journal()
        if not tail:
            return
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.journal.with_name(f"{self.journal.name}.torn-{stamp}")
        suffix = 1
        while aside.exists():
            suffix += 1
            aside = self.journal.with_name(f"{self.journal.name}.torn-{stamp}-{suffix}")
        # The tail is saved before the journal is cut, so that no byte is lost if saving it fails.
        write_atomic(aside, tail)
        with self.journal.open("r+b") as journal:
            journal.truncate(self.journal.stat().st_size - len(tail))
            os.fsync(journal.fileno())
        self._notice(
            f"note: the last record of {self.journal} was cut short (a full disk, or a crash while writing); "
            f"its {len(tail)} bytes are moved aside into {aside}, and the study goes on with every completed trial"
        )

    def _controller_running(self) -> bool:
        """Whether a controller holds this run directory's lock (its journal may be mid-append)."""
        try:
            return lock_holder(self.path) is not None
        except OSError:  # a lock no run could take: no controller runs here
            return False

    def check_spec(self, spec: dict[str, Any], *, measured: bool) -> None:
        """Records the spec; refuses a resume whose spec changed what measured trials measured.

        While no trial has been measured (a baseline that failed to start, say), every change is accepted:
        the fix a failed start asks for must not be refused. Afterwards only what decides the next trial or
        how long we wait may change (budget, sampler, confirm, timeouts)."""
        stored_path = self.spec_path
        if stored_path.exists() and measured:
            differences = spec_differences(self._stored_spec(stored_path), spec)
            if differences:
                shown = "; ".join(differences[:3]) + (
                    f"; and {len(differences) - 3} more" if len(differences) > 3 else ""
                )
                raise ConfigError(
                    f"{self.path} holds a study measured with a different {shown}; undo the change, rename the "
                    "study (name = ...) to start a new one, or remove that run directory"
                )
        write_atomic(stored_path, (json.dumps(spec, indent=2, sort_keys=True, default=str) + "\n").encode())

    def _stored_spec(self, stored_path: Path) -> dict[str, Any]:
        try:
            stored = json.loads(stored_path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not the JSON this tool wrote"
            raise StudyError(
                f"{stored_path} is unreadable ({reason}); if the study file is the one this run directory was "
                f"made with, delete {stored_path.name} and run again (it is written anew), otherwise remove {self.path}"
            ) from None
        if not isinstance(stored, dict):
            raise StudyError(
                f"{stored_path} is not the JSON object this tool wrote; delete it and run again with the study file "
                f"this run directory was made with, or remove {self.path}"
            )
        return stored

    @property
    def host_facts_path(self) -> Path:
        return self.path / "host.json"

    def save_host_facts(self, facts: dict[str, str | None]) -> None:
        """What the report says of the host and the server build; evidence, written once."""
        write_atomic(self.host_facts_path, (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode())

    def save_records(self, number: int, name: str, records: Iterable[RequestRecord]) -> Path:
        """Saves one round's records as trials/<number>/<name>.jsonl (round-1, confirm-7-1, ...)."""
        path = self.trial_dir(number) / f"{name}.jsonl"
        write_atomic(path, "".join(record.model_dump_json() + "\n" for record in records).encode())
        return path

    def save_server_tasks(self, number: int, name: str, joined: Iterable[tuple[RequestRecord, TaskTimeline]]) -> Path:
        """Saves the server's account of each request next to its records, as <name>.server.jsonl."""
        path = self.trial_dir(number) / f"{name}.server.jsonl"
        lines = []
        for record, task in joined:
            entry = {"request_id": record.request_id, **dataclasses.asdict(task)}
            entry["wait_before_prefill_s"] = task.wait_before_prefill_s
            lines.append(json.dumps(entry) + "\n")
        write_atomic(path, "".join(lines).encode())
        return path
