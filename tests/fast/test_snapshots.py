"""One read of a study's trials per step of the search loop (`tuner.snapshots`): a step reads the storage once,
sees its own writes, and sees the other controllers' trials from its next step on; the search loop's steps
read the study a few times per proposal, not a dozen (counted, not timed)."""

from __future__ import annotations

import threading
from collections.abc import Container
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from tests.support.sim_study import fleet_overrides, prepare_simulated, run_simulated_fleet
from tuner.snapshots import SnapshotStorage, snapshot


class _CountingStorage(optuna.storages.InMemoryStorage):
    """The storage beneath: counts the reads of a study's trials that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        self.reads += 1
        return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)


def _studies() -> tuple[optuna.Study, optuna.Study, _CountingStorage]:
    """This controller's study, through the snapshots, and another controller's handle on the same storage."""
    backend = _CountingStorage()
    ours = optuna.create_study(study_name="s", storage=SnapshotStorage(backend))
    theirs = optuna.load_study(study_name="s", storage=backend)
    return ours, theirs, backend


def test_a_step_reads_the_trials_once_and_again_after_its_own_write() -> None:
    study, _, backend = _studies()
    study.enqueue_trial({"x": 1.0})
    with snapshot(study):
        before = backend.reads
        assert len(study.get_trials(deepcopy=False)) == 1
        assert len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))) == 1
        assert study.get_trials(states=(TrialState.RUNNING,)) == []
        assert backend.reads == before + 1
        trial = study.ask()  # a write: the trial it creates is in the next read
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        assert [t.number for t in running] == [trial.number]
        trial.set_user_attr("k", 1)
        assert study.get_trials(deepcopy=False)[0].user_attrs == {"k": 1}
    reads = backend.reads
    study.get_trials()
    study.get_trials()
    assert backend.reads == reads + 2  # outside a step, every read reaches the storage


def test_a_step_sees_another_controllers_trial_from_its_next_read_after_a_write_or_its_next_step() -> None:
    study, peer, _ = _studies()
    with snapshot(study):
        assert study.get_trials() == []
        peer.enqueue_trial({"x": 2.0})  # another controller, meanwhile
        assert study.get_trials() == []  # as if this step had read everything at its first read
        study.set_user_attr("k", 1)
        assert len(study.get_trials()) == 1
    peer.enqueue_trial({"x": 3.0})
    with snapshot(study):
        assert len(study.get_trials()) == 2


def test_a_snapshot_is_its_threads_own_and_a_write_from_another_thread_makes_its_next_read_fresh() -> None:
    study, _, backend = _studies()
    with snapshot(study):
        assert study.get_trials() == []
        reads = backend.reads
        reader = threading.Thread(target=study.get_trials)
        reader.start()
        reader.join()
        assert backend.reads == reads + 1  # that thread is in no step: its read reached the storage
        writer = threading.Thread(target=study.enqueue_trial, args=({"x": 4.0},))
        writer.start()
        writer.join()
        assert len(study.get_trials()) == 1


def test_the_search_loop_reads_the_study_a_few_times_per_proposal(tmp_path: Path) -> None:
    # Two hosts driven by one controller: every proposal (asked, checked against the budget, the repeated
    # settings and the peers' proposals, then measured or skipped) reads the study three times: before it
    # is asked, after (the sampler), and after its record is written (the checks).
    names = ["gpu-a", "gpu-b"]
    prepared = prepare_simulated([*fleet_overrides(names), "budget.trials=8", "confirm.top=0", 'search.pruner="none"'])
    backend = _CountingStorage()
    fleet = run_simulated_fleet(prepared, tmp_path / "run", hosts=dict.fromkeys(names, 1.0), seed=1, storage=backend)
    proposals = len(fleet.study.get_trials())
    # About 3.5 a proposal here (the start's reads and the wait at the end, which polls, included); 9.5 without.
    assert backend.reads <= 5 * proposals, (backend.reads, proposals)
