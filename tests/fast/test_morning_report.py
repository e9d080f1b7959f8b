"""The morning report (`tuner report`), read as a user reads it: the verdict first, the leaderboard's
numbers, the stall picture, and nothing from any other host. The runs are made by the study's own loop on
the simulated server (tests/support/sim_study.py), with their round files kept as a real run keeps them; the
real-browser check of a real run is in tests/real/test_report_browser.py."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from tests.support import one_error_line, run_tuner
from tests.support.sim_study import ROOT, prepare_simulated, run_simulated
from tuner.morning_report import REPORT_NAME, ReportWriter, render_report
from tuner.progress import Plan, ProgressTracker
from tuner.progress_file import PROGRESS_FILE
from tuner.redact import remember_secret
from tuner.report import Leaderboard, build_leaderboard
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly
from tuner.study_record import TrialRecord, new_trial_attrs

OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "runs" / "made-by-0.1.0"


class _Page(HTMLParser):
    """The report's leaderboard cells, figures and visible text, as a browser would lay them out."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: dict[int, list[dict[str, str | None]]] = {}
        self.figures: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.ids: dict[str, str] = {}
        self._row: int | None = None
        self._table: str | None = None
        self._capture: str | None = None
        self._skip = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "table":
            self._table = found.get("id")
        if tag == "tr" and found.get("data-trial") is not None and self._table == "leaderboard":
            self._row = int(str(found["data-trial"]))
            self.rows[self._row] = []
        if tag == "td" and self._row is not None:
            self.rows[self._row].append(found)
        if tag == "figure":
            self.figures.append(found)
        if found.get("id") and tag == "p":
            self._capture = str(found["id"])
            self.ids[self._capture] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1
        if tag == "tr":
            self._row = None
        if tag == "table":
            self._table = None
        if tag == "p":
            self._capture = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        if self._capture is not None:
            self.ids[self._capture] += data

    @property
    def visible(self) -> str:
        return " ".join(" ".join(self.text).split())


@pytest.fixture(scope="module")
def simulated_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Leaderboard]:
    run_path = tmp_path_factory.mktemp("runs") / "stall-demo"
    run_simulated(prepare_simulated(), run_path, seed=3, in_memory=False, save_rounds=True)
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(run_path)))
    assert board.recommendation.row is not None, board.recommendation.message
    return run_path, board


def test_the_first_thing_the_report_says_is_what_to_change_and_what_it_buys(
    simulated_run: tuple[Path, Leaderboard],
) -> None:
    run_path, board = simulated_run
    page = render_report(run_path)
    visible = _Page(page).visible
    chosen = board.recommendation.row
    assert chosen is not None
    change = ", ".join(f"{k} = {v}" for k, v in sorted(chosen.changed.items()))
    verdict = visible.index("The verdict")
    assert visible.index(f"Change {change}.") < visible.index("Leaderboard"), "the verdict is not first"
    assert verdict < visible.index("What it buys") < visible.index("The change to apply")
    # What it buys, in user terms, from the leaderboard's medians: baseline -> recommended.
    baseline = next(r for r in board.rows if r.baseline)
    stall_before, stall_after = baseline.metrics["stall_tok_s"][0], chosen.metrics["stall_tok_s"][0]
    terms = visible[visible.index("What it buys") :]
    shown = re.search(r"streaming user's speed .*? ([\d.,]+) tok/s ([\d.,]+) tok/s", terms)
    assert shown is not None, terms
    assert float(shown[1].replace(",", "")) == pytest.approx(stall_before, rel=0.01)
    assert float(shown[2].replace(",", "")) == pytest.approx(stall_after, rel=0.01)
    # The exact change: the llama-server variables of the changed knobs, and the apply command.
    for name, value in chosen.changed.items():
        env = {"n_batch": "LLAMA_ARG_BATCH", "n_ubatch": "LLAMA_ARG_UBATCH"}[name]
        assert f"{env}={value}" in visible
    assert "set these where the server is started" in visible  # the demo runs the server as a process
    assert _Page(page).ids["recommendation"] == board.recommendation.message


