"""`tuner capacity`: a level's figures and verdict as seed 004 defines them, the sweep's rounds and climb,
the capacity rule, the command's refusals, and a whole sweep on the simulated llama-server through the
process deployer (the real server's sweep is in tests/real/test_capacity_real.py)."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support import DATA, ROOT, run_cli, run_tuner
from tests.support.sim_study import DEMO, prepare_simulated, run_simulated
from tuner.capacity.closed_loop import LevelRun
from tuner.capacity.levels import LevelFigures, capacity, climb_stops, level_figures
from tuner.capacity.record import CapacitySweep, SweptConfig, read_sweep, write_sweep
from tuner.capacity.shapes import CapacityRequests
from tuner.capacity.simulated import SimulatedCapacityTarget
from tuner.capacity.sweep import run_sweep
from tuner.config import SloSpec
from tuner.errors import StudyError
from tuner.models import RequestRecord, RequestStatus
from tuner.runs import RunDirectory
from tuner.sim.inputs import CostModel, load_cost_model

SLO = SloSpec(ttft_p95_s=2.0, decode_tok_s=10.0, min_requests=3)


def _record(send: float, first: float, tokens: int, gap: float, *, ok: bool = True) -> RequestRecord:
    token_s = tuple(first + i * gap for i in range(tokens)) if ok else ()
    return RequestRecord(
        request_id=f"r{send}", session="u", tag="summary", prompt_tokens=640, output_tokens_requested=tokens,
        send_s=send, due_s=send, token_s=token_s, end_s=token_s[-1] if token_s else send + 1,
        status=RequestStatus.OK if ok else RequestStatus.TIMEOUT, error=None if ok else "no answer",
    )  # fmt: skip


def test_a_levels_figures_are_the_windows_requests_tokens_and_speeds_as_seed_004_defines_them() -> None:
    records = [
        _record(0.0, 0.5, 11, 0.1),  # warm-up: sent before the window, its late tokens still count in the total
        _record(2.0, 2.4, 11, 0.05),  # 20 tok/s, TTFT 0.4 s
        _record(3.0, 4.0, 21, 0.1),  # 10 tok/s, TTFT 1.0 s
        _record(4.0, 4.2, 6, 0.2),  # 5 tok/s, TTFT 0.2 s
        _record(12.0, 12.1, 5, 0.1),  # sent after the window: not the level's
    ]
    figures = level_figures(records, users=2, round_=1, window=(1.0, 11.0), slo=SLO)
    assert figures.requests == 3 and figures.errors == 0
    # Tokens that arrived inside 1..11 s: 6 of the warm-up's (1.0 .. 1.5), 11 + 21 + 6 of the window's.
    assert figures.total_tok_s == pytest.approx((6 + 11 + 21 + 6) / 10.0)
    assert figures.per_user_tok_s == pytest.approx(10.0)  # the median of 20, 10 and 5
    assert figures.ttft_p95_s == pytest.approx(0.94)  # numpy's p95 of 0.2, 0.4, 1.0
    assert figures.verdict == "pass" and figures.why == ""


@pytest.mark.parametrize(
    ("records", "verdict", "why"),
    [
        ([_record(2.0, 5.0, 11, 0.05)] * 3, "fail", "TTFT p95 3.00 s > 2 s"),
        ([_record(2.0, 2.1, 11, 0.2)] * 3, "fail", "5.0 tok/s per user < 10"),
        ([_record(2.0, 2.1, 11, 0.05)] * 3 + [_record(3.0, 0, 0, 0, ok=False)], "fail", "1 of 4 requests failed"),
        ([_record(2.0, 2.1, 11, 0.05)] * 2, "too few", "2 requests in the window, fewer than metrics.slo.min_requests"),
    ],
    ids=["ttft", "per-user speed", "errors", "too few"],
)
def test_a_level_fails_naming_what_broke_the_slo_or_cannot_be_judged_on_too_few_requests(
    records: list[RequestRecord], verdict: str, why: str
) -> None:
    figures = level_figures(records, users=4, round_=2, window=(1.0, 11.0), slo=SLO)
    assert figures.verdict == verdict
    assert why in figures.why


@pytest.mark.parametrize(
    ("records", "verdict", "why"),
    [
        (
            [_record(2.0, 5.0, 11, 0.05)],
            "fail",
            "1 of 1 TTFTs over 2 s (of fewer requests than metrics.slo.min_requests",
        ),
        ([_record(2.0, 5.0, 11, 0.05), _record(3.0, 3.1, 11, 0.05)], "too few", "2 requests in the window, fewer"),
        ([_record(2.0 + i, 5.0 + i, 11, 0.05) for i in range(2)], "fail", "2 of 2 TTFTs over 2 s"),
        ([_record(2.0 + i, 2.1 + i, 11, 0.2) for i in range(4)], "too few", "4 requests in the window"),
        ([_record(2.0 + i, 2.1 + i, 11, 0.2) for i in range(5)], "fail", "5 of 5 users under 10 tok/s"),
        ([_record(2.0, 2.1, 11, 0.05), _record(3.0, 0, 0, 0, ok=False)], "fail", "1 of 2 requests failed"),
    ],
    ids=["1 of 1 slow", "1 of 2 slow", "2 of 2 slow", "4 of 4 crawling", "5 of 5 crawling", "a failure"],
)
def test_a_level_of_too_few_requests_fails_only_where_they_show_the_slo_broken_beyond_a_1_in_20_chance(
    records: list[RequestRecord], verdict: str, why: str
) -> None:
    # Fewer than min_requests cannot show the line held; they can show it broken: 1 TTFT of 1 over a p95
    # line has a 5% chance if the line held, 1 of 2 almost 10%; 5 of 5 speeds under a median line, 3%.
    slo = SloSpec(ttft_p95_s=2.0, decode_tok_s=10.0, min_requests=20)
    figures = level_figures(records, users=4, round_=1, window=(1.0, 11.0), slo=slo)
    assert figures.verdict == verdict
    assert why in figures.why


def _figures(users: int, round_: int, verdict: str) -> LevelFigures:
    return LevelFigures(
        users=users, round=round_, requests=30, errors=0, total_tok_s=100.0, per_user_tok_s=20.0, ttft_p50_s=0.3,
        ttft_p95_s=0.5, verdict=verdict, why="" if verdict == "pass" else "x",  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_capacity_is_the_most_users_that_held_the_slo_in_every_round() -> None:
    # Seed 004's llama-server -np 16 row: 4 users failed between levels that held, and 16 held in both.
    levels = [(1, "pass"), (2, "pass"), (4, "fail"), (8, "pass"), (16, "pass"), (32, "fail")]
    both = [_figures(u, r, v) for r in (1, 2) for u, v in levels]
    assert capacity(both, 2) == 16
    # A level that held in one round only is not within the SLO.
    assert capacity([*both[:-2], _figures(16, 2, "fail")], 2) == 8
    assert capacity([_figures(1, 1, "fail"), _figures(1, 2, "pass")], 2) is None
    assert capacity([_figures(2, 1, "too few"), _figures(2, 2, "pass")], 2) is None


def test_the_sentence_names_the_levels_it_could_not_judge_instead_of_hiding_them() -> None:
    from tuner.capacity.record import capacity_sentence

    levels = [_figures(u, r, v) for r in (1, 2) for u, v in ((1, "pass"), (2, "pass"), (4, "too few"), (8, "fail"))]
    trial = SweptConfig(trial=2, settings={}, levels=levels, capacity=2)
    baseline = SweptConfig(trial=None, settings={}, levels=[_figures(u, r, "too few") for r in (1, 2) for u in (1, 2)])
    sentence = capacity_sentence(_sweep([baseline, trial], [1, 2, 4, 8]).model_copy(update={"finished": True}))
    assert sentence == (
        "the recommended settings (trial 2) serve 2 users (4 users not judged: too few requests in the window) "
        "within your SLO (TTFT p95 at most 2 s, 10 tok/s per user) in both rounds; the baseline served no level of "
        "users it could judge (too few requests in each window); lengthen the window (--window) or lower "
        "metrics.slo.min_requests to judge every level"
    )


def test_a_climb_stops_after_two_failed_levels_in_a_row_and_not_on_one_that_is_too_short_to_judge() -> None:
    assert not climb_stops([_figures(1, 1, "pass"), _figures(2, 1, "fail")])
    assert not climb_stops([_figures(2, 1, "fail"), _figures(4, 1, "too few")])
    assert climb_stops([_figures(1, 1, "pass"), _figures(2, 1, "fail"), _figures(4, 1, "fail")])


class _ScriptedTarget:
    """A target whose levels fail from `fails_from` users on: it records what the sweep asked, in order."""

    def __init__(self, fails_from: dict[int | None, int]) -> None:
        self.fails_from = fails_from
        self.asked: list[str] = []
        self._config: SweptConfig | None = None

    async def start(self, config: SweptConfig, *, round_: int) -> None:
        self._config = config
        self.asked.append(f"start {config.label} round {round_}")

    async def run_level(self, users: int, requests: CapacityRequests, *, warm_up_s: float, window_s: float) -> LevelRun:
        assert self._config is not None
        self.asked.append(f"{users}")
        request = requests.next_for(0)
        # Failing levels answer slowly: a TTFT of 5 s breaks the 2 s line.
        first = 5.0 if users >= self.fails_from[self._config.trial] else 0.2
        records = [_record(1.0 + i, 1.0 + i + first, 11, 0.05) for i in range(5)]
        assert request.prompt_tokens > 0
        return LevelRun(records=records, window=(0.5, 10.0), elapsed_s=12.0)


def _sweep(configs: Sequence[SweptConfig], users: list[int], rounds: int = 2) -> CapacitySweep:
    return CapacitySweep(
        study="s", host=None, started="2026-12-04T00:00:00+00:00", shape="summary", users=users, warm_up_s=0.0,
        window_s=1.0, rounds=rounds, slo_ttft_p95_s=2.0, slo_decode_tok_s=10.0, slo_min_requests=3,
        configs=list(configs), server="llama-server: n_parallel=4",
    )  # fmt: skip


def test_round_one_climbs_each_config_until_two_levels_fail_and_round_two_comes_back_down_in_swapped_order() -> None:
    import asyncio

    prepared = prepare_simulated()
    target = _ScriptedTarget({None: 4, 3: 16})
    sweep = _sweep([SweptConfig(trial=None, settings={}), SweptConfig(trial=3, settings={"n_batch": 128})],
                   [1, 2, 4, 8, 16, 32, 64])  # fmt: skip
    saved: list[int] = []
    done = asyncio.run(
        run_sweep(sweep, target, prepared, save=lambda s: saved.append(len(s.configs[0].levels)), say=lambda _: None)
    )
    assert target.asked == [
        "start the baseline round 1", "1", "2", "4", "8",
        "start trial 3 round 1", "1", "2", "4", "8", "16", "32",
        "start trial 3 round 2", "32", "16", "8", "4", "2", "1",
        "start the baseline round 2", "8", "4", "2", "1",
    ]  # fmt: skip
    assert [c.capacity for c in done.configs] == [2, 8]
    assert done.finished and len(saved) == 20 + 1  # after every level, and once at the end


def test_the_cli_refuses_bad_levels_and_a_sweep_without_a_run_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = str(tmp_path / "runs")
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--users", "1,x")
    assert refused.code == 2 and "'1,x' is not a list of user counts; pass e.g. 1,2,4,8,16" in refused.err
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--users", "1,\u00b2")
    assert refused.code == 2 and "'1,\u00b2' is not a list of user counts" in refused.err
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--baseline", "--users", "4,2")
    assert refused.code == 2
    assert refused.error_line() == "error: --users: must climb: each level more users than the one before (got [4, 2])"
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--baseline", "--window", "0s")
    assert refused.code == 2 and refused.error_line().startswith("error: --window: Input should be greater than 0")
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--baseline", "--set", "capacity.window_s=0")
    assert refused.code == 2
    assert refused.error_line().startswith(
        "error: --set capacity.window_s=0: capacity.window_s: Input should be greater"
    )
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--baseline", "--check", "--json")
    assert refused.error_line() == "error: --check prints its lines, not JSON: leave out --json"
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs, "--baseline", "--trial", "2")
    assert refused.code == 2 and "not allowed with argument" in refused.err
    refused = run_cli(capsys, "capacity", str(DEMO), "--runs-dir", runs)
    assert refused.code == 2
    assert refused.error_line() == (
        f"error: {runs}/stall-demo holds no study to take the recommendation from; run `tuner run {DEMO}` first, or "
        "pass --baseline to measure the baseline alone"
    )
    assert not (tmp_path / "runs").exists()


def _simulated_sweep_args(runs: Path, *extra: str) -> list[str]:
    marker = f'--sim-seed", "{os.getpid()}'
    return [
        "capacity", str(DEMO), "--runs-dir", str(runs), "--set", 'engine.binary="simulated"',
        "--set", f'engine.extra_args=["--sim-speed", "20", "{marker}"]', "--shape", "summary",
        "--warm-up", "0.2s", "--window", "1s", "--set", "metrics.slo.min_requests=1", *extra,
    ]  # fmt: skip


def _servers_of_this_test() -> list[int]:
    marker = str(os.getpid()).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"tuner.sim" in argv and marker in argv:
                found.append(int(proc.name))
    return found


def test_a_sweep_of_the_baseline_and_the_recommendation_on_the_simulated_server_says_how_many_users_each_serves(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    prepared = prepare_simulated()
    run_simulated(prepared, runs / "stall-demo", seed=0, in_memory=False)
    done = run_tuner(*_simulated_sweep_args(runs, "--users", "1,2"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    order = [line.split(":")[0] for line in lines if ", round " in line and "tok/s in all" in line]
    trial = order[2].split(",")[0]
    assert trial.startswith("trial ")
    rounds = ["the baseline, round 1", f"{trial}, round 1", f"{trial}, round 2", "the baseline, round 2"]
    assert order == [label for label in rounds for _ in range(2)]
    assert any(
        line.startswith("the recommended settings (trial ") and "; the baseline served" in line for line in lines
    )
    assert _servers_of_this_test() == [], "a simulated server was left running"
    (stored,) = (runs / "stall-demo" / "capacity").glob("*.json")
    sweep = read_sweep(stored)
    assert sweep.finished and [c.trial is None for c in sweep.configs] == [True, False]
    assert all(len(c.levels) == 4 for c in sweep.configs)  # two levels, two rounds
    # The run's report is written again with the sweep in it.
    assert lines[-1] == f"the run's report, with the sweep: {runs / 'stall-demo' / 'report.html'}"
    assert "id='capacity-sentence'" in (runs / "stall-demo" / "report.html").read_text()


def test_a_sweep_stopped_by_sigterm_leaves_no_server_and_keeps_the_levels_it_measured(tmp_path: Path) -> None:
    args = _simulated_sweep_args(tmp_path / "runs", "--baseline", "--users", "1,2,4,8,16,32", "--window", "2s")
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert process.stdout is not None
    for line in process.stdout:
        if "round 1: 1 user:" in line:
            break
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert _servers_of_this_test() == [], "a simulated server was left running"
    (stored,) = (tmp_path / "runs" / "stall-demo" / "capacity").glob("*.json")
    kept = json.loads(stored.read_text())
    assert not kept["finished"] and kept["configs"][0]["levels"][0]["users"] == 1


def test_check_looks_at_the_host_and_gives_the_sweeps_length_without_starting_anything(tmp_path: Path) -> None:
    done = run_tuner(*_simulated_sweep_args(tmp_path / "runs", "--baseline", "--users", "1,2,4", "--check"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("ok    host: reached over local") for line in lines), lines
    (duration,) = [line for line in lines if "duration of" in line]
    # The baseline alone, 2 rounds: at least 2 levels a round, at most 3, and a start per round.
    assert duration.startswith("ok    duration of the baseline: at least ")
    assert ": 2 rounds of up to 3 levels (0.2 s warm-up, 1 s window) and a server start of 1 s a round;" in duration
    assert "an answer of 0.35 s at each end; it takes longer where its users outnumber the server's slots" in duration
    assert lines[-1].startswith("the sweep can run (") and "nothing on the host was changed" in lines[-1]
    assert _servers_of_this_test() == []
    assert not (tmp_path / "runs" / "stall-demo" / "capacity").exists()


def test_a_sweeps_length_takes_each_level_as_the_last_sweep_of_the_study_measured_it_else_window_and_answers(
    tmp_path: Path,
) -> None:
    from tuner.capacity.command import sweep_length
    from tuner.check import ASSUMED_DECODE_TOK_S
    from tuner.config import CapacitySpec
    from tuner.runs import RunDirectory

    prepared = prepare_simulated()
    options = CapacitySpec(users=[1, 2, 4], warm_up_s=5.0, window_s=20.0, shape="summary", rounds=2)
    answer_s = 140 / (ASSUMED_DECODE_TOK_S * prepared.engine.clock_speed())
    level_s = max(5.0, answer_s) + 20.0 + answer_s
    run_path = tmp_path / "runs" / "stall-demo"
    length = sweep_length(prepared, options, run_path, configs=2, start_s=3.0)
    assert length.longest_s == pytest.approx(2 * 2 * (3.0 + 3 * level_s))
    assert length.shortest_s == pytest.approx(2 * 2 * (3.0 + 2 * level_s))
    assert length.floor and "longer where its users outnumber the server's slots" in length.source
    # A sweep of this study measured 1 and 2 users at 30 s and 50 s (its two configs' mean): those are taken.
    measured = [_figures(1, 1, "pass").model_copy(update={"seconds": 30.0}),
                _figures(2, 1, "fail").model_copy(update={"seconds": 40.0})]  # fmt: skip
    other = [_figures(2, 1, "fail").model_copy(update={"seconds": 60.0})]
    configs = [SweptConfig(trial=None, settings={}, levels=measured), SweptConfig(trial=3, settings={}, levels=other)]
    sweep = _sweep(configs, [1, 2, 4]).model_copy(update={"warm_up_s": 5.0, "window_s": 20.0})
    directory = RunDirectory(run_path)
    write_sweep(directory.capacity_path("20261204T010000", None), sweep)
    length = sweep_length(prepared, options, run_path, configs=2, start_s=3.0)
    assert length.longest_s == pytest.approx(2 * 2 * (3.0 + 30.0 + 50.0 + level_s))
    assert length.source.endswith("; 1, 2 users as the last sweep of this study measured them")
    # A later sweep with another window says nothing about this one's levels.
    write_sweep(directory.capacity_path("20261204T020000", None), sweep.model_copy(update={"window_s": 60.0}))
    assert sweep_length(prepared, options, run_path, configs=2, start_s=3.0).longest_s == pytest.approx(
        2 * 2 * (3.0 + 30.0 + 50.0 + level_s)
    )


def test_the_budget_holds_the_sweep_after_the_study_and_a_budget_it_fills_is_refused_before_the_host(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tuner.capacity.command import SweepLength, budget_left_for_trials
    from tuner.config import load_study

    spec, _ = load_study(DEMO, ["capacity.after_study=true", "budget.hours=1"])
    assert budget_left_for_trials(spec, SweepLength(60.0, 600.0, "")) == pytest.approx(3600.0 - 600.0)
    assert budget_left_for_trials(spec, None) == pytest.approx(3600.0)
    runs = str(tmp_path / "runs")
    # The demo's sweep: 4 levels of at least 25 s, 2 configs, 2 rounds: more than 0.05 h (3 minutes).
    tiny = ["--set", "capacity.after_study=true", "--set", "budget.hours=0.05", "--runs-dir", runs]
    checked = run_cli(capsys, "run", str(DEMO), "--check", *tiny, "--set", 'engine.binary="simulated"')
    (duration,) = [line for line in checked.out.splitlines() if "duration:" in line]
    assert checked.code == 1 and duration.startswith("FAIL  duration: budget.hours = 0.05 leaves no time for trials")
    refused = run_cli(capsys, "run", str(DEMO), *tiny, "--set", 'engine.binary="simulated"')
    assert refused.code == 2
    assert refused.error_line().startswith("error: budget.hours = 0.05 leaves no time for trials: the capacity sweep")
    assert refused.error_line().endswith("raise budget.hours, or set [capacity] after_study = false and run "
                                         "`tuner capacity` on its own")  # fmt: skip
    assert not (tmp_path / "runs" / "stall-demo").exists()


def test_the_morning_report_shows_the_latest_sweep_with_its_sentence_table_and_charts_and_a_damaged_one_in_a_line(
    tmp_path: Path,
) -> None:
    from tuner.morning_report import render_report
    from tuner.runs import RunDirectory

    run_path = tmp_path / "runs" / "stall-demo"
    prepared = prepare_simulated()
    run_simulated(prepared, run_path, seed=0, in_memory=False)
    (run_path / "spec.json").write_text(prepared.spec.model_dump_json())  # as `tuner run` keeps it
    baseline = SweptConfig(trial=None, settings={}, levels=[_figures(1, 1, "pass"), _figures(2, 1, "fail")], capacity=1)
    trial = SweptConfig(trial=3, settings={"n_batch": 128}, levels=[_figures(1, 1, "pass"), _figures(2, 1, "pass")],
                        capacity=2)  # fmt: skip
    sweep = _sweep([baseline, trial], [1, 2, 4], rounds=1).model_copy(update={"finished": True})
    directory = RunDirectory(run_path)
    write_sweep(directory.capacity_path("20261204T010000", None), sweep)
    page = render_report(run_path)
    assert (
        "id='capacity-sentence'>The recommended settings (trial 3) serve 2 users within your SLO (TTFT p95 at most "
        "2 s, 10 tok/s per user); the baseline served 1 user.</p>"
    ) in page
    section = page[page.index("id='capacity-section'") :]
    section = section[: section.index("</section>")]
    assert section.count('<svg class="chart"') == 2 and ">SLO</text>" in section
    assert "<td class='fail' title='x'>100.0 / 20.0 / 0.50 s FAIL</td>" in section
    # A later sweep of the baseline alone is not the one shown; a later file that cannot be read is said above it.
    write_sweep(directory.capacity_path("20261204T020000", None), _sweep([baseline], [1, 2]))
    directory.capacity_path("20261204T030000", None).write_text('{"version": 1, "study": 3}')
    page = render_report(run_path)
    section = page[page.index("id='capacity-section'") :]
    section = section[: section.index("</section>")]
    assert "20261204T030000.json: not a capacity sweep (" in section
    assert "The recommended settings (trial 3) serve 2 users" in section
    # An earlier sweep made with the study's own [capacity] table is shown over a later quick one.
    own = sweep.model_copy(
        update={"users": [1, 2, 4, 8], "warm_up_s": 5.0, "window_s": 20.0, "rounds": 2,
                "configs": [baseline, trial.model_copy(update={"capacity": 4})]}
    )  # fmt: skip
    write_sweep(directory.capacity_path("20261204T000500", None), own)
    section = render_report(run_path).split("id='capacity-section'")[1].split("</section>")[0]
    assert "The recommended settings (trial 3) serve 4 users" in section
    assert "The run directory holds 2 other sweeps in capacity/: this one is the latest that measured" in section


def _simulated_capacity(n_parallel: int, users: list[int], *, slo_ttft_s: float, cost: CostModel | None = None,
                        rounds: int = 2) -> SweptConfig:  # fmt: skip
    import asyncio

    prepared = prepare_simulated(
        [f"engine.settings.n_parallel={n_parallel}", f'workload.path="{DATA / "capacity-short.jsonl"}"']
    )
    sweep = _sweep([SweptConfig(trial=None, settings={})], users, rounds=rounds).model_copy(
        update={"shape": "workload", "warm_up_s": 5.0, "window_s": 30.0, "slo_ttft_p95_s": slo_ttft_s,
                "slo_decode_tok_s": 1.0, "slo_min_requests": 5}
    )  # fmt: skip
    target = SimulatedCapacityTarget(prepared, seed=1, cost=cost)
    done = asyncio.run(run_sweep(sweep, target, prepared, save=lambda _: None, say=lambda _: None))
    return done.configs[0]


@pytest.mark.parametrize("n_parallel", [1, 2, 4])
def test_on_the_simulated_server_users_beyond_the_slots_wait_and_the_capacity_moves_with_n_parallel(
    n_parallel: int,
) -> None:
    # 64-token answers take longer than the SLO's 0.5 s: a user without a slot waits past it, one with a slot
    # does not, so the model predicts a capacity of exactly n_parallel users.
    swept = _simulated_capacity(n_parallel, list(range(1, 9)), slo_ttft_s=0.5)
    assert swept.capacity == n_parallel
    first = {f.users: f for f in swept.levels if f.round == 1}
    waited, served = first[n_parallel + 1].ttft_p95_s, first[n_parallel].ttft_p95_s
    assert waited is not None and served is not None and waited > 2 * served


def test_on_the_simulated_server_slots_beyond_the_users_cost_what_the_calibrations_slot_cost_says() -> None:
    base = load_cost_model()
    free = [_simulated_capacity(n, [4], slo_ttft_s=10.0, rounds=1).levels[0].total_tok_s for n in (4, 16)]
    assert free[1] == pytest.approx(free[0], rel=0.02)  # the CPU calibration: idle slots cost nothing
    costly = dataclasses.replace(base, slot_s=0.002)
    paid = [_simulated_capacity(n, [4], slo_ttft_s=10.0, cost=costly, rounds=1).levels[0].total_tok_s for n in (4, 16)]
    # A decode pass of 4 users: its own cost plus slot_s for each slot the server runs.
    step_s = base.pass_s + 4 * base.token_s(4) + 4 * base.sample_s
    predicted = (step_s + 4 * costly.slot_s) / (step_s + 16 * costly.slot_s)
    assert paid[1] / paid[0] == pytest.approx(predicted, rel=0.10)


def test_users_beyond_a_lap_of_the_shape_take_its_laps_side_by_side_each_made_once_a_session_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from collections.abc import Iterator

    from tuner.capacity import shapes

    laps: list[int] = []
    sessions: list[int] = []
    real = shapes.synthesize_sessions  # type: ignore[attr-defined]

    def counting(*args: object, **kwargs: object) -> Iterator[object]:
        laps.append(1)
        for session in real(*args, **kwargs):  # type: ignore[arg-type]
            sessions.append(1)
            yield session

    monkeypatch.setattr(shapes, "synthesize_sessions", counting)
    prepared = prepare_simulated([f'workload.path="{DATA / "capacity-short.jsonl"}"'])
    requests = CapacityRequests(prepared, shapes.shape_trace(prepared, "workload"), {}, users=8, round_=1)
    # Eight users on a lap of three requests: each round of turns spans three laps; 40 turns, 107 laps' worth.
    sent = [requests.next_for(user) for _ in range(40) for user in range(8)]
    assert len(laps) == -(-len(sent) // 3)
    assert len({r.prompt_token_ids for r in sent}) == len(sent)  # every request its own prompt
    # A level that asks for two of the 2,048 summaries of a lap makes two of them.
    sessions.clear()
    summaries = CapacityRequests(prepared, shapes.shape_trace(prepared, "summary"), {}, users=2, round_=1)
    summaries.next_for(0), summaries.next_for(1)
    assert len(sessions) == 2


def test_a_sweep_whose_server_cannot_start_says_so_in_a_line_and_keeps_a_sweep_that_did_not_finish(
    tmp_path: Path,
) -> None:
    from tests.support import busy_port, one_error_line

    with busy_port() as port:
        done = run_tuner(*_simulated_sweep_args(tmp_path / "runs", "--baseline", "--set", f"engine.port={port}"))
    assert done.returncode == 1
    assert one_error_line(done).startswith("error: ")
    (stored,) = (tmp_path / "runs" / "stall-demo" / "capacity").glob("*.json")
    kept = read_sweep(stored)
    assert not kept.finished and kept.configs[0].levels == []
    assert kept.server.startswith("llama-server (simulated): ")
    assert _servers_of_this_test() == []


def test_a_level_that_breaks_leaves_the_host_through_the_deployers_restore(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import asyncio

    from tuner.capacity import command
    from tuner.config import load_study
    from tuner.deployers import base
    from tuner.errors import MeasurementError

    real = base.create_deployer
    left: list[object] = []

    class Watched:
        """The study's deployer, its exit (the restore of the baseline) seen."""

        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def __aenter__(self) -> Watched:
            await self.inner.__aenter__()  # type: ignore[attr-defined]
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            left.append(exc_info[0])
            await self.inner.__aexit__(*exc_info)  # type: ignore[attr-defined]

    async def broken(*args: object, **kwargs: object) -> object:
        raise MeasurementError("the level broke")

    monkeypatch.setattr(base, "create_deployer", lambda spec, *, transport: Watched(real(spec, transport=transport)))
    monkeypatch.setattr(command, "run_closed_loop", broken)
    overrides = ['engine.binary="simulated"', f'engine.extra_args=["--sim-speed", "20", "--sim-seed", "{os.getpid()}"]']
    spec, base_dir = load_study(DEMO, overrides)
    run_path = tmp_path / "runs" / "stall-demo"
    plan = command.plan_capacity(
        spec, base_dir, run_path, trial=None, baseline_only=True, host=None, options=spec.capacity
    )
    with pytest.raises(MeasurementError, match="the level broke"):
        asyncio.run(command.measure_capacity(plan, run_path, say=lambda _: None, saved=lambda _: None))
    assert left == [MeasurementError]
    assert _servers_of_this_test() == []


