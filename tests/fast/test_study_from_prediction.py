"""A study that starts from a prediction (`search.predicted_from`, `tuner run --predicted-from LOG`): the
predicted best is the first trial after the baseline, once across resumes; the prediction is stored in the
run directory; the leaderboard sets each trial's predicted stall speed beside the measured one and says
whether the prediction held; a log the study cannot predict from is one line, before a run directory exists.
On the simulated llama-server (tests/support/sim_study.py), its log written by the same simulator."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest
from rich.console import Console

from tests.support import one_error_line, run_tuner
from tests.support.diagnose_logs import simulated_log, stall_requests
from tests.support.sim_study import DEMO, prepare_simulated, run_simulated
from tuner.console import render_leaderboard
from tuner.errors import ConfigError
from tuner.morning_report import render_report
from tuner.observers import NullObserver
from tuner.prediction_record import PredictionRecord, read_prediction
from tuner.report import build_leaderboard
from tuner.runs import RunDirectory
from tuner.search.prediction import study_prediction
from tuner.sim.inputs import SimSettings
from tuner.sim.log_lines import format_log_line, startup_lines
from tuner.study_record import TrialRecord
from tuner.study_view import StudyView

BUDGET = ["budget.trials=3", "confirm.pairs=2"]


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo server's log at its defaults (n_batch 2048): two streams beside a long prompt."""
    path = tmp_path_factory.mktemp("log") / "server.log"
    path.write_text("\n".join(simulated_log(stall_requests(2000)).lines) + "\n")
    return path


def predicted_study(server_log: Path, run_path: Path, *, seed: int = 0) -> StudyView:
    prepared = prepare_simulated([*BUDGET, f'search.predicted_from="{server_log}"'])
    done = run_simulated(prepared, run_path, seed=seed, in_memory=False)
    return StudyView.of(done.study, RunDirectory(run_path))


def test_the_predicted_best_is_measured_first_after_the_baseline_and_stored_in_the_run(
    server_log: Path, tmp_path: Path
) -> None:
    view = predicted_study(server_log, tmp_path / "run")
    prediction = read_prediction(RunDirectory(tmp_path / "run").prediction_path)
    assert prediction is not None and prediction.best is not None
    assert prediction.axes == ["n_batch", "n_ubatch"]  # the study's search.params, not the log's space
    assert int(str(prediction.best.settings["n_batch"])) < 2048  # the demo's stall is fixed by a smaller n_batch
    baseline, first = view.trials[0], view.trials[1]
    assert baseline.baseline
    assert first.settings == prediction.best.settings and first.deployed


