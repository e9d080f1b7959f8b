"""Output files: a reader sees the old content or the new one, and only a regular file is ever replaced.

Every file serve-tuner writes on this machine (`--out` traces, plots, the run directory's files, the
local transport's writes) goes through `write_atomic`, which keeps these promises:

- only a regular file, or nothing, is replaced: a directory, device, FIFO or socket at the path is
  refused with one line (as root, `--out /dev/null` would otherwise turn the device into a file);
- a symbolic link is followed: its target is replaced atomically and the link stays a link;
- a write never replaces one of the command's own inputs (`inputs`);
- a new file gets the mode the umask gives it; a replaced file keeps its mode; a `private` file
  (message text, anything secret) is 0600; an explicit `mode` is exactly that;
- the temporary file `.NAME.<random>.tmp` beside the target is removed on every exit Python sees
  (an exception, Ctrl-C, SIGTERM or SIGHUP while it exists); one left by SIGKILL or a power cut is
  removed by the next write to the same path. A writer holds a lock on its temporary file while it
  exists, so a second writer never removes a temporary file that is still being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import signal
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

from tuner.errors import ConfigError

__all__ = ["check_output", "check_writable", "remove_stale_temporaries", "special_file", "write_atomic"]

# The random part of a temporary file's name: ours (12 hex digits), and the 8 characters of the
# `tempfile.mkstemp` names that earlier versions left behind.
_RANDOM_PART = r"[A-Za-z0-9_]{8,16}"
_TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link that cannot be followed (a loop)"
    return "not a regular file"


def special_file(path: Path) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a directory (a FIFO or a device,
    which a read would wait on or never finish); None otherwise. Readers refuse these in one line."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing or unreadable: the read itself says so
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind_of(mode)


def check_output(path: Path, *, inputs: Iterable[Path] = ()) -> Path:
    """The file a write to `path` replaces (symbolic links followed); refuses, with the fix, a path that
    is not a regular file or absent, and one that is the same file as one of `inputs`."""
    target = Path(os.path.realpath(path))
    try:
        found = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link loop; nothing was written: pass a file path") from None
        raise
    if not stat.S_ISREG(found.st_mode):
        fix = f"pass a file path inside it, e.g. {path}/trace.jsonl" if stat.S_ISDIR(found.st_mode) else ""
        raise ConfigError(
            f"{path} is {_kind_of(found.st_mode)}, not a regular file; nothing was written: "
            + (fix or "pass the path of a regular file, or of one that does not exist yet")
        )
    for source in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(source, target):
                raise ConfigError(
                    f"{path} is the input {source} itself; writing it would replace what is being read: "
                    "pass another output path"
                )
    return target


def check_writable(path: Path) -> Path:
    """`check_output`, then proves that a write can create its temporary file beside the target, before
    a long job whose result would be lost; raises `OSError` if not. A missing directory is not made
    here (a check leaves nothing behind): its nearest existing ancestor must be writable."""
    target = check_output(path)
    directory = target.parent
    if not directory.is_dir():
        ancestor = next(parent for parent in directory.parents if parent.exists())
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", str(ancestor))
        return target
    probe = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    os.unlink(probe)
    return target


def write_atomic(
    path: Path,
    data: bytes | Iterable[bytes],
    *,
    mode: int | None = None,
    private: bool = False,
    inputs: Iterable[Path] = (),
) -> None:
    """Writes `data` (bytes, or chunks of them made as the write goes, so a big file is never held
    whole) to a temporary file beside the target, fsyncs it, and renames it over the target.

    The mode: `mode` when given; 0600 when `private`; else the replaced file's own mode; else what the
    umask gives a new file. A replaced file keeps its owner and group where we may set them (as root).
    Raises `ConfigError` for a target that is not a regular file or is one of `inputs`, and `OSError`
    when the write itself fails (the target is then unchanged)."""
    target = check_output(path, inputs=inputs)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    replaced: os.stat_result | None = None
    with contextlib.suppress(FileNotFoundError):
        replaced = os.stat(target)
    final_mode = mode if mode is not None else 0o600 if private else None
    if final_mode is None and replaced is not None:
        final_mode = stat.S_IMODE(replaced.st_mode)
    with _cleanup_on_termination():
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        # 0600 until the final mode is set, so a private file is never readable by others, not even
        # for a moment; a new file without a mode asked is created 0666 for the umask to narrow.
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if final_mode is None else 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # marks it as being written: see remove_stale_temporaries
            if replaced is not None and (replaced.st_uid, replaced.st_gid) != (os.geteuid(), os.getegid()):
                # root replacing a user's file gives it back to that user (others may not: it stays theirs)
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, replaced.st_uid, replaced.st_gid)
            if final_mode is not None:  # after the chown, which may clear set-id bits
                os.fchmod(fd, final_mode)
            for chunk in [data] if isinstance(data, bytes | bytearray | memoryview) else data:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        finally:
            os.close(fd)
    _fsync_directory(target.parent)


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Removes the temporary files of earlier writes to `target` that no live writer holds (a run killed
    with SIGKILL left them); returns what it removed."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{_RANDOM_PART}\.tmp")
    removed: list[Path] = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        if not pattern.fullmatch(name):
            continue
        candidate = target.parent / name
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.lstat(candidate).st_mode):
                continue
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a writer is alive
                if os.fstat(fd).st_ino == os.lstat(candidate).st_ino:
                    os.unlink(candidate)
                    removed.append(candidate)
            finally:
                os.close(fd)
    return removed


@contextlib.contextmanager
def _cleanup_on_termination() -> Iterator[None]:
    """While a temporary file exists, SIGTERM and SIGHUP (when nothing else handles them) end the
    process through an exception, so that the temporary file is removed first; the exit status is
    the shell's for that signal (143, 129). Only the main thread can set handlers; the commands that
    write from another thread (`tuner record`) handle the signals in their event loop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, signal.Handlers] = {}

    def exit_through_cleanup(signum: int, frame: FrameType | None) -> NoReturn:
        for taken in previous:  # a second signal must not cut short the clean-up the first one started
            signal.signal(taken, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for signum in _TERMINATING_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, exit_through_cleanup)
            previous[signum] = signal.SIG_DFL
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable: without it a power cut can bring the old file back."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