def test_the_leaderboard_in_the_page_has_the_leaderboards_numbers_and_flags(
    simulated_run: tuple[Path, Leaderboard],
) -> None:
    run_path, board = simulated_run
    page = _Page(render_report(run_path))
    assert list(page.rows) == [r.number for r in board.rows], "rows missing or out of the leaderboard's order"
    for row in board.rows:
        cells = page.rows[row.number]
        assert cells[0]["data-value"] == str(row.number)
        if row.score is None:
            assert cells[2]["data-value"] == ""
        else:
            assert float(str(cells[2]["data-value"])) == pytest.approx(row.score, rel=1e-5)
        shown = {str(c["data-metric"]): float(str(c["data-value"])) for c in cells if c.get("data-metric")}
        assert shown, f"trial {row.number} shows no metric"
        for metric, value in shown.items():
            assert value == pytest.approx(row.metrics[metric][0], rel=1e-5), (row.number, metric)
    visible = page.visible
    for row in board.rows:
        if row.state == "PRUNED":
            assert "pruned" in visible and (row.reason or "") in visible
        for violation in row.violates:
            assert violation in visible
        if row.noisy:
            assert f"rounds differ by 20%+ on {', '.join(row.noisy)}" in visible
    assert "recommended" in visible


def test_the_stall_picture_shows_the_stream_stopping_under_the_baseline_and_flowing_under_the_winner(
    simulated_run: tuple[Path, Leaderboard],
) -> None:
    run_path = simulated_run[0]
    page = _Page(render_report(run_path))
    baseline_figure, chosen_figure = page.figures[:2]
    # The demo's mechanism: a large n_batch packs the long prompt beside one decode token per step.
    assert float(str(chosen_figure["data-rate-during"])) > 2 * float(str(baseline_figure["data-rate-during"]))
    assert float(str(baseline_figure["data-longest-gap"])) > float(str(chosen_figure["data-longest-gap"]))
    visible = page.visible
    assert re.search(r"baseline \(round-\d\): [\d.]+ tok/s while \S+'s \d+-token prompt was prefilled", visible)


def test_the_page_asks_nothing_of_any_other_host(simulated_run: tuple[Path, Leaderboard]) -> None:
    page = render_report(simulated_run[0])
    # The one URL is SVG's namespace, an identifier no browser fetches.
    assert set(re.findall(r"(?:https?:)?//[\w.-]+", page)) == {"http://www.w3.org"}
    assert not re.search(r"<(?:link|img|iframe|object|embed)\b", page)
    assert not re.search(r"<script[^>]+src=", page)
    assert "default-src 'none'" in page  # the browser enforces it too


def test_a_report_of_a_run_made_by_serve_tuner_0_1_0_shows_what_it_lacks_as_absent(tmp_path: Path) -> None:
    run_path = tmp_path / "old"
    shutil.copytree(OLD_RUN, run_path)
    page = _Page(render_report(run_path))
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(run_path)))
    assert list(page.rows) == [r.number for r in board.rows]
    assert "absent: no round file of this trial" in page.visible


def test_text_from_the_server_and_the_study_is_shown_as_text_and_secrets_are_not(
    simulated_run: tuple[Path, Leaderboard], tmp_path: Path
) -> None:
    run_path = tmp_path / "hostile"
    shutil.copytree(simulated_run[0], run_path)
    study = optuna.load_study(study_name=None, storage=RunDirectory(run_path).storage())
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            params={},
            distributions={},
            user_attrs=new_trial_attrs(
                TrialRecord(deployed=True, settings={"n_batch": 8}, fail_reason="<script>alert(1)</script> &amp;")
            ),
        )
    )
    spec = json.loads((run_path / "spec.json").read_text())
    remember_secret("sk-very-secret-value-1234")
    spec["description"] = "<img src=x onerror=alert(2)>"
    spec["workload"]["time_scale"] = "<img src=y onerror=alert(3)>"  # every shown value, not only the text ones
    spec["engine"]["api_key"] = "sk-very-secret-value-1234"
    spec["engine"]["extra_args"] = ["--api-key", "hunter2-plain", "--hf-token=hf-plain", "--threads", "2"]
    spec["host"]["proxy"] = "http://admin:pw-plain@proxy.example:3128"
    (run_path / "spec.json").write_text(json.dumps(spec))
    page = render_report(run_path)
    assert "<script>alert" not in page and "<img" not in page
    visible = _Page(page).visible
    assert "<script>alert(1)</script> &amp;" in visible, "the server's text is not shown as it was"
    assert "<img src=x onerror=alert(2)>" in visible
    assert "sk-very-secret-value-1234" not in page
    for plain in ("hunter2-plain", "hf-plain", "pw-plain"):
        assert plain not in page, plain
    assert "--threads" in page and "&quot;2&quot;" in page  # what is not a secret stays


