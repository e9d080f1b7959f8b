"""One read of a study's trials per step of the search loop, however many checks that step makes.

A step of the loop (asking a proposal and deciding whether it is measured, polling for the peers at the end)
makes a dozen reads of the study's trials: Optuna's own queue and the sampler, the budget, the repeated
settings, the proposals being measured. On a database each read is several SQL statements and their rows
turned into Python objects, some milliseconds; a controller that drives several hosts makes its reads on
one event loop, so each host's reads wait for every other's.

`SnapshotStorage` wraps the study's storage: inside `snapshot(study)` the trials are read from the storage
once and served from that read until this process writes anything to the storage, after which the next
read is fresh. So a step sees everything it wrote itself (the over-budget check reads the trial the step
has just created), and the other controllers' writes as of its latest read: as if its reads since then
had been made together. A snapshot is only taken in code that does not await (a step's reads are
milliseconds apart, not the minutes of a round), and ends with the step; outside one, every read goes to
the storage. Optuna's own cache for a database (`_CachedStorage`, beneath this one) already fetches each
finished trial once per process; what it cannot save is the statements of each read.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
from collections.abc import Container, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna._typing import JSONSerializable
    from optuna.study._frozen import FrozenStudy

__all__ = ["SnapshotStorage", "snapshot"]


class _Snapshots(threading.local):
    """One thread's open snapshots, and the trials read in them by study id, each with the number of this
    process's last write before that read (a write from any thread makes them old)."""

    def __init__(self) -> None:
        self.depth = 0
        self.trials: dict[int, tuple[int, list[FrozenTrial]]] = {}


class SnapshotStorage(BaseStorage):
    """Optuna's storage, with the study's trials read once per snapshot (see the module's docstring)."""

    def __init__(self, backend: BaseStorage) -> None:
        self.backend = backend
        self._snapshots = _Snapshots()
        self._write_numbers = itertools.count(1)
        self._writes = 0  # the number of this process's last write

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        self._snapshots.depth += 1
        try:
            yield
        finally:
            self._snapshots.depth -= 1
            if self._snapshots.depth == 0:
                self._snapshots.trials.clear()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        finally:  # numbered once done: trials read while it was under way are not kept
            self._writes = next(self._write_numbers)

    # Reads.

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        if self._snapshots.depth == 0:
            return self.backend.get_all_trials(study_id, deepcopy=deepcopy, states=states)
        writes, trials = self._snapshots.trials.get(study_id, (-1, []))
        if writes != self._writes:  # none read in this snapshot yet, or written since
            writes = self._writes
            trials = self.backend.get_all_trials(study_id, deepcopy=False)
            self._snapshots.trials[study_id] = (writes, trials)
        chosen = list(trials) if states is None else [t for t in trials if t.state in states]
        return copy.deepcopy(chosen) if deepcopy else chosen

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self.backend.get_trial(trial_id)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self.backend.get_trial_id_from_study_id_trial_number(study_id, trial_number)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self.backend.get_best_trial(study_id)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.backend.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.backend.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.backend.get_study_directions(study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self.backend.get_all_studies()

    # Writes: each ends the trials read so far (the next read in a snapshot is fresh).

    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        with self._writing():
            return self.backend.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        with self._writing():
            self.backend.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        with self._writing():
            self.backend.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: JSONSerializable) -> None:
        with self._writing():
            self.backend.set_study_system_attr(study_id, key, value)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._writing():
            return self.backend.create_new_trial(study_id, template_trial)

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: BaseDistribution
    ) -> None:
        with self._writing():
            self.backend.set_trial_param(trial_id, param_name, param_value_internal, distribution)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        with self._writing():
            return self.backend.set_trial_state_values(trial_id, state, values)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        with self._writing():
            self.backend.set_trial_intermediate_value(trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        with self._writing():
            self.backend.set_trial_user_attr(trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: JSONSerializable) -> None:
        with self._writing():
            self.backend.set_trial_system_attr(trial_id, key, value)


def snapshot(study: optuna.Study) -> contextlib.AbstractContextManager[None]:
    """Within it (code that does not await), the study's trials are read once, and again after a write."""
    storage = study._storage
    return storage.snapshot() if isinstance(storage, SnapshotStorage) else contextlib.nullcontext()