def test_a_check_beside_a_running_tuner_of_the_study_fails_naming_it_and_passes_once_it_ended(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    simulated = ["--runs-dir", str(runs), "--set", 'engine.binary="simulated"']
    busy = (
        f"FAIL  run directory: another tuner (pid {os.getpid()}) holds the study in {runs}/stall-demo now (a run or "
        "a capacity sweep), so it would be refused and the host is on that tuner's settings: wait for it or stop "
        "it, then check again"
    )
    with RunDirectory(runs / "stall-demo"):  # a run or a sweep of the study, in progress
        checked = run_cli(capsys, "run", str(DEMO), "--check", *simulated)
        assert checked.code == 1 and busy in checked.out.splitlines(), checked.out
        swept = run_cli(capsys, "capacity", str(DEMO), "--baseline", "--check", *simulated)
        assert swept.code == 1 and busy in swept.out.splitlines(), swept.out
        assert "the sweep can run" not in swept.out
    checked = run_cli(capsys, "run", str(DEMO), "--check", *simulated)
    assert checked.code == 0 and "run directory" not in checked.out, checked.out


def test_a_fleets_check_names_its_hosts_tuner_and_a_run_of_the_study_from_before_it_had_hosts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    hosts = 'hosts=[{name="gpu-a"},{name="gpu-b"}]'
    fleet = ["--runs-dir", str(runs), "--set", 'engine.binary="simulated"', "--set", hosts]
    with RunDirectory(runs / "stall-demo", hosts=["gpu-b"]):  # gpu-b's own controller
        checked = run_cli(capsys, "run", str(DEMO), "--check", *fleet)
        (failed,) = [line for line in checked.out.splitlines() if line.startswith("FAIL")]
        assert checked.code == 1 and failed.startswith(
            f"FAIL  gpu-b: run directory: another tuner (pid {os.getpid()}) holds host gpu-b of the study in "
        ), checked.out
        # A sweep of gpu-a is not held up by gpu-b's run (its own lock is free), nor is its check.
        swept = run_cli(capsys, "capacity", str(DEMO), "--baseline", "--check", "--host", "gpu-a", *fleet)
        assert swept.code == 0 and "gpu-b" not in swept.out, swept.out
        # The same study without its hosts would be refused beside the fleet: its check says why.
        alone = run_cli(capsys, "run", str(DEMO), "--check", *fleet[:4])
        assert alone.code == 1 and (
            f"FAIL  run directory: another tuner (pid {os.getpid()}) holds host gpu-b of the study in " in alone.out
        ), alone.out
    with RunDirectory(runs / "stall-demo"):  # a run of the study before [[hosts]] was added holds it alone
        checked = run_cli(capsys, "run", str(DEMO), "--check", "--host", "gpu-a", *fleet)
        assert checked.code == 1 and (
            f"FAIL  gpu-a: run directory: another tuner (pid {os.getpid()}) holds the study in " in checked.out
        ), checked.out


def test_a_lock_no_run_could_take_fails_the_check_naming_it_and_one_not_ours_prints_no_pid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    simulated = ["--runs-dir", str(runs), "--set", 'engine.binary="simulated"']
    (runs / "stall-demo" / ".lock").mkdir(parents=True)
    checked = run_cli(capsys, "run", str(DEMO), "--check", *simulated)
    assert checked.code == 1 and (
        f"FAIL  run directory: cannot read {runs}/stall-demo/.lock: Is a directory; a run could not take it either: "
        "remove it, or pass --runs-dir a directory" in checked.out.splitlines()
    ), checked.out
    (runs / "stall-demo" / ".lock").rmdir()
    # A lock whose holder wrote bytes that are not a pid: neither the check nor the refused run prints them.
    with (runs / "stall-demo" / ".lock").open("wb") as held:
        held.write(b"\x1b[31m\xff" * 100_000)
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        checked = run_cli(capsys, "run", str(DEMO), "--check", *simulated)
        assert checked.code == 1 and "another tuner (pid unknown) holds the study" in checked.out, checked.out
        assert len(checked.out) < 5_000 and "\x1b" not in checked.out
        with pytest.raises(StudyError, match=r"another tuner \(pid unknown\) is running the study"):
            RunDirectory(runs / "stall-demo").__enter__()
