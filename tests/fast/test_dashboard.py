"""optuna-dashboard opens a run's journal (docs/report.md's command) and shows the study Optuna reads from it,
while it reads the journal only: a run resumed meanwhile goes on, and the dashboard sees its new trials."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from tests.support import free_port
from tests.support.sim_study import prepare_simulated, run_simulated

DASHBOARD = Path(sys.executable).parent / "optuna-dashboard"  # the console script of the `dashboard` extra


@contextmanager
def _dashboard(journal: Path, log: Path) -> Iterator[httpx.Client]:
    """`optuna-dashboard <journal>` on a loopback port, once it answers; stopped on exit."""
    if not DASHBOARD.exists():
        pytest.fail(f"{DASHBOARD} is missing: install the dev or dashboard extra (pip install -e '.[dashboard]')")
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(DASHBOARD), str(journal), "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/api/meta").status_code == 200:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                if process.poll() is not None:
                    pytest.fail(f"optuna-dashboard exited ({process.returncode}): {log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"optuna-dashboard did not answer within 60 s: {log.read_text()[-2000:]}")
                time.sleep(0.1)
            yield client
    finally:
        process.terminate()
        process.wait(timeout=10)


def _get(client: httpx.Client, path: str) -> Any:
    response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def _shown(client: httpx.Client) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dashboard's one study: its entry in the study list, and its detail with every trial."""
    (summary,) = _get(client, "/api/studies")["study_summaries"]
    return summary, _get(client, f"/api/studies/{summary['study_id']}")


def _values(trial: FrozenTrial) -> list[float | str] | None:
    """A trial's values as the dashboard serializes them (an infinity as "inf" or "-inf")."""
    if trial.values is None:
        return None
    return [v if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in trial.values]


def _as_optuna_reads(journal: Path) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(journal)))
    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


def _assert_shows(client: httpx.Client, journal: Path) -> optuna.Study:
    """Name, trials (number, state, values) and best value as the dashboard serves them equal Optuna's."""
    study = _as_optuna_reads(journal)
    summary, detail = _shown(client)
    assert summary["study_name"] == detail["name"] == study.study_name
    assert summary["directions"] == detail["directions"] == ["maximize"]
    trials = study.get_trials(deepcopy=False)
    assert len(detail["trials"]) == len(trials)
    assert [(t["number"], t["state"].upper(), t.get("values")) for t in detail["trials"]] == [
        (t.number, t.state.name, _values(t)) for t in trials
    ]
    (best,) = detail["best_trials"]
    assert best["values"] == [study.best_value] and best["number"] == study.best_trial.number
    return study


def test_the_dashboard_shows_a_run_s_study_and_only_reads_its_journal(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "stall-demo"
    first = run_simulated(prepare_simulated(), run, seed=3, in_memory=False)
    journal, before = run / "optuna.journal", len(first.study.trials)
    written = journal.read_bytes()
    with _dashboard(journal, tmp_path / "dashboard.log") as client:
        study = _assert_shows(client, journal)
        assert len(study.trials) == before and study.best_value == first.study.best_value
        assert journal.read_bytes() == written  # it wrote nothing, and took no Optuna lock
        assert not journal.with_name("optuna.journal.lock").exists()

        # The run resumed with a larger budget while the dashboard is open: our lock is free to take, the
        # trials are added, and the dashboard shows them on its next read.
        resumed = run_simulated(prepare_simulated([f"budget.trials={before + 2}"]), run, seed=3, in_memory=False)
        assert len(resumed.study.trials) > before
        written = journal.read_bytes()
        # It keeps a study's trials for 2 s (under 100 trials; up to 10 s for more) before reading them anew.
        deadline = time.monotonic() + 30
        while len(_shown(client)[1]["trials"]) < len(resumed.study.trials):
            assert time.monotonic() < deadline, "the dashboard did not show the resumed run's trials within 30 s"
            time.sleep(0.2)
        assert len(_assert_shows(client, journal).trials) == len(resumed.study.trials)
        assert journal.read_bytes() == written
    assert [t.state for t in _as_optuna_reads(journal).trials].count(TrialState.COMPLETE) >= 2


def test_the_dashboard_s_best_trial_ignores_the_study_s_constraints(tmp_path: Path) -> None:
    """Its best trial is Optuna's storage's highest score, feasible or not; Optuna's `best_trial` (and the
    leaderboard) take only feasible trials. docs/report.md warns of it: the recommendation is the leaderboard's."""
    constrained = prepare_simulated(['constraints=[{metric="prefill_tok_s", min_vs_baseline=1.0}]'])
    run = tmp_path / "runs" / "stall-demo"
    study = run_simulated(constrained, run, seed=0, in_memory=False).study
    highest = max((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
    assert highest.number != study.best_trial.number  # this seed's highest score breaks the constraint
    with _dashboard(run / "optuna.journal", tmp_path / "dashboard.log") as client:
        (best,) = _shown(client)[1]["best_trials"]
    assert best["number"] == highest.number
