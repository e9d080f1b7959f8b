"""No library's warning reaches the operator. With cryptography 51, `import asyncssh` printed ten lines
of `CryptographyDeprecationWarning` before every command that reaches the ssh transport, and a one-line
error was no longer one line. Here asyncssh is made to warn as it is imported (tests/data/library_warning),
and every such command prints only its own lines; the tuner's own warnings, and warnings asked for with
`-W` or PYTHONWARNINGS, are still shown."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner
from tuner.cli.library_warnings import hide_library_warnings

ROOT = Path(__file__).resolve().parents[2]
INJECTED = ROOT / "tests" / "data" / "library_warning"
SSH_STUDY = ROOT / "studies" / "llama-server-ssh-systemd.toml"
CALIBRATE = ROOT / "scripts" / "calibrate_sim.py"


def _environment(home: Path, mark: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    # The injection first, then this checkout's tuner (a scratch copy's, under scripts/guard_mutants.py).
    path = os.pathsep.join(part for part in (str(INJECTED), str(ROOT), env.get("PYTHONPATH", "")) if part)
    return {**env, "HOME": str(home), "MARK": str(mark), "PYTHONPATH": path, **extra}


COMMANDS = {
    "run --check": ["run", str(SSH_STUDY), "--check"],
    "trust-host": ["trust-host", "127.0.0.1", "--port", "1", "--yes"],
    "restore": ["restore", str(SSH_STUDY)],
    "capacity --baseline": ["capacity", str(SSH_STUDY), "--baseline"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_that_loads_the_ssh_transport_prints_no_library_warning(command: str, tmp_path: Path) -> None:
    mark = tmp_path / "asyncssh-warned"
    done = run_tuner(*COMMANDS[command], cwd=tmp_path, env=_environment(tmp_path, mark), timeout=60)
    assert mark.exists(), f"{command} did not import asyncssh, so this test shows nothing: {done.stderr}"
    assert done.returncode in (1, 2), done.stderr
    assert "Warning" not in done.stderr and "deprecated" not in done.stderr, done.stderr
    if command == "run --check":  # a check's report, each line its own, on stdout
        assert "FAIL  host: no pinned host keys" in done.stdout and done.stderr == ""
    else:
        assert one_error_line(done).startswith("error: ")


def test_warnings_asked_for_are_shown(tmp_path: Path) -> None:
    """The same command with PYTHONWARNINGS=default: the injected warnings are there to be hidden."""
    mark = tmp_path / "asyncssh-warned"
    env = _environment(tmp_path, mark, PYTHONWARNINGS="default")
    done = run_tuner(*COMMANDS["trust-host"], cwd=tmp_path, env=env, timeout=60)
    assert "CryptographyDeprecationWarning: DSA is deprecated" in done.stderr
    assert "FutureWarning: this call will change" in done.stderr


def test_the_tuners_own_warning_is_still_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        hide_library_warnings()
        for module in ("tuner", "tuner.transports.ssh", "asyncssh", "cryptography.utils", "tunerx", "optuna"):
            warnings.warn_explicit("a warning", UserWarning, f"{module}.py", 1, module=module)
    assert [str(w.filename) for w in shown] == ["tuner.py", "tuner.transports.ssh.py"]


def test_the_simulators_calibration_script_prints_no_library_warning(tmp_path: Path) -> None:
    """scripts/calibrate_sim.py, which an operator runs against their own server (docs/simulator.md),
    imports the transports too: scripts/drift.sh found it printing cryptography 51's warnings."""
    mark = tmp_path / "asyncssh-warned"
    done = subprocess.run(
        [sys.executable, str(CALIBRATE), "--measured", str(tmp_path / "missing.json")],
        env=_environment(tmp_path, mark),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert mark.exists(), f"the script did not import asyncssh, so this test shows nothing: {done.stderr}"
    assert done.returncode == 2 and "Warning" not in done.stderr, done.stderr
