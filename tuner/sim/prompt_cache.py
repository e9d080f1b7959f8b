"""The simulated server's prompt caches, as llama-server keeps them: each slot's own (the longest common
prefix with its last prompt decides which idle slot a request gets) and the host-RAM cache (`cache_ram`
MiB), which saves a displaced slot's prompt, evicts the oldest first and restores a better match."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.sim.inputs import SimSettings
from tuner.sim.slots import SimTask, Slot

__all__ = ["CacheEntry", "LogSink", "lcp", "select_slot", "update_ram_cache"]

_SIMILARITY_THRESHOLD = 0.1  # -sps, llama-server's default

LogSink = Callable[[float, str], None]  # (wall-clock seconds since start, line without its timestamp)


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix."""
    n = min(len(a), len(b))
    if n and a[:n] == b[:n]:
        return n
    low, high = 0, n  # binary search on prefix equality: prompts run to thousands of tokens
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(kw_only=True)
class CacheEntry:
    tokens: tuple[int, ...]
    lora: tuple[tuple[int, float], ...]

    def mib(self, kv_bytes_per_token: int) -> float:
        return len(self.tokens) * kv_bytes_per_token / 2**20


def select_slot(idle: list[Slot], task: SimTask, now: float, *, cache_prompt: bool, log: LogSink) -> Slot:
    """The idle slot whose cache shares most of the prompt (above the similarity threshold), else the
    least recently used one."""
    best, best_sim = None, 0.0
    if cache_prompt:
        for slot in idle:
            if slot.cache and slot.cache_lora == task.lora:
                similarity = lcp(slot.cache, task.prompt) / len(task.prompt)
                if similarity > best_sim:
                    best, best_sim = slot, similarity
    if best is not None and best_sim > _SIMILARITY_THRESHOLD:
        keep = lcp(best.cache, task.prompt) / len(best.cache)
        log(
            now,
            f"I slot get_availabl: id {best.id:2d} | task -1 | selected slot by LCP similarity, "
            f"f_sim_best = {best_sim:.3f} (> {_SIMILARITY_THRESHOLD:.3f} thold), f_keep = {keep:.3f}",
        )
        return best
    # Least recently used; among slots never used, the highest id (llama-server's `<=` scan): a request
    # that arrives later gets a lower slot, and slots are filled with prompt tokens in id order.
    chosen = min(idle, key=lambda s: (s.last_used, -s.id))
    log(now, f"I slot get_availabl: id {chosen.id:2d} | task -1 | selected slot by LRU, t_last = {chosen.last_used}")
    return chosen


def update_ram_cache(
    cache: list[CacheEntry],
    slot: Slot,
    task: SimTask,
    now: float,
    *,
    settings: SimSettings,
    kv_bytes_per_token: int,
    log: LogSink,
) -> int:
    """Before `task` takes `slot`: the slot's prompt saved into `cache` (the oldest evicted past the
    limit), and a cached prompt that shares more of the task's than the slot's own put into the slot.
    Returns how many tokens were restored (their copy costs time), 0 for none."""
    kv = kv_bytes_per_token
    verbose = settings.verbosity >= 4
    if verbose:
        log(now, "I srv  get_availabl: updating prompt cache")
    if slot.cache and not any(e.tokens == slot.cache and e.lora == slot.cache_lora for e in cache):
        entry = CacheEntry(tokens=slot.cache, lora=slot.cache_lora)
        if verbose:
            log(
                now,
                f"I srv   prompt_save:  - saving prompt with length {len(slot.cache)}, total state size = "
                f"{entry.mib(kv):.3f} MiB (draft: 0.000 MiB)",
            )
        cache.append(entry)
        limit = settings.cache_ram
        while limit > 0 and len(cache) > 1 and sum(e.mib(kv) for e in cache) > limit:
            evicted = cache.pop(0)
            log(
                now,
                f"W srv        update:  - cache size limit reached, removing oldest entry (size = "
                f"{evicted.mib(kv):.3f} MiB)",
            )
        if limit > 0 and cache and cache[0].mib(kv) > limit:
            cache.clear()
    own = lcp(slot.cache, task.prompt) if slot.cache_lora == task.lora else 0
    best, best_lcp = None, own
    for entry in cache:
        if entry.lora == task.lora:
            common = lcp(entry.tokens, task.prompt)
            if common > best_lcp:
                best, best_lcp = entry, common
    restored = 0
    if best is not None:
        if verbose:
            log(
                now,
                f"I srv          load:  - found better prompt with f_keep = {best_lcp / len(best.tokens):.3f}, "
                f"f_sim = {best_lcp / len(task.prompt):.3f}",
            )
        slot.cache, slot.cache_lora = best.tokens, best.lora
        restored = len(best.tokens)
    if verbose:
        total = sum(e.mib(kv) for e in cache)
        log(now, f"I srv        update:  - cache state: {len(cache)} prompts, {total:.3f} MiB")
    return restored
