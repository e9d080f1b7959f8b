"""Live progress and `tuner status`: what a user sees of a run while it goes on, and after.

The tracker is fed scripted events on a fake clock (its counts and its estimate are exact there); the
status command reads run directories written by the study's own search loop on the simulated server
(tests/support/sim_study.py), once finished and once paused in the middle of a round by an observer, with the
run's lock held by the run itself. No test sleeps: a paused run is waited for by an event.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from rich.console import Console

from tests.support import run_cli
from tests.support.sim_study import prepare_simulated, run_simulated
from tuner.config import ParamValue
from tuner.console import ConsoleObserver
from tuner.errors import StudyError
from tuner.live import LiveDisplay, run_observer
from tuner.observers import EVENTS, NullObserver, Observers, StudyObserver
from tuner.progress import Plan, ProgressTracker
from tuner.progress_file import PROGRESS_FILE, Progress, progress_file, read_progress
from tuner.runs import RunDirectory
from tuner.sim.model import NoiseModel

PLAN = Plan(budget_trials=2, budget_hours=None, rounds_per_trial=2, confirm_top=1, confirm_pairs=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def one_line(text: str) -> str:
    """`text` with the console's wrapping undone, for asserting on a sentence."""
    return " ".join(text.split())


def start(tracker: ProgressTracker | Observers, clock: Clock, *, baseline_done: bool = False) -> None:
    tracker.study_started(name="demo", run_dir="runs/demo", baseline_done=baseline_done, trials_done=0, budget=2)


def measure_round(o: StudyObserver, clock: Clock, number: int, index: int, total: int, *, seconds: float) -> None:
    o.round_started(number=number, label=f"round {index}/{total}", index=index, total=total)
    o.server_starting(number=number)
    o.server_ready(number=number, seconds=1.0)
    o.warming_up(number=number)
    o.replay_started(number=number, label=f"round {index}/{total}")
    clock.now += seconds
    o.round_finished(number=number, label=f"round {index}/{total}", metrics={}, failures=0)


# -- the tracker


def test_the_tracker_counts_rounds_and_estimates_the_time_left_from_measured_rounds(tmp_path: Path) -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    tracker.trial_started(number=0, settings={}, baseline=True)
    # The baseline's 2 rounds, 2 trials of 2 rounds, 1 candidate's 2 pairs of 2 rounds; no round timed yet.
    assert (tracker.snapshot().rounds_left, tracker.snapshot().eta_s, tracker.snapshot().trials_done) == (10, None, 0)

    measure_round(tracker, clock, 0, 1, 2, seconds=10)
    after_one = tracker.snapshot()
    assert (after_one.rounds_done, after_one.rounds_left, after_one.round_s) == (1, 9, 10.0)
    assert after_one.eta_s == pytest.approx(90)

    tracker.round_started(number=0, label="round 2/2", index=2, total=2)
    clock.now += 5  # halfway through a round: its time so far is off the estimate
    assert tracker.snapshot().eta_s == pytest.approx(85)
    clock.now += 15
    tracker.round_finished(number=0, label="round 2/2", metrics={}, failures=0)
    tracker.trial_finished(number=0, score=0.0, noisy=[])
    baseline_done = tracker.snapshot()
    assert baseline_done.baseline_done and baseline_done.round_s == pytest.approx(15)
    assert (baseline_done.rounds_left, baseline_done.eta_s) == pytest.approx((8, 120))

    tracker.trial_started(number=1, settings={"n_batch": 256}, baseline=False)
    tracker.trial_started(number=2, settings={"n_batch": 128}, baseline=False)
    measure_round(tracker, clock, 1, 1, 2, seconds=15)
    tracker.round_started(number=2, label="round 1/2", index=1, total=2)
    tracker.server_starting(number=2)
    now = tracker.snapshot()
    assert now.trials_running == [1, 2]
    assert now.current is not None and (now.current.number, now.current.index, now.current.total) == (2, 1, 2)
    assert now.current.phase == "starting the server" and now.current.settings == {"n_batch": 128}
    clock.now += 15
    tracker.trial_failed(number=2, reason="the server exited with status 1")
    measure_round(tracker, clock, 1, 2, 2, seconds=15)
    tracker.remeasuring(metrics=["stall_tok_s"], extra=1)  # trial 1 gets a third round
    assert tracker.snapshot().rounds_left == 1 + 4
    measure_round(tracker, clock, 1, 3, 3, seconds=15)
    tracker.trial_finished(number=1, score=0.4, noisy=["stall_tok_s"])
    tracker.best_so_far(number=1, score=0.4, settings={"n_batch": 256})
    searched = tracker.snapshot()
    assert (searched.trials_done, searched.failed, searched.trials_running) == (2, 1, [])
    assert searched.best is not None and (searched.best.number, searched.best.score) == (1, 0.4)
    # A failed attempt counts in the round time: 5 rounds measured in 90 s of rounds (trial 2's 15 s
    # included), so 18 s each.
    assert searched.rounds_done == 5 and searched.round_s == pytest.approx(18)
    assert searched.rounds_left == 4  # the confirmation's 2 pairs

    tracker.confirm_started(number=1, settings={"n_batch": 256}, pairs=2)
    tracker.round_started(number=0, label="pair 1/2 (baseline)", index=1, total=4)
    pair = tracker.snapshot()
    assert pair.confirming == 1 and pair.current is not None and pair.current.baseline
    assert pair.rounds_left == 4
    tracker.restoring()
    tracker.study_ended(outcome="finished")
    ended = tracker.snapshot()
    assert (ended.state, ended.rounds_left, ended.eta_s, ended.current) == ("finished", 0, 0.0, None)
    # What another process reads is what the tracker held at its last event.
    assert read_progress(tmp_path) == ended.model_copy(update={"updated_at": clock.now})


