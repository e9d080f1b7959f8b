"""The command's entry: a study file prepared and checked, its run directory and study opened, the host (or a
fleet's hosts) reached, and the search loop driven on each; the host ends on its baseline."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

import optuna

from tuner.config import HostEntry, StudySpec
from tuner.deployers.base import RecoveringDeployer, check_launch, create_deployer
from tuner.errors import ConfigError, DeployError, MeasurementError, StudyError, TransportError
from tuner.fleet import fleet_seed
from tuner.observers import FLEET_HOST, NullObserver, StudyObserver
from tuner.redact import redact
from tuner.runs import RunDirectory
from tuner.search.fleet_peers import FleetHost, FleetPeers
from tuner.search.loop import StudyRun
from tuner.search.peers import requeue_baseline
from tuner.search.prepare import check_host_files, check_simulated_server, prepare_study
from tuner.search.samplers import open_optuna_study
from tuner.storage import has_measured_trials, open_storage, stored_spec
from tuner.study_record import update_host_record
from tuner.transports.base import create_transport
from tuner.trial_runner import PreparedStudy, ServerTrialRunner, TrialRunner

__all__ = ["budget_for_trials", "fleet_hosts", "fleet_loops", "run_fleet", "run_search", "run_study"]

# What drops a fleet's host (the others go on): it stayed unreachable, its server could not be deployed or
# restored, or its baseline could not be measured.
_DROPS_HOST = (TransportError, DeployError, StudyError, MeasurementError)


@contextlib.contextmanager
def _telling_the_end(observer: StudyObserver) -> Iterator[None]:
    """Tells the observer how the run ended, before the run directory's lock is let go: whoever sees the
    lock free sees the end told."""
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError):
        observer.study_ended(outcome="interrupted")
        raise
    except BaseException:
        observer.study_ended(outcome="failed")
        raise
    observer.study_ended(outcome="finished")


async def run_search(
    prepared: PreparedStudy,
    run_dir: RunDirectory,
    study: optuna.Study,
    runner: TrialRunner,
    *,
    observer: StudyObserver | None = None,
    deadline: float | None = None,
) -> None:
    """The search loop on an open study: baseline, batches of trials, confirmation; `runner` measures."""
    observer = observer or NullObserver()
    with _telling_the_end(observer):
        loop = StudyRun(prepared, run_dir, study, observer)
        loop.begin()
        await loop.search(runner, deadline)


def _to_stderr(line: str) -> None:
    print(redact(line), file=sys.stderr, flush=True)


async def run_fleet(loops: Sequence[StudyRun], drive: Callable[[StudyRun], Awaitable[None]]) -> dict[str, str]:
    """Drives each host's loop concurrently (`drive` reaches the host and runs `loop.search`); a host that
    fails as `_DROPS_HOST` says is dropped with the reason, in the study too, and the others go on. Returns
    the dropped hosts' reasons; raises StudyError when every host was dropped."""
    dropped: dict[str, str] = {}

    async def one(loop: StudyRun) -> None:
        peers = loop.peers
        assert isinstance(peers, FleetPeers)
        if len(loops) > 1:
            FLEET_HOST.set(peers.name)  # this loop's task only: its console lines name their host
        try:
            await drive(loop)
        except _DROPS_HOST as exc:
            reason = redact(str(exc))
            dropped[peers.name] = reason
            update_host_record(loop.study, peers.name, dropped=reason)
            peers.fleet.say(f"host {peers.name} dropped: {reason}; the study goes on without it")

    async with asyncio.TaskGroup() as group:
        for loop in loops:
            group.create_task(one(loop))
    if loops and len(dropped) == len(loops):
        shown = "; ".join(f"{host}: {reason}" for host, reason in dropped.items())
        raise StudyError(f"every host was dropped ({shown})")
    return dropped


def fleet_loops(
    prepared: Mapping[str, PreparedStudy],
    run_dir: RunDirectory,
    study: optuna.Study,
    observer: StudyObserver,
    *,
    heartbeat_s: float,
    grace_s: float,
    say: Callable[[str], None] = _to_stderr,
) -> list[StudyRun]:
    """One loop per host of this controller, on one study, begun (their interrupted trials marked)."""
    own = frozenset(prepared)
    loops = [
        StudyRun(
            host_prepared,
            run_dir,
            study,
            observer,
            FleetPeers(
                study, host_prepared, FleetHost(name=name, heartbeat_s=heartbeat_s, grace_s=grace_s, own=own, say=say)
            ),
        )
        for name, host_prepared in prepared.items()
    ]
    for loop in loops:
        named = FLEET_HOST.set(loop.host) if len(loops) > 1 else None
        try:
            loop.begin()
        finally:
            if named is not None:
                FLEET_HOST.reset(named)
    return loops


def fleet_hosts(spec: StudySpec, only: Sequence[str] | None) -> list[HostEntry]:
    """The fleet's hosts that `--host` names (every one without it), in the study's order; ConfigError for a
    name the study does not have."""
    if not only:
        return list(spec.hosts)
    names = [h.name for h in spec.hosts]
    unknown = [name for name in only if name not in names]
    if not spec.hosts:
        raise ConfigError("--host names a host of the study's [[hosts]], and the study has none")
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 100 else unknown[0][:100] + "..."
        raise ConfigError(f"--host {shown!r} is not a host of the study; its hosts: {', '.join(names)}")
    return [h for h in spec.hosts if h.name in only]


