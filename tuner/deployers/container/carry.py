"""What a trial container carries of the operator's container: every field of its `inspect` that changes
what the server can do, as the `run` flags that recreate it; and the fields no flag recreates, which are
refused (by `--check`, and by the run before the original is stopped) rather than silently dropped.

The trial is the same container but for its command line and environment: the same image, user, devices
(GPUs by `--gpus` or by CDI name, `/dev/kfd` and `/dev/dri`), mounts and volumes, ulimits, capabilities,
groups, security options, network, IPC, PID and UTS namespaces, shared memory, resource limits, labels and
log driver. It never gets the original's restart policy (a crash must end the trial, not restart behind the
measurement) nor `--rm` (the run removes it itself).

Fields are read from docker's inspect and podman's (which has the same names, a few values in other forms:
an entrypoint as one string, capabilities with `CAP_`, the runtime in `OCIRuntime`). An engine's default
(podman's `PidsLimit` 2048 or `ShmSize`, docker's `MaskedPaths`) is carried like any value: the trial gets
the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.models import LaunchSpec

__all__ = ["TRIAL_LABEL", "entrypoint_of", "image_entrypoint", "trial_run_argv", "uncarried_fields"]

# Set on every trial container: the original's name, and whether it ran (what a restore starts again).
TRIAL_LABEL = "serve-tuner.trial-of"
ORIGINAL_RAN_LABEL = "serve-tuner.original-was-running"

# Fields that change nothing the server can do, or that the run handles itself: not carried, not refused.
_NOT_CAPABILITY = frozenset({
    "AutoRemove",  # refused before anything stops (ownership.py): stopping such an original deletes it
    "RestartPolicy",  # a trial never restarts by itself; the original keeps its own
    "ContainerIDFile", "ConsoleSize", "Cgroup", "CgroupManager", "CgroupMode", "Cgroups", "CgroupnsMode",
    "Isolation", "MaskedPaths", "ReadonlyPaths", "Annotations", "Runtime",  # podman's "oci"; OCIRuntime is carried
})  # fmt: skip

# Fields carried as flags (below); every other non-empty HostConfig field is refused by name.
_CARRIED = frozenset({
    "Binds", "Mounts", "Tmpfs", "VolumesFrom", "PortBindings", "PublishAllPorts", "NetworkMode", "IpcMode",
    "PidMode", "UTSMode", "UsernsMode", "ShmSize", "Privileged", "CapAdd", "CapDrop", "GroupAdd", "SecurityOpt",
    "ReadonlyRootfs", "Init", "Devices", "DeviceRequests", "DeviceCgroupRules", "Ulimits", "Sysctls",
    "ExtraHosts", "Dns", "DnsOptions", "DnsSearch", "CpusetCpus", "CpusetMems", "Memory", "MemorySwap",
    "MemoryReservation", "MemorySwappiness", "NanoCpus", "CpuShares", "CpuQuota", "CpuPeriod", "PidsLimit",
    "OomScoreAdj", "OomKillDisable", "CgroupParent", "LogConfig",
})  # fmt: skip

# Namespace modes that are each engine's default: carried only when the original asked for something else.
_DEFAULT_MODES = {
    "IpcMode": ("", "private", "shareable"),
    "PidMode": ("", "private"),
    "UTSMode": ("", "private"),
    "UsernsMode": ("", "private", "host"),
    "NetworkMode": ("", "default"),
}


# What podman 4 shows in no inspect field but its CreateCommand (a block-I/O weight reads 0 there), and no
# trial flag carries: refused by name, like any other field that cannot be carried.
_PODMAN_CREATE_ONLY_REFUSED = (
    "--blkio-weight", "--blkio-weight-device", "--device-read-bps", "--device-write-bps", "--device-read-iops",
    "--device-write-iops", "--storage-opt",
)  # fmt: skip


def _create_command(config: Mapping[str, Any]) -> list[str]:
    return [str(word) for word in config.get("CreateCommand") or []]


def _empty(value: object) -> bool:
    return value in (None, "", 0, False, [], {}, -1) or value == [0, 0]


def uncarried_fields(inspect: Mapping[str, Any], cli: str) -> list[str]:
    """The original's fields that no trial flag recreates, as `HostConfig.Name` (empty if none)."""
    host = inspect.get("HostConfig") or {}
    refused = [
        f"HostConfig.{key}"
        for key, value in sorted(host.items())
        if key not in _CARRIED and key not in _NOT_CAPABILITY and not _empty(value)
    ]
    if cli == "podman":
        refused += [
            f"{flag} (podman keeps it only in its CreateCommand)"
            for flag in _PODMAN_CREATE_ONLY_REFUSED
            if any(word == flag or word.startswith(flag + "=") for word in _create_command(inspect.get("Config") or {}))
        ]
    for request in host.get("DeviceRequests") or []:
        capabilities = {c for group in request.get("Capabilities") or [] for c in group}
        if cli != "docker":
            refused.append("HostConfig.DeviceRequests (podman takes GPUs as CDI devices: --device nvidia.com/gpu=all)")
        elif request.get("Driver") not in (None, "", "nvidia") or not capabilities <= {"gpu", "compute", "utility"}:
            refused.append(f"HostConfig.DeviceRequests (driver {request.get('Driver')!r}, {sorted(capabilities)})")
    return refused


