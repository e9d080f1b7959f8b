"""Input a reader could hang or recurse on (a study or workload that is a FIFO or a device, a study
nested thousands deep): each a one-line refusal with the README's exit code, and no read that never
ends."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner
from tests.support.bounded import fifo_nobody_may_open

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("what", ["fifo", "chardev"])
def test_a_study_or_workload_that_is_a_fifo_or_a_device_is_refused_instead_of_read_forever(
    what: str, tmp_path: Path
) -> None:
    for command in ("run", "workload show"):
        with contextlib.ExitStack() as stack:
            if what == "fifo":  # a read of it waits for a writer for ever: released after 3 s, and the test fails
                special = stack.enter_context(fifo_nobody_may_open(tmp_path / f"special-{command.split()[0]}"))
            else:
                special = Path("/dev/zero")  # a read of it never ends: a read is ended by the timeout
            # A read that never ends is bounded in time, and in memory (a read of /dev/zero takes 1 GB a second).
            done = run_tuner(*command.split(), str(special), cwd=tmp_path, timeout=30, memory_limit_bytes=4 << 30)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "not a" in one_error_line(done)


def test_a_study_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "deep.toml"
    study.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    done = run_tuner("run", str(study), cwd=tmp_path)
    assert done.returncode == 2 and "nested too deeply" in one_error_line(done)
    done = run_tuner("run", str(DATA / "tiny-study.toml"), "--set", "rounds=" + "[" * 5000, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    one_error_line(done)
