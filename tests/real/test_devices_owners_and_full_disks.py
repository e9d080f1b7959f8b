"""What the tuner's writes meet on a real system, which only root can set up: a character device at `--out`
(refused, left a device), another user's file replaced (it keeps its owner and group), and a run directory on
a disk that fills up (the journal's torn last line repaired by the next run). The cases that need no root are
in tests/fast/test_output_files.py and tests/fast/test_torn_journal.py.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests.fast.test_output_files import synth_into, temporaries
from tests.fast.test_torn_journal import completed, make_study, measure
from tests.support import one_error_line
from tests.support.real_parts import need_real_part, small_tmpfs
from tuner.runs import RunDirectory
from tuner.workloads import load_trace


@pytest.fixture
def char_device(tmp_path: Path) -> Iterator[Path]:
    """A copy of /dev/null (same major and minor): what `--out /dev/null` would meet, harmlessly."""
    if os.geteuid() != 0:
        need_real_part("root", "making a character device (a copy of /dev/null) needs root")
    device = tmp_path / "null-copy"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    yield device


@pytest.mark.real_part("root")
def test_a_character_device_at_out_is_refused_and_stays_a_device(char_device: Path) -> None:
    result = synth_into(char_device)
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"{char_device} is a character device, not a regular file; nothing was written" in line
    assert stat.S_ISCHR(os.lstat(char_device).st_mode)
    assert temporaries(char_device.parent) == []


@pytest.mark.real_part("root")
def test_a_replaced_file_keeps_its_owner_when_root_writes_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        need_real_part("root", "giving a file to another user needs root")
    out = tmp_path / "theirs.jsonl"
    out.write_text("a user's trace\n")
    os.chown(out, 4242, 4343)
    assert synth_into(out).returncode == 0
    assert (out.stat().st_uid, out.stat().st_gid) == (4242, 4343)
    assert len(load_trace(out).requests) == 2


@pytest.mark.real_part("root")
def test_a_journal_torn_by_a_real_full_disk_is_repaired_once_there_is_space_again(tmp_path: Path) -> None:
    """The issue's reproduction: the run directory on a 64 KiB tmpfs, filled up; the study appends
    until a record no longer fits and is written only in part (ENOSPC); space is freed; the next run
    moves the part aside and goes on with every trial that was told before the disk filled."""
    with small_tmpfs(tmp_path / "runs", "64k") as runs:
        run = runs / "torn"
        make_study(run)
        with open(runs / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 4096)
        told: list[int] = []
        with RunDirectory(run) as run_dir, pytest.raises(OSError, match="No space left"):
            study = optuna.load_study(study_name="torn", storage=run_dir.storage())
            for n_batch in range(100, 2000):  # the records fill the journal's last page, then one is torn
                study.enqueue_trial({"n_batch": n_batch})
                measure(study, n_batch, 0.1)
                told.append(n_batch)
        assert not run_dir.journal.read_bytes().endswith(b"\n")  # a real torn line
        (runs / "filler").unlink()
        notices: list[str] = []
        with RunDirectory(run, notice=notices.append) as run_dir:
            assert len(notices) == 1 and "moved aside into" in notices[0]
            assert [p["n_batch"] for _, p in completed(run_dir)] == [2048, 256, 64, *told]
            study = optuna.load_study(study_name="torn", storage=run_dir.storage())
            study.enqueue_trial({"n_batch": 8})
            # A trial enqueued before the disk filled, whose ask was the torn record, waits ahead of it (where
            # the tear falls depends on the records' sizes).
            while study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
                measure(study, 8, 0.2)
        assert [p["n_batch"] for _, p in completed(RunDirectory(run, notice=pytest.fail))][-1] == 8