def entrypoint_of(config: Mapping[str, Any]) -> list[str]:
    """docker's entrypoint is a list; podman 4's inspect gives one string, its words joined by spaces."""
    entrypoint = config.get("Entrypoint")
    if isinstance(entrypoint, str):
        return entrypoint.split()
    return [str(word) for word in entrypoint or []]


def image_entrypoint(said: str) -> list[str]:
    """The image's own entrypoint from `image inspect --format '{{json .Config.Entrypoint}}'` (a trial names
    none where the original named none): a list, podman's one string, or null."""
    try:
        words = json.loads(said)
    except json.JSONDecodeError:
        return []
    if isinstance(words, str):
        return words.split()
    return [str(word) for word in words] if isinstance(words, list) else []


def _ulimit_name(name: str) -> str:
    """podman says RLIMIT_NOFILE, docker nofile; both take `--ulimit nofile=...`."""
    return name.lower().removeprefix("rlimit_")


def _device_flag(device: Mapping[str, Any]) -> str:
    on_host, inside = str(device.get("PathOnHost") or ""), str(device.get("PathInContainer") or "")
    permissions = str(device.get("CgroupPermissions") or "")
    if "=" in on_host and not inside:  # a CDI name (nvidia.com/gpu=all) as podman records it
        return on_host
    flag = on_host if not inside or inside == on_host else f"{on_host}:{inside}"
    return f"{flag}:{permissions}" if permissions and permissions != "rwm" else flag


def _mount_flags(host: Mapping[str, Any], mounts: Sequence[Mapping[str, Any]]) -> list[str]:
    """`-v` for each of `Binds` (the operator's words), `--mount` for the mounts they do not cover."""
    argv: list[str] = []
    covered = set()
    for bind in host.get("Binds") or []:
        argv += ["-v", str(bind)]
        parts = str(bind).split(":")
        if len(parts) >= 2:
            covered.add(parts[1])
    tmpfs = host.get("Tmpfs") or {}
    for destination, options in sorted(tmpfs.items()):
        argv += ["--tmpfs", f"{destination}:{options}" if options else destination]
        covered.add(destination)
    for mount in mounts:
        destination = str(mount.get("Destination") or mount.get("Target") or "")
        if not destination or destination in covered:
            continue
        kind = str(mount.get("Type") or "bind")
        source = str(mount.get("Name") if kind == "volume" else mount.get("Source") or "")
        words = [f"type={kind}", f"destination={destination}"]
        if kind != "tmpfs" and source:
            words.insert(1, f"source={source}")
        if mount.get("RW") is False or mount.get("ReadOnly"):
            words.append("readonly")
        if kind == "bind" and mount.get("Propagation"):
            words.append(f"bind-propagation={mount['Propagation']}")
        argv += ["--mount", ",".join(words)]
        covered.add(destination)
    for source in host.get("VolumesFrom") or []:
        argv += ["--volumes-from", str(source)]
    return argv