def test_a_resumed_study_does_not_queue_the_predicted_best_again(server_log: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    predicted_study(server_log, run)
    stored = RunDirectory(run).prediction_path.read_bytes()
    prepared = prepare_simulated(["budget.trials=5", "confirm.pairs=2", f'search.predicted_from="{server_log}"'])
    done = run_simulated(prepared, run, seed=1, in_memory=False)
    assert RunDirectory(run).prediction_path.read_bytes() == stored  # read back, not predicted again
    best = read_prediction(RunDirectory(run).prediction_path).best  # type: ignore[union-attr]
    assert best is not None
    same = [t for t in done.study.get_trials() if TrialRecord.of(t).settings == best.settings]
    assert len(same) == 1, [TrialRecord.of(t).settings for t in done.study.get_trials()]


def test_the_leaderboard_sets_the_prediction_beside_the_measurement_and_says_whether_it_held(
    server_log: Path, tmp_path: Path
) -> None:
    view = predicted_study(server_log, tmp_path / "run")
    board = build_leaderboard(view)
    outcome = board.prediction
    assert outcome is not None
    assert set(outcome.predicted) == {row.number for row in board.rows}  # every config was in the prediction
    assert outcome.message.startswith(f"prediction from {server_log}: best n_batch=")
    chosen = board.recommendation.row
    if chosen is not None and outcome.predicted[chosen.number] == outcome.record.best:
        assert outcome.held and outcome.message.endswith("it held: the recommendation is the predicted best")
    else:
        assert outcome.held is False and "it did not hold" in outcome.message
    assert "stall" in outcome.message and "predicted" in outcome.message and "measured" in outcome.message
    assert re.search(r": best .*, score [+-]\d+\.\d\d predicted, [+-]\d+\.\d\d measured, stall ", outcome.message)
    console = Console(width=160, record=True)
    render_leaderboard(board, console)
    shown = console.export_text()
    (header,) = [line for line in shown.splitlines() if line.startswith("┃ trial")]
    assert header.index("stall") < header.index("predicted")  # the prediction beside the measured figure
    assert outcome.message.split(":")[0] in shown and ("it held" in shown or "it did not hold" in shown)
    assert "x = predicted to break the study's constraints, or not scored" in " ".join(shown.split())


def test_the_leaderboard_json_carries_the_prediction(server_log: Path, tmp_path: Path) -> None:
    predicted_study(server_log, tmp_path / "runs" / "stall-demo")
    done = run_tuner("leaderboard", str(tmp_path / "runs" / "stall-demo"), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)["prediction"]
    assert document["log"] == str(server_log)
    assert document["best"]["n_batch"] < 2048
    assert document["held"] in (True, False)
    assert document["ranked_by"] == "score" and document["why_none"] is None
    assert all(isinstance(trial["score"], float) for trial in document["trials"].values())
    stored = json.loads(RunDirectory(tmp_path / "runs" / "stall-demo").prediction_path.read_text())
    assert stored["version"] == 2  # ranked by the score: a reader of version 1 asks for an upgrade
    assert set(document["trials"]) == {str(row["number"]) for row in json.loads(done.stdout)["rows"]}


def test_a_study_without_a_prediction_shows_none(tmp_path: Path) -> None:
    done = run_simulated(prepare_simulated(BUDGET), tmp_path / "run", seed=0, in_memory=False)
    board = build_leaderboard(StudyView.of(done.study, RunDirectory(tmp_path / "run")))
    assert board.prediction is None
    assert not RunDirectory(tmp_path / "run").prediction_path.exists()


def test_a_missing_log_is_refused_before_a_run_directory_exists(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"search.predicted_from \(--predicted-from\): .*nowhere.log does not exist"):
        prepare_simulated([f'search.predicted_from="{tmp_path / "nowhere.log"}"'])
    done = run_tuner(
        "run", str(DEMO), "--runs-dir", str(tmp_path / "runs"), "--predicted-from", str(tmp_path / "nowhere.log")
    )
    assert done.returncode == 2
    assert "nowhere.log does not exist" in one_error_line(done)
    assert not (tmp_path / "runs").exists()


def test_another_engines_study_is_refused(tmp_path: Path, server_log: Path) -> None:
    study = Path(__file__).resolve().parents[2] / "studies" / "ollama-ssh-systemd.toml"
    done = run_tuner(
        "run", str(study), "--runs-dir", str(tmp_path / "runs"), "--predicted-from", str(server_log), "--check"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "models llama-server alone, and this study tunes ollama" in one_error_line(done)


def test_the_morning_report_sets_each_trials_predicted_figures_beside_the_measured_ones(
    server_log: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    prepared = prepare_simulated([*BUDGET, f'search.predicted_from="{server_log}"'])
    run_simulated(prepared, run, seed=0, in_memory=False, save_rounds=True)
    page = render_report(run)
    board = build_leaderboard(StudyView.open(RunDirectory(run)))
    assert board.prediction is not None
    assert "The prediction against the measurement" in page
    assert html.escape(board.prediction.message) in page
    table = page.split("<table id='prediction'", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr data-trial=") == len(board.rows)  # every trial, each with its predicted figures
    best = board.prediction.record.best
    assert best is not None and f"{best.median['stall_tok_s']:.2f}" in table


def test_the_morning_report_of_a_study_without_a_prediction_has_no_such_section(tmp_path: Path) -> None:
    run_simulated(prepare_simulated(BUDGET), tmp_path / "run", seed=0, in_memory=False, save_rounds=True)
    page = render_report(tmp_path / "run")
    assert "The prediction against the measurement" not in page and "id='prediction'" not in page


@pytest.mark.parametrize(("min_overlap_s", "has_stall"), [(0.5, True), (60.0, False)])
def test_the_prediction_measures_stalls_as_the_study_does(
    server_log: Path, tmp_path: Path, min_overlap_s: float, has_stall: bool
) -> None:
    """The study's own metrics settings, not the diagnose defaults: a sped-up simulated study's overlaps are
    shorter than 0.5 s, and its prediction had no stall figure until it took `metrics.min_overlap_s`."""
    prepared = prepare_simulated(
        [*BUDGET, f'search.predicted_from="{server_log}"', f"metrics.min_overlap_s={min_overlap_s}"]
    )
    with RunDirectory(tmp_path / "run", notice=lambda _line: None) as run_dir:
        record = study_prediction(prepared, run_dir)
    assert record is not None
    baseline = next(config for config in record.configs if config.baseline)
    assert (baseline.median["stall_tok_s"] is not None) is has_stall


def test_the_line_walk_starts_beside_the_predicted_best_not_at_the_ladders_middle(
    server_log: Path, tmp_path: Path
) -> None:
    view = predicted_study(server_log, tmp_path / "run")
    best = read_prediction(RunDirectory(tmp_path / "run").prediction_path).best  # type: ignore[union-attr]
    assert best is not None and best.settings["n_batch"] == best.settings["n_ubatch"]  # on the line
    ladder = [32, 64, 128, 256, 512, 1024, 2048]
    at = ladder.index(int(str(best.settings["n_batch"])))
    first_batch = [dict(t.settings) for t in view.trials[1:4]]  # the baseline goes alone, then interleave 3
    beside = [{"n_batch": ladder[i], "n_ubatch": ladder[i]} for i in (at - 1, at + 1) if 0 <= i < len(ladder)]
    assert first_batch[0] == best.settings
    assert sorted(first_batch[1:], key=str) == sorted(beside, key=str), first_batch


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"version": 1, "log": 3}', "is not a prediction serve-tuner wrote (damaged?); remove it to predict again"),
        ('{"version": 3, "log": "x.log", "calibrated_by": "a newer field"}', "was written by a newer serve-tuner"),
        ("not json", "is not a prediction serve-tuner wrote (damaged?)"),
    ],
)
def test_a_damaged_or_newer_prediction_is_one_line_naming_the_file(
    server_log: Path, tmp_path: Path, text: str, said: str
) -> None:
    run = tmp_path / "runs" / "stall-demo"
    predicted_study(server_log, run)
    RunDirectory(run).prediction_path.write_text(text)
    done = run_tuner("leaderboard", str(run))
    assert done.returncode == 1
    line = one_error_line(done)
    assert "prediction.json" in line and said in line


class Told(NullObserver):
    def __init__(self) -> None:
        self.said: list[tuple[str, dict[str, object]]] = []

    def predicting(self, **told: object) -> None:
        self.said.append(("predicting", told))

    def predicted(self, **told: object) -> None:
        self.said.append(("predicted", told))


def test_the_run_says_it_predicts_then_what_it_queued_and_a_resume_what_it_kept(
    server_log: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    first = Told()
    prepared = prepare_simulated([*BUDGET, f'search.predicted_from="{server_log}"'])
    run_simulated(prepared, run, seed=0, in_memory=False, observer=first)
    best = read_prediction(RunDirectory(run).prediction_path).best  # type: ignore[union-attr]
    assert best is not None
    assert first.said == [
        ("predicting", {"log": str(server_log)}),
        ("predicted", {"log": str(server_log), "best": best.settings, "queued": True, "note": None}),
    ]
    other = tmp_path / "other.log"
    other.write_bytes(server_log.read_bytes())
    again = Told()
    prepared = prepare_simulated(["budget.trials=4", "confirm.pairs=2", f'search.predicted_from="{other}"'])
    run_simulated(prepared, run, seed=1, in_memory=False, observer=again)
    (said,) = again.said  # read back, not made again: no "predicting"
    assert said[0] == "predicted" and said[1]["queued"] is False and said[1]["log"] == str(server_log)
    assert f"to predict from {other}" in str(said[1]["note"])


VLLM_LINE = (
    "INFO 12-04 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation "
    "throughput: 20.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit "
    "rate: 0.0%\n"
)
IDLE_LINES = "".join(format_log_line(0.0, line) + "\n" for line in startup_lines(SimSettings()))  # no request


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("logs", None, "is a directory; name the llama-server log"),
        ("empty.log", "", "empty.log"),
        ("vllm.log", VLLM_LINE, "vllm.log is a vllm log, and the simulated server models llama-server"),
        ("idle.log", IDLE_LINES, "idle.log times no prompt and no decode (no print_timing line)"),
    ],
    ids=["directory", "empty", "vllm", "no-request"],
)
def test_a_log_no_prediction_can_be_made_of_is_refused_by_the_check_before_a_run_directory_exists(
    tmp_path: Path, name: str, text: str | None, said: str
) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" if text is None else tmp_path / "logs" / name
    if text is not None:
        log.write_text(text)
    runs = tmp_path / "runs"
    for command in (["run", str(DEMO)], ["run", str(DEMO), "--check"]):
        done = run_tuner(*command, "--runs-dir", str(runs), "--predicted-from", str(log), "--set", "budget.trials=1")
        assert done.returncode == 2, done.stdout + done.stderr
        line = one_error_line(done)
        assert line.startswith("error: search.predicted_from (--predicted-from): ") and said in line, line
        assert not runs.exists()


