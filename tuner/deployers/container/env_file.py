"""The trial's environment as one env file: no environment value is ever on a command line, where `ps`
shows it to every user of the host. The original's environment (an `HF_TOKEN`, say), the launch's and its
secrets all go through one file, mode 0600, written just before `run` and removed as soon as `run` returns,
whether it succeeded or not; the CLI reads it itself when it creates the container. An env file holds one
`KEY=VALUE` per line, so a value with a line break cannot be carried: it is refused, naming the variable
(never its value), before the operator's container is touched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tuner.errors import ConfigError
from tuner.models import LaunchSpec

__all__ = ["trial_env_file", "without_env_values"]

# What docker's and podman's env-file parsers take as a name: no whitespace or `=`, and a leading `#`
# would make the line a comment, silently dropping the variable.
_ENV_FILE_NAME = re.compile(r"[^\s=#][^\s=]*")
# A line break ends the line (the rest would become a variable of its own); NUL ends the string.
_ENV_FILE_BREAKS = ("\n", "\r", "\0")


def trial_env_file(cli: str, container: str, inspect: Mapping[str, Any], launch: LaunchSpec) -> str:
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


def without_env_values(inspect: Mapping[str, Any]) -> dict[str, Any]:
    """The inspect output as saved beside the log: environment names kept, their values (which may be
    the operator's secrets) left out; so is podman's `CreateCommand`, which may hold `-e KEY=VALUE`."""
    config = dict(inspect.get("Config") or {})
    config["Env"] = [entry.split("=", 1)[0] + "=(not saved)" for entry in config.get("Env") or []]
    if "CreateCommand" in config:
        config["CreateCommand"] = ["(not saved: it may hold environment values)"]
    return {**inspect, "Config": config}
