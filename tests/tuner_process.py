"""Runs `tuner` as a user runs it, for the tests that drive whole studies through the command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["CLI_DEADLINE_S", "run_tuner"]

# A backstop against a hang, not a benchmark: the study's own start and request timeouts bound each trial.
# Under a load of 5 on 2 cores (scripts/pass_rates_under_load.py sharing the machine with other jobs) the
# tiny study took over 600 s; 1,800 s leaves room for that and still ends a hung run.
CLI_DEADLINE_S = 1800


def run_tuner(
    args: Sequence[str], *, timeout: float = CLI_DEADLINE_S, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`tuner ARGS`; past the deadline it is stopped as a user would stop it, with SIGTERM, so that it
    restores the host and stops its server (subprocess.run's SIGKILL left a llama-server running)."""
    command = [sys.executable, "-m", "tuner", *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=None if env is None else dict(env)
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                stdout, stderr = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
