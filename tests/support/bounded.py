"""Waits a broken guard cannot make endless. A FIFO handed to a reader whose special-file guard is gone
blocks that reader for ever (seen twice: the fast tier never ended); here it is released after a few
seconds and the test fails, saying the FIFO was opened."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fifo_nobody_may_open"]

RELEASE_AFTER_S = 3.0


@contextlib.contextmanager
def fifo_nobody_may_open(path: Path, *, release_after_s: float = RELEASE_AFTER_S) -> Iterator[Path]:
    """A FIFO at `path` that the code under test must refuse without opening. A reader that opens it anyway
    waits for a writer: after `release_after_s` the writing end is opened and closed, so that the reader
    reads an empty file and goes on, and on leaving the block the test fails, naming the FIFO. This
    process or a child may be the reader."""
    os.mkfifo(path)
    leaving = threading.Event()
    released: list[bool] = []

    def release() -> None:
        if leaving.wait(release_after_s):
            return
        while not leaving.is_set():  # every reader, however often one opens it again
            try:  # without a reader, O_NONBLOCK refuses at once (ENXIO) instead of waiting for one
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno not in (errno.ENXIO, errno.ENOENT):
                    raise
            else:
                released.append(True)
                os.close(fd)
            leaving.wait(0.05)

    watcher = threading.Thread(target=release, name=f"release {path.name}", daemon=True)
    watcher.start()
    try:
        yield path
    finally:
        leaving.set()
        watcher.join(timeout=10)
    assert not released, f"{path}, a FIFO, was opened for reading and waited on: the special-file guard is broken"