def study_prediction_with(server_log: Path, tmp_path: Path, *overrides: str) -> PredictionRecord:
    prepared = prepare_simulated([*BUDGET, f'search.predicted_from="{server_log}"', *overrides])
    with RunDirectory(tmp_path / "run", notice=lambda _line: None) as run_dir:
        prediction = study_prediction(prepared, run_dir)
    assert prediction is not None
    return prediction


def test_the_prediction_ranks_configs_by_the_studys_own_weighted_score_not_by_stall_speed_alone(
    server_log: Path, tmp_path: Path
) -> None:
    # Stall weighed once and prefill twice, no constraint: the 80% prefill rule of `diagnose --predict` is
    # not the study's, and the config the study would score highest is the predicted best.
    objectives = (
        'objectives=[{metric="stall_tok_s", direction="maximize", weight=1.0}, '
        '{metric="prefill_tok_s", direction="maximize", weight=2.0}]'
    )
    prediction = study_prediction_with(server_log, tmp_path, objectives, "constraints=[]")
    assert prediction.ranked_by == "score" and prediction.best is not None
    base = next(c for c in prediction.configs if c.baseline)
    for config in prediction.configs:  # each score is the study's, of the predicted medians
        stall, prefill = config.median["stall_tok_s"], config.median["prefill_tok_s"]
        base_stall, base_prefill = base.median["stall_tok_s"], base.median["prefill_tok_s"]
        assert stall and prefill and base_stall and base_prefill
        assert config.score == pytest.approx(math.log(stall / base_stall) + 2.0 * math.log(prefill / base_prefill))
    assert prediction.best.score == max(c.score for c in prediction.configs if c.score is not None)
    assert prediction.configs[0] == prediction.best


