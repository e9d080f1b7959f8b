"""The real parts, as fixtures: every test in tests/real/ needs at least one of them (or asks for one itself
with `need_real_part`, marked `real_part` or `real_server`), and no test in tests/fast/ can have them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import DATA
from tests.support.real_parts import need_real_part
from tests.support.sshd import SshHost, running_sshd
from tuner import assets

if TYPE_CHECKING:
    from tests.support.browser import Browser
    from tests.support.containers import PodmanHost
    from tests.support.systemd_host import SystemdHost


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The real llama-server and its model (`tuner setup`)."""
    binary, model = assets.find_llama_server(), assets.find_model()
    if binary is None or model is None:
        why = os.environ.get("SERVE_TUNER_SETUP_ERROR") or "run `tuner setup` (scripts/test.sh does it)"
        need_real_part("llama-server", why)
    return binary


@pytest.fixture(scope="session")
def ollama_binary() -> Path:
    """The real Ollama and the demo model made an Ollama model (`tuner setup --ollama`)."""
    binary, model = assets.find_ollama(), assets.find_ollama_model()
    if binary is None or model is None:
        why = os.environ.get("SERVE_TUNER_SETUP_ERROR") or "run `tuner setup --ollama` (scripts/test.sh does it)"
        need_real_part("ollama", why)
    return binary


_PODMAN_HOSTS: list[PodmanHost] = []  # the one podman_host of this test process, once it is up


@pytest.fixture(scope="session")
def podman_host(llama_server_binary: Path) -> Iterator[PodmanHost]:
    """Debian's podman on runc, as root, with the llama-server image made offline from `tuner setup`'s
    binary (tests/support/containers.py). Every podman and every tuner that calls podman takes its `env`
    (CONTAINERS_CONF). Missing where podman or runc is not installed, the run is not root, or a trivial
    container does not start (then it says podman's last words); no container outlives its test."""
    from tests.support.containers import PodmanUnavailable
    from tests.support.containers import podman_host as start_podman_host

    starting = start_podman_host()
    try:
        host = starting.__enter__()
    except PodmanUnavailable as exc:
        need_real_part("podman", str(exc))
    _PODMAN_HOSTS.append(host)
    try:
        yield host
    finally:
        _PODMAN_HOSTS.remove(host)
        starting.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def _no_container_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that uses the podman host, every container named under its prefix is removed."""
    yield
    if "podman_host" in request.fixturenames:
        for host in _PODMAN_HOSTS:
            host.remove_all()


@dataclass(frozen=True, kw_only=True)
class TinyRun:
    """`tuner run tests/data/tiny-study.toml` against the real llama-server, once per test process."""

    runs_dir: Path
    result: subprocess.CompletedProcess[str]
    servers_before: list[int]
    servers_after: list[int]

    @property
    def run_path(self) -> Path:
        return self.runs_dir / "tiny"


@pytest.fixture(scope="session")
def tiny_run(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """A real run shared by the tests that read one (its leaderboard, its report in a browser): the study
    takes a few minutes on 2 cores, so it runs once."""
    from tests.support import run_tuner

    runs_dir = tmp_path_factory.mktemp("tiny-runs")
    before = llama_server_processes(llama_server_binary, under=runs_dir)
    result = run_tuner("run", str(DATA / "tiny-study.toml"), "--runs-dir", str(runs_dir))
    return TinyRun(
        runs_dir=runs_dir,
        result=result,
        servers_before=before,
        servers_after=llama_server_processes(llama_server_binary, under=runs_dir),
    )


def llama_server_processes(binary: Path, *, under: Path) -> list[int]:
    """PIDs of running processes of this binary whose output goes under `under` (a test's own run
    directory), to check that nothing was left running: tests in other workers run servers of their own."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")) == binary.resolve() and _writes_under(entry, under):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _writes_under(process: Path, base: Path) -> bool:
    for fd in ("1", "2"):
        try:
            if Path(os.readlink(process / "fd" / fd)).is_relative_to(base):
                return True
        except OSError:
            continue
    return False


@pytest.fixture(scope="session")
def sshd_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as host:
        yield host


@pytest.fixture(scope="session")
def systemd_host(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdHost]:
    """A real systemd as PID 1 of a PID namespace on an overlay root, laid out as a production host (its
    own paths for the server and model, two operator units: tests/support/systemd_host.py), reached by its sshd.
    Missing only where this machine refuses the namespaces, mounts or cgroups it needs (then it says
    which); a boot that times out or a failing systemctl is a failure."""
    from tests.support.systemd_host import HostRefused, boot_systemd_host, systemd_host_unavailable

    why = systemd_host_unavailable()
    if why is not None:
        need_real_part("systemd host", why)
    if not Path("/usr/sbin/sshd").exists():
        need_real_part("sshd", "the systemd host is reached through an sshd unit, and /usr/sbin/sshd is not installed")
    model = assets.find_model()
    assert model is not None
    # The operator's server and model are copied to the host's own paths; the controller's cache, where
    # `tuner setup` put them here, is hidden inside the host.
    booting = boot_systemd_host(
        tmp_path_factory.mktemp("systemd-host"),
        binary=llama_server_binary,
        model=model,
        adapter=assets.find_test_lora(),
        hide=[assets.cache_root()],
    )
    try:
        host = booting.__enter__()
    except HostRefused as exc:
        need_real_part("systemd host", f"this machine refused it: {exc}")
    try:
        yield host
    finally:
        booting.__exit__(None, None, None)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, driven over the DevTools protocol (tests/support/browser.py). One per test
    process; each `open_page` is a fresh tab. A chromium that is there but does not start is a failure."""
    from tests.support.browser import chromium_path, start_browser

    if chromium_path() is None:
        need_real_part(
            "chromium", "`chromium` is not on PATH (scripts/test.sh installs it where apt-get and root allow)"
        )
    with start_browser() as running:
        yield running


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL, started for the test session in a temporary directory (tests/support/postgres.py). Not
    under pytest's own temporary directory: each pytest session makes that 0700 again, and the cluster's
    files belong to the postgres user when the suite runs as root."""
    import shutil
    import tempfile

    from tests.support.postgres import find_postgres_bin, running_postgres

    if find_postgres_bin() is None:
        need_real_part("postgresql", "initdb is not installed (Debian's postgresql)")
    base = Path(tempfile.mkdtemp(prefix="serve-tuner-postgres-"))
    try:
        with running_postgres(base / "cluster") as url:
            yield url
    finally:
        shutil.rmtree(base, ignore_errors=True)