def test_tuner_status_says_the_confirmations_pairs_as_the_leaderboard_does(tmp_path: Path) -> None:
    from tuner.study_record import Confirmation

    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=Clock())
    tracker.confirm_started(number=1, settings={"n_batch": 256}, pairs=4)
    assert tracker.snapshot().last == "re-measuring trial 1 against the baseline in up to 4 pairs"
    result = Confirmation(differences=[1.4, 1.6], mean=1.5, ci=[1.2, 1.8], planned_pairs=4, stopped="above")
    tracker.confirm_finished(number=1, result=result)
    assert tracker.snapshot().last == (
        "trial 1 against the baseline: +1.50, 95% interval +1.20..+1.80 over 2 of at most 4 alternating pairs "
        "(stopped early: its interval cleared the minimum effect)"
    )


def test_the_tracker_says_where_the_runs_time_went_per_phase_across_resumes(tmp_path: Path) -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    clock.now += 1  # opening the study, reaching the host
    tracker.trial_started(number=0, settings={}, baseline=True)
    tracker.round_started(number=0, label="round 1/2", index=1, total=2)
    tracker.server_starting(number=0)
    clock.now += 4
    tracker.server_ready(number=0, seconds=3.5)
    tracker.probing(number=0)
    clock.now += 2
    tracker.replay_started(number=0, label="round 1/2")
    clock.now += 20
    tracker.round_finished(number=0, label="round 1/2", metrics={}, failures=0)
    clock.now += 0.5
    tracker.round_started(number=0, label="round 2/2", index=2, total=2)
    tracker.server_reused(number=0)
    clock.now += 0.25
    tracker.warming_up(number=0)
    clock.now += 1
    tracker.replay_started(number=0, label="round 2/2")
    clock.now += 3  # a third of the round so far: counted as it goes
    assert tracker.snapshot().phase_seconds == pytest.approx(
        {
            "stopping and starting the server": 4.0,
            "clearing the running server's slots": 0.25,
            "warm-up": 1.0,
            "correctness probes": 2.0,
            "replaying the workload": 23.0,
            "between rounds: scoring, storage, the sampler": 1.5,
        }
    )
    clock.now += 17
    tracker.round_finished(number=0, label="round 2/2", metrics={}, failures=0)
    tracker.study_ended(outcome="interrupted")
    clock.now += 3600  # the run stopped: nothing counts until it resumes

    resumed = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(resumed, clock)
    measure_round(resumed, clock, 0, 2, 2, seconds=10)
    seconds = resumed.snapshot().phase_seconds
    assert seconds["replaying the workload"] == pytest.approx(50.0)
    assert seconds["between rounds: scoring, storage, the sampler"] == pytest.approx(1.5)
    assert sum(seconds.values()) == pytest.approx(1 + 4 + 2 + 20 + 0.5 + 0.25 + 1 + 20 + 10)


