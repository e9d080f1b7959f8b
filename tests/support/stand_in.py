"""Starts `tests/data/fake_engine_server.py` with a launch's own argv and environment, as a deployer would
start the real server, and reads back what it parsed (TRANSCRIPT-BASED stand-in; see its docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.models import LaunchSpec

__all__ = ["STAND_IN", "RunningStandIn", "run_stand_in"]

STAND_IN = Path(__file__).resolve().parents[1] / "data" / "fake_engine_server.py"
_READY_DEADLINE_S = 30.0  # a generous bound for a busy 2-core machine, never a speed check


@dataclass(kw_only=True)
class RunningStandIn:
    process: subprocess.Popen[str]
    base_url: str
    launch: dict[str, Any]  # what it parsed from its argv and environment
    stderr: list[str] = field(default_factory=list)  # filled once it has stopped

    def received(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.base_url}/stand-in/requests", timeout=10) as answer:
            return list(json.loads(answer.read()))


def _argv(launch: LaunchSpec, engine: str) -> list[str]:
    # llama-server's launch runs its binary; the stand-in takes the same arguments after a mode word.
    mode = ["llama-server"] if engine == "llama-server" else []
    return [sys.executable, str(STAND_IN), *mode, *launch.args]


@contextlib.contextmanager
def run_stand_in(launch: LaunchSpec, *, engine: str) -> Iterator[RunningStandIn]:
    """The stand-in serving `launch` (its args and env only, nothing inherited but PATH); fails with its
    stderr if it exits before answering, as a server that refuses its settings does."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **launch.env, **launch.secret_values()}
    process = subprocess.Popen(
        _argv(launch, engine), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    running: RunningStandIn | None = None
    try:
        deadline = time.monotonic() + _READY_DEADLINE_S
        while running is None:
            if process.poll() is not None:
                raise AssertionError(f"the server exited {process.returncode}: {process.stderr.read()}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"{launch.base_url}/stand-in/launch", timeout=2) as answer:
                    running = RunningStandIn(
                        process=process, base_url=launch.base_url, launch=json.loads(answer.read())
                    )
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the server did not answer within {_READY_DEADLINE_S:g} s") from None
                time.sleep(0.02)  # polling for the socket, not waiting a fixed time
        yield running
    finally:
        process.terminate()
        try:
            _, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        if running is not None:
            running.stderr.extend(err.splitlines())
