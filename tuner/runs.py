"""The `runs/<study>/` layout: one controller at a time, Optuna's journal, and per-trial evidence.

runs/<study>/
  .lock               held by the running controller (flock), so a second one refuses to start
  spec.json           the study as first run; a resume must match it (budget aside)
  optuna.journal      Optuna storage (append-only, locked, fsynced)
  trials/0003/server.log        the server's log for that trial
  trials/0003/round-1.jsonl     one RequestRecord per line
  summary.json        the last leaderboard and recommendation
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

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


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: IO[str] | None = None

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
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

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