def test_the_budgets_hours_bound_the_trials_the_estimate_counts() -> None:
    clock = Clock()
    plan = Plan(budget_trials=10, budget_hours=0.01, rounds_per_trial=2, confirm_top=1, confirm_pairs=2)
    tracker = ProgressTracker(plan, clock=clock)
    start(tracker, clock)
    tracker.trial_started(number=0, settings={}, baseline=True)
    measure_round(tracker, clock, 0, 1, 2, seconds=10)
    # 36 s of budget, 10 gone, the baseline's last round takes 10: 16 s buy 2 rounds of new trials (20 without
    # the bound), then the confirmation's 4.
    capped = tracker.snapshot()
    assert capped.eta_capped
    assert (capped.rounds_left, capped.eta_s) == pytest.approx((1 + 2 + 4, 70))


def test_no_confirmation_is_counted_once_the_search_ends_with_no_trial_above_the_baseline() -> None:
    clock = Clock()
    plan = Plan(budget_trials=1, budget_hours=None, rounds_per_trial=2, confirm_top=1, confirm_pairs=3)
    tracker = ProgressTracker(plan, clock=clock)
    start(tracker, clock, baseline_done=True)
    tracker.trial_started(number=1, settings={"n_batch": 64}, baseline=False)
    assert tracker.snapshot().rounds_left == 2 + 6
    measure_round(tracker, clock, 1, 1, 2, seconds=4)
    measure_round(tracker, clock, 1, 2, 2, seconds=4)
    tracker.trial_finished(number=1, score=-0.3, noisy=[])
    assert tracker.snapshot().rounds_left == 0


def test_a_tracker_whose_study_never_began_writes_nothing(tmp_path: Path) -> None:
    # Another run holding the directory refuses this one before its study begins: the file is that run's.
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE)
    tracker.study_ended(outcome="failed")
    assert not (tmp_path / PROGRESS_FILE).exists()


def test_the_fan_out_tells_each_observer_every_event_in_order() -> None:
    # Each event is written once (StudyObserver); the null observer inherits it and the fan-out is made from it.
    protocol = {name: inspect.signature(getattr(StudyObserver, name)) for name in EVENTS}
    assert len(protocol) >= 20
    assert all(inspect.signature(getattr(Observers, event)) == protocol[event] for event in EVENTS)
    assert isinstance(NullObserver(), StudyObserver)

    told: list[tuple[str, str]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, event: str) -> object:
            return lambda **_: told.append((self.name, event))

    fan = Observers(Recorder("a"), Recorder("b"))  # type: ignore[arg-type]
    for event, signature in protocol.items():
        arguments = {name: None for name in list(signature.parameters)[1:]}
        getattr(fan, event)(**arguments)
    assert told == [(who, event) for event in protocol for who in ("a", "b")]


# -- the live display


