"""A fleet on simulated hosts and the virtual clock (fast tier: no PostgreSQL, no real server): each host's
own baseline, scores against the trial's own host's baseline, the host-to-host spread, confirmation on every
host, dead controllers' trials (leases), live peers' trials left alone, a host that stays unreachable, the
per-host locks, records of version 1 and 2, and a storage URL's password kept out of sight."""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from tests.support.sim_study import SimulatedFleet, fleet_overrides, prepare_simulated, run_simulated_fleet
from tuner.config import ParamValue, load_study
from tuner.console import ConsoleObserver, render_leaderboard
from tuner.errors import ConfigError, ServerNotReady, StudyError
from tuner.fleet import (
    fail_own_interrupted_trials,
    fail_stale_trials,
    requeue,
    write_lease,
)
from tuner.runs import RunDirectory, lock_holder
from tuner.scoring import median_metrics, score_round
from tuner.search import HOST_CHECK_AFTER_FAILURES, PreparedStudy, open_optuna_study, over_budget
from tuner.search.samplers import distribution
from tuner.sim.runner import SimulatedTrialRunner
from tuner.storage import open_storage, shown_url, stored_spec
from tuner.study_record import LEASE_KEY, RECORD_KEY, HostRecord, TrialRecord, new_trial_attrs

HOSTS = {"gpu-a": 1.0, "gpu-b": 1.1, "gpu-c": 0.95}


def _fleet_prepared(hosts: list[str], *extra: str) -> PreparedStudy:
    return prepare_simulated([*fleet_overrides(hosts), "budget.trials=6", "confirm.pairs=2", *extra])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> SimulatedFleet:
    prepared = _fleet_prepared(list(HOSTS), 'search.pruner="none"')  # every host's trials complete
    return run_simulated_fleet(prepared, tmp_path_factory.mktemp("fleet") / "run", hosts=HOSTS, seed=3)


def _records(study: optuna.Study) -> list[tuple[optuna.trial.FrozenTrial, TrialRecord]]:
    return [(t, TrialRecord.of(t)) for t in study.get_trials()]


def test_each_host_measures_its_own_baseline_first_and_every_trial_records_its_host(fleet: SimulatedFleet) -> None:
    study = fleet.study
    records = _records(study)
    baselines = {r.host: t for t, r in records if r.baseline and t.state == TrialState.COMPLETE}
    assert set(baselines) == set(HOSTS)
    for trial, record in records:
        if record.deployed:
            assert record.host in HOSTS, trial.number
            if not record.baseline:  # measured after its host's baseline
                done = baselines[record.host].datetime_complete
                assert trial.datetime_start is not None and done is not None and trial.datetime_start >= done
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    assert sum(1 for _, r in records if r.deployed and not r.baseline) == 6  # the budget is the study's


def test_every_score_is_against_its_own_hosts_baseline(fleet: SimulatedFleet) -> None:
    """Recomputed from the rounds: the trial's host's baseline gives its stored score; another host's, 10% off,
    does not."""
    study = fleet.study
    spec = load_study(Path("studies/stall-demo.toml"))[0]
    records = _records(study)
    references = {r.host: median_metrics(r.rounds) for t, r in records if r.baseline and t.state == TrialState.COMPLETE}
    checked: set[str | None] = set()
    for trial, record in records:
        if trial.state != TrialState.COMPLETE or record.baseline or record.duplicate_of is not None:
            continue
        own = statistics.median(score_round(m, references[record.host], spec.objectives) for m in record.rounds)
        assert record.score == pytest.approx(own), trial.number
        other = next(h for h in references if h != record.host)
        theirs = statistics.median(score_round(m, references[other], spec.objectives) for m in record.rounds)
        assert abs(theirs - own) > 0.01, (trial.number, record.host, other)
        checked.add(record.host)
    assert len(checked) >= 2, checked  # trials scored on at least two hosts


def test_the_leaderboard_shows_each_trials_host_and_the_host_to_host_spread(fleet: SimulatedFleet) -> None:
    board = fleet.board
    assert all(row.host in HOSTS for row in board.rows)
    assert board.hosts is not None
    # gpu-b is 10% slower, gpu-c 5% faster: the prefill speed of their baselines spreads by about 15%
    assert 0.08 < board.hosts.between_hosts["prefill_tok_s"] < 0.5  # 15% apart, and the noise
    assert set(board.hosts.baselines["prefill_tok_s"]) == set(HOSTS)
    assert "prefill_tok_s" in board.hosts.between_rounds
    from rich.console import Console

    console = Console(width=200, record=True)
    render_leaderboard(board, console)
    text = console.export_text()
    assert "host" in text and "gpu-b" in text
    assert "host-to-host spread of the baseline over 3 hosts: " in text and "round to round" in text


