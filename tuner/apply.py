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

from tuner.config import ParamValue, StudySpec
from tuner.deployers.base import PersistentDeployer, create_deployer
from tuner.errors import ConfigError, MeasurementError, StudyError
from tuner.report import LeaderboardRow, build_leaderboard
from tuner.runs import RunDirectory
from tuner.study import fleet_hosts, open_optuna_study_readonly, prepare_study
from tuner.transports.base import create_transport
from tuner.trial_runner import ServerTrialRunner

__all__ = ["Applied", "apply_settings", "apply_to_hosts", "restore_hosts", "restore_settings"]

# Fresh prompts for the verification run: no round of the study used this index, so nothing is cached.
_VERIFY_PROMPTS_INDEX = 1_000_003


@dataclass(frozen=True, kw_only=True)
class Applied:
    trial: int
    server_settings: dict[str, ParamValue]
    client_settings: dict[str, ParamValue]
    path: str
    requests: int
    metrics: dict[str, float | None]
    host: str | None = None  # a fleet's host; None for a one-host study


def _chosen_row(run_path: Path, trial: int | None) -> LeaderboardRow:
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(run_path)))
    if trial is None:
        if board.recommendation.row is None:
            raise StudyError(
                f"nothing to apply: {board.recommendation.message} (pass --trial N to apply a trial anyway)"
            )
        return board.recommendation.row
    row = next((r for r in board.rows if r.number == trial), None)
    if row is None or row.state != "COMPLETE":
        done = ", ".join(str(r.number) for r in board.rows if r.state == "COMPLETE")
        if not done:
            raise ConfigError(f"--trial {trial}: no trial of {run_path} completed yet; run the study first")
        raise ConfigError(f"trial {trial} did not complete in {run_path}; choose one of: {done}")
    return row


async def apply_to_hosts(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    *,
    trial: int | None,
    hosts: Sequence[str] | None,
    say: Callable[[str], None],
) -> list[Applied]:
    """`apply_settings` on the study's host, or on a fleet's hosts (those named, else every one) one after
    another, as a rollout: the first host whose verification run fails stops it there, back on its
    baseline; the hosts before it keep what they verified, and the error says which did and which were not
    tried."""
    if not spec.hosts and not hosts:
        return [await apply_settings(spec, base_dir, run_path, trial=trial, say=say)]
    entries = fleet_hosts(spec, hosts)
    applied: list[Applied] = []
    for index, entry in enumerate(entries):
        say(f"host {entry.name}:")
        try:
            applied.append(
                await apply_settings(spec.for_host(entry), base_dir, run_path, trial=trial, say=say, host=entry.name)
            )
        except StudyError as exc:
            kept = ", ".join(str(a.host) for a in applied)
            left = ", ".join(e.name for e in entries[index + 1 :])
            raise StudyError(
                f"host {entry.name}: {exc}"
                + (f"; applied on {kept}, which keep it (`tuner restore STUDY --host NAME` removes it)" if kept else "")
                + (f"; not tried: {left}" if left else "")
            ) from None
    return applied


async def restore_hosts(
    spec: StudySpec, base_dir: Path, *, hosts: Sequence[str] | None
) -> list[tuple[str | None, str | None]]:
    """`restore_settings` on the study's host or on a fleet's hosts (those named, else every one): per host,
    the path removed (None: it had none)."""
    if not spec.hosts and not hosts:
        return [(None, await restore_settings(spec, base_dir))]
    return [(e.name, await restore_settings(spec.for_host(e), base_dir)) for e in fleet_hosts(spec, hosts)]


async def apply_settings(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    *,
    trial: int | None,
    say: Callable[[str], None],
    host: str | None = None,
) -> Applied:
    prepared = prepare_study(spec, base_dir)
    engine = prepared.engine
    row = _chosen_row(run_path, trial)
    try:
        engine.check_settings(row.settings)  # what the journal holds, which a hand edit may have changed
    except ConfigError as exc:
        raise ConfigError(f"trial {row.number} of {run_path}: {exc}; apply another trial with --trial N") from None
    server = {k: v for k, v in row.settings.items() if engine.knobs[k].scope == "server"}
    client = {k: v for k, v in row.settings.items() if engine.knobs[k].scope == "request"}
    engine.launch_spec(server)  # a bad setting or a missing build is refused before the host is reached
    log_path = run_path / "apply" / f"{time.strftime('%Y%m%dT%H%M%S')}{'' if host is None else '-' + host}-server.log"
    async with create_transport(spec.host) as transport:
        deployer = create_deployer(spec.deploy, transport=transport)
        if not isinstance(deployer, PersistentDeployer):
            flags = " ".join(f"{name}={value}" for name, value in sorted(server.items()))
            raise ConfigError(
                f"deploy.kind = {spec.deploy.kind!r} has no configuration of the host to write; start the server "
                f"with these settings yourself: {flags}"
            )
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
        trial=row.number, server_settings=server, client_settings=client, path=path, requests=len(records),
        metrics=metrics, host=host,
    )  # fmt: skip


async def restore_settings(spec: StudySpec, base_dir: Path) -> str | None:
    """Removes what `apply_settings` wrote; returns its path, or None if the host had none."""
    prepared = prepare_study(spec, base_dir)
    async with create_transport(spec.host) as transport:
        deployer = create_deployer(spec.deploy, transport=transport)
        if not isinstance(deployer, PersistentDeployer):
            raise ConfigError(f"deploy.kind = {spec.deploy.kind!r} writes nothing to the host that could be removed")
        async with deployer:
            return await deployer.remove_persisted(prepared.engine.launch_spec({}))