def test_the_prediction_measures_the_metrics_of_the_studys_objectives(server_log: Path, tmp_path: Path) -> None:
    # Objectives on figures the stall ranking never looks at: each config has them, and a score.
    objectives = (
        'objectives=[{metric="output_tok_s", direction="maximize"}, {metric="itl_max_s", direction="minimize"}]'
    )
    prediction = study_prediction_with(server_log, tmp_path, objectives, "constraints=[]")
    for config in prediction.configs:
        assert config.median["output_tok_s"] is not None and config.median["itl_max_s"] is not None
        assert config.score is not None


def test_a_config_that_breaks_the_studys_constraints_is_never_the_predicted_best(
    server_log: Path, tmp_path: Path
) -> None:
    # The study's own demo objectives, with its prefill constraint tightened to 95% of the baseline's.
    prediction = study_prediction_with(
        server_log, tmp_path, 'constraints=[{metric="prefill_tok_s", min_vs_baseline=0.95}]'
    )
    base = next(c for c in prediction.configs if c.baseline)
    base_prefill = base.median["prefill_tok_s"]
    assert base_prefill is not None
    for config in prediction.configs:
        prefill = config.median["prefill_tok_s"]
        assert prefill is not None
        assert config.eligible == (prefill >= 0.95 * base_prefill)
    assert any(c.score is not None and c.score > 0 and not c.eligible for c in prediction.configs)
    assert prediction.best is not None and prediction.best.eligible
    assert prediction.best.score == max(c.score for c in prediction.configs if c.eligible and c.score is not None)
    # Ranked as the leaderboard shows them: every config that may win (and the baseline) before any that may not.
    may_win = [c.eligible or c.baseline for c in prediction.configs]
    assert may_win == sorted(may_win, reverse=True)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        # Prefill alone, with streams twice as fast as the baseline's: the configs that free the streams
        # prefill slower, so the best that keeps the constraint scores below the baseline.
        (
            (
                'objectives=[{metric="prefill_tok_s", direction="maximize"}]',
                'constraints=[{metric="stall_tok_s", min_vs_baseline=2.0}]',
            ),
            "no config that keeps the study's constraints gains the study's minimum effect over the baseline "
            "(a score of +0.05; the best, -",
        ),
        # Prefill five times the baseline's: no config keeps it.
        (('constraints=[{metric="prefill_tok_s", min_vs_baseline=5.0}]',), "no config keeps the study's constraints"),
    ],
)
def test_where_no_config_is_predicted_to_win_the_run_and_the_leaderboard_say_why(
    server_log: Path, tmp_path: Path, overrides: tuple[str, ...], why: str
) -> None:
    prediction = study_prediction_with(server_log, tmp_path / "predicted", *overrides)
    assert prediction.best is None and prediction.ranked_by == "score"
    assert prediction.why_none is not None and prediction.why_none.startswith(why)
    told = Told()
    prepared = prepare_simulated([*BUDGET, f'search.predicted_from="{server_log}"', *overrides])
    done = run_simulated(prepared, tmp_path / "run", seed=0, in_memory=False, observer=told)
    assert told.said[-1][1]["best"] is None and told.said[-1][1]["note"] == prediction.why_none
    outcome = build_leaderboard(StudyView.of(done.study, RunDirectory(tmp_path / "run"))).prediction
    assert outcome is not None
    assert outcome.message.startswith(f"prediction from {server_log}: {prediction.why_none}")