def test_confirmation_remeasures_against_each_hosts_baseline_and_says_where_it_held(fleet: SimulatedFleet) -> None:
    study = fleet.study
    confirmed = {host: HostRecord.of(study, host).confirmations for host in HOSTS}
    assert all(confirmed.values()), confirmed  # every host (at least two) re-measured the best
    assert len({number for c in confirmed.values() for number in c}) == 1  # the same candidate
    message = fleet.board.recommendation.message
    assert "held on" in message or "not on" in message
    for host in HOSTS:
        assert host in message
        # How many pairs ran on that host and why they stopped, as a single host's recommendation says it.
        (confirmation,) = confirmed[host].values()
        assert f"{host} ({confirmation.mean:+.2f}, " in message
        assert f"over {confirmation.pairs_told()})" in message


def test_one_controller_driving_several_hosts_names_the_host_on_each_line(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    prepared = _fleet_prepared(["gpu-a", "gpu-b"], "budget.trials=4", "confirm.pairs=2")
    run_simulated_fleet(
        prepared, tmp_path / "run", hosts={"gpu-a": 1.0, "gpu-b": 1.0}, seed=1, observer=ConsoleObserver(console)
    )
    output = console.file.getvalue()  # type: ignore[attr-defined]
    trial_lines = [line for line in output.splitlines() if line.strip()]
    assert trial_lines, output
    # Every line says whose it is: both hosts confirm the same trial, in lines that would read alike.
    assert all(line.lstrip().startswith(("[gpu-a] ", "[gpu-b] ")) for line in trial_lines), output
    assert any(line.lstrip().startswith("[gpu-a] re-measuring trial") for line in trial_lines), output
    assert any(line.lstrip().startswith("[gpu-b] re-measuring trial") for line in trial_lines), output


def test_a_host_that_stays_unreachable_is_dropped_with_the_reason_and_the_study_goes_on(tmp_path: Path) -> None:
    prepared = _fleet_prepared(["gpu-a", "gpu-b"], "confirm.top=0")
    said: list[str] = []
    result = run_simulated_fleet(
        prepared, tmp_path / "run", hosts={"gpu-a": 1.0, "gpu-b": 1.0}, seed=1, unreachable=["gpu-b"], say=said.append
    )
    assert list(result.dropped) == ["gpu-b"] and "reconnect window" in result.dropped["gpu-b"]
    assert HostRecord.of(result.study, "gpu-b").dropped == result.dropped["gpu-b"]
    assert any("gpu-b dropped" in line for line in said)
    assert sum(1 for _, r in _records(result.study) if r.deployed and not r.baseline) == 6
    assert result.board.hosts is not None and "gpu-b" in result.board.hosts.dropped


class _BreaksAfterItsBaseline(SimulatedTrialRunner):
    """A host that measured its baseline and then broke: no server starts on it any more."""

    broken = False  # from its first trial on

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        self.broken = self.broken or bool(settings)
        if self.broken:
            raise ServerNotReady("no answer on port 8080 within 60 s")
        await super().start(settings, number=number, log_path=log_path, warm_up=warm_up)


class _BreaksAndChecksSlowly(_BreaksAfterItsBaseline):
    """As `_BreaksAfterItsBaseline`, its baseline's start taking a while to fail: its peer may have nothing
    left to measure meanwhile."""

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        if self.broken and not settings:
            await asyncio.sleep(1.0)
        await super().start(settings, number=number, log_path=log_path, warm_up=warm_up)


class _RefusesItsFirstThreeTrials(SimulatedTrialRunner):
    """A sound host whose first three trials' settings do not start (the settings' fault, not the host's)."""

    refused = 0

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        if settings and self.refused < HOST_CHECK_AFTER_FAILURES:
            self.refused += 1
            raise ServerNotReady("the process exited with status 1")
        await super().start(settings, number=number, log_path=log_path, warm_up=warm_up)


def _gpu_b_misbehaving(
    tmp_path: Path, runner: type[SimulatedTrialRunner], *extra: str, heartbeat_s: float = 10.0, grace_s: float = 120.0
) -> tuple[SimulatedFleet, list[str]]:
    """A two-host fleet (no pruning, no confirmation) whose gpu-b runs on `runner`; what its loops said."""
    prepared = _fleet_prepared(["gpu-a", "gpu-b"], "confirm.top=0", 'search.pruner="none"', *extra)
    said: list[str] = []
    result = run_simulated_fleet(
        prepared,
        tmp_path / "run",
        hosts={"gpu-a": 1.0, "gpu-b": 1.0},
        seed=1,
        runner_class={"gpu-b": runner},
        say=said.append,
        heartbeat_s=heartbeat_s,
        grace_s=grace_s,
    )
    return result, said


def test_a_host_whose_trials_keep_failing_and_whose_baseline_no_longer_starts_is_dropped(tmp_path: Path) -> None:
    result, said = _gpu_b_misbehaving(tmp_path, _BreaksAfterItsBaseline)
    reason = result.dropped["gpu-b"]
    assert list(result.dropped) == ["gpu-b"], result.dropped
    assert "failed in a row" in reason and "baseline settings no longer start" in reason, reason
    records = _records(result.study)
    failed_on_b = [t.number for t, r in records if r.host == "gpu-b" and t.state == TrialState.FAIL]
    assert len(failed_on_b) == HOST_CHECK_AFTER_FAILURES
    # Each of them queued again and measured by gpu-a, the budget spent there.
    again = {r.requeued_from: (t, r) for t, r in records if r.requeued_from is not None}
    assert set(again) == set(failed_on_b)
    assert all(t.state == TrialState.COMPLETE and r.host == "gpu-a" for t, r in again.values())
    assert sum(1 for t, r in records if r.deployed and not r.baseline and t.state == TrialState.COMPLETE) == 6
    assert any("gpu-b dropped" in line for line in said)


def test_a_peer_with_nothing_left_waits_for_a_host_checking_itself_and_measures_what_it_queues(
    tmp_path: Path,
) -> None:
    # gpu-b fails its three trials while gpu-a takes the rest of the budget; gpu-a, done with its own, must
    # not end the search while gpu-b checks its baseline, or the three trials gpu-b queues are never measured.
    result, _ = _gpu_b_misbehaving(tmp_path, _BreaksAndChecksSlowly, heartbeat_s=0.1, grace_s=5.0)
    assert list(result.dropped) == ["gpu-b"]
    records = _records(result.study)
    assert not [t.number for t, _ in records if t.state == TrialState.WAITING]
    assert sum(1 for t, r in records if r.deployed and not r.baseline and t.state == TrialState.COMPLETE) == 6


def test_a_host_whose_trials_fail_but_whose_baseline_still_starts_goes_on(tmp_path: Path) -> None:
    result, said = _gpu_b_misbehaving(tmp_path, _RefusesItsFirstThreeTrials, "budget.trials=10")
    assert result.dropped == {}
    assert any("gpu-b: its baseline settings start; the failures were the settings'" in line for line in said)
    records = _records(result.study)
    assert any(r.host == "gpu-b" and t.state == TrialState.COMPLETE and not r.baseline for t, r in records)
    assert not any(r.requeued_from is not None for _, r in records)  # the settings' failures stand


def test_every_host_unreachable_is_one_error(tmp_path: Path) -> None:
    prepared = _fleet_prepared(["gpu-a", "gpu-b"])
    with pytest.raises(StudyError, match="every host was dropped"):
        run_simulated_fleet(
            prepared, tmp_path / "run", hosts={"gpu-a": 1.0, "gpu-b": 1.0}, seed=1, unreachable=["gpu-a", "gpu-b"]
        )


def _running_trial(study: optuna.Study, host: str, settings: dict[str, object], *, at: float) -> int:
    trial = study.ask({"n_batch": optuna.distributions.CategoricalDistribution([64, 128, 512, 2048])})
    record = TrialRecord(settings={"n_batch": trial.params["n_batch"]}, host=host, deployed=True)
    trial.set_user_attr(RECORD_KEY, record.stored())
    write_lease(trial, host, now=at)
    return trial.number


def test_a_live_peers_running_trial_is_never_failed_and_a_silent_ones_is_failed_and_requeued() -> None:
    study = optuna.create_study()
    now = time.time()
    live = _running_trial(study, "gpu-b", {}, at=now - 5)
    silent = _running_trial(study, "gpu-c", {}, at=now - 500)
    mine = _running_trial(study, "gpu-a", {}, at=now - 500)
    failed = fail_stale_trials(study, {"gpu-a"}, grace_s=120, now=now)
    assert failed == [silent]
    states = {t.number: t.state for t in study.get_trials()}
    assert states[live] == TrialState.RUNNING and states[mine] == TrialState.RUNNING
    reason = TrialRecord.of(study.trials[silent]).fail_reason or ""
    assert "gpu-c" in reason and "silent for 500 s" in reason
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and TrialRecord.of(waiting[0]).requeued_from == silent
    assert TrialRecord.of(waiting[0]).deployed is False and TrialRecord.of(waiting[0]).host is None
    assert waiting[0].system_attrs["fixed_params"] == study.trials[silent].params
    # A second pass (or a peer's) fails nothing again.
    assert fail_stale_trials(study, {"gpu-a"}, grace_s=120, now=now) == []


def test_of_two_controllers_that_took_the_last_trial_at_once_the_later_one_is_over_the_budget() -> None:
    # Two hosts' controllers each saw one trial left of the budget and asked: the later trial is over (and
    # its controller skips it), the earlier one is not, and a re-queued trial's copy takes its original's place.
    study = optuna.create_study()
    now = time.time()
    done = _running_trial(study, "gpu-a", {}, at=now)
    study.tell(done, 1.0)
    first = _running_trial(study, "gpu-b", {}, at=now)
    second = _running_trial(study, "gpu-c", {}, at=now)
    assert not over_budget(study, first, 2)
    assert over_budget(study, second, 2)
    assert not over_budget(study, second, 3)
    study.tell(first, state=TrialState.FAIL)
    requeue(study, first, dict(study.trials[first].params), {"n_batch": study.trials[first].params["n_batch"]})
    copy = study.ask()
    assert TrialRecord.of(study.trials[copy.number]).requeued_from == first
    assert not over_budget(study, copy.number, 1)  # a copy is never over: its original no longer counts


def test_a_trial_asked_when_a_peer_took_the_last_one_of_the_budget_is_skipped_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gpu-a sees one trial left of a budget of 3 and asks; a peer on another machine (gpu-z) asked a moment
    # before it: gpu-a's trial is over the budget and skipped, and the study ends with 3 trials measured.
    prepared = _fleet_prepared(["gpu-a"], "budget.trials=3", "confirm.top=0", 'search.pruner="none"')
    ask, asked = optuna.Study.ask, []

    def peer_first(study: optuna.Study, *args: object, **kwargs: object) -> optuna.Trial:
        asked.append(1)
        if len(asked) == 3:  # gpu-a's third trial (the baseline is created, not asked)
            peer = ask(study)
            record = TrialRecord(settings={"n_batch": 64, "n_ubatch": 64}, host="gpu-z", deployed=True)
            peer.set_user_attr(RECORD_KEY, record.stored())
            write_lease(peer, "gpu-z")
            study.tell(peer, [1.0] * len(study.directions) if len(study.directions) > 1 else 1.0)
        return ask(study, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.Study, "ask", peer_first)
    result = run_simulated_fleet(prepared, tmp_path / "run", hosts={"gpu-a": 1.0}, seed=4)
    records = _records(result.study)
    over = [r for _, r in records if "over the study's budget of 3 trials" in (r.skip_reason or "")]
    assert len(over) == 1 and not over[0].deployed
    assert sum(1 for _, r in records if r.deployed and not r.baseline) == 3


def test_at_a_start_only_the_trials_of_the_hosts_this_controller_holds_are_its_interrupted_ones() -> None:
    study = optuna.create_study()
    now = time.time()
    peer = _running_trial(study, "gpu-b", {}, at=now - 500)  # silent, but not ours: its lease decides
    mine = _running_trial(study, "gpu-a", {}, at=now)
    assert fail_own_interrupted_trials(study, {"gpu-a"}, requeue=True, say=lambda _l: None) == [mine]
    assert study.trials[peer].state == TrialState.RUNNING


def test_a_requeued_trial_is_measured_by_another_host_with_a_fresh_record(tmp_path: Path) -> None:
    prepared = _fleet_prepared(["gpu-a"], "budget.trials=3", "confirm.top=0")
    storage = optuna.storages.InMemoryStorage()
    with RunDirectory(tmp_path / "seed", notice=lambda _l: None) as run_dir:
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=storage)
    settings: dict[str, ParamValue] = {"n_batch": 512, "n_ubatch": 512}
    params = prepared.space.encode(settings)
    distributions = {n: distribution(p) for n, p in prepared.space.params.items()}
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.RUNNING,
            params=params,
            distributions={n: distributions[n] for n in params},
            user_attrs={
                **new_trial_attrs(TrialRecord(settings=settings, host="gpu-gone", deployed=True, rounds=[{"x": 1.0}])),
                LEASE_KEY: {"host": "gpu-gone", "at": time.time() - 1000},
            },
        )
    )
    result = run_simulated_fleet(prepared, tmp_path / "run", hosts={"gpu-a": 1.0}, seed=2, storage=storage)
    trials = result.study.get_trials()
    assert trials[0].state == TrialState.FAIL and "gpu-gone" in (TrialRecord.of(trials[0]).fail_reason or "")
    again = [t for t in trials if TrialRecord.of(t).requeued_from == 0]
    assert len(again) == 1 and again[0].state == TrialState.COMPLETE
    record = TrialRecord.of(again[0])
    assert record.host == "gpu-a" and record.settings == settings and "x" not in record.rounds[0]