def test_the_live_panel_shows_the_phase_and_round_k_of_n_and_prints_failures_above_it() -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, clock=clock)
    console = Console(force_terminal=True, record=True, width=120)
    with LiveDisplay(console, tracker, auto_refresh=False) as display:
        observer = Observers(tracker, display)
        start(observer, clock, baseline_done=True)
        observer.trial_started(number=3, settings={"n_batch": 256, "n_ubatch": 128}, baseline=False)
        measure_round(observer, clock, 3, 1, 2, seconds=12)
        observer.round_started(number=3, label="round 2/2", index=2, total=2)
        observer.server_starting(number=3)
        clock.now += 3
        display.refresh()
        during = console.export_text(clear=False)
        observer.trial_failed(number=3, reason="the server exited [status 1]")
        display.refresh()
    shown = console.export_text()
    assert "trial 3 (n_batch=256 n_ubatch=128): round 2 of 2, starting the server (3 s)" in during
    # This round, trial 4's 2 (the budget's second trial), the confirmation's 2 pairs: 7 rounds of 12 s, less
    # the 3 s this one has run.
    assert "1 done in this run, about 7 left" in during
    assert "about 1m21s left" in during
    # The failure is a line of its own, above the panel that follows it, which shows it as the last event.
    assert "trial 3 FAIL the server exited [status 1]" in shown
    assert shown.rindex("FAIL the server exited") < shown.rindex("╭─ study demo")
    assert "trial 3 FAILED: the server exited [status 1]" in shown[shown.rindex("╭─ study demo") :]


def test_off_a_terminal_the_run_prints_the_plain_lines_and_no_panel(tmp_path: Path) -> None:
    clock = Clock()
    console = Console(file=open(os.devnull, "w"), record=True, width=200)  # noqa: SIM115 (closed below)
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    try:
        assert not console.is_terminal
        with run_observer(console, tracker) as observer:
            assert isinstance(observer, Observers)
            assert [type(o) for o in observer.observers] == [ProgressTracker, ConsoleObserver]
            start(observer, clock)
            observer.trial_started(number=0, settings={}, baseline=True)
            measure_round(observer, clock, 0, 1, 2, seconds=2)
    finally:
        console.file.close()
    lines = console.export_text().splitlines()
    assert lines[0].startswith("study demo  in runs/demo  budget 2 trials")
    assert lines[1:] == [
        "trial 0  baseline (the server's own settings)",
        "  trial 0: server healthy after 1.0 s",
        "  trial 0 round 1/2  ttft p95 (s) -  stall (tok/s) -  prefill (tok/s) -  itl max (s) -",
    ]
    assert read_progress(tmp_path) is not None  # the progress file is written all the same


# -- tuner status


def files_of(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `directory` with its mode, modification time and content; the directory's own mtime."""
    found = {".": (0, directory.stat().st_mtime_ns, b"")}
    for path in sorted(directory.rglob("*")):
        info = path.stat()
        content = path.read_bytes() if path.is_file() else b""
        found[str(path.relative_to(directory))] = (info.st_mode, info.st_mtime_ns, content)
    return found


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prepared = prepare_simulated(["budget.trials=3"])
    run_path = tmp_path_factory.mktemp("runs") / prepared.spec.name
    tracker = ProgressTracker(Plan.of(prepared.spec), path=run_path / PROGRESS_FILE)
    run_simulated(prepared, run_path, seed=3, in_memory=False, observer=tracker)
    return run_path


def test_status_of_a_finished_run_shows_its_counts_and_best_and_says_it_is_not_running(
    capsys: pytest.CaptureFixture[str], finished_run: Path
) -> None:
    from tuner.report import build_leaderboard
    from tuner.storage import open_optuna_study_readonly

    before = files_of(finished_run)
    outcome = run_cli(capsys, "status", str(finished_run))
    assert files_of(finished_run) == before
    assert outcome.code == 0, outcome.err
    shown = one_line(outcome.out)
    assert f"{finished_run}: not running: finished at" in shown
    assert "3 of 3 done after the baseline (trial 0: measured)" in shown
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(finished_run)))
    best = max(
        (r for r in board.rows if not r.baseline and r.score is not None and not r.violates and r.state == "COMPLETE"),
        key=lambda r: r.score or 0.0,
    )
    settings = " ".join(f"{k}={v}" for k, v in sorted(best.settings.items()))
    assert f"best so far trial {best.number}: score {best.score:+.2f} {settings}" in shown
    assert "the run finished" in shown and "left" not in shown  # no estimate for a run that is over


