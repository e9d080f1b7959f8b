"""Where a trial's server answers: with `exec_start = "keep"` the unit's own server (program, model,
address), read once from its running process or its ExecStart= and Environment=; else the launch's."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.deployers.base import running_values
from tuner.deployers.systemd.container_unit import parse_container_run, reached_at
from tuner.deployers.systemd.unit import SystemdUnit, UnitState
from tuner.deployers.systemd.unit_file import ExecStartMode, parse_show_environment
from tuner.errors import ConfigError, DeployError
from tuner.models import LaunchSpec, OperatorServer, RunningValue, TunedKnob

__all__ = ["UnitServer"]


class UnitServer:
    def __init__(self, unit: SystemdUnit, *, exec_start: ExecStartMode) -> None:
        self._unit = unit
        self._exec_start = exec_start
        self.operator: OperatorServer | None = None  # with `keep`: the unit's own server, once read

    async def operator_server(self, launch: LaunchSpec, state: UnitState | None = None) -> OperatorServer:
        """The unit's own server (program, model, address), read from its running process, or from its
        ExecStart= and Environment= where it is not running; with `keep` a trial listens where it does."""
        if self.operator is not None:
            return self.operator
        unit = self._unit.name
        if launch.listen is None:
            raise DeployError(f"{unit}: this engine cannot say where the unit's server listens")
        state = state or await self._unit.state()
        argv, environ = await self._unit.command_line(state)
        if not argv:
            raise DeployError(f"cannot read {unit}'s command line (ExecStart=); check `systemctl cat {unit}`")
        try:
            self.operator = launch.listen.read(argv, environ)
        except ValueError:
            raise DeployError(
                f"{unit} sets a port that is not a port number (1-65535); check its ExecStart= and Environment="
            ) from None
        return self.operator

    async def address(self, launch: LaunchSpec) -> str:
        """Where this controller reaches the server: the unit's own address with `keep`, else the launch's."""
        if self._exec_start == "keep" and launch.listen is not None:
            server = await self.operator_server(launch)
            return await self._unit.transport.reach(server.reach_host, server.port)
        return await self._unit.transport.reach(launch.host, launch.port)


async def unit_running_values(unit: SystemdUnit, tuned: Sequence[TunedKnob]) -> list[RunningValue]:
    """The tuned knobs' values in the unit's own server (its running process, or its ExecStart= and
    Environment= where it is stopped), each with where it was read."""
    state = await unit.state()
    argv, environ = await unit.command_line(state)
    shown = parse_show_environment(state["Environment"])

    def source(env: str) -> str:
        if env in shown:
            return f"{env} in {unit.name}'s Environment= (the unit or a drop-in)"
        return f"{env} in {unit.name}'s EnvironmentFile= or its process's environment"

    return running_values(argv, environ, tuned, env_source=source)


async def container_run_url(unit: SystemdUnit, state: UnitState, launch: LaunchSpec) -> str | None:
    """`container`: where the unit's running container answers at the study's address (its `--network host`,
    or the port its `run` publishes); None where its ExecStart is no foreground `run` (its own check says so)."""
    try:
        run = parse_container_run((await unit.command_line(state))[0], unit=unit.name)
    except ConfigError:
        return None
    return await unit.transport.reach(*reached_at(run, launch))
