"""P14: a study survives a full disk. A journal whose last line a full disk tore is repaired by the next
run (the torn bytes moved aside into a file it names); the leaderboard reads it as it is, without
changing it; a journal that is binary or damaged elsewhere is one line naming the file and the way back.

The journals are written by real Optuna studies on the project's own storage (`RunDirectory.storage`),
trials asked and told the way a study run does it; no server is needed. The tear made by a real full disk (a
small tmpfs, which needs root to mount) is in tests/real/test_devices_owners_and_full_disks.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from tests.support import one_error_line, run_tuner
from tuner.errors import StudyError
from tuner.runs import RunDirectory
from tuner.study_record import update_study_record, update_trial_record

ROUNDS = [{"stall_tok_s": 1.0, "prefill_tok_s": 200.0}, {"stall_tok_s": 1.1, "prefill_tok_s": 190.0}]


def measure(study: optuna.Study, n_batch: int, score: float, *, baseline: bool = False) -> None:
    """One trial as the study loop records it: asked, its attributes set, told."""
    trial = study.ask({"n_batch": optuna.distributions.IntDistribution(1, 4096)})
    trial.suggest_int("n_batch", 1, 4096)  # the fixed distribution already holds it; this logs the param
    update_trial_record(
        trial,
        deployed=True,
        baseline=baseline,
        settings={"n_batch": n_batch},
        score=score,
        round_scores=[score - 0.01, score + 0.01],
        rounds=ROUNDS,
    )
    study.tell(trial, score)


def make_study(path: Path) -> bytes:
    """A run directory holding a baseline and two measured trials; returns its journal's bytes."""
    with RunDirectory(path) as run_dir:
        study = optuna.create_study(study_name="torn", storage=run_dir.storage(), direction="maximize")
        update_study_record(study, min_effect=0.1)
        study.enqueue_trial({"n_batch": 2048})
        measure(study, 2048, 0.0, baseline=True)
        study.enqueue_trial({"n_batch": 256})
        measure(study, 256, 0.4)
        study.enqueue_trial({"n_batch": 64})
        measure(study, 64, 0.9)  # its last record, the tell, is the one the tests tear
    return run_dir.journal.read_bytes()


def completed(run_dir: RunDirectory) -> list[tuple[int, dict[str, object]]]:
    study = optuna.load_study(study_name="torn", storage=run_dir.storage())
    return [(t.number, t.params) for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return make_study(tmp_path_factory.mktemp("study") / "torn")


def test_a_journal_torn_at_any_byte_of_its_last_record_is_repaired_and_the_study_goes_on(
    journal: bytes, tmp_path: Path
) -> None:
    whole, last = journal[: journal.rstrip(b"\n").rfind(b"\n") + 1], journal[journal.rstrip(b"\n").rfind(b"\n") + 1 :]
    assert last.endswith(b"\n") and b'"op_code":6' in last  # the last trial's tell
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "optuna.journal").write_bytes(whole)
    expected = completed(RunDirectory(reference, notice=pytest.fail))
    assert [number for number, _ in expected] == [0, 1]  # trial 2 was told in the record that is torn
    for cut in range(1, len(last)):  # every torn length, down to the whole record without its newline
        run = tmp_path / f"cut-{cut}"
        run.mkdir()
        (run / "optuna.journal").write_bytes(whole + last[:cut])
        notices: list[str] = []
        with RunDirectory(run, notice=notices.append) as run_dir:
            assert len(notices) == 1, (cut, notices)
            aside = [p for p in run.iterdir() if p.name.startswith("optuna.journal.torn-")]
            assert len(aside) == 1 and aside[0].read_bytes() == last[:cut], cut
            assert str(aside[0]) in notices[0] and "moved aside" in notices[0]
            assert run_dir.journal.read_bytes() == whole, cut
            assert completed(run_dir) == expected, cut
            study = optuna.load_study(study_name="torn", storage=run_dir.storage())
            study.enqueue_trial({"n_batch": 128})
            measure(study, 128, 0.5)  # the study goes on, appending after the last whole record
        again = completed(RunDirectory(run, notice=pytest.fail))
        assert [params for _, params in again] == [p for _, p in expected] + [{"n_batch": 128}], cut