def test_tuner_report_writes_the_page_and_refuses_an_output_that_would_lose_something(
    simulated_run: tuple[Path, Leaderboard], tmp_path: Path
) -> None:
    run_path = tmp_path / "run"
    shutil.copytree(simulated_run[0], run_path)
    result = run_tuner("report", str(run_path))
    assert result.returncode == 0, result.stderr
    assert (run_path / REPORT_NAME).read_text().startswith("<!doctype html>")
    journal = (run_path / "optuna.journal").read_bytes()

    result = run_tuner("report", str(run_path), "--out", str(run_path / "optuna.journal"))
    assert result.returncode == 2
    assert "optuna.journal" in one_error_line(result)
    assert (run_path / "optuna.journal").read_bytes() == journal

    evidence = run_path / "trials" / "0000" / "round-1.jsonl"
    kept = evidence.read_bytes()
    result = run_tuner("report", str(run_path), "--out", str(evidence))
    assert result.returncode == 2
    assert "inside the run directory" in one_error_line(result)
    assert evidence.read_bytes() == kept

    result = run_tuner("report", str(run_path), "--out", str(tmp_path / "missing" / "r.html"))
    assert result.returncode == 2
    assert "does not exist" in one_error_line(result)
    assert not (tmp_path / "missing").exists()

    result = run_tuner("report", str(tmp_path / "nothing-here"))
    assert result.returncode == 2
    assert "holds no study" in one_error_line(result)


def test_a_run_rewrites_its_report_after_every_trial_and_goes_on_when_it_cannot(tmp_path: Path) -> None:
    run_path = tmp_path / "stall-demo"
    written: list[int] = []

    class Counting(ReportWriter):
        def write(self) -> None:
            super().write()
            if (run_path / REPORT_NAME).is_file():
                written.append(len(build_leaderboard(open_optuna_study_readonly(RunDirectory(run_path))).rows))

    run_simulated(
        prepare_simulated(["budget.trials=3"]),
        run_path,
        seed=1,
        in_memory=False,
        observer=Counting(run_path, say=pytest.fail),
    )
    assert len(written) >= 4 and written == sorted(written), "not rewritten after each trial"

    blocked = tmp_path / "blocked"
    said: list[str] = []
    (blocked / REPORT_NAME).mkdir(parents=True)  # the page cannot be written there
    board = run_simulated(
        prepare_simulated(["budget.trials=2"]),
        blocked,
        seed=1,
        in_memory=False,
        observer=ReportWriter(blocked, say=said.append),
    ).board
    assert board.recommendation.message  # the study ran to its end
    assert len(said) == 1 and "the report could not be written" in said[0] and "the run goes on" in said[0]


