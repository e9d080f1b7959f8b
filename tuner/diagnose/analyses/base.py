"""The registry of the analyses (`analysis`, in the order they run) and what they share: the
median, p95, the n_batch a chunk fits, a speed as text, the worst few instances as evidence."""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

from tuner.diagnose.reader import Analysis, ReadContext
from tuner.diagnose.report import Evidence, Figure, Finding

__all__ = ["ANALYSES", "Reporting", "Worst", "analysis", "bucket", "fmt_speed", "median", "new_analyses", "p95"]


class Reporting(Analysis, Protocol):
    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]: ...

    def profile(self) -> list[Figure]: ...


ANALYSES: dict[str, Callable[[], Reporting]] = {}


def analysis(kind: str) -> Callable[[type], type]:
    """Registers an analysis class under `kind`; they run in registration order."""

    def register(cls: type) -> type:
        if kind in ANALYSES:
            raise ValueError(f"analysis {kind!r} registered twice")
        setattr(cls, "kind", kind)  # noqa: B010
        ANALYSES[kind] = cls
        return cls

    return register


def new_analyses() -> list[Reporting]:
    return [make() for make in ANALYSES.values()]


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if len(values) else None


def p95(values: Sequence[float]) -> float | None:
    if not len(values):
        return None
    ordered = sorted(values)
    rank = 0.95 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def bucket(chunk: int) -> int:
    """The power of two at or above a chunk: the n_batch a chunk of this size fits (2047 -> 2048)."""
    size = 1
    while size < chunk:
        size *= 2
    return size


def fmt_speed(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


class Worst:
    """The few worst instances of something, for evidence: a bounded heap."""

    def __init__(self, keep: int = 5) -> None:
        self.keep = keep
        self.heap: list[tuple[float, int, Evidence]] = []
        self.order = itertools.count()

    def add(self, weight: float, evidence: Callable[[], Evidence]) -> None:
        if len(self.heap) < self.keep:
            heapq.heappush(self.heap, (weight, next(self.order), evidence()))
        elif weight > self.heap[0][0]:
            heapq.heapreplace(self.heap, (weight, next(self.order), evidence()))

    def items(self) -> list[Evidence]:
        return [e for _, _, e in sorted(self.heap, key=lambda item: (-item[0], item[1]))]
