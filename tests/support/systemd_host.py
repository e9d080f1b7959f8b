"""A real systemd, PID 1 of its own PID namespace, on an overlay of this machine's root: the host the
systemd deployer's tests tune, laid out as an operator lays out a production host. An sshd unit inside
it is the way in. The operator's llama-server and model sit at the host's own paths (/opt/llama,
/srv/models), copied into the host's overlay, and the controller's cache of them is hidden inside the
host (an empty tmpfs over it), so nothing the tuner built here can be run there by mistake. Two operator
units serve: one whose model, address and port are flags in its ExecStart= (listening on every
interface), one whose are its own Environment= lines (on 127.0.0.2); beside them an unrelated operator
drop-in and an EnvironmentFile= the operator owns. Never booted on the machine's own root: its tmpfiles
cleanup would empty /tmp for everyone, so everything it writes lands in the overlay and fresh tmpfs mounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import free_port
from tests.support.real_parts import need_real_part

__all__ = [
    "ENV_UNIT",
    "HostBaseline",
    "assert_baseline",
    "controller_env",
    "host_baseline",
    "running_argv",
    "operator_drop_in",
    "stand_in_unit",
    "study_file",
    "sudo_login",
    "HOST_ADAPTER",
    "HOST_BINARY",
    "HOST_MODEL",
    "UNIT",
    "HostRefused",
    "SystemdHost",
    "boot_systemd_host",
    "systemd_host_unavailable",
]

_BOOT_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "boot-systemd-host.sh"
_PR_SET_PDEATHSIG = 1
UNIT = "llama-server.service"  # model, address and port as flags in ExecStart=
ENV_UNIT = "llama-server-env.service"  # model, address and port as its own Environment= lines
HOST_BINARY = "/opt/llama/bin/llama-server"
HOST_MODEL = "/srv/models/smollm2-135m.gguf"
HOST_ADAPTER = "/srv/models/smollm2-style-lora.gguf"
ENV_UNIT_HOST = "127.0.0.2"  # a loopback address nothing else listens on: a re-pointed server would be missed
OPERATOR_OVERRIDE = (
    '[Service]\n# the operator\'s own setting, which the tuner must leave alone\nEnvironment="LLAMA_ARG_THREADS=1"\n'
)
# An operator drop-in that has nothing to do with the tuner, and the operator's own environment file.
OPERATOR_LIMITS = "[Service]\nLimitNOFILE=65536\n"
OPERATOR_ENV_FILE = "/etc/llama/operator.env"
OPERATOR_ENV = "LLAMA_ARG_ALIAS=team-assistant\n"


class HostRefused(RuntimeError):
    """This machine refused a namespace, mount or cgroup the host needs (not a failure of systemd)."""


_REFUSED_EXIT = 3  # boot-systemd-host.sh's status when the machine refused it something


def _cgroup_roots() -> list[Path]:
    """The hierarchies a test host's cgroup lives in: each v1 hierarchy, or the unified one (v2)."""
    top = Path("/sys/fs/cgroup")
    if (top / "cgroup.controllers").exists():
        return [top]
    return [hierarchy for hierarchy in top.iterdir() if (hierarchy / "cgroup.procs").exists()]


