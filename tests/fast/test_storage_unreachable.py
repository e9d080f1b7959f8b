"""A shared storage (PostgreSQL URL) that does not answer: one line, without the URL's password, and
nothing written."""

from __future__ import annotations

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