def test_status_json_says_the_same(capsys: pytest.CaptureFixture[str], finished_run: Path) -> None:
    outcome = run_cli(capsys, "status", str(finished_run), "--json")
    assert outcome.code == 0, outcome.err
    status = json.loads(outcome.out)
    assert (status["running"], status["remaining_s"]) == (False, None)
    assert status["status"].startswith("not running: finished at")
    progress = Progress.model_validate(status["progress"])
    assert (progress.state, progress.trials_done, progress.budget_trials, progress.baseline_done) == (
        "finished",
        3,
        3,
        True,
    )
    # The baseline's 2 rounds, 3 trials' (pruned ones stop after 1), the confirmation's pairs.
    assert progress.rounds_done >= 2 + 3 + 1 and progress.rounds_left == 0


class _PauseAt(NullObserver):
    """Holds the run (and so its lock) at the first `round_started` of `trial` until released."""

    def __init__(self, trial: int) -> None:
        self.trial = trial
        self.reached = threading.Event()
        self.release = threading.Event()

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        if number == self.trial and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(timeout=120), "the test never released the run"


@pytest.fixture
def paused_run(tmp_path: Path) -> Iterator[tuple[Path, _PauseAt]]:
    """A study on the simulated server, held at trial 2's first round: the baseline and trial 1's first
    round are measured, the batch of trials 1-3 is under way."""
    prepared = prepare_simulated(["budget.trials=3", "interleave=3", "confirm.top=1", "confirm.pairs=4"])
    run_path = tmp_path / "runs" / prepared.spec.name
    tracker = ProgressTracker(Plan.of(prepared.spec), path=run_path / PROGRESS_FILE)
    pause = _PauseAt(2)
    failure: list[BaseException] = []

    def study() -> None:
        try:
            # Without noise no round is re-measured, so the counts below are the plan's.
            observer = Observers(tracker, pause)
            run_simulated(prepared, run_path, seed=5, noise=NoiseModel(), in_memory=False, observer=observer)
        except BaseException as exc:
            failure.append(exc)
            pause.reached.set()

    thread = threading.Thread(target=study)
    thread.start()
    try:
        assert pause.reached.wait(timeout=120), "the simulated study never reached trial 2"
        assert not failure, failure
        yield run_path, pause
    finally:
        pause.release.set()
        thread.join(timeout=120)
    assert not failure, failure


def test_status_while_a_run_holds_its_directory_says_running_with_the_phase_and_the_time_left(
    capsys: pytest.CaptureFixture[str], paused_run: tuple[Path, _PauseAt]
) -> None:
    run_path, _ = paused_run
    before = files_of(run_path)
    outcome = run_cli(capsys, "status", str(run_path))
    after = files_of(run_path)
    assert after == before  # no lock taken for good, nothing written, not even a timestamp
    assert outcome.code == 0, outcome.err
    shown = one_line(outcome.out)
    assert f"{run_path}: running (pid {os.getpid()}); last update" in shown
    assert "0 of 3 done after the baseline (trial 0: measured); measuring trials 1, 2, 3" in shown
    assert "trial 2 (" in shown and "round 1 of 2, getting the server ready" in shown
    # Measured: the baseline's 2 rounds and trial 1's first (a pruned trial would have ended its rounds).
    # Left: trial 2's and 3's 2 each (this one included), trial 1's second, the confirmation's 4 pairs.
    assert "3 done in this run, about 13 left" in shown
    assert "so far, about" in shown and "s left" in shown
    status = json.loads(run_cli(capsys, "status", str(run_path), "--json").out)
    assert status["running"] and status["pid"] == os.getpid() and status["remaining_s"] is not None


def test_status_of_a_run_that_was_killed_says_it_stopped_without_finishing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    tracker.trial_started(number=0, settings={}, baseline=True)
    tracker.round_started(number=0, label="round 1/2", index=1, total=2)  # then SIGKILL: no end is told
    shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
    assert "not running: it stopped after" in shown and "without finishing" in shown
    assert "`tuner run` with its study file resumes it" in shown


