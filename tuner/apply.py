"""`tuner apply` and `tuner restore`: make a study's winner the host's configuration for good, and undo it.

Apply never trusts the study's numbers alone: the chosen settings go on as a trial would (our drop-in
under /run, the running process verified), the workload is replayed once more, and only if every
request of that verification run succeeds is the drop-in made permanent. Anything else leaves the host
on its baseline, as a study does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.config import ParamValue, StudySpec
from tuner.engines.base import request_setting_advice
from tuner.errors import ConfigError, MeasurementError, StudyError, TunerError
from tuner.report import LeaderboardRow, row_to_apply
from tuner.runs import RunDirectory
from tuner.text import settings_text

if TYPE_CHECKING:
    from tuner.search import PreparedStudy

# The search loop's preparation, the deployers and the trial runner are imported where a host is reached, so
# choosing the trial (`row_to_apply`, which may refuse) loads neither (tests/fast/test_reading_commands.py).

__all__ = ["Applied", "apply_to_hosts", "restore_hosts", "restore_settings"]

# Fresh prompts for the verification run: no round of the study used this index, so nothing is cached.
_VERIFY_PROMPTS_INDEX = 1_000_003


@dataclass(frozen=True, kw_only=True)
class Applied:
    trial: int
    server_settings: dict[str, ParamValue]
    client_settings: dict[str, ParamValue]
    client_advice: tuple[str, ...]  # how to keep each client setting, which the host's configuration cannot carry
    path: str
    requests: int
    metrics: dict[str, float | None]
    host: str | None = None  # a fleet's host; None for a one-host study


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """What `tuner apply` will do on one host, checked before any host is touched."""

    spec: StudySpec
    prepared: PreparedStudy
    row: LeaderboardRow
    server: dict[str, ParamValue]
    client: dict[str, ParamValue]
    host: str | None


def _writes_the_hosts_config(spec: StudySpec) -> bool:
    """Whether the study's deploy kind can make a trial the host's own (`PersistentDeployer`)."""
    from tuner.deployers.base import DEPLOYERS

    factory = DEPLOYERS.get(spec.deploy.kind)
    return all(callable(getattr(factory, name, None)) for name in ("persist", "remove_persisted"))


def _plan(spec: StudySpec, base_dir: Path, run_path: Path, row: LeaderboardRow, host: str | None) -> _Plan:
    from tuner.search import prepare_study

    prepared = prepare_study(spec, base_dir)
    engine = prepared.engine
    try:
        engine.check_settings(row.settings)  # what the journal holds, which a hand edit may have changed
    except ConfigError as exc:
        raise ConfigError(f"trial {row.number} of {run_path}: {exc}; apply another trial with --trial N") from None
    server = {k: v for k, v in row.settings.items() if engine.knobs[k].scope == "server"}
    client = {k: v for k, v in row.settings.items() if engine.knobs[k].scope == "request"}
    engine.launch_spec(server)  # a bad setting or a missing build is refused before the host is reached
    if not _writes_the_hosts_config(spec):
        flags = settings_text(server)
        on = "" if host is None else f" (host {host})"
        raise ConfigError(
            f"deploy.kind = {spec.deploy.kind!r}{on} has no configuration of the host to write; start the server "
            f"with these settings yourself: {flags}"
        )
    return _Plan(spec=spec, prepared=prepared, row=row, server=server, client=client, host=host)


def _hosts_text(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


async def apply_to_hosts(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    *,
    trial: int | None,
    hosts: Sequence[str] | None,
    say: Callable[[str], None],
    applied: Callable[[Applied], None],
    storage_url: str | None = None,
) -> list[Applied]:
    """Makes the chosen trial (the recommendation, or `trial`) the host's own after a verification run, or
    a fleet's hosts' (those named, else every one), one after another, as a rollout. The trial is chosen
    once and every host is checked before any is touched; `applied` hears of each host as it is done. The
    first host where it fails is back on its baseline and stops the rollout: the error (a failed
    verification run) or a line said before it (anything else, Ctrl-C included) names the hosts that keep
    the trial and those not tried."""
    row = row_to_apply(run_path, trial, storage_url)
    from tuner.search import fleet_hosts

    if not spec.hosts and not hosts:
        plans = [_plan(spec, base_dir, run_path, row, None)]
    else:
        plans = [_plan(spec.for_host(e), base_dir, run_path, row, e.name) for e in fleet_hosts(spec, hosts)]
    done: list[Applied] = []
    for index, plan in enumerate(plans):
        if plan.host is not None:
            say(f"host {plan.host}:")
        try:
            result = await _apply(plan, run_path, say=say)
        except BaseException as exc:
            if plan.host is None:
                raise
            kept = [str(a.host) for a in done]
            state = (f"; {_hosts_text(kept)} keep{'s' if len(kept) == 1 else ''} trial {row.number} (`tuner restore "
                     f"STUDY --host NAME` removes it)" if kept else "")  # fmt: skip
            left = [p.host for p in plans[index + 1 :] if p.host is not None]
            state += f"; not tried: {', '.join(left)}" if left else ""
            if isinstance(exc, StudyError):  # the verification run failed: one line says it all
                raise StudyError(f"host {plan.host}: {exc}{state}") from None
            say(f"the rollout stopped at host {plan.host}, which is back on its baseline{state}")
            raise
        done.append(result)
        applied(result)
    return done


async def restore_hosts(
    spec: StudySpec,
    base_dir: Path,
    *,
    hosts: Sequence[str] | None,
    restored: Callable[[str | None, str | None], None],
) -> None:
    """Removes what `tuner apply` wrote on the study's host, or on a fleet's hosts (those named, else every
    one). A rollback: every host is tried; `restored` hears of each (the path removed, or None where there
    was nothing), and the hosts that could not be restored are named at the end (`StudyError`)."""
    from tuner.search import fleet_hosts

    targets = (
        [(None, spec)]
        if not spec.hosts and not hosts
        else [(e.name, spec.for_host(e)) for e in fleet_hosts(spec, hosts)]
    )
    for host, host_spec in targets:  # before any host is touched
        if not _writes_the_hosts_config(host_spec):
            on = "" if host is None else f" (host {host})"
            raise ConfigError(
                f"deploy.kind = {host_spec.deploy.kind!r}{on} writes nothing to the host that could be removed"
            )
    failed: list[str] = []
    for host, host_spec in targets:
        try:
            removed = await restore_settings(host_spec, base_dir)
        except TunerError as exc:
            if host is None:
                raise
            failed.append(f"{host}: {exc}")
            continue
        restored(host, removed)
    if failed:
        raise StudyError(f"could not restore {len(failed)} of {len(targets)} hosts ({'; '.join(failed)}); run it again")


async def _apply(plan: _Plan, run_path: Path, *, say: Callable[[str], None]) -> Applied:
    from tuner.deployers.base import PersistentDeployer, create_deployer
    from tuner.transports.base import create_transport
    from tuner.trial_runner import ServerTrialRunner

    spec, prepared, row, server, host = plan.spec, plan.prepared, plan.row, plan.server, plan.host
    log_path = RunDirectory(run_path).apply_log_path(time.strftime("%Y%m%dT%H%M%S"), host)
    async with create_transport(spec.host) as transport:
        deployer = create_deployer(spec.deploy, transport=transport)
        assert isinstance(deployer, PersistentDeployer), "checked by _plan"
        async with deployer:
            runner = ServerTrialRunner(prepared, deployer=deployer, transport=transport)
            say(f"starting trial {row.number}'s settings as a trial first: {server}")
            failure: str | None = None
            try:
                await runner.start(server, number=row.number, log_path=str(log_path))
                say("verification run: replaying the workload once with fresh prompts")
                measured = await runner.measure_round(
                    settings=row.settings,
                    number=row.number,
                    prompts_index=_VERIFY_PROMPTS_INDEX,
                    label="the verification run",
                    records_name=None,
                )
            except MeasurementError as exc:
                failure = str(exc)
            else:
                records, metrics = measured.records, measured.metrics
                failed = [r for r in records if not r.ok]
                if failed:
                    failure = f"{len(failed)} of {len(records)} requests failed (first: {failed[0].error})"
            if failure is not None:
                raise StudyError(f"the verification run failed: {failure}; the host stays on its baseline")
            note = (
                f"serve-tuner: trial {row.number} of study {spec.name!r}, applied {time.strftime('%Y-%m-%d %H:%M')} "
                "after a verification run; `tuner restore STUDY` removes this file"
            )
            path = await deployer.persist(note=note)
    return Applied(
        trial=row.number, server_settings=server, client_settings=plan.client, path=path, requests=len(records),
        client_advice=tuple(request_setting_advice(plan.prepared.engine.knobs, plan.client)), metrics=metrics,
        host=host,
    )  # fmt: skip


async def restore_settings(spec: StudySpec, base_dir: Path) -> str | None:
    """Removes what `tuner apply` wrote on one host; returns its path, or None if the host had none."""
    from tuner.deployers.base import PersistentDeployer, create_deployer
    from tuner.search import prepare_study
    from tuner.transports.base import create_transport

    prepared = prepare_study(spec, base_dir)
    async with create_transport(spec.host) as transport:
        deployer = create_deployer(spec.deploy, transport=transport)
        if not isinstance(deployer, PersistentDeployer):
            raise ConfigError(f"deploy.kind = {spec.deploy.kind!r} writes nothing to the host that could be removed")
        async with deployer:
            return await deployer.remove_persisted(prepared.engine.launch_spec({}))
