"""The stored record of a trial and of a study: one versioned key, and runs made before it still open.

`tests/data/runs/made-by-0.1.0` is a run directory written by serve-tuner 0.1.0 (loose user attributes,
`confirmation_<n>` study attributes): `tuner run studies/stall-demo-simulated.toml` as it was shipped, its
journal, spec and the leaderboard CSV that version wrote.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.support import run_tuner
from tuner.errors import StudyError
from tuner.report import build_leaderboard
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly
from tuner.study_record import (
    RECORD_KEY,
    RECORD_VERSION,
    StudyRecord,
    TrialRecord,
    new_trial_attrs,
    update_trial_record,
)

ROOT = Path(__file__).resolve().parents[2]
MADE_BY_0_1_0 = ROOT / "tests" / "data" / "runs" / "made-by-0.1.0"
PRINTED_BY_THIS_VERSION = ROOT / "tests" / "data" / "runs" / "made-by-0.1.0-leaderboard.txt"
DEMO = ROOT / "studies" / "stall-demo-simulated.toml"


def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "stall-demo-simulated"
    shutil.copytree(MADE_BY_0_1_0, run)
    return run


def test_a_run_made_by_0_1_0_shows_the_leaderboard_that_version_wrote(tmp_path: Path) -> None:
    run = old_run(tmp_path)
    shown = run_tuner("leaderboard", str(run), "--csv", str(tmp_path / "now.csv"))
    assert shown.returncode == 0, shown.stderr
    assert (tmp_path / "now.csv").read_text() == (MADE_BY_0_1_0 / "leaderboard.csv").read_text()
    # The table as printed, byte for byte: 0.1.0's own but for the recommendation's wording, which says how
    # many pairs ran since the sequential confirmation (issue 30, commit 541704e).
    assert shown.stdout.removesuffix(f"wrote {tmp_path / 'now.csv'}\n") == PRINTED_BY_THIS_VERSION.read_text()


def test_apply_names_a_trial_the_search_skipped_as_never_deployed_not_as_missing(tmp_path: Path) -> None:
    from tuner.errors import ConfigError
    from tuner.report import row_to_apply

    run = old_run(tmp_path)
    with pytest.raises(ConfigError, match=r"--trial 4: trial 4 was never deployed \(a proposal the search skipped"):
        row_to_apply(run, 4)
    with pytest.raises(ConfigError, match="--trial 99: no trial has that number"):
        row_to_apply(run, 99)
    assert row_to_apply(run, 5).settings == {"n_batch": 256, "n_ubatch": 128}


def test_a_run_made_by_0_1_0_resumes_and_keeps_its_measurements(tmp_path: Path) -> None:
    run = old_run(tmp_path)
    before = build_leaderboard(open_optuna_study_readonly(RunDirectory(run)))
    resumed = run_tuner(
        "run", str(DEMO), "--runs-dir", str(tmp_path), "--set", "budget.trials=6", "--set", "confirm.top=0"
    )
    assert resumed.returncode == 0, resumed.stderr
    study = open_optuna_study_readonly(RunDirectory(run))
    after = build_leaderboard(study)
    old = {row.number: row for row in before.rows}
    assert len(after.rows) == len(before.rows) + 1
    for row in after.rows:
        if row.number in old:
            assert row == old[row.number], f"trial {row.number} reads differently after the resume"
    # The 0.1.0 confirmation is still the evidence of the recommendation; the study's record now holds it.
    assert after.recommendation.message == before.recommendation.message
    assert 3 in StudyRecord.of(study).confirmations and RECORD_KEY in study.user_attrs
    (new,) = [t for t in study.get_trials() if t.number not in old and TrialRecord.of(t).deployed]
    assert set(new.user_attrs) == {RECORD_KEY}, "a new trial stores its record under one key"


def test_a_record_from_a_newer_serve_tuner_is_refused_with_one_line(tmp_path: Path) -> None:
    run = tmp_path / "newer"
    with RunDirectory(run) as run_dir:
        study = optuna.create_study(study_name="newer", storage=run_dir.storage())
        newer = TrialRecord(baseline=True, deployed=True).stored() | {"version": RECORD_VERSION + 1}
        study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={RECORD_KEY: newer}))
    shown = run_tuner("leaderboard", str(run))
    assert shown.returncode == 1 and shown.stdout == ""
    assert shown.stderr.strip().splitlines() == [
        f"error: trial 0 was stored by a newer serve-tuner (record version {RECORD_VERSION + 1}, this one reads "
        f"{RECORD_VERSION}); upgrade serve-tuner to open this run"
    ]


def test_a_record_holding_a_sequential_confirmation_asks_the_version_before_for_an_upgrade_not_as_damaged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tuner import study_record
    from tuner.study_record import Confirmation

    confirmation = Confirmation(differences=[0.4, 0.5], mean=0.45, ci=[0.2, 0.7], planned_pairs=4, stopped="above")
    stored = StudyRecord(confirmations={3: confirmation}).stored()
    study = optuna.create_study()
    study.set_user_attr(RECORD_KEY, stored)
    assert StudyRecord.of(study).confirmations[3] == confirmation
    monkeypatch.setattr(study_record, "RECORD_VERSION", 2)  # the reader of the version before it
    with pytest.raises(StudyError, match=r"stored by a newer serve-tuner \(record version 4, this one reads 2\)"):
        StudyRecord.of(study)


def test_a_trial_the_prediction_queued_asks_the_version_before_for_an_upgrade_not_as_damaged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tuner import study_record

    study = optuna.create_study()
    study.enqueue_trial({}, user_attrs=new_trial_attrs(TrialRecord(settings={"n_batch": 64}, predicted=True)))
    (trial,) = study.get_trials()
    assert TrialRecord.of(trial).predicted
    monkeypatch.setattr(study_record, "RECORD_VERSION", 3)  # the reader of the version before it
    with pytest.raises(StudyError, match=r"stored by a newer serve-tuner \(record version 4, this one reads 3\)"):
        TrialRecord.of(trial)


def test_a_damaged_record_is_refused_naming_the_field(tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    with RunDirectory(run) as run_dir:
        study = optuna.create_study(study_name="damaged", storage=run_dir.storage())
        damaged = TrialRecord(deployed=True).stored() | {"score": "high"}
        study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={RECORD_KEY: damaged}))
    shown = run_tuner("leaderboard", str(run))
    assert shown.returncode == 1
    (line,) = shown.stderr.strip().splitlines()
    assert line.startswith(f"error: trial 0: the stored {RECORD_KEY!r} record is damaged (score: ")
    assert "optuna.journal was changed by something other than serve-tuner" in line


def test_an_update_rewrites_the_one_key_and_keeps_an_infinite_score() -> None:
    study = optuna.create_study()
    study.enqueue_trial({}, user_attrs=new_trial_attrs(TrialRecord(baseline=True)))
    trial = study.ask()
    update_trial_record(trial, deployed=True, settings={"n_batch": 64})
    update_trial_record(trial, score=-math.inf, round_scores=[-math.inf])
    study.tell(trial, 0.0)
    (stored,) = study.get_trials()
    assert set(stored.user_attrs) == {RECORD_KEY}
    record = TrialRecord.of(stored)
    assert record.baseline and record.deployed and record.settings == {"n_batch": 64}
    assert record.score == -math.inf
    json.dumps(stored.user_attrs)  # what a journal line holds


def test_an_update_that_breaks_the_record_raises_before_anything_is_stored() -> None:
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(ValueError, match="invalid TrialRecord update: saved_s"):
        update_trial_record(trial, saved_s="a while")
    assert trial.user_attrs == {}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished simulated study in today's format: the baseline and one trial. Made once a session, however
    many workers take this module's tests (each copies it before it changes it)."""
    import fcntl
    import os

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's, above each worker's own
    runs = shared / "small-run"
    with (shared / "small-run.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker makes it, the others wait for it
        if not (runs / "made").exists():
            done = run_tuner("run", str(DEMO), "--runs-dir", str(runs), "--set", "budget.trials=1",
                             "--set", "confirm.top=0")  # fmt: skip
            assert done.returncode == 0, done.stderr
            (runs / "made").touch()
    return runs / "stall-demo-simulated"


def edit_last_record(journal: Path, trial_id: int, edit: Callable[[dict[str, Any]], object]) -> None:
    """Hand-edits the last record the journal stored for a trial, as a user with an editor could."""
    lines = journal.read_text().splitlines()
    index = max(
        i
        for i, line in enumerate(lines)
        if json.loads(line).get("trial_id") == trial_id and RECORD_KEY in json.loads(line).get("user_attr", {})
    )
    entry = json.loads(lines[index])
    entry["user_attr"][RECORD_KEY] = edit(entry["user_attr"][RECORD_KEY])
    lines[index] = json.dumps(entry)
    journal.write_text("\n".join(lines) + "\n")


HAND_EDITS: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "a score as text": (lambda r: r | {"score": "1.5"}, "(score: Input should be a valid number)"),
    "deployed as text": (lambda r: r | {"deployed": "yes"}, "(deployed: Input should be a valid boolean)"),
    "deployed removed": (lambda r: {k: v for k, v in r.items() if k != "deployed"}, "(deployed: missing)"),
    "nothing but a version": (lambda r: {"version": 1}, ": missing)"),
    "the version as text": (lambda r: r | {"version": "2"}, "(version: Input should be a valid integer)"),
    "the version as a float": (lambda r: r | {"version": 2.0}, "(version: Input should be a valid integer)"),
    "version 0": (lambda r: r | {"version": 0}, "(version: Input should be greater than or equal to 1)"),
    "a key we never write": (lambda r: r | {"owner": "me"}, "(owner: Extra inputs are not permitted)"),
    "not an object": (lambda r: [1, 2], "(not an object but list)"),
}