def test_status_while_a_resume_is_starting_says_the_progress_is_the_last_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    tracker.study_ended(outcome="interrupted")
    assert "not running: interrupted at" in one_line(run_cli(capsys, "status", str(tmp_path)).out)
    earlier = tmp_path / PROGRESS_FILE
    stored = Progress.model_validate_json(earlier.read_bytes())
    earlier.write_text(stored.model_copy(update={"pid": 1}).model_dump_json())  # the last run's own pid
    with RunDirectory(tmp_path, notice=lambda _: None):
        shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
    assert f"running (pid {os.getpid()}), starting: what follows is the previous run's state" in shown


def test_status_during_a_capacity_sweep_says_it_sweeps_and_names_its_record_and_an_older_record_is_not_taken_for_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    tracker.study_ended(outcome="finished")
    earlier = tmp_path / "capacity" / "20261204T010000.json"
    earlier.parent.mkdir()
    earlier.write_text("{}")
    os.utime(earlier, (1_000_000.0, 1_000_000.0))  # a sweep of an earlier night
    with RunDirectory(tmp_path, notice=lambda _: None):
        shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
        assert "a capacity sweep" not in shown  # the holder has written no sweep: it is a study starting
        sweep = RunDirectory(tmp_path).capacity_path("20261204T020000", None)
        sweep.write_text("{}")  # `tuner capacity` writes its record once it holds the lock, then every level
        shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
    assert shown.startswith(f"{tmp_path}: running (pid {os.getpid()}): a capacity sweep (`tuner capacity`, or ")
    assert f"its record {sweep} last written" in shown
    assert "not running: finished at" in one_line(run_cli(capsys, "status", str(tmp_path)).out)


def test_controllers_sharing_a_run_directory_each_keep_their_progress_and_status_shows_each(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Two `tuner run --host` controllers of one fleet in one run directory: gpu-a's runs (it holds its host's
    # lock), gpu-b's was interrupted. One progress.json would be the last writer's.
    assert progress_file(()) == PROGRESS_FILE
    assert progress_file(["gpu-b", "gpu-a"]) == "progress-gpu-a+gpu-b.json"
    clock = Clock()
    running = ProgressTracker(PLAN, path=tmp_path / progress_file(["gpu-a"]), clock=clock)
    stopped = ProgressTracker(PLAN, path=tmp_path / progress_file(["gpu-b"]), clock=clock)
    for tracker in (running, stopped):
        start(tracker, clock)
    running.trial_started(number=3, settings={"n_batch": 64}, baseline=False)
    stopped.trial_started(number=4, settings={"n_batch": 128}, baseline=False)
    clock.now += 5
    stopped.study_ended(outcome="interrupted")
    with RunDirectory(tmp_path, notice=lambda _: None, hosts=["gpu-a"]):
        shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
        status = json.loads(run_cli(capsys, "status", str(tmp_path), "--json").out)
    assert not (tmp_path / PROGRESS_FILE).exists()
    assert "no progress file" not in shown  # the directory's own file: none, its controllers have theirs
    assert f"{tmp_path} (controller of gpu-a): running (pid {os.getpid()}); last update" in shown
    assert "measuring trial 3" in shown
    assert f"{tmp_path} (controller of gpu-b): not running: interrupted at" in shown
    assert "`tuner run` with its study file and --host gpu-b resumes it" in shown
    controllers = [(c["hosts"], c["running"], c["progress"]["state"]) for c in status["controllers"]]
    assert controllers == [(["gpu-a"], True, "running"), (["gpu-b"], False, "interrupted")]
    # Only controllers wrote here: the run is running while one of them is, for a script reading the top.
    assert status["running"] is True and status["status"].startswith("1 of 2 controllers running"), status
    resumed = ProgressTracker(PLAN, path=tmp_path / progress_file(["gpu-b"]), clock=clock)
    start(resumed, clock)  # gpu-b's controller again: its own file's time so far is carried over
    assert resumed.snapshot().phase_seconds == pytest.approx(stopped.snapshot().phase_seconds)


def test_status_passes_over_files_no_controller_wrote_and_names_a_controller_of_many_hosts_within_limits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A file name has at most 255 bytes: a controller of many long host names is named by its first.
    many = [f"{letter * 100}" for letter in "cab"]
    name = progress_file(many)
    assert len(name) < 255 and name == f"progress-{'a' * 100}+=2.json"
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / name, clock=clock)
    start(tracker, clock)
    tracker.study_ended(outcome="interrupted")
    # Files of that shape that no controller wrote: unreadable, a host name no study has, a link.
    (tmp_path / "progress-gpu-a+gpu-b.json").write_text("{junk")
    (tmp_path / "progress-.json").write_text("{}")
    (tmp_path / "progress-x.json").symlink_to(tmp_path / name)
    done = run_cli(capsys, "status", str(tmp_path), "--json")
    status = json.loads(done.out)
    assert [(c["hosts"], c["progress"]["state"]) for c in status["controllers"]] == [(["a" * 100], "interrupted")]
    assert status["running"] is False


