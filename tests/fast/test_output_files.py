"""Output files (`--out`, the run directory, the local transport): only a regular file or nothing is
replaced, a symlink's target is, a command never overwrites its own input, modes follow the umask or
the replaced file, and no temporary file outlives a write, whatever ended it.

Through the CLI where a user meets it (`workload synth`, `workload import`), as a separate process;
the signal tests stop that process at the moment its temporary file exists (its `os.replace` waits),
so nothing here depends on timing. The cases that need root (a character device at `--out`, another user's
file replaced) are in tests/real/test_devices_owners_and_full_disks.py.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner
from tuner.files import write_atomic
from tuner.workloads import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
LOG = DATA / "import" / "llama-server.log"


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def synth_into(out: Path) -> subprocess.CompletedProcess[str]:
    return run_tuner("workload", "synth", "chat", "--users", "2", "--turns", "1", "--out", str(out))


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
def test_a_fifo_a_socket_or_a_directory_at_out_is_refused_in_one_line(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "directory":
        out.mkdir()
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(out))
    expected = {"fifo": "a FIFO (named pipe)", "socket": "a socket", "directory": "a directory"}[kind]
    result = synth_into(out)
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"{out} is {expected}, not a regular file; nothing was written" in line
    if kind == "directory":
        assert f"pass a file path inside it, e.g. {out}/trace.jsonl" in line
        assert list(out.iterdir()) == []
    assert not stat.S_ISREG(os.lstat(out).st_mode)
    assert temporaries(tmp_path) == []


def test_a_symlink_at_out_is_followed_and_its_target_replaced(tmp_path: Path) -> None:
    target = tmp_path / "real" / "trace.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert synth_into(link).returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(load_trace(target).requests) == 2  # the trace, written through the link
    assert temporaries(tmp_path) == [] and temporaries(target.parent) == []


def test_an_import_never_overwrites_its_own_input(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(LOG.read_bytes())
    for out in (log, tmp_path / "link-to-log"):
        if out != log:
            out.symlink_to(log)
        result = run_tuner("workload", "import", "llama-server-log", str(log), "--out", str(out))
        assert result.returncode == 2
        assert "is the input" in one_error_line(result) and "pass another output path" in result.stderr
        assert log.read_bytes() == LOG.read_bytes()
    elsewhere = run_tuner("workload", "import", "llama-server-log", str(log), "--out", str(tmp_path / "t.jsonl"))
    assert elsewhere.returncode == 0, elsewhere.stderr


def test_a_new_file_gets_the_umask_and_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    private, shared = tmp_path / "private.jsonl", tmp_path / "shared.jsonl"
    assert run_tuner("workload", "synth", "chat", "--out", str(private), umask=0o077).returncode == 0
    assert run_tuner("workload", "synth", "chat", "--out", str(shared), umask=0o022).returncode == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
    # Overwritten under a looser umask, the 0600 file stays 0600; a 0640 one stays 0640.
    shared.chmod(0o640)
    for path, mode in ((private, 0o600), (shared, 0o640)):
        before = path.read_bytes()
        assert run_tuner("workload", "synth", "chat", "--users", "3", "--out", str(path), umask=0o000).returncode == 0
        assert path.read_bytes() != before
        assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_private_write_is_0600_and_an_explicit_mode_is_exact(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        loose = tmp_path / "loose"
        loose.write_text("x")
        loose.chmod(0o666)
        write_atomic(loose, b"secret", private=True)  # even over a world-readable file
        write_atomic(tmp_path / "new-private", b"secret", private=True)
        write_atomic(tmp_path / "exact", b"x", mode=0o640)
    finally:
        os.umask(old)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new-private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "exact").stat().st_mode) == 0o640


# A child that runs the CLI with os.replace held: it says where its temporary file is, then waits to
# be signalled there, between the write and the rename. SIGHUP as a login shell leaves it: a test run under
# nohup hands its children SIGHUP ignored, and the import then rightly goes on through it.
HELD_AT_RENAME = """
import os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
def held(source, target):
    print(source, flush=True)
    time.sleep(600)
