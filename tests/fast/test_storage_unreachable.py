"""A shared storage (PostgreSQL URL) that does not answer: one line, without the URL's password, and
nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import ROOT, run_tuner

SIMULATED = ROOT / "studies" / "stall-demo-simulated.toml"
PASSWORD = "pw-never-shown-7731"


def test_a_storage_that_does_not_answer_is_one_line_without_the_password_and_nothing_written(tmp_path: Path) -> None:
    """No PostgreSQL needed: a closed port on loopback."""
    url = f"postgresql://tuner:{PASSWORD}@127.0.0.1:9/tuner"
    result = run_tuner("run", str(SIMULATED), "--runs-dir", str(tmp_path / "runs"), "--storage", url, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot open the study's storage postgresql://tuner@127.0.0.1:9/tuner" in lines[0]
    assert PASSWORD not in result.stderr + result.stdout
    assert not (tmp_path / "runs" / "stall-demo-simulated" / "spec.json").exists()
    bad = run_tuner("run", str(SIMULATED), "--runs-dir", str(tmp_path / "r2"), "--storage", "nope", cwd=ROOT)
    assert bad.returncode == 2 and "storage.url is not a database URL" in bad.stderr


def test_a_storage_url_of_no_known_database_or_an_empty_one_is_a_bad_value_exit_2(tmp_path: Path) -> None:
    # A wrong URL is the user's to fix (2), not a database that failed to answer (1); an empty one is not absent.
    run = tmp_path / "stall-demo-simulated"
    shutil.copytree(ROOT / "tests" / "data" / "runs" / "made-by-0.1.0", run)
    unknown = run_tuner("leaderboard", str(run), "--storage", "garbage://x", cwd=ROOT)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip() == (
        "error: storage.url garbage://x names no database SQLAlchemy knows (garbage); give one, "
        "e.g. postgresql://tuner@db.example:5432/tuner"
    )
    for command in ("leaderboard", "status"):
        empty = run_tuner(command, str(run), "--storage", "", cwd=ROOT)
        assert empty.returncode == 2 and "--storage: an empty URL" in empty.stderr, empty.stderr