def test_status_of_a_fleet_run_by_one_controller_says_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `tuner run fleet.toml` without --host: one controller drives every host, and holds the directory's lock
    # shared (another host's controller may join) and each host's lock alone.
    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    with RunDirectory(tmp_path, notice=lambda _: None, hosts=["gpu-a", "gpu-b"]):
        start(tracker, clock)
        shown = one_line(run_cli(capsys, "status", str(tmp_path)).out)
    assert f"{tmp_path}: running (pid {os.getpid()}); last update" in shown
    tracker.study_ended(outcome="finished")
    assert f"{tmp_path}: not running: finished at" in one_line(run_cli(capsys, "status", str(tmp_path)).out)


@pytest.mark.parametrize("make", ["empty", "file", "missing"])
def test_status_of_a_directory_that_is_not_a_run_exits_2_naming_the_problem_and_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, make: str
) -> None:
    target = tmp_path / "somewhere"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("not a directory")
    before = files_of(tmp_path)
    outcome = run_cli(capsys, "status", str(target))
    assert files_of(tmp_path) == before
    assert outcome.code == 2
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in outcome.err
    reason = {"empty": "is not a run directory", "file": "is not a directory", "missing": "does not exist"}[make]
    assert lines[0].startswith(f"error: {target} {reason}")
    assert "pass a run directory made by `tuner run`" in lines[0] or "pass one made by `tuner run`" in lines[0]


def test_a_damaged_or_newer_progress_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / PROGRESS_FILE).write_text('{"version": 1, "study": ')
    outcome = run_cli(capsys, "status", str(tmp_path))
    assert outcome.code == 1 and outcome.err.count("\n") == 1
    assert "is not a progress file this serve-tuner wrote" in outcome.err
    (tmp_path / PROGRESS_FILE).write_text('{"version": 7}')
    with pytest.raises(StudyError, match="newer serve-tuner"):
        read_progress(tmp_path)