async def _search_on_host(
    loop: StudyRun,
    spec: StudySpec,
    run_dir: RunDirectory,
    observer: StudyObserver,
    deadline: float | None,
    *,
    state_path: Path,
) -> None:
    """The host reached, its deployer ready (remembering its state in `state_path` where it recovers), and
    the loop searched on it; the observer told of the restore that the deployer's exit does."""
    async with create_transport(spec.host) as transport:
        deployer = create_deployer(spec.deploy, transport=transport)
        if isinstance(deployer, RecoveringDeployer):
            deployer.remember_in(state_path)
        async with deployer:
            await _adopt_running_values(loop, deployer)
            runner = ServerTrialRunner(
                loop.prepared, deployer=deployer, transport=transport, run_dir=run_dir, observer=observer
            )
            try:
                await loop.search(runner, deadline)
            finally:
                observer.restoring()


async def _adopt_running_values(loop: StudyRun, deployer: object) -> None:
    """With a deployer that keeps the operator's command line, the baseline is what that server runs: its
    tuned knobs' values are read (after the deployer put back anything an earlier run left) and recorded as
    the baseline's settings, so a proposal equal to them is the baseline, not a new trial. A resumed study
    keeps the baseline it measured."""
    read = getattr(deployer, "running_values", None)
    if not callable(read) or loop.baseline_trial() is not None:
        return
    found = await read(loop.prepared.tuned_knobs())
    if found is None:
        return
    loop.prepared, said = loop.prepared.with_running_values(found)
    loop.peers.prepared = loop.prepared
    if loop.peers.host is None:  # a fleet host queues its own baseline once it is reached, from these values
        requeue_baseline(loop.study, loop.prepared.space.encode(loop.prepared.baseline_settings))
    if said:
        loop.observer.baseline_read(values=said)


async def _run_fleet_study(
    spec: StudySpec, base_dir: Path, run_path: Path, observer: StudyObserver, only: Sequence[str] | None
) -> optuna.Study:
    entries = fleet_hosts(spec, only)
    specs = {entry.name: spec.for_host(entry) for entry in entries}
    prepared = {name: prepare_study(host_spec, base_dir) for name, host_spec in specs.items()}
    for name, host_spec in specs.items():  # each host's launch, before any host is touched
        check_simulated_server(host_spec, prepared[name].engine.launch_spec({}))
        check_launch(host_spec.deploy, prepared[name].engine.launch_spec({}))
    first = next(iter(prepared.values()))
    started = time.monotonic()
    deadline = started + spec.budget.hours * 3600 if spec.budget.hours else None
    storage = None if spec.storage is None else open_storage(spec.storage.url)
    heartbeat_s = 10.0 if spec.storage is None else spec.storage.heartbeat_s
    grace_s = 120.0 if spec.storage is None else spec.storage.grace_s
    with RunDirectory(run_path, hosts=list(specs)) as run_dir, _telling_the_end(observer):
        measured = has_measured_trials(run_dir, storage, name=spec.name)
        run_dir.check_spec(stored_spec(spec.model_dump(mode="json")), measured=measured)
        study = open_optuna_study(run_dir, spec, first.space, storage=storage, seed=fleet_seed(spec.seed, specs))
        loops = fleet_loops(prepared, run_dir, study, observer, heartbeat_s=heartbeat_s, grace_s=grace_s)

        async def drive(loop: StudyRun) -> None:
            assert loop.host is not None
            host_spec = specs[loop.host]
            await check_host_files(host_spec, loop.prepared.engine)
            await _search_on_host(
                loop, host_spec, run_dir, observer, deadline, state_path=run_dir.deployer_state_path(loop.host)
            )

        await run_fleet(loops, drive)
        return study


def budget_for_trials(spec: StudySpec, prepared: PreparedStudy, run_path: Path) -> float | None:
    """`budget.hours` less the capacity sweep the run ends with (`[capacity] after_study`): the budget holds
    the sweep too. `ConfigError`, before the host is touched, where the sweep alone fills it."""
    from tuner.capacity.command import after_study_length, budget_left_for_trials
    from tuner.check import assumed_start_s

    sweep = after_study_length(spec, prepared, run_path, start_s=assumed_start_s(spec, prepared.engine))
    return budget_left_for_trials(spec, sweep)


async def run_study(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    observer: StudyObserver | None = None,
    *,
    hosts: Sequence[str] | None = None,
    prepared: PreparedStudy | None = None,
) -> optuna.Study:
    """Runs (or resumes) a study and returns its Optuna study; the host ends on its baseline. A fleet
    (`[[hosts]]`) runs the hosts named in `hosts` (all of them by default), each against its own baseline.
    `prepared`: the caller's `prepare_study(spec, base_dir)`, where it needed one first (a big workload is
    then loaded once)."""
    observer = observer or NullObserver()
    if spec.hosts or hosts:
        return await _run_fleet_study(spec, base_dir, run_path, observer, hosts)
    prepared = prepared or prepare_study(spec, base_dir)
    baseline_launch = prepared.engine.launch_spec({})  # fails here, before the host is touched, without a build
    check_simulated_server(spec, baseline_launch)
    check_launch(spec.deploy, baseline_launch)
    budget_s = budget_for_trials(spec, prepared, run_path)
    await check_host_files(spec, prepared.engine)
    started = time.monotonic()
    deadline = None if budget_s is None else started + budget_s
    storage = None if spec.storage is None else open_storage(spec.storage.url)
    with RunDirectory(run_path) as run_dir, _telling_the_end(observer):
        measured = has_measured_trials(run_dir, storage, name=None if storage is None else spec.name)
        run_dir.check_spec(stored_spec(spec.model_dump(mode="json")), measured=measured)
        study = open_optuna_study(run_dir, spec, prepared.space, storage=storage)
        loop = StudyRun(prepared, run_dir, study, observer)
        loop.begin()
        await _search_on_host(loop, spec, run_dir, observer, deadline, state_path=run_dir.deployer_state_path(None))
        return study
