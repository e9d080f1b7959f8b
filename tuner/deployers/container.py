"""The `container` deployer (docker or podman): trials run as a copy of the user's server container
with new arguments; the original container itself is never changed, only stopped and renamed aside.

    apply:   inspect NAME (the baseline, kept in memory and beside the log)
             stop NAME; rename NAME -> NAME-tuner-baseline          (first trial only)
             rm -f NAME-tuner-trial; run -d --name NAME-tuner-trial <NAME's ports, mounts, devices,
             network, IPC> --env-file LOG.env [--entrypoint X] IMAGE <args>
    restore: rm -f NAME-tuner-trial; rename NAME-tuner-baseline -> NAME; start NAME

No environment value is ever on a command line, where `ps` shows it to every user of the host: the
original's environment (an `HF_TOKEN`, say), the launch's and its secrets all go through one env file,
mode 0600, written just before `run` and removed as soon as `run` returns, whether it succeeded or not.
The CLI reads that file itself when it creates the container. An env file holds one `KEY=VALUE` per
line, so a value with a line break cannot be carried: it is refused, naming the variable, before the
user's container is touched.

A run that finds NAME-tuner-baseline already there (a controller killed mid-study) restores it first.
The trial's argv is the engine's launch: where the image's entrypoint already is its start (vLLM's image
runs `vllm serve`), only the rest is passed, as the image expects; otherwise `--entrypoint` replaces it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.errors import CommandFailed, ConfigError, DeployError, ServerNotReady
from tuner.models import CheckLine, LaunchSpec, ServerCommand, TunedKnob
from tuner.redact import redact
from tuner.transports.base import CommandResult, Transport

__all__ = ["ContainerDeployer", "ContainerOptions", "trial_env_file", "trial_run_argv"]

_BASELINE_SUFFIX = "-tuner-baseline"
_TRIAL_SUFFIX = "-tuner-trial"
_ENV_FILE_SUFFIX = ".env"  # beside the trial's log, on the host where the CLI runs

# What docker's and podman's env-file parsers take as a name: no whitespace or `=`, and a leading `#`
# would make the line a comment, silently dropping the variable.
_ENV_FILE_NAME = re.compile(r"[^\s=#][^\s=]*")
# A line break ends the line (the rest would become a variable of its own); NUL ends the string.
_ENV_FILE_BREAKS = ("\n", "\r", "\0")


class ContainerOptions(StrictModel):
    cli: Literal["docker", "podman"] = Field(default="docker", description="The container engine's command.")
    container: str = Field(min_length=1, description="Name of the container that runs the server now.")
    start_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for a healthy server.")
    stop_timeout_s: int = Field(default=30, ge=1, description="Seconds `stop` waits before killing.")


def trial_run_argv(cli: str, name: str, inspect: dict[str, Any], launch: LaunchSpec, *, env_file: str) -> list[str]:
    """`<cli> run -d` for a trial: the original's ports, mounts, devices, network and IPC, the environment
    from `env_file` (see `trial_env_file`), and the launch's argv fitted to the image's entrypoint."""
    config, host = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    argv = [cli, "run", "-d", "--name", name]
    for container_port, bindings in sorted((host.get("PortBindings") or {}).items()):
        for binding in bindings or []:
            address = binding.get("HostIp") or ""
            published = f"{address}:{binding.get('HostPort', '')}" if address else str(binding.get("HostPort", ""))
            argv += ["-p", f"{published}:{container_port}"]
    for bind in host.get("Binds") or []:
        argv += ["-v", bind]
    if host.get("NetworkMode") and host["NetworkMode"] != "default":
        argv += ["--network", host["NetworkMode"]]
    if host.get("IpcMode") and host["IpcMode"] not in ("private", "shareable", ""):
        argv += ["--ipc", host["IpcMode"]]
    if host.get("ShmSize"):
        argv += ["--shm-size", str(host["ShmSize"])]
    for request in host.get("DeviceRequests") or []:
        if request.get("Driver") in ("nvidia", "") and request.get("Count") == -1:
            argv += ["--gpus", "all"]
        elif request.get("DeviceIDs"):
            argv += ["--gpus", "device=" + ",".join(request["DeviceIDs"])]
    if host.get("Runtime") and host["Runtime"] != "runc":
        argv += ["--runtime", host["Runtime"]]
    # Every environment value, inherited, tuned or secret, is in this file; none is on the command line.
    argv += ["--env-file", env_file]
    entrypoint = list(config.get("Entrypoint") or [])
    command = [launch.executable, *launch.args]
    if entrypoint and command[: len(entrypoint)] == entrypoint:
        rest = command[len(entrypoint) :]
    else:
        argv += ["--entrypoint", command[0]]
        rest = command[1:]
    return [*argv, str(config.get("Image") or inspect.get("Image")), *rest]


def trial_env_file(cli: str, container: str, inspect: dict[str, Any], launch: LaunchSpec) -> str:
    """The trial's whole environment as env-file text: the original container's, the launch's on top,
    its secrets last. `ConfigError` naming the variable and its fix for one that no env file can carry."""
    config = inspect.get("Config") or {}
    inherited = dict(entry.split("=", 1) for entry in config.get("Env") or [] if "=" in entry)
    # name -> (value, what it is, how to fix it)
    sources: dict[str, tuple[str, str, str]] = {}
    for key, value in inherited.items():
        sources[key] = (
            value,
            f"the environment variable {key} of container {container!r}",
            f"recreate {container} with {key} on one line (`{cli} inspect {container}` shows its Env)",
        )
    for key, value in launch.env.items():
        sources[key] = (value, f"the server's environment variable {key}", "fix it in the study file's engine section")
    for key, value in launch.secret_values().items():
        sources[key] = (
            value,
            f"the secret {key}",
            "fix the variable that engine.api_key_env names in the controller's environment",
        )
    lines = []
    for key, (value, what, fix) in sources.items():
        if not _ENV_FILE_NAME.fullmatch(key):
            raise ConfigError(f"{what} has a name an env file cannot carry (spaces, '=' or a leading '#'); {fix}")
        if any(mark in value for mark in _ENV_FILE_BREAKS):
            # Never the value itself in the message: it may be the secret.
            raise ConfigError(
                f"{what} has a line break or NUL in its value, which an env file cannot carry "
                f"(and no value goes on the command line); {fix}"
            )
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def _without_env_values(inspect: dict[str, Any]) -> dict[str, Any]:
    """The inspect output as saved beside the log: environment names kept, their values (which may be
    the operator's secrets) left out."""
    config = dict(inspect.get("Config") or {})
    config["Env"] = [entry.split("=", 1)[0] + "=(not saved)" for entry in config.get("Env") or []]
    return {**inspect, "Config": config}


@DEPLOYERS.register("container")
class ContainerDeployer:
    options_model = ContainerOptions

    @staticmethod
    def server_command(options: ContainerOptions, *, local_host: bool) -> ServerCommand:
        """The image's paths, not this machine's, whichever host runs it."""
        return ServerCommand.REMOTE

    def __init__(self, options: ContainerOptions, *, transport: Transport) -> None:
        self._options = options
        self._transport = transport
        self._baseline: dict[str, Any] | None = None
        self._moved_aside = False

    @property
    def _name(self) -> str:
        return self._options.container

    async def __aenter__(self) -> ContainerDeployer:
        if await self._exists(self._name + _BASELINE_SUFFIX):
            # A controller died mid-study: the user's container is still aside. Put it back first.
            self._moved_aside = True
            await self.restore()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.restore()

    async def _run_cli(self, *args: str, timeout_s: float, check: bool) -> CommandResult:
        # Privileged (`sudo -n` where the host says `sudo = true`): the env file is written as the
        # transport's privileged user with mode 0600, and `run` must read it as that same user; every
        # other command goes the same way so that all of them see the same containers (rootful podman
        # and rootless podman keep separate ones).
        return await self._transport.run([self._options.cli, *args], timeout_s=timeout_s, check=check, privileged=True)

    async def _cli(self, *args: str, check: bool = True, timeout_s: float = 120) -> str:
        try:
            result = await self._run_cli(*args, timeout_s=timeout_s, check=check)
        except CommandFailed as exc:
            raise DeployError(f"{self._options.cli} {args[0]} failed: {exc.stderr_tail.strip()[-300:]}") from None
        return result.stdout

    @property
    def privileged_commands(self) -> tuple[str, ...]:
        """What it runs as root (through `sudo -n` for a plain login): the container CLI and its env file's steps."""
        return (self._options.cli, "sh", "rm")

    async def check(self, launch: LaunchSpec, *, tuned: Sequence[TunedKnob]) -> list[CheckLine]:
        """What `tuner run --check` reads, changing nothing: the container, and a copy an earlier run left."""
        subject = f"container {self._name}"
        if not await self._exists(self._name):
            fix = f"set deploy.container to the container that runs the server (`{self._options.cli} ps -a`)"
            return [CheckLine(subject, False, f"no container of that name; {fix}")]
        state = (await self._inspect(self._name)).get("State") or {}
        lines = [CheckLine(subject, True, f"{state.get('Status', 'unknown')}")]
        if await self._exists(self._name + _BASELINE_SUFFIX):
            lines.append(
                CheckLine("leftovers", True, "an earlier run left the original aside: the run restores it first")
            )
        return lines

    async def _exists(self, name: str) -> bool:
        result = await self._run_cli("inspect", "--type", "container", name, timeout_s=60, check=False)
        return result.exit_status == 0

    async def _inspect(self, name: str) -> dict[str, Any]:
        data = json.loads(await self._cli("inspect", "--type", "container", name))
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise DeployError(f"{self._options.cli} inspect {name} gave no container description")
        return data[0]

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        if self._baseline is None:
            if not await self._exists(self._name):
                raise DeployError(
                    f"no container named {self._name!r}; set deploy.container to the container that runs the server"
                )
            self._baseline = await self._inspect(self._name)
            await self._transport.write_file(
                log_path + ".baseline.json", json.dumps(_without_env_values(self._baseline)).encode()
            )
        # Refused here, before the user's container is stopped, if a value cannot be carried.
        env_text = trial_env_file(self._options.cli, self._name, self._baseline, launch)
        if not self._moved_aside:
            await self._cli("stop", "-t", str(self._options.stop_timeout_s), self._name)
            await self._cli("rename", self._name, self._name + _BASELINE_SUFFIX)
            self._moved_aside = True
        trial = self._name + _TRIAL_SUFFIX
        await self._cli("rm", "-f", trial, check=False)
        env_path = log_path + _ENV_FILE_SUFFIX
        await self._transport.write_file(env_path, env_text.encode(), mode=0o600)
        try:
            await self._cli(*trial_run_argv(self._options.cli, trial, self._baseline, launch, env_file=env_path)[1:])
        finally:
            # The CLI has read the file by the time `run` returns; a failed `run` must not leave it either.
            await self._transport.remove_file(env_path)
        base_url = await self._transport.reach(launch.host, launch.port)
        try:
            took = await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=self.check_alive
            )
        except ServerNotReady as exc:
            tail = (await self.read_log(0))[0].strip().splitlines()[-1:] or ["(no output)"]
            raise ServerNotReady(f"{exc}; container log ends: {redact(tail[0])[:200]}") from None
        return Deployment(launch=launch, pid=None, started_in_s=took, log_path=log_path, base_url=base_url)

    async def check_alive(self) -> str | None:
        result = await self._run_cli(
            "inspect", "--type", "container", "-f", "{{.State.Status}} {{.State.ExitCode}}", self._name + _TRIAL_SUFFIX,
            timeout_s=60,
            check=False,
        )  # fmt: skip
        if result.exit_status != 0:
            return "the trial container is gone"
        status, _, code = result.stdout.strip().partition(" ")
        return None if status == "running" else f"the trial container is {status} (exit code {code})"

    async def read_log(self, since: int) -> tuple[str, int]:
        result = await self._run_cli("logs", self._name + _TRIAL_SUFFIX, timeout_s=120, check=False)
        text = result.stdout + result.stderr
        return text[since:], len(text)

    async def restore(self) -> None:
        """The trial container removed, the user's container back under its name and started."""
        await self._cli("rm", "-f", self._name + _TRIAL_SUFFIX, check=False)
        if self._moved_aside:
            if await self._exists(self._name + _BASELINE_SUFFIX):
                await self._cli("rename", self._name + _BASELINE_SUFFIX, self._name)
            await self._cli("start", self._name)
            self._moved_aside = False