def test_status_imports_neither_optuna_nor_the_reports(tmp_path: Path) -> None:
    # Run from another shell while a study runs: it reads one small file, not the journal.
    import subprocess
    import sys

    clock = Clock()
    tracker = ProgressTracker(PLAN, path=tmp_path / PROGRESS_FILE, clock=clock)
    start(tracker, clock)
    script = (
        "import sys; from tuner.cli import main; code = main(['status', sys.argv[1]]); "
        "heavy = {'optuna', 'pandas', 'numpy', 'scipy', 'matplotlib', 'httpx', 'asyncssh'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules})); sys.exit(code)"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_status_of_a_run_directory_without_a_progress_file_points_to_the_leaderboard(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "optuna.journal").write_text("")  # made by an earlier serve-tuner
    outcome = run_cli(capsys, "status", str(tmp_path))
    assert outcome.code == 0
    assert f"`tuner leaderboard {tmp_path}` shows its trials" in one_line(outcome.out)


def test_the_study_reports_each_rounds_phases_in_order(tmp_path: Path) -> None:
    told: list[tuple[str, int]] = []

    class Phases(NullObserver):
        def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
            told.append((f"round_started {label} {index}/{total}", number))

        def server_starting(self, *, number: int) -> None:
            told.append(("server_starting", number))

        def server_ready(self, *, number: int, seconds: float) -> None:
            told.append(("server_ready", number))

        def warming_up(self, *, number: int) -> None:
            told.append(("warming_up", number))

        def probing(self, *, number: int) -> None:
            told.append(("probing", number))

        def replay_started(self, *, number: int, label: str) -> None:
            told.append((f"replay_started {label}", number))

        def round_finished(
            self, *, number: int, label: str, metrics: Mapping[str, float | None], failures: int
        ) -> None:
            told.append((f"round_finished {label}", number))

        def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
            told.append(("confirm_started", number))

        def study_ended(self, *, outcome: str) -> None:
            told.append((f"study_ended {outcome}", -1))

    prepared = prepare_simulated(["budget.trials=1", "confirm.pairs=2"])
    run_simulated(prepared, tmp_path / "s", seed=1, noise=NoiseModel(), observer=Phases())
    first = ["round_started round 1/2 1/2", "server_starting", "server_ready", "warming_up", "probing"]
    second = ["round_started round 2/2 2/2", "server_starting", "server_ready", "warming_up"]
    assert [event for event, number in told if number == 0][:13] == [
        *first,
        "replay_started round 1/2",
        "round_finished round 1/2",
        *second,
        "replay_started round 2/2",
        "round_finished round 2/2",
    ]
    assert [event for event, number in told if number == 1][:7] == [
        *first,
        "replay_started round 1/2",
        "round_finished round 1/2",
    ]
    confirming = [event for event, _ in told[told.index(("confirm_started", 1)) + 1 :]]
    assert [e for e in confirming if e.startswith("round_started")] == [
        "round_started pair 1/2 (baseline) 1/4",
        "round_started pair 1/2 2/4",
        "round_started pair 2/2 3/4",
        "round_started pair 2/2 (baseline) 4/4",
    ]
    assert told[-1] == ("study_ended finished", -1)


def test_a_resumed_run_shows_the_best_trial_its_earlier_runs_measured(tmp_path: Path) -> None:
    prepared = prepare_simulated(["budget.trials=2", "confirm.top=0"])
    run_path = tmp_path / prepared.spec.name
    first = ProgressTracker(Plan.of(prepared.spec), path=run_path / PROGRESS_FILE)
    run_simulated(prepared, run_path, seed=2, noise=NoiseModel(), in_memory=False, observer=first)
    measured = first.snapshot().best
    assert measured is not None
    # The same budget again: nothing is left to measure, and the best comes from the journal alone.
    again = ProgressTracker(Plan.of(prepared.spec), path=run_path / PROGRESS_FILE)
    run_simulated(prepared, run_path, seed=2, noise=NoiseModel(), in_memory=False, observer=again)
    resumed = again.snapshot()
    assert resumed.rounds_done == 0 and resumed.best == measured
    assert resumed.trials_done == 2 and resumed.baseline_done


@pytest.mark.parametrize("lock", [".lock", ".lock-gpu-a"])
def test_a_run_that_starts_while_a_reader_looks_at_its_lock_is_not_turned_away(tmp_path: Path, lock: str) -> None:
    # `tuner status` and `--check` hold a lock shared for a moment to see whether a run holds it: the study's,
    # or a fleet host's.
    (tmp_path / lock).write_text("")
    with (tmp_path / lock).open("rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)
        released = threading.Timer(0.05, fcntl.flock, (reader, fcntl.LOCK_UN))
        released.start()
        try:
            with RunDirectory(tmp_path, hosts=["gpu-a"] if lock != ".lock" else []):
                assert (tmp_path / lock).read_text() == str(os.getpid())
        finally:
            released.join()
