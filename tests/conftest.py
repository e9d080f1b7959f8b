from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tuner import assets

if TYPE_CHECKING:
    from tests.systemd_host import SystemdHost


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The real llama-server; a test needing it skips only when it could not be built here."""
    binary, model = assets.find_llama_server(), assets.find_model()
    if binary is None or model is None:
        why = os.environ.get("SERVE_TUNER_SETUP_ERROR") or "run `tuner setup` (scripts/test.sh does it)"
        pytest.skip(f"the real llama-server or model is missing: {why}")
    return binary


def llama_server_processes(binary: Path) -> list[int]:
    """PIDs of running processes of this binary, to check that nothing was left running."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")) == binary.resolve():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@dataclass(frozen=True)
class SshHost:
    """A real sshd on loopback with a throwaway host key, pinned in a test known_hosts file."""

    port: int
    known_hosts: Path
    client_key: Path
    host_key: Path
    workdir: Path

    def options(self, **extra: object) -> dict[str, object]:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "known_hosts": str(self.known_hosts),
            "client_keys": [str(self.client_key)],
            **extra,
        }


@pytest.fixture(scope="session")
def sshd_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    import asyncssh

    sshd = Path("/usr/sbin/sshd")
    if not sshd.exists():
        pytest.skip("openssh-server is not installed (scripts/test.sh installs it where apt-get and root allow)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root and needs to run as root")
    workdir = tmp_path_factory.mktemp("sshd")
    host_key, client_key = workdir / "host_key", workdir / "client_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(host_key))
    client = asyncssh.generate_private_key("ssh-ed25519")
    client.write_private_key(str(client_key))
    (workdir / "authorized_keys").write_bytes(client.export_public_key())
    for key in (host_key, client_key, workdir / "authorized_keys"):
        key.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {workdir}/authorized_keys\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"StrictModes no\nUsePAM no\nPidFile {workdir}/sshd.pid\nLogLevel VERBOSE\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    public = asyncssh.read_private_key(str(host_key)).export_public_key("openssh").decode().strip()
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {public}\n")
    log = (workdir / "sshd.log").open("w")
    process = subprocess.Popen([str(sshd), "-D", "-e", "-f", str(config)], stderr=log)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None or time.monotonic() > deadline:
            log.close()
            pytest.fail(f"the test sshd did not start: {(workdir / 'sshd.log').read_text()[-500:]}")
        time.sleep(0.05)
    try:
        yield SshHost(port=port, known_hosts=known_hosts, client_key=client_key, host_key=host_key, workdir=workdir)
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture(scope="session")
def systemd_host(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdHost]:
    """A real systemd as PID 1 of a PID namespace on an overlay root, with the operator's llama-server
    unit and an sshd to reach it by; skips only where such a host cannot be booted here, saying why."""
    from tests.systemd_host import boot_systemd_host, systemd_host_unavailable

    why = systemd_host_unavailable()
    if why is not None:
        pytest.skip(f"no systemd host for the systemd deployer's tests: {why}")
    model = assets.find_model()
    assert model is not None
    booting = boot_systemd_host(tmp_path_factory.mktemp("systemd-host"), binary=llama_server_binary, model=model)
    try:
        host = booting.__enter__()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        # Namespaces, mounts or cgroups refused by this machine (a container without CAP_SYS_ADMIN, say).
        pytest.skip(f"the systemd host did not boot here: {exc}")
    try:
        yield host
    finally:
        booting.__exit__(None, None, None)