def systemd_host_unavailable() -> str | None:
    """Why a systemd host cannot be booted here, or None."""
    if os.geteuid() != 0:
        return "booting systemd in a PID namespace needs root"
    for tool in ("unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed"
    if not Path("/sys/fs/cgroup/systemd").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no cgroup hierarchy for systemd"
    return None


@dataclass
class SystemdHost:
    pid: int  # PID 1 of the namespace, as this machine numbers it
    ssh_port: int
    server_port: int
    known_hosts: Path
    client_key: Path
    env_port: int  # ENV_UNIT's, on ENV_UNIT_HOST
    binary: str = HOST_BINARY  # paths on the host, which this machine does not have
    model: str = HOST_MODEL
    adapter: str = HOST_ADAPTER
    unit: str = UNIT
    env_unit: str = ENV_UNIT
    env_host: str = ENV_UNIT_HOST

    def ssh_options(self, **extra: object) -> dict[str, object]:
        return {
            "host": "127.0.0.1",
            "port": self.ssh_port,
            "user": "root",
            "known_hosts": str(self.known_hosts),
            "client_keys": [str(self.client_key)],
            **extra,
        }

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command inside the host, beside systemd, not through the tuner's transport."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-r", "-w", *argv],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def write(self, path: str, data: str) -> None:
        subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-r", "-w", "sh", "-c", 'cat > "$0"', path],
            input=data, text=True, check=True, timeout=60,
        )  # fmt: skip

    def copy_in(self, source: Path, path: str, *, mode: str = "0644") -> None:
        """A file of this machine's (a build, a model blob) to `path` on the host, byte for byte."""
        subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-r", "-w", "sh", "-c",
             'mkdir -p "$(dirname "$0")" && cat > "$0" && chmod "$1" "$0"', path, mode],
            input=source.read_bytes(), check=True, timeout=120,
        )  # fmt: skip

    def show(self, *properties: str, unit: str | None = None) -> dict[str, str]:
        args = [arg for name in properties for arg in ("-p", name)]
        out = self.run("systemctl", "show", unit or self.unit, *args).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def read(self, path: str) -> bytes | None:
        done = self.run("cat", "--", path, check=False)
        return done.stdout.encode() if done.returncode == 0 else None

    def unit_files(self, unit: str | None = None) -> dict[str, str]:
        """Every file that configures the unit (its fragment, the drop-ins of all directories and the
        operator's environment file), hashed."""
        unit = unit or self.unit
        listing = self.run(
            "sh",
            "-c",
            f"ls -1 /etc/systemd/system/{unit} /etc/systemd/system/{unit}.d/* "
            f"/run/systemd/system/{unit}.d/* {OPERATOR_ENV_FILE} 2>/dev/null || true",
        ).stdout.split()
        return {path: hashlib.sha256(self.read(path) or b"").hexdigest() for path in listing}

    def main_pid(self, unit: str | None = None) -> int:
        return int(self.show("MainPID", unit=unit)["MainPID"])

    def process_environment(self, unit: str | None = None) -> dict[str, str]:
        raw = self.read(f"/proc/{self.main_pid(unit)}/environ") or b""
        return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)

    def wait_active(self, timeout: float = 120, unit: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while self.show("ActiveState", unit=unit)["ActiveState"] != "active":
            if time.monotonic() > deadline:
                raise AssertionError(f"{unit or self.unit} is not active: {self.show('ActiveState', 'Result')}")
            time.sleep(0.2)

    def address(self, unit: str | None = None) -> str:
        """Where the operator's unit serves, as this machine reaches it (the host shares its network)."""
        if unit in (None, self.unit):
            return f"http://127.0.0.1:{self.server_port}"
        assert unit == self.env_unit
        return f"http://{self.env_host}:{self.env_port}"

    def healthy(self, unit: str | None = None) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.address(unit)}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