def test_the_leaderboard_reads_a_torn_journal_as_it_is_and_changes_nothing(journal: bytes, tmp_path: Path) -> None:
    """The leaderboard may run beside a controller whose append is in flight: it only reads."""
    run = tmp_path / "torn"
    run.mkdir()
    torn = journal[:-20]
    (run / "optuna.journal").write_bytes(torn)
    result = run_tuner("leaderboard", str(run))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"note: the last record of {run / 'optuna.journal'} is incomplete (a full disk?); the study is read "
        "without it, and the next `tuner run` moves it aside"
    ]
    assert "n_batch=256" in result.stdout and "baseline" in result.stdout  # every trial completed before the tear
    assert "n_batch=64" not in result.stdout  # the trial whose tell was torn is not shown as measured
    assert (run / "optuna.journal").read_bytes() == torn
    assert sorted(p.name for p in run.iterdir()) == ["optuna.journal"]


@pytest.mark.parametrize(
    ("what", "content", "expected"),
    [
        ("binary", b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage\n", "is not an Optuna journal (line 1)"),
        ("unknown op", b'{"op_code":0,"worker_id":"w","study_name":"x","directions":[1]}\n{"op_code":99}\n', "line 2"),
    ],
)
def test_a_journal_that_is_not_optunas_is_one_line_naming_it_and_the_way_back(
    what: str, content: bytes, expected: str, tmp_path: Path
) -> None:
    run = tmp_path / "bad"
    run.mkdir()
    (run / "optuna.journal").write_bytes(content)
    line = one_error_line(run_tuner("leaderboard", str(run)))
    assert expected in line and str(run / "optuna.journal") in line and f"move {run} aside" in line, line
    with pytest.raises(StudyError, match=r"optuna\.journal") as refused, RunDirectory(run, notice=pytest.fail):
        pass
    assert refused.value.exit_code == 1
    assert (run / "optuna.journal").read_bytes() == content  # nothing is "repaired" that cannot be


def test_a_journal_damaged_mid_way_names_the_line_and_the_way_back_works(journal: bytes, tmp_path: Path) -> None:
    """What earlier versions left: the next run's record appended right after a torn fragment."""
    lines = journal.splitlines(keepends=True)
    damaged = b"".join(lines[:-1]) + lines[-1][:15] + lines[-1]
    run = tmp_path / "damaged"
    run.mkdir()
    (run / "optuna.journal").write_bytes(damaged)
    result = run_tuner("leaderboard", str(run))
    assert result.returncode == 1
    line = one_error_line(result)
    number = len(lines)
    assert f"damaged at line {number}" in line, line
    fix = line.split("`")[1]  # the command the line gives, run as the user would
    assert fix.startswith(f"head -n {number - 1} ")
    subprocess.run(["sh", "-c", fix], check=True, timeout=30)
    assert completed(RunDirectory(run, notice=pytest.fail)) == [(0, {"n_batch": 2048}), (1, {"n_batch": 256})]


def test_an_unreadable_journal_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "unreadable"
    (run / "optuna.journal").mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(StudyError, match=r"cannot read .*optuna.journal: Is a directory; restore it"):
        RunDirectory(run).storage()


def test_a_binary_spec_json_on_resume_is_one_line_naming_it(journal: bytes, tmp_path: Path) -> None:
    run = tmp_path / "spec"
    run.mkdir()
    (run / "optuna.journal").write_bytes(journal)
    (run / "spec.json").write_bytes(b"\x00\xff\xfe\x00")
    with RunDirectory(run) as run_dir, pytest.raises(StudyError, match=r"spec.json is unreadable") as refused:
        run_dir.check_spec({"name": "torn"}, measured=True)
    assert refused.value.exit_code == 1


def test_optunas_lock_left_by_a_controller_killed_mid_append_is_cleared_by_the_next_run(
    journal: bytes, tmp_path: Path
) -> None:
    """Killed between taking Optuna's journal lock (a symlink beside the journal) and releasing it, a
    controller leaves the lock behind; every append of the next run would wait out Optuna's 30 s grace
    period for it. The next run holds the run directory's lock, so the journal's is stale: it goes."""
    run = tmp_path / "locked"
    run.mkdir()
    (run / "optuna.journal").write_bytes(journal)
    optuna_lock = run / "optuna.journal.lock"
    optuna_lock.symlink_to(run / "optuna.journal")  # what JournalFileSymlinkLock.acquire makes
    with RunDirectory(run, notice=pytest.fail) as run_dir:
        assert not optuna_lock.is_symlink() and not optuna_lock.exists()
        study = optuna.load_study(study_name="torn", storage=run_dir.storage())
        study.enqueue_trial({"n_batch": 32})
        measure(study, 32, 0.3)
    assert [p["n_batch"] for _, p in completed(RunDirectory(run, notice=pytest.fail))][-1] == 32
