"""A request inside the simulated server (`SimTask`), the slot that serves it (`Slot`, with the prompt its
own cache holds), and the answer a greedy server gives (`answer_tokens`: a function of the prompt and the
adapters only, never of the batch settings, so the correctness gate sees the same answers for every config)."""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SimTask", "Slot", "answer_tokens"]

_TOKEN_RANGE = (100, 30000)


def _stable_hash(values: Sequence[int], salt: str) -> int:
    return zlib.crc32(array("q", values).tobytes(), zlib.crc32(salt.encode()))


def answer_tokens(prompt: Sequence[int], lora: tuple[tuple[int, float], ...], count: int) -> list[int]:
    """The answer a greedy server gives: a function of the prompt and the adapters only."""
    state = _stable_hash(prompt, repr(lora))
    low, high = _TOKEN_RANGE
    out = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(low + (state >> 33) % (high - low))
    return out


@dataclass(kw_only=True, eq=False)
class SimTask:
    """One request inside the server."""

    id: int
    prompt: tuple[int, ...]
    n_predict: int
    lora: tuple[tuple[int, float], ...]  # (adapter id, scale), sorted, zero scales left out
    arrival_s: float
    slot: int | None = None
    launch_s: float | None = None
    n_cached: int = 0
    n_past: int = 0  # prompt tokens in the slot, cached ones included
    prefill_start_s: float | None = None
    answer: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    token_s: list[float] = field(default_factory=list)  # model time of each generated token
    done: bool = False
    truncated: bool = False
    error: str | None = None
    finished_s: float | None = None
    rate_mark: tuple[float, int] | None = None  # (time, n_gen) of the last tg_3s line
    progress_logged: bool = False

    @property
    def prefilling(self) -> bool:
        return not self.done and self.slot is not None and self.n_past < len(self.prompt)

    @property
    def generating(self) -> bool:
        return not self.done and self.slot is not None and self.n_past >= len(self.prompt)


@dataclass(kw_only=True)
class Slot:
    id: int
    cache: tuple[int, ...] = ()
    cache_lora: tuple[tuple[int, float], ...] = ()
    task: SimTask | None = None
    last_used: int = -1
