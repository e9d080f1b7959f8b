"""The process deployer against a stand-in server (tests/data/health_server.py), no llama-server needed."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from tuner.deployers import ProcessDeployer
from tuner.deployers.process import ProcessOptions
from tuner.errors import ServerNotReady
from tuner.models import LaunchSpec
from tuner.transports import LocalTransport

STAND_IN = Path(__file__).resolve().parent / "data" / "health_server.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stand_in(port: int, loading_s: float = 0.5) -> LaunchSpec:
    return LaunchSpec(
        executable=sys.executable,
        args=(str(STAND_IN),),
        env={"PORT": str(port), "LOADING_S": str(loading_s)},
        port=port,
    )


def test_apply_waits_for_a_200_not_the_503_while_loading_and_restore_stops_the_server(tmp_path: Path) -> None:
    async def scenario() -> int:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            deployment = await deployer.apply(stand_in(free_port(), loading_s=1.0), log_path=str(tmp_path / "a.log"))
            assert deployment.started_in_s >= 0.9
            assert await deployer.check_alive() is None
            assert deployment.pid is not None
            return deployment.pid

    pid = asyncio.run(scenario())
    assert not Path(f"/proc/{pid}").exists()
    assert "503" in (tmp_path / "a.log").read_text()


def test_a_new_apply_replaces_the_running_server(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            first = await deployer.apply(stand_in(free_port(), 0.1), log_path=str(tmp_path / "1.log"))
            second = await deployer.apply(stand_in(free_port(), 0.1), log_path=str(tmp_path / "2.log"))
            assert first.pid is not None and second.pid is not None
            assert not Path(f"/proc/{first.pid}").exists()
            return first.pid, second.pid

    first, second = asyncio.run(scenario())
    assert first != second


def test_a_server_that_exits_while_starting_fails_fast_with_its_last_error_line(tmp_path: Path) -> None:
    launch = LaunchSpec(
        executable="sh", args=("-c", "echo 'error: unknown argument --bogus' >&2; exit 1"), port=free_port()
    )

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            await deployer.apply(launch, log_path=str(tmp_path / "bad.log"))

    with pytest.raises(ServerNotReady, match=r"exited with status 1.*unknown argument --bogus"):
        asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_a_server_that_never_gets_healthy_fails_at_the_start_timeout_and_is_stopped(tmp_path: Path) -> None:
    options = ProcessOptions(start_timeout_s=1.0)

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(options, transport=transport) as deployer:
            await deployer.apply(stand_in(free_port(), loading_s=600), log_path=str(tmp_path / "slow.log"))

    with pytest.raises(ServerNotReady, match=r"within 1 s \(last answer: HTTP 503\)"):
        asyncio.run(scenario())
    pid = int((tmp_path / "slow.log").read_text().split()[3])
    assert not Path(f"/proc/{pid}").exists()


def test_the_server_gets_only_the_launch_environment_and_the_inherited_basics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_ARG_BATCH", "7")
    monkeypatch.setenv("SECRET_TOKEN", "do-not-pass")
    launch = LaunchSpec(
        executable="sh", args=("-c", 'env > "$OUT"; exit 0'), env={"OUT": str(tmp_path / "env")}, port=free_port()
    )

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            with pytest.raises(ServerNotReady):
                await deployer.apply(launch, log_path=str(tmp_path / "log"))

    asyncio.run(scenario())
    env = (tmp_path / "env").read_text()
    assert "LLAMA_ARG_BATCH" not in env and "SECRET_TOKEN" not in env and "PATH=" in env
