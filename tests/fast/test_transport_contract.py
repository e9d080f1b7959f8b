"""The contract every transport passes, here by `local`; tests/real/test_transport_contract_ssh.py runs the
same tests over `ssh`, against a real sshd on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.config import PluginSpec
from tuner.errors import CommandFailed, TransportError
from tuner.transports import LocalTransport, Transport, create_transport


@pytest.fixture(params=["local"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """The transport under test; tests/real/test_transport_contract_ssh.py gives `ssh` (with its sshd)."""
    return str(request.param)


@pytest.fixture
def make_transport(transport_kind: str, request: pytest.FixtureRequest) -> Callable[[], Transport]:
    if transport_kind == "local":
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
    """P5: the mode is the one asked, on a new file and on a replaced one (a write that ignored `mode`
    would leave the umask's 0644), and nothing but the target is left in its directory."""
    target = tmp_path / "d" / "zz-tuner.conf"

    async def scenario() -> None:
        async with make_transport() as transport:
            await transport.write_file(str(target), b"first\n", mode=0o600)
            assert stat.S_IMODE(target.stat().st_mode) == 0o600
            await transport.write_file(str(target), b"second\n", mode=0o640)
            assert stat.S_IMODE(target.stat().st_mode) == 0o640
            assert await transport.read_file(str(target)) == b"second\n"
            assert [p.name for p in target.parent.iterdir()] == ["zz-tuner.conf"]
            await transport.remove_file(str(target))
            await transport.remove_file(str(target))  # removing twice is not an error

    run(scenario())
    assert list(target.parent.iterdir()) == []


def test_a_reader_never_sees_a_partial_file_while_it_is_rewritten(
    make_transport: Callable[[], Transport], tmp_path: Path
) -> None:
    """P5: a reader that reads the file as fast as it can during a run of rewrites sees one of the
    whole contents every time, never a truncated or half-new one (which a write in place shows)."""
    target = tmp_path / "zz-tuner.conf"
    contents = [bytes([ord("a") + n]) * (1 << 20) for n in range(2)]  # 1 MiB each: a write takes a while
    target.write_bytes(contents[0])
    # Counted as they come, not kept: a fast reader makes thousands of 1 MiB reads (4.5 GB when kept).
    reads, torn = 0, []
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            data = target.read_bytes()
            reads += 1
            if data not in contents:
                torn.append(len(data))

    async def scenario() -> None:
        async with make_transport() as transport:
            for n in range(12):
                await transport.write_file(str(target), contents[(n + 1) % 2], mode=0o644)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        run(scenario())
    finally:
        stop.set()
        watcher.join()
    assert reads > 12
    assert torn == [], f"{len(torn)} of {reads} reads saw a partial file"


def test_a_write_cut_off_before_its_rename_leaves_the_old_content_and_no_temporary_file(
    transport_kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P5: a write that fails between writing the new content and renaming it over the old one leaves
    the old file as it was and no temporary file. Locally the rename itself fails; over ssh the
    controller's link dies while the new content is on its way (what a controller killed mid-write
    does to the host), and the host's side must neither rename a part nor leave it behind."""
    target = tmp_path / "zz-tuner.conf"
    target.write_bytes(b"old\n")
    target.chmod(0o644)
    if transport_kind == "local":

        def rename_fails(source: object, destination: object) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "replace", rename_fails)

        async def local() -> None:
            async with LocalTransport() as transport:
                with pytest.raises(TransportError, match="Input/output error"):
                    await transport.write_file(str(target), b"new\n" * 1000, mode=0o600)

        run(local())
        monkeypatch.undo()
    else:
        host = request.getfixturevalue("sshd_host")
        with StallingProxy(host.port, forward_bytes=1 << 20) as proxy:
            pinned = tmp_path.parent / f"known_hosts-{proxy.port}"  # the host's key, pinned for the proxy's port
            pinned.write_text(host.known_hosts.read_text().replace(f":{host.port} ", f":{proxy.port} "))
            options = host.options(port=proxy.port, known_hosts=str(pinned), reconnect_window_s=1, connect_timeout_s=1)
            transport = create_transport(PluginSpec.model_validate({"kind": "ssh", **options}))

            async def over_ssh() -> None:
                async with transport:
                    writing = asyncio.create_task(transport.write_file(str(target), b"n" * (16 << 20), mode=0o600))
                    # The host has started writing the new content, and the rest is held back.
                    await until(lambda: any(p.stat().st_size > 0 for p in temporaries(tmp_path)))
                    proxy.cut()
                    with pytest.raises(TransportError):
                        await writing

            run(over_ssh())
        # The host's side ends by itself once it sees the link gone: wait for that, not for a while.
        asyncio.run(until(lambda: not temporaries(tmp_path), within_s=30))
    assert target.read_bytes() == b"old\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert temporaries(tmp_path) == []


def temporaries(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


async def until(condition: Callable[[], bool], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition was not met in time"
        await asyncio.sleep(0.01)


class StallingProxy:
    """Forwards a TCP port, but only the first `forward_bytes` the client sends; the rest waits until
    `cut()` closes every connection (and the listener, so that no reconnect gets through)."""

    def __init__(self, target_port: int, *, forward_bytes: int) -> None:
        self._target = target_port
        self._budget = forward_bytes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._target))
                self._sockets += [client, upstream]
                threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if counted:
                    allowed, self._budget = data[: max(self._budget, 0)], self._budget - len(data)
                    sink.sendall(allowed)
                    if self._budget < 0:
                        self._cut.wait(timeout=60)  # hold the rest back until the link is cut
                        return
                else:
                    sink.sendall(data)

    def cut(self) -> None:
        self._cut.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()


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
