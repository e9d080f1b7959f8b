"""What every fast test must leave as it found it in the test process: the SIGINT and SIGTERM handlers and
their blocking, which a child process started by a later test inherits. (A pytest started as a background
job of a non-interactive shell has SIGINT ignored from the start: that is no test's doing, and unchanged.)"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

STOPPING = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | None


def _signal_state() -> tuple[dict[signal.Signals, Handler], set[signal.Signals]]:
    handlers = {signum: signal.getsignal(signum) for signum in STOPPING}
    blocked = {signal.Signals(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])} & set(STOPPING)
    return handlers, blocked


@pytest.fixture(autouse=True)
def signal_handlers_put_back() -> Iterator[None]:
    """Fails the test that changes SIGINT's or SIGTERM's handler, or blocks either, without putting it back;
    puts it back itself, so that the tests after it run as they would alone."""
    handlers, blocked = _signal_state()
    yield
    after_handlers, after_blocked = _signal_state()
    changed = [
        f"{signum.name}: {handlers[signum]!r} -> {after_handlers[signum]!r}"
        for signum in STOPPING
        if after_handlers[signum] is not handlers[signum]
    ]
    if after_blocked != blocked:
        changed.append(f"blocked: {sorted(s.name for s in blocked)} -> {sorted(s.name for s in after_blocked)}")
    if changed:
        for signum, handler in handlers.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back from it
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, after_blocked - blocked)
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked - after_blocked)
        pytest.fail(f"the test left the signal handling of the test process changed ({'; '.join(changed)})")


# A fast test's own limit (pytest-timeout), tighter than pyproject.toml's 900 s for the real tier: the
# slowest fast test takes 30 s in 4 workers on 2 cores (a whole simulated study through the process
# deployer), so 120 s is a hang, never a slow machine.
FAST_TIMEOUT_S = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None and "tests/fast/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(FAST_TIMEOUT_S))