def _payload(
    directory: Path, *, ssh_port: int, server_port: int, env_port: int, binary: Path, model: Path, adapter: Path | None
) -> tuple[Path, Path]:
    """Units, sshd config, keys, the operator's server and model to copy over the new root; returns
    (known_hosts, client key)."""
    import asyncssh

    etc = directory / "etc"
    conf = etc / "serve-tuner-test"
    units = etc / "systemd" / "system"
    (units / f"{UNIT}.d").mkdir(parents=True)
    conf.mkdir(parents=True)
    for source, target in ((binary, HOST_BINARY), (model, HOST_MODEL), (adapter, HOST_ADAPTER)):
        if source is not None:
            (directory / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, directory / target.lstrip("/"))
    (directory / OPERATOR_ENV_FILE.lstrip("/")).parent.mkdir(parents=True)
    (directory / OPERATOR_ENV_FILE.lstrip("/")).write_text(OPERATOR_ENV)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key.write_private_key(str(conf / "host_key"))
    client = asyncssh.generate_private_key("ssh-ed25519")
    client_key = directory.parent / "client_key"
    client.write_private_key(str(client_key))
    client_key.chmod(0o600)
    (conf / "host_key").chmod(0o600)
    (conf / "authorized_keys").write_bytes(client.export_public_key())
    # Root's shell setup is the host's, not this machine's: bash reads ~/.bashrc for every command sshd runs,
    # and a pyenv there rehashes under a lock file that a login killed mid-command leaves behind; every later
    # command then waited 60 s for it (each systemd-host test took 95 s once it happened).
    (directory / "root").mkdir(mode=0o700)
    (directory / "root" / ".bashrc").write_text("# the test host's root: no shell setup\n")
    (conf / "sshd_config").write_text(
        f"Port {ssh_port}\nListenAddress 127.0.0.1\nHostKey /etc/serve-tuner-test/host_key\n"
        "AuthorizedKeysFile /etc/serve-tuner-test/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
    )
    (units / "serve-tuner-test-sshd.service").write_text(
        "[Service]\nRuntimeDirectory=sshd\nExecStart=/usr/sbin/sshd -D -e -f /etc/serve-tuner-test/sshd_config\n"
    )
    (units / UNIT).write_text(
        "[Unit]\nDescription=llama.cpp server (the operator's unit: model, address and port as flags)\n[Service]\n"
        f"EnvironmentFile={OPERATOR_ENV_FILE}\n"
        f"ExecStart={HOST_BINARY} -m {HOST_MODEL} --host 0.0.0.0 --port {server_port}\n"
        "Restart=on-failure\nRestartSec=1\n[Install]\nWantedBy=multi-user.target\n"
    )
    (units / f"{UNIT}.d" / "override.conf").write_text(OPERATOR_OVERRIDE)
    (units / f"{UNIT}.d" / "10-limits.conf").write_text(OPERATOR_LIMITS)
    (units / ENV_UNIT).write_text(
        "[Unit]\nDescription=llama.cpp server (the operator's unit: model, address and port as Environment=)\n"
        f'[Service]\nEnvironment="LLAMA_ARG_MODEL={HOST_MODEL}" "LLAMA_ARG_HOST={ENV_UNIT_HOST}"\n'
        f'Environment="LLAMA_ARG_PORT={env_port}" "LLAMA_ARG_THREADS=1"\n'
        f"EnvironmentFile={OPERATOR_ENV_FILE}\nExecStart={HOST_BINARY}\n"
        "Restart=on-failure\nRestartSec=1\n[Install]\nWantedBy=multi-user.target\n"
    )
    (units / "serve-tuner-test.target").write_text(
        f"[Unit]\nRequires=basic.target\nAfter=basic.target\nWants=serve-tuner-test-sshd.service {UNIT} {ENV_UNIT}\n"
    )
    known_hosts = directory.parent / "known_hosts"
    public = host_key.export_public_key("openssh").decode().strip()
    known_hosts.write_text(f"[127.0.0.1]:{ssh_port} {public}\n")
    return known_hosts, client_key


def _namespace_init(unshare_pid: int, timeout: float = 10) -> int:
    """The PID (as this machine numbers it) of the namespace's PID 1: unshare's only child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise RuntimeError("the namespace's init did not appear")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _remove_stale_cgroups() -> None:
    """Cgroups of earlier test hosts whose run was killed before its teardown: empty ones whose test process
    is gone (another pytest worker's host may be booting, its cgroup still empty)."""
    for root in _cgroup_roots():
        for top in root.glob("serve-tuner-test-*"):
            owner = top.name.removeprefix("serve-tuner-test-").partition("-")[0]
            if owner.isdigit() and Path(f"/proc/{owner}").exists():
                continue
            if not any(procs.read_text().strip() for procs in top.rglob("cgroup.procs")):
                _remove_cgroup(top.name)


def _remove_cgroup(name: str) -> None:
    """Deepest first: a cgroup directory can be removed once its children are."""
    for hierarchy in _cgroup_roots():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


@contextlib.contextmanager
def boot_systemd_host(
    workdir: Path, *, binary: Path, model: Path, adapter: Path | None, hide: Sequence[Path]
) -> Iterator[SystemdHost]:
    """Boots the host with the operator's server and model copied to the host's paths; `hide` are this
    machine's directories (the controller's build cache) that the host must not see."""
    ssh_port, server_port, env_port = free_port(), free_port(), free_port()
    payload = workdir / "payload"
    known_hosts, client_key = _payload(
        payload, ssh_port=ssh_port, server_port=server_port, env_port=env_port, binary=binary, model=model,
        adapter=adapter,
    )  # fmt: skip
    base = workdir / "root"
    base.mkdir()
    cgroup = f"serve-tuner-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # the owner: see _remove_stale_cgroups
    log = (workdir / "boot.log").open("w")
    _remove_stale_cgroups()
    # If the test run dies without its teardown (SIGTERM, SIGKILL), the host must die with it: unshare
    # gets SIGKILL when this process ends, and --kill-child passes that on to the namespace's PID 1.
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--uts", "--ipc", str(_BOOT_SCRIPT),
         str(base), str(payload), cgroup],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SERVE_TUNER_TEST_HIDE": " ".join(str(path) for path in hide)},
        start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 -- one prctl call, safe between fork and exec
    )  # fmt: skip
    init_pid = 0
    try:
        init_pid = _namespace_init(unshare.pid)
        host = SystemdHost(
            pid=init_pid, ssh_port=ssh_port, server_port=server_port, known_hosts=known_hosts,
            client_key=client_key, env_port=env_port,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            state = host.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded") and all(
                host.show("ActiveState", unit=unit)["ActiveState"] == "active" for unit in (UNIT, ENV_UNIT)
            ):
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", ssh_port)) == 0:
                        break
            exited = unshare.poll()
            boot_log = (workdir / "boot.log").read_text()
            if exited == _REFUSED_EXIT or (exited is not None and "unshare failed" in boot_log):
                raise HostRefused(boot_log.strip().splitlines()[-1] if boot_log.strip() else f"exit {exited}")
            if exited is not None or time.monotonic() > deadline:
                why = f"exited {exited}" if exited is not None else "not up within 90 s"
                failed = (
                    "" if exited is not None else host.run("systemctl", "--failed", "--no-legend", check=False).stdout
                )
                raise RuntimeError(
                    f"the systemd host did not come up ({why}, state {state!r}; failed units: "
                    f"{' '.join(failed.split()) or 'none'}): {boot_log[-500:]}"
                )
            time.sleep(0.2)
        yield host
    finally:
        if init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init_pid, 9)  # PID 1 of the namespace: the kernel ends every process in it
        unshare.wait(timeout=30)
        log.close()
        for _ in range(50):
            _remove_cgroup(cgroup)
            if not any((hierarchy / cgroup).exists() for hierarchy in _cgroup_roots()):
                break
            time.sleep(0.1)