os.replace = held
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def held_import(out: Path, source: Path) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HELD_AT_RENAME,
            "workload",
            "import",
            "llama-server-log",
            str(source),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    temporary = Path(child.stdout.readline().strip())  # blocks until the temporary file is written
    assert temporary.parent == out.parent and temporary.exists(), temporary
    return child, temporary


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_an_import_removes_its_temporary_file(signum: int, tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl"
    out.write_text("the old trace\n")
    child, temporary = held_import(out, LOG)
    child.send_signal(signum)
    assert child.wait(timeout=30) == 128 + signum
    assert not temporary.exists()
    assert out.read_text() == "the old trace\n"
    assert temporaries(tmp_path) == []


def test_a_temporary_file_left_by_sigkill_is_removed_by_the_next_write_but_a_live_writers_is_not(
    tmp_path: Path,
) -> None:
    out = tmp_path / "trace.jsonl"
    child, stale = held_import(out, LOG)
    child.kill()
    child.wait(timeout=30)
    assert stale.exists() and not out.exists()  # what a SIGKILL leaves
    live = tmp_path / ".trace.jsonl.0123456789ab.tmp"  # another writer, still writing (it holds its lock)
    with live.open("wb") as writing:
        fcntl.flock(writing, fcntl.LOCK_EX)
        other = tmp_path / ".other.jsonl.0123456789ab.tmp"  # a temporary file of another path
        other.write_text("")
        assert synth_into(out).returncode == 0
        assert not stale.exists()
        assert live.exists() and other.exists()
    assert out.read_text().strip()


def test_leaderboard_csv_never_overwrites_the_runs_own_files(tmp_path: Path) -> None:
    import optuna

    from tuner.runs import RunDirectory
    from tuner.study_record import TrialRecord, new_trial_attrs

    run = tmp_path / "tiny"
    with RunDirectory(run) as run_dir:
        optuna.create_study(storage=run_dir.storage(), study_name="tiny").add_trial(
            optuna.trial.create_trial(
                value=1.0, params={}, distributions={}, user_attrs=new_trial_attrs(TrialRecord(baseline=True))
            )
        )
    journal = (run / "optuna.journal").read_bytes()
    (run / "spec.json").write_text("{}\n")
    for name in ("optuna.journal", "spec.json"):
        before = (run / name).read_bytes()
        done = run_tuner("leaderboard", str(run), "--csv", str(run / name), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is the input" in one_error_line(done)
        assert done.stdout.strip() == "", "refused only after the leaderboard was shown"
        assert (run / name).read_bytes() == before
    assert (run / "optuna.journal").read_bytes() == journal
    # The run's other files are its evidence too: only its own leaderboard file may be written inside it.
    (run / "trials" / "0000").mkdir(parents=True)
    (run / "trials" / "0000" / "server.log").write_text("the server's log\n")
    (run / "host.json").write_text("{}\n")
    for flag, name in (("--csv", "trials/0000/server.log"), ("--parquet", "host.json"), ("--csv", "notes.csv")):
        kept: bytes | None = (run / name).read_bytes() if (run / name).exists() else None
        done = run_tuner("leaderboard", str(run), flag, str(run / name), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        line = one_error_line(done)
        assert "inside the run directory" in line and f"the leaderboard to {run / ('leaderboard.' + flag[2:])}" in line
        assert done.stdout.strip() == ""
        assert ((run / name).read_bytes() if (run / name).exists() else None) == kept
    done = run_tuner("leaderboard", str(run), "--csv", str(run / "leaderboard.csv"), cwd=tmp_path)
    assert done.returncode == 0 and (run / "leaderboard.csv").is_file(), done.stderr


def test_record_checks_an_out_in_a_missing_directory_without_creating_it(tmp_path: Path) -> None:
    from tuner.files import check_writable

    out = tmp_path / "missing" / "deeper" / "rec.jsonl"
    assert check_writable(out) == out
    assert not (tmp_path / "missing").exists(), "a check made directories"
