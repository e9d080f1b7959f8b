"""Runs one command: parse (the table's parser), check the arguments (no I/O), import and run the command's
function, and turn what it raises into one line and the README's exit code."""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, cast

from tuner.cli.commands import Command, chosen
from tuner.cli.library_warnings import hide_library_warnings
from tuner.cli.parser import build_parser
from tuner.cli.signals import hold_late_signals as ignore_late_signals
from tuner.errors import TunerError
from tuner.redact import RedactingFilter, redact

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "entry", "main"]

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

Handler = Callable[[argparse.Namespace, "Console"], int]


def entry() -> NoReturn:
    """The `tuner` command: main, then its exit code, with no signal after that deciding another. A
    library's warning is not printed (tuner/cli/library_warnings.py)."""
    hide_library_warnings()
    sys.exit(main(hold_late_signals=True))


def main(argv: Sequence[str] | None = None, *, hold_late_signals: bool = False) -> int:
    """Runs one command; returns its exit code. Signal handlers it sets are put back on return (it may
    be called in-process), unless `hold_late_signals`: then signals are ignored from here on."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(argv)
    finally:
        if hold_late_signals:
            ignore_late_signals()
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def command_function(command: Command) -> Handler:
    """The function that runs `command`, its module imported now (the table names it as `module:function`)."""
    module, _, function = command.run.partition(":")
    return cast(Handler, getattr(importlib.import_module(module), function))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    command = chosen(args)
    from tuner.console import make_console  # after parsing: `--help` and a mistyped flag print no rich

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # a library's debug line may carry a header or the key
        handler.addFilter(RedactingFilter())
    console = make_console()
    err = make_console(stderr=True)
    try:
        if command.check is not None:
            command.check(args)
        return command_function(command)(args, console)
    except TunerError as exc:
        # The last line out: server text an error quotes is scrubbed here whatever raised it.
        err.print(f"error: {redact(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except OSError as exc:
        # Raised by this machine's own files (a full disk under the run directory, say), after the
        # study's `finally` blocks put the host back.
        err.print(f"error: {_os_error_line(exc)}", markup=False, highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print(f"interrupted{_after_stop(command)}", markup=False, highlight=False)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        err.print(f"terminated{_after_stop(command)}", markup=False, highlight=False)
        return EXIT_TERMINATED


def _after_stop(command: Command) -> str:
    """What a stopped command left: a host command restored the baseline; the others touched no host
    (their output is written atomically, whole or not at all), so they claim nothing."""
    return ": the baseline was restored" if command.restores_host else ""


def _os_error_line(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    fix = ""
    if exc.errno == errno.ENOSPC:
        fix = (
            "; free some space there and run again (a study's run directory keeps its completed trials; "
            "`--runs-dir` puts it on another disk)"
        )
    return f"{exc.strerror or exc}{where}{fix}"
