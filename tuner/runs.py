"""The `runs/<study>/` layout: one controller at a time, Optuna's journal, and per-trial evidence.

runs/<study>/
  .lock               held by the running controller (flock), so a second one refuses to start
  spec.json           the study as first run; a resume must match it (budget aside)
  optuna.journal      Optuna storage (append-only, locked, fsynced); a last line torn by a full disk
                      is moved aside into optuna.journal.torn-<time> by the next run
  trials/0003/server.log        the server's log for that trial
  trials/0003/round-1.jsonl     one RequestRecord per line
  summary.json        the last leaderboard and recommendation
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._storage import JournalOperation

from tuner.errors import StudyError
from tuner.files import write_atomic
from tuner.models import RequestRecord, TaskTimeline

__all__ = ["RunDirectory"]

# Keys of the spec that may change between runs of the same study without invalidating its trials:
# they decide what is tried next, not what a trial measured.
_RESUMABLE_KEYS = ("budget", "confirm", "description", "interleave", "seed")
_RESUMABLE_SEARCH_KEYS = ("sampler", "pruner")


def _measured_part(spec: dict[str, Any]) -> dict[str, Any]:
    part = {k: v for k, v in spec.items() if k not in _RESUMABLE_KEYS}
    if isinstance(part.get("search"), dict):
        part["search"] = {k: v for k, v in part["search"].items() if k not in _RESUMABLE_SEARCH_KEYS}
    return part


# What Optuna's journal replay can raise on a record it does not expect (it asserts on unknown ops).
_REPLAY_ERRORS = (ValueError, KeyError, IndexError, TypeError, AssertionError)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RunDirectory:
    def __init__(self, path: Path, *, notice: Callable[[str], None] = _to_stderr) -> None:
        self.path = path
        self._lock: IO[str] | None = None
        self._notice = notice

    @property
    def journal(self) -> Path:
        return self.path / "optuna.journal"

    def trial_dir(self, number: int) -> Path:
        return self.path / "trials" / f"{number:04d}"

    def __enter__(self) -> RunDirectory:
        self.path.mkdir(parents=True, exist_ok=True)
        handle = (self.path / ".lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise StudyError(
                f"another tuner (pid {owner}) is running the study in {self.path}; wait for it or stop it"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle
        try:
            self._repair_journal()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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
            with (self.path / ".lock").open("r") as handle:  # read-only: a reader creates nothing
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                return False
        except OSError:  # no lock file: no controller ever ran here
            return False

    def check_spec(self, spec: dict[str, Any]) -> None:
        """Records the spec on the first run; refuses a resume whose spec changed what trials measure."""
        stored_path = self.path / "spec.json"
        comparable = _measured_part(spec)
        if stored_path.exists():
            stored_comparable = _measured_part(json.loads(stored_path.read_text()))
            if stored_comparable != comparable:
                changed = sorted(
                    k for k in set(stored_comparable) | set(comparable) if stored_comparable.get(k) != comparable.get(k)
                )
                raise StudyError(
                    f"{self.path} holds a study with a different {', '.join(changed)}; "
                    "rename the study (name = ...) or remove that run directory"
                )
        write_atomic(stored_path, (json.dumps(spec, indent=2, sort_keys=True, default=str) + "\n").encode())

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