def _resource_flags(host: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, flag in (
        ("CpusetCpus", "--cpuset-cpus"), ("CpusetMems", "--cpuset-mems"), ("Memory", "--memory"),
        ("MemorySwap", "--memory-swap"), ("MemoryReservation", "--memory-reservation"),
        ("CpuShares", "--cpu-shares"), ("CpuQuota", "--cpu-quota"), ("CpuPeriod", "--cpu-period"),
        ("PidsLimit", "--pids-limit"), ("OomScoreAdj", "--oom-score-adj"), ("CgroupParent", "--cgroup-parent"),
    ):  # fmt: skip
        if not _empty(host.get(key)):
            argv += [flag, str(host[key])]
    if host.get("MemorySwappiness") not in (None, -1):
        argv += ["--memory-swappiness", str(host["MemorySwappiness"])]
    if host.get("NanoCpus"):
        argv += ["--cpus", f"{int(host['NanoCpus']) / 1e9:g}"]
    if host.get("OomKillDisable"):
        argv.append("--oom-kill-disable")
    return argv


def _gpu_flags(host: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for request in host.get("DeviceRequests") or []:
        if request.get("DeviceIDs"):  # quoted: docker reads the value as CSV, and `device=0,1` as a count of 1
            argv += ["--gpus", '"device=' + ",".join(request["DeviceIDs"]) + '"']
        elif request.get("Count") == -1:
            argv += ["--gpus", "all"]
        elif request.get("Count"):
            argv += ["--gpus", str(request["Count"])]
    return argv


def _create_command_only(config: Mapping[str, Any]) -> list[str]:
    """What podman 4 keeps whole only in the command that created the container: every `--device` as the
    operator gave it (its inspect drops a CDI name, `nvidia.com/gpu=all`, and a device's permissions, `:r`),
    and `--sysctl`."""
    words = _create_command(config)
    argv: list[str] = []
    for i, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if not equals and i + 1 < len(words):
            value = words[i + 1]
        if flag in ("--device", "--sysctl") and value:
            argv += [flag, value]
    return argv


def _log_flags(host: Mapping[str, Any]) -> list[str]:
    log = host.get("LogConfig") or {}
    argv = ["--log-driver", str(log["Type"])] if log.get("Type") else []
    options = log.get("Config") or {}
    for key, value in sorted(options.items() if isinstance(options, dict) else []):
        argv += ["--log-opt", f"{key}={value}"]
    return argv


def _list_flags(host: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, flag in (
        ("CapAdd", "--cap-add"), ("CapDrop", "--cap-drop"), ("GroupAdd", "--group-add"),
        ("SecurityOpt", "--security-opt"), ("DeviceCgroupRules", "--device-cgroup-rule"),
        ("ExtraHosts", "--add-host"), ("Dns", "--dns"), ("DnsOptions", "--dns-option"),
        ("DnsSearch", "--dns-search"),
    ):  # fmt: skip
        for value in host.get(key) or []:
            argv += [flag, str(value)]
    for device in host.get("Devices") or []:
        argv += ["--device", _device_flag(device)]
    for limit in host.get("Ulimits") or []:
        argv += ["--ulimit", f"{_ulimit_name(str(limit['Name']))}={limit['Soft']}:{limit['Hard']}"]
    for key, value in sorted((host.get("Sysctls") or {}).items()):
        argv += ["--sysctl", f"{key}={value}"]
    return argv


def _namespace_flags(host: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, flag in (("NetworkMode", "--network"), ("IpcMode", "--ipc"), ("PidMode", "--pid"),
                      ("UTSMode", "--uts"), ("UsernsMode", "--userns")):  # fmt: skip
        mode = str(host.get(key) or "")
        if mode not in _DEFAULT_MODES[key]:
            argv += [flag, mode]
    for container_port, bindings in sorted((host.get("PortBindings") or {}).items()):
        for binding in bindings or []:
            address = binding.get("HostIp") or ""
            published = f"{address}:{binding.get('HostPort', '')}" if address else str(binding.get("HostPort", ""))
            argv += ["-p", f"{published}:{container_port}"]
    if host.get("PublishAllPorts"):
        argv.append("--publish-all")
    return argv


def _with_entrypoint(
    argv: list[str], cli: str, entrypoint: list[str], image_entrypoint: Sequence[str], launch: LaunchSpec
) -> tuple[list[str], list[str]]:
    """The launch fitted to the original's entrypoint: where it starts with it (vLLM's image runs `vllm
    serve`), only the rest is passed, as the image expects, and `--entrypoint` only where the original set
    one of its own; otherwise the launch's program replaces it."""
    command = [launch.executable, *launch.args]
    if not entrypoint or command[: len(entrypoint)] != entrypoint:
        return [*argv, "--entrypoint", command[0]], command[1:]
    if entrypoint == list(image_entrypoint):
        return argv, command[len(entrypoint) :]
    if cli == "podman" and len(entrypoint) > 1:
        return [*argv, "--entrypoint", json.dumps(entrypoint)], command[len(entrypoint) :]
    return [*argv, "--entrypoint", command[0]], command[1:]  # docker's --entrypoint takes one word


def trial_run_argv(
    cli: str,
    name: str,
    inspect: Mapping[str, Any],
    launch: LaunchSpec,
    *,
    env_file: str,
    original_ran: bool,
    image_entrypoint: Sequence[str] = (),
) -> list[str]:
    """`<cli> run -d` for a trial: everything of the original but its command line and environment, which
    are the launch's (its environment, with the original's under it, only in `env_file`).
    `image_entrypoint` is the image's own, which the trial keeps by not naming one where the original did not."""
    config, host = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    argv = [cli]
    if cli == "podman" and inspect.get("OCIRuntime"):
        argv += ["--runtime", str(inspect["OCIRuntime"])]  # a global flag of podman 4
    original = str(inspect.get("Name") or "").lstrip("/")
    argv += ["run", "-d", "--name", name, "--label", f"{TRIAL_LABEL}={original}"]
    argv += ["--label", f"{ORIGINAL_RAN_LABEL}={'yes' if original_ran else 'no'}"]
    for key, value in sorted((config.get("Labels") or {}).items()):
        if key not in (TRIAL_LABEL, ORIGINAL_RAN_LABEL):
            argv += ["--label", f"{key}={value}"]
    if config.get("User"):
        argv += ["--user", str(config["User"])]
    if config.get("WorkingDir"):
        argv += ["--workdir", str(config["WorkingDir"])]
    argv += _namespace_flags(host)
    argv += _mount_flags(host, inspect.get("Mounts") or [])
    if host.get("ShmSize") and not str(host.get("IpcMode") or "").startswith(("host", "container:")):
        argv += ["--shm-size", str(host["ShmSize"])]  # a shared IPC namespace has its owner's /dev/shm
    if host.get("Privileged"):
        argv.append("--privileged")
    if host.get("ReadonlyRootfs"):
        argv.append("--read-only")
    if host.get("Init"):
        argv.append("--init")
    from_create = cli == "podman" and bool(_create_command(config))  # its devices whole, from CreateCommand
    argv += _list_flags({**host, "Devices": []} if from_create else host)
    if cli == "docker":
        argv += _gpu_flags(host)
        if host.get("Runtime") and host["Runtime"] != "runc":
            argv += ["--runtime", str(host["Runtime"])]
    argv += _resource_flags(host)
    argv += _log_flags(host)
    argv += _create_command_only(config)
    # Every environment value, inherited, tuned or secret, is in this file; none is on the command line.
    argv += ["--env-file", env_file]
    argv, rest = _with_entrypoint(argv, cli, entrypoint_of(config), image_entrypoint, launch)
    # The image the original runs, by its ID: its tag may name a newer image since (a `docker pull`).
    image = str(inspect.get("Image") or config.get("Image"))
    return [*argv, image, *rest]