def test_a_second_controller_of_one_host_is_refused_and_another_host_may_share_the_directory(tmp_path: Path) -> None:
    with RunDirectory(tmp_path, hosts=["gpu-a"]):
        with pytest.raises(StudyError, match="running host gpu-a"), RunDirectory(tmp_path, hosts=["gpu-a"]):
            pass
        with RunDirectory(tmp_path, hosts=["gpu-b"]):
            pass
        with pytest.raises(StudyError, match="another tuner"), RunDirectory(tmp_path):
            pass
        # What `tuner run --check` names: the host's own controller; the directory itself is shared.
        assert lock_holder(tmp_path, ".lock-gpu-a") == str(os.getpid())
        assert lock_holder(tmp_path, ".lock-gpu-b") is None and lock_holder(tmp_path) is None
    assert lock_holder(tmp_path, ".lock-gpu-a") is None
    with RunDirectory(tmp_path):
        assert lock_holder(tmp_path) == str(os.getpid())


def test_a_version_1_record_may_lack_the_host_and_a_version_2_record_must_have_it() -> None:
    study = optuna.create_study()
    stored = TrialRecord(settings={"n_batch": 64}).stored()
    old = {k: v for k, v in stored.items() if k not in ("host", "requeued_from")} | {"version": 1}
    study.enqueue_trial({}, user_attrs={RECORD_KEY: old})
    trial = study.ask()
    assert TrialRecord.of(trial).host is None
    new = {k: v for k, v in stored.items() if k != "host"}
    trial.set_user_attr(RECORD_KEY, new)
    with pytest.raises(StudyError, match="host: missing"):
        TrialRecord.of(trial)


