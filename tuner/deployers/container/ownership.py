"""Who else may stop, start or delete the operator's container while a trial runs in its place: each is
refused before anything stops, with the way to tune that container, where stopping the original would lose
it or bring it back beside the trial.

- `--rm`: the engine deletes such a container when it stops; restore would have nothing to start.
- A systemd unit that runs it (podman's `PODMAN_SYSTEMD_UNIT` label, from `podman generate systemd` and
  Quadlet), or a `docker run`/`podman run` that holds it in the foreground (a unit's `ExecStart`, a
  terminal): when the container stops, that command ends and its unit restarts it beside the trial.

Restart policies and Compose need no refusal: a stopped container stays stopped (docker's `always` comes
back only when the engine itself restarts), the trial never has a policy, and an original that comes back
anyway ends the trial it would disturb (`ContainerDeployer.check_alive`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

__all__ = ["SYSTEMD_LABEL", "foreground_runner", "ownership_refusals"]

SYSTEMD_LABEL = "PODMAN_SYSTEMD_UNIT"
_RUNNERS = ("docker", "podman")


def _auto_removed(inspect: Mapping[str, Any]) -> bool:
    config, host = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    annotations = config.get("Annotations") or {}
    return (
        bool(host.get("AutoRemove")) or str(annotations.get("io.podman.annotations.autoremove", "")).upper() == "TRUE"
    )


def foreground_runner(process_lines: str, container: str) -> str | None:
    """The `docker run`/`podman run` command line (from `ps -eo args`) that names `container`, if one runs."""
    for line in process_lines.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        if not words or words[0].rsplit("/", 1)[-1] not in _RUNNERS or "run" not in words:
            continue
        for i, word in enumerate(words):
            if word == f"--name={container}" or (word == "--name" and words[i + 1 : i + 2] == [container]):
                # Named, never quoted: the rest of that command line may hold `-e KEY=SECRET`.
                return f"{words[0].rsplit('/', 1)[-1]} run --name {container}"
    return None


def ownership_refusals(cli: str, container: str, inspect: Mapping[str, Any], runner: str | None) -> list[str]:
    """Why stopping `container` for a trial would lose it or start it again beside the trial; empty if neither."""
    refusals = []
    if _auto_removed(inspect):
        refusals.append(
            f"container {container} was started with --rm: stopping it for a trial would delete it; recreate it "
            f"without --rm (the same `{cli} run` line otherwise) and run again"
        )
    unit = ((inspect.get("Config") or {}).get("Labels") or {}).get(SYSTEMD_LABEL)
    if unit:  # `podman generate systemd` and Quadlet: a detached `run`, which no drop-in can verify
        refusals.append(
            f"container {container} is run by systemd unit {unit}: stopping it for a trial would have it started "
            f"again beside the trial; for the night, stop {unit} and start the same container by hand (its `{cli} "
            "run` with -d, without --rm and --replace), tune that, then put the result in the unit"
        )
    elif runner:
        refusals.append(
            f"container {container} is run by `{runner} ...` in the foreground (a unit's ExecStart=, a terminal): "
            "stopping it for a trial would have it started again beside the trial; tune it through its unit: "
            '[deploy] kind = "systemd", unit = "THE-UNIT.service", exec_start = "container" (docs/production-host.md)'
        )
    return refusals