@pytest.mark.parametrize("edit", HAND_EDITS, ids=list(HAND_EDITS))
def test_a_hand_edited_record_is_refused_naming_the_field(small_run: Path, tmp_path: Path, edit: str) -> None:
    run = tmp_path / "stall-demo-simulated"
    shutil.copytree(small_run, run)
    change, named = HAND_EDITS[edit]
    edit_last_record(run / "optuna.journal", 1, change)
    with pytest.raises(StudyError) as refused:
        build_leaderboard(open_optuna_study_readonly(RunDirectory(run)))
    assert str(refused.value).startswith(f"trial 1: the stored {RECORD_KEY!r} record is damaged ")
    assert named in str(refused.value) and "restore it from a backup, or move the run directory aside" in str(
        refused.value
    )


def test_a_resume_refused_for_a_damaged_record_writes_nothing(small_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "stall-demo-simulated"
    shutil.copytree(small_run, run)
    edit_last_record(run / "optuna.journal", 1, lambda r: {k: v for k, v in r.items() if k != "deployed"})
    before = {name: (run / name).read_bytes() for name in ("optuna.journal", "spec.json")}
    refused = run_tuner("run", str(DEMO), "--runs-dir", str(tmp_path), "--set", "budget.trials=2")
    assert refused.returncode == 1, refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: trial 1: the stored {RECORD_KEY!r} record is damaged (deployed: missing)")
    assert {name: (run / name).read_bytes() for name in before} == before, "the refused resume wrote to the run"


def test_apply_refuses_stored_settings_with_an_unknown_knob_in_one_line(small_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "stall-demo-simulated"
    shutil.copytree(small_run, run)
    edit_last_record(run / "optuna.journal", 1, lambda r: r | {"settings": r["settings"] | {"bogus": 1}})
    refused = run_tuner("apply", str(DEMO), "--runs-dir", str(tmp_path), "--trial", "1")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: trial 1 of {run}: unknown llama-server knob 'bogus'; valid: ")
    assert line.endswith("apply another trial with --trial N")