# ---- what the tests assert about the host, and how they drive the tuner against it -------------------


# What systemd gives every process of its own (new at each start), left out of the comparison.
_PER_START_VARIABLES = {"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"}


@dataclass(frozen=True)
class HostBaseline:
    """The unit as the operator left it: its files (hashed), and what its running process was given."""

    unit: str
    files: dict[str, str]
    environment: dict[str, str]
    argv: list[str]


def running_argv(host: SystemdHost, unit: str | None = None) -> list[str]:
    return (host.read(f"/proc/{host.main_pid(unit)}/cmdline") or b"").decode().split("\0")[:-1]


def host_baseline(host: SystemdHost, unit: str | None = None) -> HostBaseline:
    unit = unit or host.unit
    host.wait_active(unit=unit)
    environment = host.process_environment(unit)
    for name in _PER_START_VARIABLES:
        environment.pop(name, None)
    return HostBaseline(unit=unit, files=host.unit_files(unit), environment=environment, argv=running_argv(host, unit))


def assert_baseline(host: SystemdHost, before: HostBaseline) -> None:
    """Nothing of ours left, the unit's files byte-identical, the running process given exactly what it
    was given before (environment and argv), no pending daemon-reload, and the server answering where
    the operator put it."""
    unit = before.unit
    assert host.read(f"/run/systemd/system/{unit}.d/zz-tuner.conf") is None, "serve-tuner's drop-in was left"
    left = [
        name
        for name in (f"{unit}.json", f"{unit}.lock", f"{unit}.restore.sh", f"{unit}.secret.env")
        if host.run("test", "-e", f"/run/serve-tuner/{name}", check=False).returncode == 0
    ]
    assert not left, f"serve-tuner left {left} in /run/serve-tuner"
    timer = host.show("LoadState", "ActiveState", unit=f"serve-tuner-restore-{unit.removesuffix('.service')}.timer")
    assert timer["ActiveState"] != "active", "the dead-man timer is still armed after a clean restore"
    assert host.unit_files(unit) == before.files, "a file of the unit changed"
    now = host_baseline(host, unit)
    assert now.environment == before.environment, "the unit's process runs with another environment"
    assert now.argv == before.argv, "the unit's process runs another command line"
    assert host.show("NeedDaemonReload", unit=unit)["NeedDaemonReload"] == "no"
    deadline = time.monotonic() + 120
    while not host.healthy(unit):
        assert time.monotonic() < deadline, "the baseline server is not healthy"
        time.sleep(0.5)
    answer = httpx.post(f"{host.address(unit)}/completion", json={"prompt": "Hello", "n_predict": 4}, timeout=60)
    assert answer.status_code == 200 and answer.json()["tokens_predicted"] > 0