def test_the_fleet_sampler_counts_running_trials_constant_liar() -> None:
    prepared = _fleet_prepared(["gpu-a", "gpu-b"])
    with RunDirectory(Path("/tmp") / f"liar-{time.time_ns()}", notice=lambda _l: None) as run_dir:
        study = open_optuna_study(
            run_dir,
            prepared.spec,
            prepared.space,
            storage=optuna.storages.InMemoryStorage(),
        )
    model = study.sampler._model  # type: ignore[union-attr]
    assert model._constant_liar is True


SECRET = "s3cret-pw-91"


def test_a_storage_password_is_never_stored_and_never_in_an_error() -> None:
    url = f"postgresql://tuner:{SECRET}@127.0.0.1:1/tuner"
    assert SECRET not in shown_url(url) and "tuner@127.0.0.1:1/tuner" in shown_url(url)
    spec = stored_spec({"name": "x", "storage": {"url": url, "heartbeat_s": 10.0}})
    assert SECRET not in str(spec)
    with pytest.raises(StudyError) as unreachable:
        open_storage(url)
    assert SECRET not in str(unreachable.value) and "cannot open the study's storage" in str(unreachable.value)
    assert unreachable.value.exit_code == 1
    with pytest.raises(ConfigError) as bad:
        open_storage("not a url at all")
    assert bad.value.exit_code == 2 and "storage.url is not a database URL" in str(bad.value)


def test_a_fleet_study_file_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="twice"):
        prepare_simulated(fleet_overrides(["a", "a"]))
    with pytest.raises(ConfigError, match="every host of a study shares"):
        prepare_simulated(['hosts=[{name = "a", engine = {settings = {n_batch = 64}}}]'])
    with pytest.raises(ConfigError, match="at least twice heartbeat_s"):
        prepare_simulated(['storage={url = "postgresql://x@y/z", heartbeat_s = 10, grace_s = 5}'])
