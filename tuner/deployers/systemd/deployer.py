"""`SystemdDeployer`: a trial as one drop-in of ours on the operator's unit, its lifecycle (enter, apply,
restore, persist) over the unit, the lock, the dead-man timer and the snapshot (the package's docstring
walks through it)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field

from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.deployers.systemd.check import check_unit
from tuner.deployers.systemd.container_unit import ContainerRun, parse_container_run, trial_exec_start
from tuner.deployers.systemd.container_unit import reached_at as container_reached_at
from tuner.deployers.systemd.dead_man import DeadManTimer
from tuner.deployers.systemd.lock import HostLock
from tuner.deployers.systemd.operator_server import UnitServer, container_run_url, unit_running_values
from tuner.deployers.systemd.paths import HostPaths
from tuner.deployers.systemd.snapshot import difference_from_snapshot, read_snapshot, take_snapshot
from tuner.deployers.systemd.start import StartWatcher, verify_started, wait_restored
from tuner.deployers.systemd.unit import SystemdUnit, UnitState
from tuner.deployers.systemd.unit_file import (
    ExecStartMode,
    check_kept_command,
    render_drop_in,
    render_secrets_file,
)
from tuner.errors import DeployError, HostUnreachable, ServerNotReady
from tuner.faults import crash_point
from tuner.models import CheckLine, LaunchSpec, OperatorServer, RunningValue, ServerCommand, TunedKnob
from tuner.redact import redact
from tuner.transports.base import Transport

__all__ = ["SystemdDeployer", "SystemdOptions"]

_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\-]+\.service\Z")


class SystemdOptions(StrictModel):
    unit: str = Field(description="The service that runs the server, e.g. `llama-server.service`.")
    exec_start: ExecStartMode = Field(
        default="keep",
        description="`keep`: the unit's own ExecStart runs, with the trial's settings as Environment= "
        "lines. `replace`: the drop-in also resets ExecStart= to the engine's full command line (needed "
        "for flags without an environment variable, such as LoRA adapters, or a unit whose ExecStart "
        "sets a tuned flag, which would win over the environment). `container`: the unit's ExecStart runs the "
        "server's container in the foreground (`podman run ...`, `docker run ...`); the drop-in resets it to the "
        "same `run` with the trial's command line after the image and its variables passed by name.",
    )
    start_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for a trial to be healthy.")
    restore_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for the baseline to be back.")
    dead_man_s: float = Field(
        default=3600.0,
        ge=5,
        description="The host restores its baseline by itself this long after the controller was last "
        "heard from (a timer armed on the host before every change, re-armed after every round): make it "
        "longer than a trial's longest round.",
    )
    lock_stale_s: float = Field(
        default=900.0, gt=0, description="A lock whose holder has not been heard from for this long is taken over."
    )

    def model_post_init(self, context: object, /) -> None:
        if not _UNIT_NAME.match(self.unit):
            raise ValueError(f"deploy.unit {self.unit!r} is not a service name: write it as NAME.service")


@DEPLOYERS.register("systemd")
class SystemdDeployer:
    options_model = SystemdOptions

    @staticmethod
    def server_command(options: SystemdOptions, *, local_host: bool) -> ServerCommand:
        """`keep`: the unit's own command line, model and address; `replace`: the study's, with host paths."""
        if options.exec_start == "keep":
            return ServerCommand.UNIT
        if options.exec_start == "container":
            return ServerCommand.REMOTE  # the image's paths
        return ServerCommand.LOCAL if local_host else ServerCommand.REMOTE

    # What it runs as root (through `sudo -n` for a plain login), the transport's file steps included.
    privileged_commands = ("systemctl", "systemd-run", "journalctl", "mkdir", "rm", "sh", "cat")

    @staticmethod
    def uses_image_paths(options: SystemdOptions) -> bool:  # `container`: the image's paths, not the host's
        return options.exec_start == "container"

    @staticmethod
    def check_launch(options: SystemdOptions, launch: LaunchSpec) -> None:
        """A launch no drop-in can carry is refused before the host is touched."""
        render_drop_in(launch, exec_start=options.exec_start, note="check", secrets_file="/dev/null")

    def __init__(self, options: SystemdOptions, *, transport: Transport) -> None:
        self._options = options
        self._transport = transport
        self._paths = HostPaths(options.unit)
        self._unit = SystemdUnit(options.unit, transport=transport)
        self._lock = HostLock(self._unit, self._paths, stale_s=options.lock_stale_s)
        self._dead_man = DeadManTimer(self._paths, transport=transport, seconds=options.dead_man_s)
        self._server = UnitServer(self._unit, exec_start=options.exec_start)
        self._baseline: dict[str, object] | None = None
        self._written: str | None = None  # our drop-in's text, while one is in place
        self._deployed: UnitState | None = None
        self._launch: LaunchSpec | None = None
        self._container: ContainerRun | None = None  # `container`: the operator's own `run`, read on entry

    # ---- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> SystemdDeployer:
        await self._lock.take()
        try:
            state = await self._unit.state()
            if state["LoadState"] != "loaded":
                raise DeployError(
                    f"the host has no unit {self._unit.name} ({state['LoadState'] or 'unknown'}); set deploy.unit "
                    "to the service that runs the server (`systemctl list-units --type=service`)"
                )
            previous = await self._unit.read(self._paths.snapshot)
            if previous is not None or await self._unit.read(self._paths.runtime_drop_in) is not None:
                # An earlier controller died before it had restored (its snapshot is removed only once the
                # host is back): put the host back before looking at it, and hold the result to that
                # run's snapshot, as its own restore would have.
                self._written = "(left by an earlier run)"
                self._baseline = read_snapshot(previous) if previous else {"active": True}
                await self.restore()
                await self._lock.take()
                state = await self._unit.state()
            self._baseline = await take_snapshot(self._unit, state)
            if self._options.exec_start == "container":
                self._container = parse_container_run((await self._unit.command_line(state))[0], unit=self._unit.name)
        except BaseException:
            await self._lock.release()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.restore()

    async def _heartbeat(self) -> None:
        """Re-arm the dead-man timer and refresh the lock, at most every few minutes."""
        if time.monotonic() - self._lock.last_beat < min(120.0, self._options.dead_man_s / 4):
            return
        await self._lock.write_owner()
        if self._written is not None:
            await self._arm_dead_man()

    async def _arm_dead_man(self) -> None:
        await self._dead_man.arm(active=bool(self._baseline and self._baseline.get("active", True)))

    # ---- the unit's own server, and the read-only check -----------------------------------------

    async def operator_server(self, launch: LaunchSpec, state: UnitState | None = None) -> OperatorServer:
        """The unit's own server (program, model, address), read from its running process, or from its
        ExecStart= and Environment= where it is not running; with `keep` a trial listens where it does."""
        return await self._server.operator_server(launch, state)

    @property
    def operator(self) -> OperatorServer | None:
        """The unit's own server, once read (`operator_server`)."""
        return self._server.operator

    async def running_log(self) -> str:
        """The start of the log of the unit's running invocation (the operator's server, for `--check`)."""
        return await self._unit.running_log()

    async def running_url(self, launch: LaunchSpec) -> str | None:
        """Where the operator's server answers now (`keep`; `container`: at the study's address), for `--check`'s
        request; None where the unit is not active, or runs a command line other than the study's (`replace`)."""
        state = await self._unit.state()
        if self._options.exec_start == "replace" or state["ActiveState"] != "active":
            return None
        if self._options.exec_start == "container":
            return await container_run_url(self._unit, state, launch)
        return await self._server.address(launch)

    async def running_values(self, tuned: Sequence[TunedKnob]) -> list[RunningValue] | None:
        """With `keep`, the tuned knobs' values in the unit's own server (its running process, or its
        ExecStart= and Environment= where it is stopped): the baseline's settings. None with `replace`,
        whose baseline runs the study's own command line."""
        if self._options.exec_start != "keep":
            return None
        return await unit_running_values(self._unit, tuned)

    async def check(self, launch: LaunchSpec, *, tuned: Sequence[TunedKnob]) -> list[CheckLine]:
        """What `tuner run --check` reads of the unit, changing nothing and taking no lock (`check.py`)."""
        return await check_unit(
            self._unit, self._lock, self._paths, self._server, launch, tuned=tuned, exec_start=self._options.exec_start
        )

    # ---- a trial ------------------------------------------------------------------------------

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        if self._baseline is None:
            raise DeployError("the systemd deployer was used outside `async with`")
        exec_start = self._options.exec_start
        exec_argv = trial_exec_start(self._container, launch) if self._container is not None else None
        text = render_drop_in(
            launch,
            exec_start=exec_start,
            note="serve-tuner trial; removed when the study ends",
            secrets_file=self._paths.secrets,
            exec_argv=exec_argv,
        )
        secrets = render_secrets_file(launch)
        before = await self._unit.state()
        await self._unit.refuse_later_overrides(launch, before, exec_start=exec_start)
        if exec_start == "keep":
            check_kept_command(launch, before["ExecStart"])
            if launch.listen is not None:
                await self.operator_server(launch, before)
        if self._container is not None:
            base_url = await self._transport.reach(*container_reached_at(self._container, launch))
        else:
            base_url = await self._server.address(launch)
        if (
            text == self._written
            and self._deployed is not None
            and before.main_pid == self._deployed.main_pid != 0
            and before["ActiveState"] == "active"
            and before["NeedDaemonReload"] == "no"
        ):
            # The same settings are already running: no restart (P5), only a check that they still serve.
            took = await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=self.check_alive
            )
            self._launch = launch
            return Deployment(
                launch=launch, pid=before.main_pid, started_in_s=took, log_path=log_path, base_url=base_url
            )
        self._launch = launch
        if self._written is None:
            # Kept on the host until a restore finishes: a run that finds it knows the host is not on its
            # baseline, even where the drop-in is already gone (a controller killed mid-restore).
            await self._transport.write_file(self._paths.snapshot, json.dumps(self._baseline).encode(), mode=0o600)
        await self._arm_dead_man()
        self._written = text
        if secrets:
            await self._transport.write_file(self._paths.secrets, secrets.encode(), mode=0o600)
        await self._transport.write_file(self._paths.runtime_drop_in, text.encode(), mode=0o644)
        crash_point("after-write")
        await self._unit.systemctl("daemon-reload")
        started = time.monotonic()
        await self._unit.restart(before, timeout_s=self._options.start_timeout_s)
        crash_point("after-restart")
        self._deployed = None
        watcher = StartWatcher(self._unit, before)
        try:
            await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=watcher.failure
            )
        except ServerNotReady as exc:
            raise ServerNotReady(f"{exc}{await self._unit.journal_tail()}") from None
        after = await self._unit.state()
        await verify_started(self._unit, launch, before, after, exec_start=exec_start, command=exec_argv)
        self._deployed = after
        log = await self._unit.journal(after["InvocationID"])
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(redact(log))  # the server's own lines may quote the key
        return Deployment(
            launch=launch,
            pid=after.main_pid,
            started_in_s=time.monotonic() - started,
            log_path=log_path,
            base_url=base_url,
        )

    async def persist(self, *, note: str) -> str:
        """The running trial's drop-in moved under /etc (as APPLIED_NAME): the same settings, so no restart."""
        if self._written is None or self._launch is None or self._deployed is None:
            raise DeployError("nothing to apply: no verified trial is running")
        path, secrets_path = self._paths.persistent_drop_in, self._paths.persistent_secrets
        exec_argv = trial_exec_start(self._container, self._launch) if self._container is not None else None
        text = render_drop_in(
            self._launch, exec_start=self._options.exec_start, note=note, secrets_file=secrets_path, exec_argv=exec_argv
        )
        if self._launch.secret_env:
            await self._transport.write_file(secrets_path, render_secrets_file(self._launch).encode(), mode=0o600)
        await self._transport.write_file(path, text.encode(), mode=0o644)
        await self._transport.remove_file(self._paths.runtime_drop_in)
        await self._transport.remove_file(self._paths.secrets)
        await self._unit.systemctl("daemon-reload")
        self._written = None
        state = await self._unit.state()
        if state.main_pid != self._deployed.main_pid or state["NeedDaemonReload"] != "no":
            raise DeployError(f"{self._unit.name} changed while its settings were made permanent; check it by hand")
        await self._dead_man.disarm()
        await self._transport.remove_file(self._paths.restore_script)
        await self._transport.remove_file(self._paths.snapshot)
        return path

    async def remove_persisted(self, launch: LaunchSpec) -> str | None:
        path = self._paths.persistent_drop_in
        if await self._unit.read(path) is None:
            return None
        await self._transport.remove_file(path)
        await self._transport.remove_file(self._paths.persistent_secrets)
        await self._unit.systemctl("daemon-reload")
        await self._unit.restart(await self._unit.state(), timeout_s=self._options.restore_timeout_s)
        self._launch = launch
        await self._wait_restored()
        return path

    async def check_alive(self) -> str | None:
        if self._deployed is None:
            return "no trial is running"
        state = await self._unit.state()
        await self._heartbeat()
        unit = self._unit.name
        if state.main_pid != self._deployed.main_pid:
            return f"{unit}'s main process changed ({self._deployed.main_pid} -> {state.main_pid or 'none'})"
        if state.restarts != self._deployed.restarts:
            return f"{unit} restarted {state.restarts - self._deployed.restarts} time(s) (Restart= hid a crash)"
        if state["ActiveState"] != "active":
            return f"{unit} is {state['ActiveState']} (result: {state['Result']})"
        return None

    async def read_log(self, since: int) -> tuple[str, int]:
        if self._deployed is None:
            return "", since
        text = await self._unit.journal(self._deployed["InvocationID"])
        return text[since:], len(text)

    # ---- restore ------------------------------------------------------------------------------

    async def restore(self) -> None:
        """Our drop-in removed and the unit back as the snapshot found it; the files compared byte for byte."""
        try:
            await self._restore()
        except HostUnreachable as exc:
            if self._written is None:
                raise
            raise HostUnreachable(
                f"{exc}; the host's dead-man timer puts {self._unit.name} back on its baseline within "
                f"{self._options.dead_man_s:g} s of the last contact, and the next run checks it"
            ) from None

    async def _restore(self) -> None:
        difference = None
        try:
            if self._written is not None:
                await self._transport.remove_file(self._paths.runtime_drop_in)
                await self._transport.remove_file(self._paths.secrets)
                crash_point("mid-restore")
                await self._unit.systemctl("daemon-reload")
                active = bool(self._baseline is None or self._baseline.get("active", True))
                if active:
                    await self._unit.restart(await self._unit.state(), timeout_s=self._options.restore_timeout_s)
                else:
                    await self._unit.systemctl("reset-failed", self._unit.name, check=False)
                    await self._unit.systemctl("stop", self._unit.name, timeout_s=self._options.restore_timeout_s)
                self._written, self._deployed = None, None
                if active:
                    await self._wait_restored()
                if self._baseline is not None and "files" in self._baseline:
                    difference = await difference_from_snapshot(self._unit, await self._unit.state(), self._baseline)
            # Our drop-in is gone and the unit restarted: nothing of ours stays armed, whether or not
            # the unit now matches the snapshot (a difference is someone else's change, for a person).
            await self._dead_man.disarm()
            await self._transport.remove_file(self._paths.restore_script)
            await self._transport.remove_file(self._paths.snapshot)
        finally:
            await self._lock.release()
        if difference is not None:
            raise DeployError(difference)

    async def _wait_restored(self) -> None:
        await wait_restored(self._unit, self._server, self._launch, timeout_s=self._options.restore_timeout_s)
