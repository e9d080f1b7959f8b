"""Reads llama-server's log into per-task timelines: the server's own evidence for a trial.

Handles the current line shape (`M.SS.mmm.uuu L slot print_timing: id  1 | task 7 | ...`, function
names cut to 12 characters), older builds whose final timings came as unprefixed lines after a
`print_timing` header, and journal output with its `Mon DD HH:MM:SS host unit[pid]: ` prefix. The
timestamp is minutes.seconds.milliseconds.microseconds since the server started, not hours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tuner.models import PrefillProgress, TaskTimeline, TokenRateSample

__all__ = ["parse_llama_server_log", "parse_timestamp"]

_TIMESTAMP = re.compile(r"(?:^|\s)(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) [IWED] ")
_TASK = re.compile(r"\bslot\s+(\S+): id\s+(\d+) \| task (-?\d+) \|\s?(.*)$")
_TG = re.compile(r"n_gen =\s*(\d+), tg =\s*([\d.]+) t/s, tg_3s =\s*([\d.]+) t/s")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+)")
_SELECTED = re.compile(r"selected slot by (LCP|LRU)")
_CACHE_HIT = re.compile(r"found better prompt")
_CACHE_EVICTION = re.compile(r"removing oldest entry")
_PROGRESS = re.compile(r"prompt processing(?: progress)?, n_tokens =\s*(\d+).*?progress = ([\d.]+)")


# journalctl's `short`/`short-precise` (`Nov 29 12:00:01.123456 host unit[1]: `) and `short-iso(-precise)`.
_JOURNAL_SHORT = re.compile(r"^[A-Z][a-z]{2} +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(\.\d{1,6})? ")
_JOURNAL_ISO = re.compile(r"^\d{4}-\d{2}-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?")


def parse_timestamp(text: str) -> float | None:
    """Seconds since the server started, from `M.SS.mmm.uuu`; for lines without it (a server run with
    --no-log-timestamps, seen through journalctl) the journal's time in seconds since the month began,
    which keeps the order and the gaps; None if the line has no time at all."""
    match = _TIMESTAMP.search(text)
    if match:
        minutes, seconds, millis, micros = (int(g) for g in match.groups())
        return minutes * 60 + seconds + millis / 1e3 + micros / 1e6
    journal = _JOURNAL_SHORT.match(text) or _JOURNAL_ISO.match(text)
    if journal is None:
        return None
    day, hours, minutes, seconds = (int(g) for g in journal.groups()[:4])
    fraction = float(journal[5]) if journal[5] else 0.0
    return ((day * 24 + hours) * 60 + minutes) * 60 + seconds + fraction


def parse_llama_server_log(lines: Iterable[str]) -> list[TaskTimeline]:
    """Every task the log mentions, in launch order; lines of other kinds are ignored."""
    tasks: dict[int, TaskTimeline] = {}
    last_timed: TaskTimeline | None = None  # older builds print final timings without the task prefix
    # Slot choice and prompt-cache lines come before the task is launched, without its id.
    selection_by_slot: dict[int, str] = {}
    cache_hit, evictions = False, 0
    for line in lines:
        at = parse_timestamp(line)
        match = _TASK.search(line)
        if match is None:
            if last_timed is not None:
                _read_timings(last_timed, line)
            cache_hit = cache_hit or _CACHE_HIT.search(line) is not None
            evictions += 1 if _CACHE_EVICTION.search(line) else 0
            continue
        task_id, slot, message = int(match[3]), int(match[2]), match[4]
        if task_id < 0:
            if (selected := _SELECTED.search(message)) is not None:
                selection_by_slot[slot] = selected[1]
            continue
        task = tasks.setdefault(task_id, TaskTimeline(task=task_id, slot=slot))
        if "processing task" in message and at is not None:
            task.launch_s = at
            task.slot_selection = selection_by_slot.pop(slot, None)
            task.prompt_cache_hit, task.prompt_cache_evictions = cache_hit, evictions
            cache_hit, evictions = False, 0
        elif (release := _RELEASE.search(message)) is not None:
            task.release_s = at
            task.n_tokens_at_release = int(release[1])
        elif (rate := _TG.search(message)) is not None and at is not None:
            task.rate_samples.append(
                TokenRateSample(at_s=at, n_gen=int(rate[1]), tg=float(rate[2]), tg_3s=float(rate[3]))
            )
        elif (progress := _PROGRESS.search(message)) is not None and at is not None:
            task.prefill_progress.append(
                PrefillProgress(at_s=at, n_tokens=int(progress[1]), progress=float(progress[2]))
            )
        else:
            _read_timings(task, message)
        last_timed = task if match[1].strip() == "print_timing" else None
    return sorted(tasks.values(), key=lambda t: (t.launch_s is None, t.launch_s or 0.0, t.task))


def _read_timings(task: TaskTimeline, text: str) -> None:
    if (prompt := _PROMPT_EVAL.search(text)) is not None:
        task.prompt_ms, task.prompt_n = float(prompt[1]), int(prompt[2])
    elif (decode := _EVAL.search(text)) is not None:
        task.eval_ms, task.eval_n = float(decode[1]), int(decode[2])
