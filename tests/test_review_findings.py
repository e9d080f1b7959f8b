"""Hostile input a fresh-clone review found after issue 13's fixes: each a one-line refusal with the
README's exit code, nothing overwritten, nothing created, and no read that never ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("what", ["fifo", "chardev"])
def test_a_study_or_workload_that_is_a_fifo_or_a_device_is_refused_instead_of_read_forever(
    what: str, tmp_path: Path
) -> None:
    special = tmp_path / "special"
    if what == "fifo":
        os.mkfifo(special)
    else:
        special = Path("/dev/zero")  # a read of it never ends
    for args, code in ((["run", str(special)], 2), (["workload", "show", str(special)], 2)):
        done = run_tuner(*args, cwd=tmp_path, timeout=120)  # a read that never ends is a hang
        assert done.returncode == code, done.stderr[-2000:]
        assert "not a" in one_error_line(done)


def test_a_study_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "deep.toml"
    study.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    done = run_tuner("run", str(study), cwd=tmp_path)
    assert done.returncode == 2 and "nested too deeply" in one_error_line(done)
    done = run_tuner("run", str(DATA / "tiny-study.toml"), "--set", "rounds=" + "[" * 5000, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    one_error_line(done)


def test_leaderboard_csv_never_overwrites_the_studys_own_files(tmp_path: Path) -> None:
    import optuna

    from tuner.runs import RunDirectory
    from tuner.study_record import TrialRecord, new_trial_attrs

    run = tmp_path / "tiny"
    with RunDirectory(run) as run_dir:
        optuna.create_study(storage=run_dir.storage(), study_name="tiny").add_trial(
            optuna.trial.create_trial(
                value=1.0, params={}, distributions={}, user_attrs=new_trial_attrs(TrialRecord(baseline=True))
            )
        )
    journal = (run / "optuna.journal").read_bytes()
    (run / "spec.json").write_text("{}\n")
    for name in ("optuna.journal", "spec.json"):
        before = (run / name).read_bytes()
        done = run_tuner("leaderboard", str(run), "--csv", str(run / name), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is the input" in one_error_line(done)
        assert done.stdout.strip() == "", "refused only after the leaderboard was shown"
        assert (run / name).read_bytes() == before
    assert (run / "optuna.journal").read_bytes() == journal


def test_record_checks_an_out_in_a_missing_directory_without_creating_it(tmp_path: Path) -> None:
    from tuner.files import check_writable

    out = tmp_path / "missing" / "deeper" / "rec.jsonl"
    assert check_writable(out) == out
    assert not (tmp_path / "missing").exists(), "a check made directories"
