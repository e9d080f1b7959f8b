"""The `local` transport: this machine, no shell, atomic writes, process groups for clean stops."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.config import StrictModel
from tuner.errors import CommandFailed, TransportError
from tuner.files import write_atomic
from tuner.transports.base import TRANSPORTS, CommandResult

__all__ = ["LocalOptions", "LocalProcess", "LocalTransport"]


class LocalOptions(StrictModel):
    """The local host takes no options."""


class LocalProcess:
    """A child process in its own process group, so that stopping it stops everything it started."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def poll(self) -> int | None:
        if self._process.returncode is None and hasattr(os, "waitid"):
            # asyncio sets returncode only on a later turn of the loop, after its child watcher reaped
            # the process: a server that died during a round's last request still looked alive here,
            # and the round was scored. Ask the kernel, without reaping (WNOWAIT: the watcher still does).
            try:
                running = os.waitid(os.P_PID, self._process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:  # the watcher reaped it already and will report it at once
                running = False
            if not running:
                return await self._process.wait()
        return self._process.returncode

    async def stop(self, *, grace_s: float) -> int:
        if self._process.returncode is not None:
            return self._process.returncode
        self._signal_group(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self._process.wait(), timeout=grace_s)
        except TimeoutError:
            self._signal_group(signal.SIGKILL)
            return await self._process.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)


@TRANSPORTS.register("local")
class LocalTransport:
    options_model = LocalOptions

    def __init__(self, options: LocalOptions | None = None) -> None:
        self._children: list[LocalProcess] = []

    async def __aenter__(self) -> LocalTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Whatever a consumer forgot to stop must not outlive the controller.
        for child in self._children:
            await child.stop(grace_s=5.0)
        self._children.clear()

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        check: bool = True,
        privileged: bool = False,
        idempotent: bool = False,
    ) -> CommandResult:
        # The controller's own rights are the local host's: there is no second user to switch to.
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]}: {exc.strerror}") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise TransportError(f"{argv[0]} did not finish within {timeout_s:g} s") from None
        result = CommandResult(
            argv=tuple(argv),
            exit_status=process.returncode or 0,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
        )
        if check and result.exit_status != 0:
            raise CommandFailed(argv=argv, exit_status=result.exit_status, stderr_tail=result.stderr[-2000:])
        return result

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        try:
            write_atomic(Path(path), data, mode=mode)
        except OSError as exc:
            raise TransportError(f"cannot write {path}: {exc.strerror}") from None

    async def read_file(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise TransportError(f"cannot read {path}: {exc.strerror}") from None

    async def remove_file(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()

    async def reach(self, host: str, port: int) -> str:
        bare = host.strip("[]")
        return f"http://[{bare}]:{port}" if ":" in bare else f"http://{host}:{port}"

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: str) -> LocalProcess:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log_path, "ab") as log:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                )
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]}: {exc.strerror}") from None
        child = LocalProcess(process)
        self._children.append(child)
        return child
