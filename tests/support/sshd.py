"""A real sshd on loopback, as root, with a throwaway host key pinned in a test known_hosts file: the SSH
transport's tests log in to this machine through it. `extra_config` adds sshd_config lines (a test whose
commands need an environment variable, such as podman's CONTAINERS_CONF, gives `SetEnv NAME=VALUE`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port
from tests.support.real_parts import need_real_part

__all__ = ["SshHost", "running_sshd"]


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


@contextlib.contextmanager
def running_sshd(workdir: Path, *, extra_config: str = "") -> Iterator[SshHost]:
    import asyncssh

    sshd = Path("/usr/sbin/sshd")
    if not sshd.exists():
        need_real_part(
            "sshd", "/usr/sbin/sshd is not installed (scripts/test.sh installs it where apt-get and root allow)"
        )
    if os.geteuid() != 0:
        need_real_part("root", "the test sshd logs in as root and needs to run as root")
    host_key, client_key = workdir / "host_key", workdir / "client_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(host_key))
    client = asyncssh.generate_private_key("ssh-ed25519")
    client.write_private_key(str(client_key))
    (workdir / "authorized_keys").write_bytes(client.export_public_key())
    for key in (host_key, client_key, workdir / "authorized_keys"):
        key.chmod(0o600)
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {workdir}/authorized_keys\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"StrictModes no\nUsePAM no\nPidFile {workdir}/sshd.pid\nLogLevel VERBOSE\n{extra_config}"
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
