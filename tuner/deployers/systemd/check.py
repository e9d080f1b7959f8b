"""What `tuner run --check` reads of the unit, changing nothing and taking no lock: the unit, who holds
its lock, what its server runs and where it answers, and whatever would decide a tuned knob instead of
the trial's drop-in (a flag in its ExecStart=, an EnvironmentFile= line, a later operator drop-in)."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.deployers.base import health_answer
from tuner.deployers.systemd.container_unit import parse_container_run
from tuner.deployers.systemd.lock import HostLock, read_holder
from tuner.deployers.systemd.operator_server import UnitServer
from tuner.deployers.systemd.paths import HostPaths
from tuner.deployers.systemd.unit import SystemdUnit, UnitState
from tuner.deployers.systemd.unit_file import ExecStartMode, check_kept_command, parse_show_environment
from tuner.errors import ConfigError, DeployError
from tuner.models import CheckLine, LaunchSpec, TunedKnob

__all__ = ["LOADING_WAIT_S", "check_unit"]

# How long a unit's server that answers 503 (bound, its model still loading: it was just started) is waited
# for before the check calls it not ready. A model of a few GB loads within this from a page-cached disk.
LOADING_WAIT_S = 60.0


async def check_unit(
    unit: SystemdUnit,
    lock: HostLock,
    paths: HostPaths,
    server: UnitServer,
    launch: LaunchSpec,
    *,
    tuned: Sequence[TunedKnob],
    exec_start: ExecStartMode,
) -> list[CheckLine]:
    state = await unit.state()
    name = f"unit {unit.name}"
    if state["LoadState"] != "loaded":
        fix = "set deploy.unit to the service that runs the server (`systemctl list-units --type=service`)"
        return [CheckLine(name, False, f"the host has no such unit ({state['LoadState'] or 'unknown'}); {fix}")]
    lines = [await _check_lock(unit, lock, paths)]
    try:
        operator = await server.operator_server(launch, state) if launch.listen is not None else None
    except DeployError as exc:
        return [*lines, CheckLine(name, False, str(exc))]
    runs = f"; runs {operator.describe()}" if operator else ""
    if state["ActiveState"] == "failed":
        fix = f"the baseline could not start either; see `systemctl status {unit.name}` and fix the unit first"
        return [*lines, CheckLine(name, False, f"failed (result {state['Result']}){runs}; {fix}")]
    lines.append(CheckLine(name, True, f"{state['ActiveState']}{runs}"))
    if exec_start == "keep":
        lines += await _check_kept(unit, launch, state, tuned)
    if exec_start == "container":
        lines.append(await _check_container_run(unit, state))
    try:
        tuned_env = [knob.env for knob in tuned if knob.env]
        await unit.refuse_later_overrides(launch, state, exec_start=exec_start, tuned=tuned_env)
    except DeployError as exc:
        lines.append(CheckLine("operator drop-ins", False, str(exc)))
    lines.append(await _check_answers(unit, server, launch, state))
    return lines


async def _check_container_run(unit: SystemdUnit, state: UnitState) -> CheckLine:
    """`container`: the unit's ExecStart must run the container in the foreground, a trial's `run` from it."""
    try:
        run = parse_container_run((await unit.command_line(state))[0], unit=unit.name)
    except ConfigError as exc:
        return CheckLine("container", False, str(exc))
    return CheckLine(
        "container", True, f"runs {run.image} in the foreground: a trial replaces its command after the image"
    )


async def _check_lock(unit: SystemdUnit, lock: HostLock, paths: HostPaths) -> CheckLine:
    raw = await unit.read(paths.lock_owner)
    holder = read_holder(raw)
    if raw is not None and not lock.stale(holder):
        return CheckLine(
            "lock", False,
            f"another serve-tuner (pid {holder.get('pid')} on {holder.get('controller')}) is tuning {unit.name}; "
            "wait for it to finish",
        )  # fmt: skip
    if await unit.read(paths.snapshot) is not None:
        return CheckLine("lock", True, "an earlier run did not finish its restore: the run puts the unit back first")
    return CheckLine("lock", True, "free")


async def _check_kept(
    unit: SystemdUnit, launch: LaunchSpec, state: UnitState, tuned: Sequence[TunedKnob]
) -> list[CheckLine]:
    """With `keep`: the unit's command line passes what the launch needs, and nothing of the unit's own
    (a flag, an EnvironmentFile= line) decides a tuned knob over the drop-in's Environment= line."""
    lines = []
    try:
        check_kept_command(launch, state["ExecStart"])
    except ConfigError as exc:
        lines.append(CheckLine("command line", False, str(exc)))
    argv, environ = await unit.command_line(state)
    shown = parse_show_environment(state["Environment"])
    for knob in tuned:
        given = next((w for w in argv[1:] for f in knob.flags if w == f or w.startswith(f + "=")), None)
        if given is not None:
            lines.append(CheckLine(
                f"knob {knob.name}", False,
                f"{unit.name}'s ExecStart= passes {given.split('=')[0]}, which decides {knob.name} in every "
                'trial; remove it from ExecStart= or set deploy.exec_start = "replace"',
            ))  # fmt: skip
        elif knob.env and knob.env in environ and knob.env not in shown:
            lines.append(CheckLine(
                f"knob {knob.name}", False,
                f"{knob.env} comes from {unit.name}'s EnvironmentFile=, which wins over the trial's "
                "Environment= line; move it to an Environment= line or remove it from that file",
            ))  # fmt: skip
    if not lines:
        names = ", ".join(knob.name for knob in tuned) or "none"
        lines.append(CheckLine("knobs", True, f"nothing in {unit.name} overrides the tuned knobs ({names})"))
    return lines


async def _check_answers(unit: SystemdUnit, server: UnitServer, launch: LaunchSpec, state: UnitState) -> CheckLine:
    if state["ActiveState"] != "active":
        return CheckLine("server", True, f"{unit.name} is {state['ActiveState']}: the study starts it")
    # The server running now is the operator's, wherever the study's own command line would put a trial's.
    operator = server.operator
    base_url = await (unit.transport.reach(operator.reach_host, operator.port) if operator else server.address(launch))
    where = operator.address if operator else f"{launch.host}:{launch.port}"
    problem, waited = await health_answer(base_url + launch.health_path, loading_wait_s=LOADING_WAIT_S)
    if problem is None:
        loaded = f" (after {waited:.0f} s of loading its model)" if waited >= 1 else ""
        return CheckLine("server", True, f"answers {launch.health_path} on {where}{loaded}")
    if problem == "HTTP 503":
        return CheckLine(
            "server", False,
            f"{unit.name} answers on {where} but not ready: HTTP 503 for {LOADING_WAIT_S:g} s (still loading its "
            f"model?); check again once it has loaded, or read its log (`journalctl -u {unit.name}`)",
        )  # fmt: skip
    return CheckLine(
        "server", False,
        f"{unit.name} is active but nothing healthy answers on {where} ({problem}); check the unit's address "
        "and port, or its log (`journalctl -u " + unit.name + "`)",
    )  # fmt: skip
