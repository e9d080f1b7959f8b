"""What the tuner reads of the operator's container (its state, the tuned knobs' values), where it reaches a
container's server, and everything that stops a trial from being a faithful,
safe copy of the original (what it cannot carry, who else starts or deletes it, an address it cannot reach):
what `--check` shows and what the run refuses before anything stops."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.deployers.base import running_values
from tuner.deployers.container.carry import entrypoint_of, uncarried_fields
from tuner.deployers.container.ownership import foreground_runner, ownership_refusals
from tuner.models import LaunchSpec, RunningValue, TunedKnob

__all__ = ["address_refusal", "knob_values", "published", "reach_address", "reached_at", "refusals", "status"]

_ALL_ADDRESSES = ("0.0.0.0", "::", "[::]")


def status(inspect: Mapping[str, Any]) -> str:
    return str((inspect.get("State") or {}).get("Status") or "unknown")


def published(inspect: Mapping[str, Any], port: int) -> tuple[str, int] | None:
    """Where the host publishes the container's `port`: (address, host port), the first binding."""
    bindings = ((inspect.get("HostConfig") or {}).get("PortBindings") or {}).get(f"{port}/tcp") or []
    for binding in bindings:
        if str(binding.get("HostPort") or "").isdigit():
            address = str(binding.get("HostIp") or "")
            return ("127.0.0.1" if address in ("", *_ALL_ADDRESSES) else address), int(binding["HostPort"])
    return None


def address_refusal(container: str, inspect: Mapping[str, Any], launch: LaunchSpec) -> str | None:
    """On the host's network the server is reached where it listens; on any other (a bridge, docker's
    default) it must listen on all of the container's addresses, and is reached at the port the original
    publishes for engine.port."""
    network = str((inspect.get("HostConfig") or {}).get("NetworkMode") or "")
    if network == "host":
        return None
    if published(inspect, launch.port) is None:
        return (
            f"container {container} is on network {network or 'default'!r} and publishes no host port for "
            f"{launch.port}/tcp, so the tuner cannot reach its server; set engine.port to the container port "
            f"it publishes (`-p HOSTPORT:CONTAINERPORT`), or run it with --network host"
        )
    try:
        loopback = ipaddress.ip_address(launch.host.strip("[]")).is_loopback
    except ValueError:
        loopback = launch.host == "localhost"
    if loopback:
        return (
            f"container {container} is on network {network or 'default'!r}, where a server listening on "
            f'{launch.host} answers only inside the container; set engine.host = "0.0.0.0" (the tuner reaches '
            "it through the published port)"
        )
    return None


def reached_at(original: Mapping[str, Any], launch: LaunchSpec) -> str:
    """Where a trial is reached, in words: the host's network, or the port the original publishes."""
    bound = published(original, launch.port)
    if str((original.get("HostConfig") or {}).get("NetworkMode")) == "host" or bound is None:
        return f"{launch.host}:{launch.port} (the host's network)"
    return f"{bound[0]}:{bound[1]} (published for {launch.port}/tcp)"


def refusals(
    cli: str, name: str, original: Mapping[str, Any], launch: LaunchSpec, *, processes: str
) -> list[tuple[str, str]]:
    """(subject, why) for each reason a trial cannot stand in for `original`; `processes` is the host's
    `ps -eo args` (a `docker run` holding the container in the foreground)."""
    fix = (
        f"recreate {name} without it, or tune a copy of it that has none (docs/production-host.md lists what a "
        "trial carries)"
    )
    refused = [
        ("copy", f"container {name}'s {field} cannot be carried into a trial container; {fix}")
        for field in uncarried_fields(original, cli)
    ]
    runner = foreground_runner(processes, name)
    refused += [("owner", why) for why in ownership_refusals(cli, name, original, runner)]
    address = address_refusal(name, original, launch)
    if address is not None:
        refused.append(("address", address))
    return refused


def reach_address(original: Mapping[str, Any], launch: LaunchSpec) -> tuple[str, int]:
    """Where the host reaches the server: as it listens on the host's network, else the published port."""
    bound = published(original, launch.port)
    if str((original.get("HostConfig") or {}).get("NetworkMode")) == "host" or bound is None:
        return launch.host, launch.port
    return bound


def knob_values(name: str, original: Mapping[str, Any], tuned: Sequence[TunedKnob]) -> list[RunningValue]:
    """The tuned knobs' values in the original's command line and environment: the study's baseline."""
    config = original.get("Config") or {}
    argv = [*entrypoint_of(config), *[str(word) for word in config.get("Cmd") or []]]
    environ = dict(str(entry).split("=", 1) for entry in config.get("Env") or [] if "=" in str(entry))
    return running_values(argv, environ, tuned, env_source=lambda env: f"container {name}'s environment variable {env}")
