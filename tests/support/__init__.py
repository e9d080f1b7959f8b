"""What every test file shares: a free loopback port and a busy one, `tuner` run as a user runs it (a subprocess), and
`tuner` run in this process (its `main`, with pytest's captured output). The other support modules here
stand up the real parts and the stand-ins (systemd_host, stand_in, postgres, browser, ...)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pytest

__all__ = [
    "CLI_DEADLINE_S",
    "DATA",
    "ROOT",
    "Outcome",
    "busy_port",
    "free_port",
    "one_error_line",
    "run_cli",
    "run_tuner",
]

ROOT = Path(__file__).resolve().parents[2]  # the repository
DATA = ROOT / "tests" / "data"

# A backstop against a hang, not a benchmark: the study's own start and request timeouts bound each trial.
# Under a load of 5 on 2 cores (scripts/pass_rates_under_load.py sharing the machine with other jobs) the
# tiny study took over 600 s; 1,800 s leaves room for that and still ends a hung run.
CLI_DEADLINE_S = 1800


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def busy_port() -> Iterator[int]:
    """A loopback port something listens on (and never answers) while the block runs."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield int(busy.getsockname()[1])


def run_tuner(
    *args: str,
    timeout: float = CLI_DEADLINE_S,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
    umask: int = -1,
    memory_limit_bytes: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """`tuner ARGS` in a subprocess, its output captured; past the deadline it is stopped as a user would
    stop it, with SIGTERM, so that it restores the host and stops its server (subprocess.run's SIGKILL left
    a llama-server running). `memory_limit_bytes` bounds its address space, for a test whose broken guard
    would read without end (/dev/zero: 9 GB in 10 s)."""
    command = [sys.executable, "-m", "tuner", *args]
    if memory_limit_bytes is not None:  # set by the child itself: a preexec_fn is unsafe beside threads
        limited = f"resource.setrlimit(resource.RLIMIT_AS, ({memory_limit_bytes}, {memory_limit_bytes}))"
        start = f"import resource, runpy; {limited}; runpy.run_module('tuner', run_name='__main__', alter_sys=True)"
        command = [sys.executable, "-c", start, *args]
    with subprocess.Popen(
        command,
        stdin=None if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        cwd=cwd,
        umask=umask,
    ) as process:
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                stdout, stderr = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused `tuner` command printed: asserts there is exactly one, and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


class Outcome(NamedTuple):
    """What `tuner ARGS` run in this process ended with."""

    code: int
    out: str
    err: str

    def error_line(self) -> str:
        """The one line of an error: asserts there is exactly one, and no traceback."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert "Traceback" not in self.err and "Traceback" not in self.out, self.err
        assert len(lines) == 1, self.err
        assert lines[0].startswith("error: "), lines[0]
        return lines[0]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Outcome:
    """`tuner ARGV` through its `main` in this process; only what it printed is in the outcome."""
    from tuner.cli import main

    capsys.readouterr()  # what ran before it
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own exits (--help, a bad flag)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)