def test_the_run_section_says_where_the_nights_time_went_and_what_the_host_ran(
    simulated_run: tuple[Path, Leaderboard], tmp_path: Path
) -> None:
    run_path = tmp_path / "facts"
    shutil.copytree(simulated_run[0], run_path)
    visible = _Page(render_report(run_path)).visible
    assert "engine build absent: this run recorded no host facts" in visible
    rounds = [p for p in run_path.glob("trials/*/round-*.jsonl") if not p.name.endswith(".server.jsonl")]
    confirms = [p for p in run_path.glob("trials/*/confirm-*.jsonl") if not p.name.endswith(".server.jsonl")]
    assert rounds and confirms
    search = re.search(rf"measuring the search ([\d.]+) (s|min|h) in {len(rounds)} rounds", visible)
    confirm = re.search(rf"measuring confirmations ([\d.]+) (s|min|h) in {len(confirms)} measurements", visible)
    assert search is not None and confirm is not None, visible
    for shown, paths in ((search, rounds), (confirm, confirms)):
        unit = {"s": 1, "min": 60, "h": 3600}[shown[2]]
        assert abs(float(shown[1]) * unit - _seconds(paths)) <= unit / 2 + 1

    assert "split it by phase" in visible  # no progress file: the split is not guessed

    now = [100.0]
    tracker = ProgressTracker(
        Plan(budget_trials=5, budget_hours=None, rounds_per_trial=2, confirm_top=1, confirm_pairs=4),
        path=run_path / PROGRESS_FILE,
        clock=lambda: now[0],
    )
    tracker.study_started(name="stall-demo", run_dir=str(run_path), baseline_done=False, trials_done=0, budget=5)
    tracker.round_started(number=0, label="round 1/2", index=1, total=2)
    tracker.server_starting(number=0)
    now[0] += 4
    tracker.replay_started(number=0, label="round 1/2")
    now[0] += 20
    tracker.round_finished(number=0, label="round 1/2", metrics={}, failures=0)
    now[0] += 1
    tracker.study_ended(outcome="finished")
    visible = _Page(render_report(run_path)).visible
    assert "time by phase 25 s counted while `tuner run` ran" in visible
    assert "phase: stopping and starting the server 4 s (16%)" in visible
    assert "phase: replaying the workload 20 s (80%)" in visible

    (run_path / "host.json").write_text(
        json.dumps({"engine": "llama-server", "engine_build": "b11434-0123abc", "host": "Linux 6.1.0 x86_64"})
    )
    visible = _Page(render_report(run_path)).visible
    assert "engine build b11434-0123abc" in visible and "host system Linux 6.1.0 x86_64" in visible


def _seconds(paths: list[Path]) -> float:
    total = 0.0
    for path in paths:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        total += max(r["end_s"] for r in records) - min(r["send_s"] for r in records)
    return total


def test_each_trial_comes_with_what_its_server_log_says_its_settings_did(tmp_path: Path) -> None:
    """The LoRA demo on the simulated server: the baseline's requests wait behind another adapter setting
    (`tuner diagnose`'s waits, from the trial's own server.log), and the report says so beside its score."""
    run_path = tmp_path / "lora-demo"
    run_simulated(
        prepare_simulated(study_file=ROOT / "studies" / "lora-demo.toml"),
        run_path,
        seed=1,
        in_memory=False,
        save_rounds=True,
    )
    page = render_report(run_path)
    rows = dict(re.findall(r"<tr class='[^']*' data-trial='(\d+)'>(.*?)</tr>", page))
    baseline_flags = _Page(rows["0"]).visible
    assert re.search(r"its log \d+ requests? waited more than [\d.]+ s before their prefill began", baseline_flags)
    assert "behind another LoRA setting" in baseline_flags
    (run_path / "trials" / "0000" / "server.log").unlink()  # no log, no reason: nothing is made up
    rows = dict(re.findall(r"<tr class='[^']*' data-trial='(\d+)'>(.*?)</tr>", render_report(run_path)))
    assert "its log" not in rows["0"]


def test_a_run_whose_final_report_cannot_be_written_still_ends_as_the_run_did(tmp_path: Path) -> None:
    (tmp_path / "stall-demo-simulated" / REPORT_NAME).mkdir(parents=True)
    result = run_tuner(
        "run",
        str(ROOT / "studies" / "stall-demo-simulated.toml"),
        "--runs-dir",
        str(tmp_path),
        "--set",
        "budget.trials=1",
        "--set",
        "confirm.top=0",
    )
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert out.count("the report could not be written") == 1 and "the run goes on" in out
    assert "this run took" in out and "the report in" not in out


def test_an_ollama_change_is_said_in_ollamas_own_terms() -> None:
    from tuner.engines.base import request_setting_advice
    from tuner.engines.ollama import OLLAMA_KNOBS
    from tuner.morning_report.compute import Change
    from tuner.morning_report.render import _apply_parts

    change = Change(
        env=[("OLLAMA_NUM_PARALLEL", "8")],
        flags=[],
        request={"num_batch": 128},
        request_advice=request_setting_advice(OLLAMA_KNOBS, {"num_batch": 128}),
        server=True,
        deploy_kind="process",
        unit="UNIT.service",
        command="ollama serve",
    )
    page = "".join(_apply_parts(change))
    assert "OLLAMA_NUM_PARALLEL=8 ollama serve" in page and "llama-server" not in page
    assert "num_batch=128: PARAMETER num_batch 128 in the model&#x27;s Modelfile, then `ollama create` it" in page
