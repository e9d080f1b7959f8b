"""`ContainerDeployer`: trials as a copy of the operator's container (carry.py) beside the stopped original,
which keeps its name and is never changed; the watcher on the host (dead_man.py) and the next run put it
back if this controller cannot."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.deployers.container.address import (
    address_refusal,
    knob_values,
    reach_address,
    reached_at,
    refusals,
    status,
)
from tuner.deployers.container.carry import (
    ORIGINAL_RAN_LABEL,
    image_entrypoint,
    trial_run_argv,
)
from tuner.deployers.container.cli import ContainerCli
from tuner.deployers.container.dead_man import DeadManWatcher, host_state_dir
from tuner.deployers.container.env_file import trial_env_file, without_env_values
from tuner.errors import ConfigError, DeployError, ServerNotReady
from tuner.models import CheckLine, LaunchSpec, RunningValue, ServerCommand, TunedKnob
from tuner.redact import redact
from tuner.transports.base import Transport

__all__ = ["ContainerDeployer", "ContainerOptions"]

TRIAL_SUFFIX = "-tuner-trial"
_OLD_BASELINE_SUFFIX = "-tuner-baseline"  # where versions before 0.6 moved the original aside
# Fields of the original compared with the snapshot after the restore: all but its state and timestamps.
_COMPARED = ("Id", "Name", "Image", "Config", "HostConfig", "Mounts")


# Whose containers the study looks at, said where it finds none of the name.
_LOOKED_AS = {
    "podman": "podman keeps each user's containers apart: the study looks at the login's, or root's with host.sudo",
    "docker": "looked for as the login, or through sudo with host.sudo",
}


class ContainerOptions(StrictModel):
    cli: Literal["docker", "podman"] = Field(default="docker", description="The container engine's command.")
    container: str = Field(min_length=1, description="Name of the container that runs the server now.")
    start_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for a healthy server.")
    stop_timeout_s: int = Field(default=30, ge=1, description="Seconds `stop` waits before killing.")
    dead_man_s: float = Field(
        default=3600.0,
        ge=5,
        description="The host puts the original container back by itself this long after the controller was "
        "last heard from (a watcher started on the host before the original stops): make it longer than a "
        "trial's longest round.",
    )


@DEPLOYERS.register("container")
class ContainerDeployer:
    options_model = ContainerOptions
    # Its commands run as the login (a docker group member, rootless podman, root), or all through `sudo -n`
    # where host.sudo says so: `--check` asks no sudo of a plain login (tuner/check.py).
    runs_as_login = True

    @staticmethod
    def uses_image_paths(options: ContainerOptions) -> bool:
        """engine.binary and engine.model are the container's: none is looked for on the host."""
        return True

    @staticmethod
    def server_command(options: ContainerOptions, *, local_host: bool) -> ServerCommand:
        """The image's paths, not this machine's, whichever host runs it."""
        return ServerCommand.REMOTE

    def __init__(self, options: ContainerOptions, *, transport: Transport) -> None:
        self._options = options
        self._transport = transport
        self._runtime = ContainerCli(options.cli, transport)
        self._original: dict[str, Any] | None = None  # its inspect when the study first stopped it
        self._original_ran = False
        self._image_entrypoint: list[str] = []
        self._watcher: DeadManWatcher | None = None
        self._armed = False
        self._last_beat = 0.0
        self._log_path: str | None = None
        self._log_kept = 0
        self._launch: LaunchSpec | None = None

    @property
    def _name(self) -> str:
        return self._options.container

    @property
    def _trial(self) -> str:
        return self._name + TRIAL_SUFFIX

    @property
    def privileged_commands(self) -> tuple[str, ...]:
        """What goes through `sudo -n` where host.sudo is true: the CLI, and the watcher's and env file's steps."""
        return (self._options.cli, "sh", "rm", "touch")

    # ---- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> ContainerDeployer:
        await self._put_back_leftovers()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.restore()

    async def _put_back_leftovers(self) -> None:
        """A controller killed mid-study left its trial running and the original stopped: put it back first.
        A study whose controller still beats for this container is another run's: refused, not undone."""
        left = await self._runtime.inspect(self._trial)
        busy = await self._busy_with_another_run(left)
        if busy is not None:
            raise DeployError(busy)
        if left is not None:
            labels = (left.get("Config") or {}).get("Labels") or {}
            await self._runtime("rm", "-f", self._trial)
            original = await self._runtime.inspect(self._name)
            if labels.get(ORIGINAL_RAN_LABEL) == "yes" and original is not None and status(original) != "running":
                await self._runtime("start", self._name)
        if await self._runtime.inspect(self._name + _OLD_BASELINE_SUFFIX) is not None:
            await self._runtime("rename", self._name + _OLD_BASELINE_SUFFIX, self._name)
            await self._runtime("start", self._name)
        watcher = await self._make_watcher()
        await watcher.disarm()
        await self._transport.remove_file(watcher.env_file)  # a killed controller's, between writing and `run`

    async def _busy_with_another_run(self, left: Mapping[str, Any] | None) -> str | None:
        """Why this container is another study's now (its trial runs and its controller beat lately), or None."""
        watcher = await self._make_watcher()
        return None if left is None else watcher.held_by_another_run(await watcher.holder())

    async def _make_watcher(self) -> DeadManWatcher:
        if self._watcher is None:
            self._watcher = DeadManWatcher(
                self._transport,
                state_dir=await host_state_dir(self._transport),
                cli=self._options.cli,
                container=self._name,
                seconds=self._options.dead_man_s,
            )
        return self._watcher

    async def _original_now(self) -> dict[str, Any]:
        found = await self._runtime.inspect(self._name)
        if found is None:
            raise ConfigError(
                f"no container named {self._name!r} ({_LOOKED_AS[self._options.cli]}); set deploy.container to the "
                f"container that runs the server (`{self._options.cli} ps -a`)"
            )
        return found

    async def _refusals(self, original: Mapping[str, Any], launch: LaunchSpec) -> list[tuple[str, str]]:
        """(subject, why) for everything that stops a trial from being a faithful, safe copy of `original`."""
        processes = await self._transport.run(["ps", "-eo", "args"], timeout_s=30, check=False)
        return refusals(self._options.cli, self._name, original, launch, processes=processes.stdout)

    # ---- --check ----------------------------------------------------------------------------------

    async def check(self, launch: LaunchSpec, *, tuned: Sequence[TunedKnob]) -> list[CheckLine]:
        """What `tuner run --check` reads, changing nothing: the container, what a trial would carry of it,
        who else starts it, where the tuner reaches it, and a trial an earlier run left."""
        subject = f"container {self._name}"
        try:
            original = await self._original_now()
        except (ConfigError, DeployError) as exc:
            return [CheckLine(subject, False, str(exc))]
        lines = [CheckLine(subject, True, f"{status(original)}, image {(original.get('Config') or {}).get('Image')}")]
        refused = await self._refusals(original, launch)
        lines += [CheckLine(what, False, why) for what, why in refused]
        try:  # a value no env file can carry, which the run refuses before anything stops
            trial_env_file(self._options.cli, self._name, original, launch)
        except ConfigError as exc:
            lines.append(CheckLine("environment", False, str(exc)))
        if not refused:
            reached = reached_at(original, launch)
            lines.append(
                CheckLine("copy", True, f"a trial carries everything but the command line; reached at {reached}")
            )
        left = await self._runtime.inspect(self._trial)
        busy = await self._busy_with_another_run(left)
        if busy is not None:
            lines.append(CheckLine("leftovers", False, busy))
        elif left is not None:
            lines.append(CheckLine("leftovers", True, f"an earlier run left {self._trial}: the run restores first"))
        return lines

    async def running_url(self, launch: LaunchSpec) -> str | None:
        """Where the original answers now, if it runs: for `--check`'s request."""
        original = await self._runtime.inspect(self._name)
        if original is None or status(original) != "running" or address_refusal(self._name, original, launch):
            return None
        return await self._reach(original, launch)

    async def running_values(self, tuned: Sequence[TunedKnob]) -> list[RunningValue] | None:
        """The tuned knobs' values in the original's command line and environment: the study's baseline."""
        original = await self._runtime.inspect(self._name)
        return None if original is None else knob_values(self._name, original, tuned)

    async def _reach(self, original: Mapping[str, Any], launch: LaunchSpec) -> str:
        return await self._transport.reach(*reach_address(original, launch))

    # ---- a trial ------------------------------------------------------------------------------

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        original = await self._original_now() if self._original is None else self._original
        refused = await self._refusals(original, launch)
        if refused:
            raise ConfigError(refused[0][1])
        # Refused here, before the operator's container is stopped, if a value cannot be carried.
        env_text = trial_env_file(self._options.cli, self._name, original, launch)
        if self._original is None:
            self._original, self._original_ran = original, status(original) == "running"
            found = await self._runtime.run(
                "image", "inspect", "--format", "{{json .Config.Entrypoint}}", str(original.get("Image") or ""),
                timeout_s=60,
                check=False,
            )  # fmt: skip
            self._image_entrypoint = image_entrypoint(found.stdout if found.exit_status == 0 else "null")
            baseline = Path(log_path + ".original.json")  # on this machine, beside the trial's log
            baseline.parent.mkdir(parents=True, exist_ok=True)
            baseline.write_text(json.dumps(without_env_values(original), indent=1))
        watcher = await self._make_watcher()
        # Armed before anything stops: once per study, and again only if it already put the original back
        # (a silence too long), so that one watcher runs, not one per trial.
        if not self._armed or not await watcher.armed():
            await watcher.arm(trial=self._trial, original_ran=self._original_ran)
            self._armed = True
        self._last_beat = time.monotonic()
        now = await self._runtime.inspect(self._name)
        if now is not None and status(now) == "running":
            await self._runtime("stop", "-t", str(self._options.stop_timeout_s), self._name)
        await self._runtime.run("rm", "-f", self._trial, timeout_s=120, check=False)
        env_path = watcher.env_file
        await self._transport.write_file(env_path, env_text.encode(), mode=0o600)
        argv = trial_run_argv(
            self._options.cli,
            self._trial,
            original,
            launch,
            env_file=env_path,
            original_ran=self._original_ran,
            image_entrypoint=self._image_entrypoint,
        )
        try:
            await self._runtime(*argv[1:])
        finally:
            # The CLI has read the file by the time `run` returns; a failed `run` must not leave it either.
            await self._transport.remove_file(env_path)
        self._log_path, self._log_kept, self._launch = log_path, 0, launch
        base_url = await self._reach(original, launch)
        try:
            took = await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=self.check_alive
            )
        except ServerNotReady as exc:
            tail = (await self.read_log(0))[0].strip().splitlines()[-1:] or ["(no output)"]
            raise ServerNotReady(f"{exc}; container log ends: {redact(tail[0])[:200]}") from None
        await self.read_log(0)  # the start's lines in the run directory, as the systemd deployer keeps them
        return Deployment(launch=launch, pid=None, started_in_s=took, log_path=log_path, base_url=base_url)

    async def check_alive(self) -> str | None:
        if self._watcher is not None and time.monotonic() - self._last_beat > min(60.0, self._options.dead_man_s / 4):
            await self._watcher.beat_now()
            self._last_beat = time.monotonic()
        result = await self._runtime.run(
            "inspect", "--type", "container", "-f", "{{.State.Status}} {{.State.ExitCode}}", self._trial,
            timeout_s=60,
            check=False,
        )  # fmt: skip
        original = await self._runtime.inspect(self._name)
        back = original is not None and status(original) == "running"
        if not back and result.exit_status == 0 and result.stdout.startswith("running "):
            return None
        if self._watcher is not None and not await self._watcher.armed():  # it removed the trial, started NAME
            return (
                f"the host's watcher put {self._name} back: this controller was not heard from for deploy.dead_man_s "
                f"({self._options.dead_man_s:g} s); make it longer than a trial's longest round"
            )
        if back:
            return (
                f"the original container {self._name} is running again beside the trial (its restart policy after "
                "an engine restart, or someone started it): the trial was not measured alone"
            )
        if result.exit_status != 0:
            return "the trial container is gone"
        trial_status, _, code = result.stdout.strip().partition(" ")
        return f"the trial container is {trial_status} (exit code {code})"

    async def read_log(self, since: int) -> tuple[str, int]:
        """The trial container's log; kept whole (redacted) in the run directory as it grows."""
        result = await self._runtime.run("logs", self._trial, timeout_s=120, check=False)
        if result.exit_status != 0:
            return "", since
        text = result.stdout + result.stderr
        if self._log_path is not None and len(text) > self._log_kept:
            Path(self._log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(self._log_path).write_text(redact(text))  # the server's own lines may quote the key
            self._log_kept = len(text)
        return text[since:], len(text)

    # ---- restore ------------------------------------------------------------------------------

    async def restore(self) -> None:
        """The trial container removed, the original started again if it ran, the watcher disarmed; then the
        original compared with what the study found (all but its state)."""
        await self._runtime.run("rm", "-f", self._trial, timeout_s=120, check=False)
        if self._original is None:
            return
        if self._original_ran:
            now = await self._runtime.inspect(self._name)
            if now is not None and status(now) != "running":
                await self._runtime("start", self._name)
            if self._launch is not None and now is not None:
                await self._wait_original(now, self._launch)
        if self._watcher is not None:
            await self._watcher.disarm()
            self._armed = False
        before, self._original = self._original, None
        after = await self._runtime.inspect(self._name)
        changed = [key for key in _COMPARED if after is None or after.get(key) != before.get(key)]
        if changed:
            raise DeployError(
                f"container {self._name} is not as the study found it ({', '.join(changed)} differ"
                f"{'; it is gone' if after is None else ''}): someone changed it during the study; check it by hand"
            )

    async def _wait_original(self, original: Mapping[str, Any], launch: LaunchSpec) -> None:
        async def stopped() -> str | None:
            now = await self._runtime.inspect(self._name)
            return None if now is not None and status(now) == "running" else f"{self._name} is not running"

        if address_refusal(self._name, original, launch) is None:
            await wait_until_healthy(
                launch,
                base_url=await self._reach(original, launch),
                timeout_s=self._options.start_timeout_s,
                exited=stopped,
            )
