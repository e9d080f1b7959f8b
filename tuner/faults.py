"""Crash points: the fault tests make the controller SIGKILL itself at a named step, to check that
the next run finds the host and the study in a state it can recover from (reliability promise P2).

    SERVE_TUNER_CRASH_AT=mid-replay      the first time the controller reaches that step
    SERVE_TUNER_CRASH_AT=after-write:2   the second time

Unset, which is how every user runs it, `crash_point` does nothing.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

__all__ = ["CRASH_POINTS", "crash_point"]

CRASH_POINTS = ("after-write", "after-restart", "mid-health-wait", "mid-replay", "before-tell", "mid-restore")
_ENV = "SERVE_TUNER_CRASH_AT"
_reached: Counter[str] = Counter()


def crash_point(step: str) -> None:
    assert step in CRASH_POINTS, step
    wanted = os.environ.get(_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != step:
        return
    _reached[step] += 1
    if _reached[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