def test_a_predicted_gain_inside_the_studys_minimum_effect_is_no_predicted_best(
    server_log: Path, tmp_path: Path
) -> None:
    # The median TTFT alone: the best config is predicted a little faster than the baseline, by less than
    # the 5% a measured win must gain (a score of log 1.05 = +0.05), so the prediction names none.
    overrides = ('objectives=[{metric="ttft_p50_s", direction="minimize"}]', "constraints=[]")
    prediction = study_prediction_with(server_log, tmp_path, *overrides)
    top = prediction.configs[0]
    assert not top.baseline and top.score is not None and 0.0 < top.score < math.log(1.05)
    assert prediction.best is None
    assert prediction.why_none == (
        f"no config gains the study's minimum effect over the baseline (a score of +0.05; the best, {top.score:+.2f})"
    )


def test_a_config_the_simulated_round_cannot_score_is_not_predicted_to_win(server_log: Path, tmp_path: Path) -> None:
    # The simulated round measures no LoRA switches: no config has a score, so none is the predicted best.
    objectives = (
        'objectives=[{metric="stall_tok_s", direction="maximize"}, {metric="lora_wait_p95_s", direction="minimize"}]'
    )
    prediction = study_prediction_with(server_log, tmp_path, objectives, "constraints=[]")
    assert all(c.score is None and not c.eligible for c in prediction.configs)
    assert prediction.best is None
    assert prediction.why_none == (
        "the simulated rounds of the study's workload give no lora_wait_p95_s, so no config has a score"
    )


def test_a_study_whose_workload_runs_lora_adapters_is_predicted_with_its_adapters(
    server_log: Path, tmp_path: Path
) -> None:
    # Its requests name adapters by name, which only the study's engine turns into the server's ids.
    prepared = prepare_simulated(
        ['search.params=["n_batch", "n_ubatch"]', f'search.predicted_from="{server_log}"'],
        study_file=DEMO.parent / "lora-demo.toml",
    )
    assert any(adapters for adapters in prepared.trace.lora_mix())
    with RunDirectory(tmp_path / "run", notice=lambda _line: None) as run_dir:
        prediction = study_prediction(prepared, run_dir)
    assert prediction is not None and prediction.ranked_by == "score" and prediction.configs


def test_a_prediction_stored_before_the_score_ranking_is_read_as_ranked_by_stall_speed(
    server_log: Path, tmp_path: Path
) -> None:
    view = predicted_study(server_log, tmp_path / "run")
    path = RunDirectory(tmp_path / "run").prediction_path
    stored = json.loads(path.read_text())
    stored["version"] = 1  # as serve-tuner wrote it before the score ranking: no score, ranked_by, why_none
    for field in ("ranked_by", "why_none"):
        del stored[field]
    for config in [*stored["configs"], stored["best"]]:
        del config["score"]
    path.write_text(json.dumps(stored))
    outcome = build_leaderboard(view).prediction
    assert outcome is not None and outcome.record.ranked_by == "stall"
    assert "stall" in outcome.message and ", score " not in outcome.message


def test_a_study_that_tunes_no_knob_the_simulator_models_is_refused_before_a_run_directory_exists(
    server_log: Path, tmp_path: Path
) -> None:
    lora_demo = DEMO.parent / "lora-demo.toml"  # it tunes lora_policy alone
    done = run_tuner(
        "run", str(lora_demo), "--runs-dir", str(tmp_path / "runs"), "--set", 'engine.binary="simulated"',
        "--predicted-from", str(server_log),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_error_line(done) == (
        "error: search.predicted_from (--predicted-from): the study tunes lora_policy, none of which the simulated "
        "server models (n_batch, n_ubatch, n_parallel, kv_unified, cache_ram); tune one of them, or leave "
        "predicted_from out"
    )
    assert not (tmp_path / "runs").exists()
