"""`exec_start = "container"`: a unit whose `ExecStart=` runs the server's container in the foreground
(`docker run ...` or `podman run ...`, without `-d`, as a docker-run unit does) is tuned as any unit is, by
our drop-in, which resets `ExecStart=` to the operator's own command with two changes only:

- the container's command line (the words after the image) is the trial's, with `--entrypoint` set to the
  trial's program (one word, as docker takes it);
- `--env NAME` (no value) before the image for each variable of the trial: the container takes its value
  from the runner's environment, which the drop-in's `Environment=` (or, for a secret, its 0600
  `EnvironmentFile=`) sets, so no value is ever on a command line.

Everything else of the operator's `run` stays word for word: `--rm`, `--name`, devices, mounts, network.
The unit's main process is the runner itself, so the systemd deployer's verification (its command line,
its environment, its MainPID and restarts) applies as for any unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.models import LaunchSpec

__all__ = ["ContainerRun", "parse_container_run", "reached_at", "trial_exec_start"]

_RUNNERS = ("docker", "podman")
# `run` options that take no value (docker's and podman's); every other `--flag` takes the next word.
_SWITCHES = frozenset({
    "--rm", "--init", "--privileged", "--read-only", "--replace", "--interactive", "--tty", "--publish-all",
    "--oom-kill-disable", "--no-healthcheck", "--no-hosts", "--help", "--quiet", "--rootfs", "--read-only-tmpfs",
    "--detach", "--sig-proxy", "--disable-content-trust", "--http-proxy", "--env-host", "--tls-verify",
    "--rmi", "--unsetenv-all", "--passwd", "--use-api-socket",
})  # fmt: skip
_SHORT_SWITCHES = frozenset("ditPq")
# Global options before `run` that take no value.
_GLOBAL_SWITCHES = frozenset({"--debug", "-D", "--tls", "--tlsverify", "--syslog", "--remote", "-r"})


@dataclass(frozen=True)
class ContainerRun:
    """A `docker run`/`podman run` command line, cut at its image."""

    head: list[str]  # the runner, its global options, `run` and every option of the operator's
    image: str
    command: list[str]  # the container's command line: the words after the image

    def option_values(self, *names: str) -> list[str]:
        """The values given to any of `names` (`--network host`, `--network=host`)."""
        found = []
        for i, word in enumerate(self.head):
            flag, equals, value = word.partition("=")
            if flag in names:
                found.append(value if equals else (self.head[i + 1] if i + 1 < len(self.head) else ""))
        return found


def _takes_value(word: str) -> bool:
    if word.startswith("--"):
        return "=" not in word and word not in _SWITCHES
    letters = word[1:]
    if all(letter in _SHORT_SWITCHES for letter in letters):
        return False
    return len(letters) == 1  # `-p 8080:80`; `-p8080:80` carries its value


def _detaches(word: str) -> bool:
    """`-d`, `--detach`, `--detach=true`, `-d=True`, or `-d` among other short switches (`-dit`)."""
    flag, equals, value = word.partition("=")
    if flag in ("-d", "--detach"):
        return not equals or value.lower() in ("true", "1")
    return word.startswith("-") and not word.startswith("--") and "d" in word and set(word[1:]) <= _SHORT_SWITCHES


def parse_container_run(argv: Sequence[str], *, unit: str) -> ContainerRun:
    """The unit's command line as a foreground `run`; `ConfigError` naming what it is instead, with the fix."""
    fix = (
        f"deploy.exec_start = \"container\" needs {unit}'s ExecStart= to run the server's container in the "
        "foreground (`/usr/bin/podman run --rm --name NAME ... IMAGE ARGS`, or docker's)"
    )
    if not argv or argv[0].rsplit("/", 1)[-1] not in _RUNNERS:
        raise ConfigError(f"{unit} runs {' '.join(argv[:1]) or 'nothing'}, not docker or podman; {fix}")
    i = 1
    while i < len(argv) and argv[i].startswith("-"):  # global options: `podman --runtime runc run`
        i += 1 if argv[i] in _GLOBAL_SWITCHES or "=" in argv[i] else 2
    if argv[i : i + 1] == ["container"]:
        i += 1
    if argv[i : i + 1] != ["run"]:
        raise ConfigError(f"{unit} runs `{' '.join(argv[: i + 1])}`, not a `run`; {fix}")
    i += 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        i += 2 if _takes_value(argv[i]) else 1
    if argv[i : i + 1] == ["--"]:
        i += 1
    if i >= len(argv):
        raise ConfigError(f"{unit}'s ExecStart= names no image; {fix}")
    run = ContainerRun(head=list(argv[:i]), image=argv[i], command=list(argv[i + 1 :]))
    detached = next((w for w in run.head if _detaches(w)), None)
    if detached is not None:
        raise ConfigError(
            f"{unit} runs its container detached ({detached}): the unit's main process is not the server's, so a "
            "trial could not be verified; run it in the foreground (without -d, Type=simple) to tune it this way"
        )
    return run


def trial_exec_start(run: ContainerRun, launch: LaunchSpec) -> list[str]:
    """The operator's `run` with the trial's program and arguments, and `--env NAME` for each of its
    variables (values from the drop-in's environment)."""
    head: list[str] = []
    skip = False
    for word in run.head:
        if skip:
            skip = False
            continue
        if word == "--entrypoint":
            skip = True
            continue
        if word.startswith("--entrypoint="):
            continue
        head.append(word)
    for name in [*launch.env, *launch.secret_env]:
        head += ["--env", name]
    return [*head, "--entrypoint", launch.executable, run.image, *launch.args]


def reached_at(run: ContainerRun, launch: LaunchSpec) -> tuple[str, int]:
    """Where the controller reaches the trial: the launch's address on the host's network, else the host
    port published for the launch's port (`-p [IP:]HOSTPORT:PORT`)."""
    if "host" in run.option_values("--network", "--net"):
        return launch.host, launch.port
    for published in run.option_values("-p", "--publish"):
        parts = published.removesuffix("/tcp").rsplit(":", 2)
        if len(parts) >= 2 and parts[-1] == str(launch.port) and parts[-2].isdigit():
            address = parts[0] if len(parts) == 3 and parts[0] not in ("", "0.0.0.0") else "127.0.0.1"
            return address, int(parts[-2])
    return launch.host, launch.port
