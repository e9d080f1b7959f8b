"""The commands that only read a run directory (`tuner report`, `leaderboard`, `status`, and `tuner apply` up to
its choice of a trial) load neither the search loop nor the deployers: each runs in a process of its own on a
finished run, and the modules it imported are checked, as tests/fast/test_startup.py checks the light commands'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sim_study import DEMO, fleet_overrides, prepare_simulated, run_simulated, run_simulated_fleet
from tuner.morning_report import REPORT_NAME
from tuner.progress import Plan, ProgressTracker
from tuner.progress_file import PROGRESS_FILE

ROOT = Path(__file__).resolve().parents[2]

# The search loop (tuner/search/; tuner.study was its old name) and the deployers.
FORBIDDEN = ("tuner.study", "tuner.search", "tuner.deployers", "tuner.trial_runner")

# Runs `tuner.cli.main(ARGV)` for one JSON argument list; writes its exit code and the tuner modules it
# imported to stderr as the last line.
ONE = """
import json, sys
from tuner.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as stop:
    code = stop.code
sys.stderr.write("\\n" + json.dumps([code, sorted(m for m in sys.modules if m.split(".")[0] == "tuner")]) + "\\n")
"""


def imported_by(argv: list[str], cwd: Path) -> tuple[int, set[str], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", ONE, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=env,
    )
    code, modules = json.loads(result.stderr.splitlines()[-1])
    return code, set(modules), result.stdout + result.stderr


def loop_or_deployer(modules: set[str]) -> set[str]:
    return {m for m in modules if m in FORBIDDEN or m.startswith(tuple(f"{f}." for f in FORBIDDEN))}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated study run to its end as `tuner run` leaves it: round files, server logs, progress.json."""
    run_path = tmp_path_factory.mktemp("runs") / "stall-demo"
    prepared = prepare_simulated(["budget.trials=3"])
    tracker = ProgressTracker(Plan.of(prepared.spec), path=run_path / PROGRESS_FILE)
    run_simulated(prepared, run_path, seed=1, in_memory=False, save_rounds=True, observer=tracker)
    assert (run_path / PROGRESS_FILE).is_file() and list(run_path.glob("trials/*/server.log"))
    return run_path


def test_tuner_report_imports_neither_the_search_loop_nor_the_deployers(finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / REPORT_NAME
    code, modules, said = imported_by(["report", str(finished_run), "--out", str(out)], tmp_path)
    assert code == 0, said
    assert out.read_text().startswith("<!doctype html>")
    assert "tuner.morning_report.render" in modules  # the page was made in this process
    assert loop_or_deployer(modules) == set()


def test_tuner_leaderboard_imports_neither_the_search_loop_nor_the_deployers(
    finished_run: Path, tmp_path: Path
) -> None:
    code, modules, said = imported_by(["leaderboard", str(finished_run), "--json"], tmp_path)
    assert code == 0, said
    assert "tuner.report" in modules
    assert loop_or_deployer(modules) == set()


def test_tuner_apply_chooses_its_trial_without_the_search_loop_or_the_deployers(
    finished_run: Path, tmp_path: Path
) -> None:
    # A trial that did not complete is refused by the reading step, before any host is planned or reached.
    argv = ["apply", str(DEMO), "--runs-dir", str(finished_run.parent), "--trial", "99", "--set", "budget.trials=3"]
    code, modules, said = imported_by([*argv, "--set", 'engine.binary="simulated"'], tmp_path)
    assert code == 2, said
    assert "--trial 99: no trial has that number in" in " ".join(said.split())
    assert "tuner.apply" in modules and "tuner.report" in modules
    assert loop_or_deployer(modules) == set()


def test_tuner_status_imports_neither_the_search_loop_nor_the_deployers_nor_the_progress_writer(
    finished_run: Path, tmp_path: Path
) -> None:
    code, modules, said = imported_by(["status", str(finished_run)], tmp_path)
    assert code == 0, said
    assert "not running: finished" in " ".join(said.split())
    assert "tuner.status" in modules
    assert loop_or_deployer(modules) == set()
    assert "tuner.progress" not in modules  # the writer is `tuner run`'s; status reads the file alone


def test_tuner_status_of_a_fleets_run_imports_neither_the_search_loop_nor_the_deployers(tmp_path: Path) -> None:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    run_path = tmp_path / "fleet"
    run_path.mkdir()
    hosts = {"a": 1.0, "b": 1.5}
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(run_path / "optuna.journal")))
    prepared = prepare_simulated(["budget.trials=2", *fleet_overrides(list(hosts))])
    run_simulated_fleet(prepared, run_path, hosts=hosts, seed=3, storage=storage)
    (run_path / "spec.json").write_text(json.dumps({"hosts": [{"name": name} for name in hosts]}))
    code, modules, said = imported_by(["status", str(run_path)], tmp_path)
    assert code == 0, said
    assert "host a: baseline measured" in said and "host b: baseline measured" in said  # read from the storage
    assert "tuner.fleet" in modules
    assert loop_or_deployer(modules) == set()
