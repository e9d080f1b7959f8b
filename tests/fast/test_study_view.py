"""One read model of a study (tuner/study_view.py): what every reader sees agrees with the leaderboard, the
budget and the fleet summary, and a run made by an earlier version opens through it."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tests.support.sim_study import DEMO, fleet_overrides, prepare_simulated, run_simulated, run_simulated_fleet
from tuner.fleet import fleet_summary
from tuner.report import build_leaderboard
from tuner.runs import RunDirectory
from tuner.study_view import StudyView, recommendable

MADE_BY_0_1_0 = Path(__file__).resolve().parents[1] / "data" / "runs" / "made-by-0.1.0"


def test_the_views_candidates_are_the_leaderboard_rows_the_recommendation_may_choose(tmp_path: Path) -> None:
    for name, study_file in (("demo", DEMO), ("lora", DEMO.with_name("lora-demo.toml"))):
        study = run_simulated(prepare_simulated(study_file=study_file), tmp_path / name, seed=2).study
        view = StudyView.of(study)
        board = build_leaderboard(view)
        allowed = view.allow_answer_changes
        rows = [row.number for row in board.rows if recommendable(row, allow_answer_changes=allowed)]
        assert [t.number for t in view.candidates()] == rows
        # Trials done: those after the baseline that reached the host, as the budget counts them.
        assert view.trials_done() == sum(1 for row in board.rows if not row.baseline)
        assert view.trials_done() == len(view.deployed) - len(view.baselines)


def test_a_fleets_summary_counts_each_hosts_trials_as_the_view_does(tmp_path: Path) -> None:
    prepared = prepare_simulated([*fleet_overrides(["a", "b"]), "budget.trials=4", "confirm.top=0"])
    result = run_simulated_fleet(prepared, tmp_path / "f", hosts={"a": 1.0, "b": 1.1}, seed=2)
    view = StudyView.of(result.study)
    summary = fleet_summary(view)
    assert [host["host"] for host in summary] == ["a", "b"]
    assert sum(host["trials"] for host in summary) == view.trials_done() == 4
    for host in summary:
        assert host["baseline"] == view.baselines[host["host"]].number and host["running"] is None
    assert summary == fleet_summary(result.study)  # the study itself, as `tuner status` passes it


def test_a_run_made_by_0_1_0_opens_through_the_view(tmp_path: Path) -> None:
    run = tmp_path / "old"
    shutil.copytree(MADE_BY_0_1_0, run)
    view = StudyView.open(RunDirectory(run))
    assert view.run_dir is not None and view.run_dir.read_spec() is not None
    assert list(view.baselines) == [None] and view.baselines[None].number == 0
    assert view.in_state(TrialState.COMPLETE) and view.confirmations()
    assert build_leaderboard(view) == build_leaderboard(
        optuna.load_study(study_name=view.name, storage=RunDirectory(run).storage())
    )


def test_every_file_a_run_writes_in_its_trials_is_one_the_run_directorys_accessors_name(tmp_path: Path) -> None:
    run_path = tmp_path / "demo"
    study = run_simulated(prepare_simulated(), run_path, seed=1, in_memory=False, save_rounds=True).study
    run_dir, view = RunDirectory(run_path), StudyView.of(study)
    confirmed = list(view.confirmations())
    assert confirmed, "the demo confirms its best trial"
    (baseline,) = view.baselines.values()
    assert run_dir.round_path(baseline.number, 1).is_file()
    for directory in run_dir.trial_dirs():
        number = int(directory.name)
        assert directory == run_dir.trial_dir(number)
        for path in directory.iterdir():
            if run_dir.is_confirmation(path):
                names = [run_dir.confirmation_name(candidate, None) for candidate in confirmed]
                assert any(path.name.startswith(name + "-") for name in names), path
            else:
                named = [*run_dir.round_paths(number), run_dir.server_log_path(number)]
                assert path in named or path.name.endswith(".server.jsonl"), path
