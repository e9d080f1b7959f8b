"""P12 against the real llama-server: the API key (a canary here) is used, and never appears in anything
the tool prints or writes: run directories, Optuna's journal, reports, logs at debug level. The stand-in
cases (a server that quotes the key back, a key pasted where its variable's name belongs) are in
tests/fast/test_secrets.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.quick import QUICK_ROUNDS

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny-study.toml"
# Fixed, so that the parametrized test ids are the same in every process (pytest-xdist compares them).
CANARY = "sk-canary-3b2a1f0e9d8c47b6a5f4e3d2c1b0a998"


def everything_under(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file())


@pytest.mark.real_server
def test_the_api_key_is_used_but_never_printed_or_written(tmp_path: Path, llama_server_binary: Path) -> None:
    env = {**os.environ, "SERVE_TUNER_TEST_KEY": CANARY}
    base = [sys.executable, "-m", "tuner", "--log-level", "debug", "run", str(TINY)]
    base += ["--set", 'engine.api_key_env="SERVE_TUNER_TEST_KEY"', "--set", "budget.trials=0", "--set", "confirm.top=0"]
    base += QUICK_ROUNDS
    ok = subprocess.run(
        [*base, "--runs-dir", str(tmp_path / "ok")], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    # A forced failure: every request times out, so the baseline cannot be measured and the run errors.
    failing = subprocess.run(
        [*base, "--runs-dir", str(tmp_path / "failing"), "--set", "workload.request_timeout_s=0.001"],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert failing.returncode != 0 and failing.stderr.strip()

    printed = (ok.stdout + ok.stderr + failing.stdout + failing.stderr).encode()
    assert b"DEBUG" in printed  # the debug logging really ran
    assert CANARY.encode() not in printed
    assert CANARY.encode() not in everything_under(tmp_path)
    # ...and the key was in force: llama-server warns at start when it has none, and every request of
    # the baseline (which it would have refused without the key) was answered.
    server_log = (tmp_path / "ok" / "tiny" / "trials" / "0000" / "server.log").read_text()
    assert "listening on" in server_log and "no API key is set" not in server_log