def study_file(
    systemd_host: SystemdHost, tmp_path: Path, *, unit: str | None = None, deploy: str = "", **ssh: object
) -> Path:
    """The tiny study, run on the systemd host over ssh as an operator writes it: trials are drop-ins on
    the operator's unit, whose program, model, address and port the study does not name."""
    data = Path(__file__).resolve().parents[1] / "data"
    text = (data / "tiny-study.toml").read_text().replace('name = "tiny"', 'name = "unit"')
    text = text.replace('"stall-small.jsonl"', json.dumps(str(data / "stall-small.jsonl")))
    text = text.replace('"batch-space.toml"', json.dumps(str(data / "batch-space.toml")))
    host = "\n".join(
        f"{key} = {json.dumps(value)}" for key, value in {"kind": "ssh", **systemd_host.ssh_options(**ssh)}.items()
    )
    deploy = f'kind = "systemd"\nunit = "{unit or systemd_host.unit}"\n{deploy}'
    (tmp_path / "unit.toml").write_text(f"{text}\n[host]\n{host}\n[deploy]\n{deploy}\n")
    return tmp_path / "unit.toml"


def controller_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The controller as on an operator's laptop: no llama-server build and no model (its cache empty)."""
    empty = tmp_path / "controller-cache"
    empty.mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in ("SERVE_TUNER_LLAMA_SERVER", "SERVE_TUNER_MODEL")}
    return {**inherited, "SERVE_TUNER_CACHE": str(empty), **extra}


@contextlib.contextmanager
def operator_drop_in(host: SystemdHost, name: str, text: str, files: dict[str, str] | None = None) -> Iterator[None]:
    """An operator's own drop-in (and the files it names), in place for the test, removed afterwards."""
    path = f"/etc/systemd/system/{host.unit}.d/{name}"
    for file, content in (files or {}).items():
        host.write(file, content)
    host.write(path, text)
    host.run("sh", "-c", f"systemctl daemon-reload && systemctl restart {host.unit}")
    try:
        yield
    finally:
        host.run("rm", "-f", path, *(files or {}))
        host.run("sh", "-c", f"systemctl daemon-reload && systemctl restart {host.unit}")
        host.wait_active()


def sudo_login(host: SystemdHost, user: str, commands: Sequence[str]) -> str:
    """A plain login on the host (keys only) whose sudoers entry allows exactly `commands`, without a
    password, as docs/production-host.md tells an operator to write it."""
    if host.run("test", "-x", "/usr/bin/sudo", check=False).returncode != 0:
        need_real_part("sudo", "/usr/bin/sudo is not installed (scripts/test.sh installs it where apt-get allows)")
    if host.run("id", user, check=False).returncode != 0:
        host.run("useradd", "--create-home", "--shell", "/bin/sh", user)
        host.run("usermod", "-p", "*", user)  # no password, but not locked: keys only
    allowed = ", ".join(f"{prefix}/bin/{name}" for name in commands for prefix in ("", "/usr"))
    host.write(f"/etc/sudoers.d/serve-tuner-{user}", f"{user} ALL=(root) NOPASSWD: {allowed}\n")
    host.run("chmod", "0440", f"/etc/sudoers.d/serve-tuner-{user}")
    return user


_STAND_IN = Path(__file__).resolve().parents[1] / "data" / "fake_engine_server.py"


@contextlib.contextmanager
def stand_in_unit(host: SystemdHost, unit: str, service: str) -> Iterator[dict[str, str]]:
    """`unit` running the transcript stand-in (Ollama and vLLM cannot run here), as an operator would
    have installed the real server; yields its files' hashes and removes it afterwards."""
    host.run("mkdir", "-p", "/etc/serve-tuner-test/transcripts")
    host.write("/etc/serve-tuner-test/fake_engine_server.py", _STAND_IN.read_text())
    for transcript in (_STAND_IN.parent / "transcripts").iterdir():
        host.write(f"/etc/serve-tuner-test/transcripts/{transcript.name}", transcript.read_text())
    host.write(f"/etc/systemd/system/{unit}", f"[Unit]\nDescription=stand-in\n[Service]\n{service}")
    host.run("sh", "-c", f"systemctl daemon-reload && systemctl start {unit}")
    files = {f"/etc/systemd/system/{unit}": hashlib.sha256(host.read(f"/etc/systemd/system/{unit}") or b"").hexdigest()}
    try:
        yield files
    finally:
        host.run("sh", "-c", f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload")
