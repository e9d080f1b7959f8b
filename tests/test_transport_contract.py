"""The contract every transport passes: `local`, and `ssh` against a real sshd on loopback."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.config import PluginSpec
from tuner.errors import CommandFailed, TransportError
from tuner.transports import LocalTransport, Transport, create_transport

TRANSPORTS = ("local", "ssh")


@pytest.fixture(params=TRANSPORTS)
def make_transport(request: pytest.FixtureRequest) -> Callable[[], Transport]:
    if request.param == "local":
        return LocalTransport
    host = request.getfixturevalue("sshd_host")
    return lambda: create_transport(PluginSpec.model_validate({"kind": "ssh", **host.options()}))


def eventually_gone(pid: int, within_s: float = 5.0) -> bool:
    """True once the process has exited (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if "zombie" in Path(f"/proc/{pid}/status").read_text():
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_run_returns_output_and_refuses_a_non_zero_exit(make_transport: Callable[[], Transport]) -> None:
    async def scenario() -> None:
        async with make_transport() as transport:
            result = await transport.run(["sh", "-c", "echo out; echo err >&2"], timeout_s=10)
            assert (result.exit_status, result.stdout, result.stderr) == (0, "out\n", "err\n")
            with pytest.raises(CommandFailed) as failed:
                await transport.run(["sh", "-c", "echo boom >&2; exit 3"], timeout_s=10)
            assert failed.value.exit_status == 3 and "boom" in str(failed.value)
            unchecked = await transport.run(["false"], timeout_s=10, check=False)
            assert unchecked.exit_status == 1

    run(scenario())


def test_arguments_are_never_interpreted_by_a_shell(make_transport: Callable[[], Transport], tmp_path: Path) -> None:
    marker = tmp_path / "injected"

    async def scenario() -> None:
        async with make_transport() as transport:
            result = await transport.run(["echo", f"$(touch {marker}); `touch {marker}`"], timeout_s=10)
            assert "$(touch" in result.stdout

    run(scenario())
    assert not marker.exists()


def test_a_command_past_its_timeout_is_stopped(make_transport: Callable[[], Transport]) -> None:
    async def scenario() -> None:
        async with make_transport() as transport:
            with pytest.raises(TransportError, match="did not finish within"):
                await transport.run(["sleep", "30"], timeout_s=0.5)

    run(scenario())


def test_write_file_replaces_content_whole_and_leaves_no_temporary_file(
    make_transport: Callable[[], Transport], tmp_path: Path
) -> None:
    target = tmp_path / "d" / "zz-tuner.conf"

    async def scenario() -> None:
        async with make_transport() as transport:
            await transport.write_file(str(target), b"first\n", mode=0o600)
            await transport.write_file(str(target), b"second\n", mode=0o600)
            assert await transport.read_file(str(target)) == b"second\n"
            await transport.remove_file(str(target))
            await transport.remove_file(str(target))  # removing twice is not an error

    run(scenario())
    assert list(target.parent.iterdir()) == []


def test_a_spawned_process_and_its_children_are_stopped(
    make_transport: Callable[[], Transport], tmp_path: Path
) -> None:
    log = tmp_path / "server.log"

    async def scenario() -> int:
        async with make_transport() as transport:
            child = await transport.spawn(
                ["sh", "-c", "sleep 60 & echo child $!; wait"], env={"PATH": os.environ["PATH"]}, log_path=str(log)
            )
            for _ in range(200):
                if "child" in log.read_text():
                    break
                await asyncio.sleep(0.05)
            assert await child.poll() is None
            await child.stop(grace_s=2)
            return int(log.read_text().split()[1])

    grandchild = run(scenario())
    assert isinstance(grandchild, int)
    assert eventually_gone(grandchild)


def test_processes_left_running_are_stopped_when_the_transport_closes(
    make_transport: Callable[[], Transport], tmp_path: Path
) -> None:
    async def scenario() -> int:
        async with make_transport() as transport:
            child = await transport.spawn(
                [sys.executable, "-c", "import time; time.sleep(60)"], env={}, log_path=str(tmp_path / "log")
            )
            return child.pid

    pid = run(scenario())
    assert isinstance(pid, int)
    assert eventually_gone(pid)
