"""Input a reader could hang or recurse on (a study or workload that is a FIFO or a device, a study
nested thousands deep): each a one-line refusal with the README's exit code, and no read that never
ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("what", ["fifo", "chardev"])
def test_a_study_or_workload_that_is_a_fifo_or_a_device_is_refused_instead_of_read_forever(
    what: str, tmp_path: Path
) -> None:
    special = tmp_path / "special"
    if what == "fifo":
        os.mkfifo(special)
    else:
        special = Path("/dev/zero")  # a read of it never ends
    for args, code in ((["run", str(special)], 2), (["workload", "show", str(special)], 2)):
        done = run_tuner(*args, cwd=tmp_path, timeout=120)  # a read that never ends is a hang
        assert done.returncode == code, done.stderr[-2000:]
        assert "not a" in one_error_line(done)


def test_a_study_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "deep.toml"
    study.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    done = run_tuner("run", str(study), cwd=tmp_path)
    assert done.returncode == 2 and "nested too deeply" in one_error_line(done)
    done = run_tuner("run", str(DATA / "tiny-study.toml"), "--set", "rounds=" + "[" * 5000, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    one_error_line(done)
