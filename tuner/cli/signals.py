"""Ctrl-C and SIGTERM for the commands that change a host: the running task is cancelled, its clean-up
(the restore) runs to the end, and the signal decides the exit code (130 or 143)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["hold_late_signals", "raise_if_stopped", "run_stoppable", "stop_on_signals"]

_T = TypeVar("_T")


def stop_on_signals(received: list[int]) -> None:
    """Ctrl-C and SIGTERM cancel the running task, whose `finally` blocks put the host back.

    A library can absorb a cancellation (anyio's shielded scopes, which httpcore uses to close a
    response, may); the job must stop all the same, so the cancellation is repeated while the task runs
    on with none pending. During clean-up one stays pending, so the restore itself is never cut short.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    insisting = False  # one chain of repeats, however many signals arrive

    def insist() -> None:
        nonlocal insisting
        insisting = True
        if task.done():
            return
        if task.cancelling() == 0:
            task.cancel()
        loop.call_later(0.5, insist)

    def on_signal(signum: int, frame: object) -> None:
        # Runs in the main thread between two bytecodes, and a signal arriving meanwhile runs it again
        # inside itself: record, and wake the loop only for the first one.
        first = not received
        received.append(signum)
        if first and not insisting and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(insist)

    # signal.signal, not loop.add_signal_handler: asyncio puts the default action back when its loop
    # closes, and a second signal in that moment would kill the process with -15 instead of 143.
    # These stay until `main` returns: one that arrives after the loop is only recorded, and
    # `raise_if_stopped` turns it into the exit code (never an exception at an arbitrary line).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)


def hold_late_signals() -> None:
    """Once the exit code is decided, further signals change nothing: ignored, since Python's own
    shutdown puts the default action back for a handler of ours, and one would end it with -15."""
    stopping = (signal.SIGINT, signal.SIGTERM)
    # Blocked first, so none arrives from here on; then a do-nothing handler, which takes any that
    # Python noted but has not handled yet (one meeting SIG_IGN is reported "ignored due to race
    # condition" with a traceback); then SIG_IGN, which Python's shutdown leaves alone.
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    for signum in stopping:
        signal.signal(signum, _ignore_signal)
    for signum in stopping:
        signal.signal(signum, signal.SIG_IGN)


def _ignore_signal(signum: int, frame: object) -> None:
    """A signal after the exit code was decided: nothing to do."""


def run_stoppable(command: Coroutine[Any, Any, _T], received: list[int]) -> _T:
    """`asyncio.run` of a host command that called `stop_on_signals(received)`: a signal's exit code
    wins over the command's result, however the loop ended."""
    try:
        result = asyncio.run(command)
    except asyncio.CancelledError:
        raise_if_stopped(received)
        raise
    raise_if_stopped(received)
    return result


def raise_if_stopped(received: list[int]) -> None:
    """A signal that arrived while the command finished (its clean-up done) still sets its exit code."""
    if signal.SIGINT in received:
        raise KeyboardInterrupt
    if received:
        raise asyncio.CancelledError
