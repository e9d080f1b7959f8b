"""One pass over a llama-server log, in bounded memory: each task's lines are gathered while it runs and,
once no running or future task can overlap it, handed to the analyses with the tasks that ran beside it,
then dropped. What stays is each analysis's compact aggregates.

Lines read: the current and older llama-server shapes (`tuner/engines/llama_server_log.py`), with or
without the `M.SS.mmm.uuu L` prefix, and journal output (`journalctl -u UNIT`: its time is used where
the server wrote none, as with Ollama's runner). A server restart (its start-up lines, or the clock going
back) starts a new epoch on one continuous clock.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tuner.engines.llama_server_log import parse_timestamp
from tuner.redact import redact

__all__ = ["Activity", "Analysis", "LogFacts", "Task", "read_llama_server_log"]

_TASK = re.compile(r"\bslot\s+(\S+): id\s+(\d+) \| task (-?\d+) \|\s?(.*)$")
_TG = re.compile(r"n_gen =\s*(\d+), tg =\s*([\d.]+) t/s, tg_3s =\s*([\d.]+) t/s")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+)(?:, truncated = (\d))?")
_SELECTED = re.compile(r"selected slot by (LCP|LRU)(?: similarity, f_sim_best = ([\d.]+).*?f_keep = ([\d.]+))?")
_PROGRESS = re.compile(r"prompt processing(?: progress)?, n_tokens =\s*(\d+)")
_BATCH_START = re.compile(r"cached n_tokens = (\d+), memory_seq_rm")
_CACHE_HIT = re.compile(r"found better prompt")
_EVICTION = re.compile(r"removing oldest entry")
_CONTEXT_SHIFT = re.compile(r"context shift")
_LORA_CHANGE = re.compile(r"clearing cache for lora change")
_RESERVE = re.compile(r"\bsched_reserve: reserving")
_N_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)")
_START = re.compile(r"llama_server: initializing|main: loading model|load_model: loading model")
_TRACE_LEVEL = re.compile(r"update_slots: all slots are idle|init_sampler:|sched_reserve:|server_strea")

# A restart shows as the clock going back by more than this (a log's own lines are never out of order by
# more than a few milliseconds).
_CLOCK_BACK_S = 2.0
# A task launched on a slot this soon after that slot's release was waiting for it (one loop iteration).
_SAME_ITERATION_S = 0.05
# Lines of one loop iteration, printed together.
_SAME_INSTANT_S = 0.01
# llama-server prints a prompt's progress after each batch once its prefill has run this long (>= 3 s).
_PROGRESS_AFTER_S = 3.0


@dataclass(slots=True)
class Task:
    """One task's account, on one continuous clock (seconds since the log's first timestamp)."""

    task: int
    slot: int
    epoch: int
    launch_s: float
    launch_line: int
    release_s: float | None = None
    release_line: int | None = None
    prompt_ms: float | None = None
    prompt_n: int | None = None
    eval_ms: float | None = None
    eval_n: int | None = None
    n_tokens_at_release: int | None = None
    truncated: bool = False
    selection: str | None = None
    f_keep: float | None = None
    cache_hit: bool = False
    evictions_before: int = 0  # prompt-cache evictions logged since the log began, at its launch
    context_shifts: int = 0
    lora_change_logged: bool = False  # -lv 4: "clearing cache for lora change" as it was placed
    previous_prompt_on_slot: int | None = None  # the prompt length of the task before it on its slot
    queued: bool = False  # launched in the iteration that freed its slot while every other slot was busy
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # (at, n_gen, tg_3s)
    progress: list[tuple[float, int]] = field(default_factory=list)  # (at, n_tokens): prefill batches
    quote: str | None = None  # its launch line, redacted

    @property
    def complete(self) -> bool:
        return None not in (self.release_s, self.prompt_ms, self.eval_ms, self.eval_n)

    @property
    def prompt_tokens(self) -> int | None:
        if self.n_tokens_at_release is None or self.eval_n is None:
            return None
        return self.n_tokens_at_release + 1 - self.eval_n

    @property
    def cached_tokens(self) -> int | None:
        total = self.prompt_tokens
        return None if total is None or self.prompt_n is None else max(0, total - self.prompt_n)

    @property
    def prefill_start_s(self) -> float:
        return self.decode_start_s - (self.prompt_ms or 0.0) / 1000.0

    @property
    def decode_start_s(self) -> float:
        end = self.release_s if self.release_s is not None else self.launch_s
        return max(self.launch_s, end - (self.eval_ms or 0.0) / 1000.0)

    @property
    def wait_s(self) -> float:
        """Launch to the start of prefill: in no server timing."""
        return max(0.0, self.prefill_start_s - self.launch_s)

    def tokens_inside(self, start: float, end: float, usual_tok_s: float | None, beside: Task | None = None) -> float:
        """Tokens the stream generated in (start, end): whole between its rate lines (printed as a token
        came, so they are exact points). In a stretch that crosses `start` or `end`: where `beside` is the
        long prefill and its iterations in that part are all logged, one token per iteration (each loop
        iteration gives every decoding slot one token); else what is left after the time outside ran at
        the stream's usual speed."""
        points = [(self.decode_start_s, 1.0), *((at, float(n)) for at, n, _ in self.samples)]
        if self.release_s is not None and self.eval_n is not None:
            points.append((self.release_s, float(self.eval_n)))
        points.sort()
        iterations, known_from = beside.iteration_ends() if beside is not None else ([], math.inf)
        total = 0.0
        for (t0, n0), (t1, n1) in itertools.pairwise(points):
            if t1 <= start or t0 >= end or t1 <= t0:
                continue
            outside = max(0.0, start - t0) + max(0.0, t1 - end)
            part = (max(t0, start), min(t1, end))
            if outside == 0.0:
                total += n1 - n0
            elif part[0] >= known_from:
                # A token at an iteration's end is printed in the same instant: ends within 10 ms of the
                # part's start belong to the token before it.
                total += min(
                    n1 - n0, sum(1 for at in iterations if part[0] + _SAME_INSTANT_S < at <= part[1] + _SAME_INSTANT_S)
                )
            elif beside is not None and (iteration_s := beside.unlogged_iteration_s()) is not None:
                # Before the progress lines begin, the prefill's iterations are not logged, but their length
                # is (its first line's time over the batches before it): one token each, then those logged.
                unlogged = (min(part[1], known_from) - part[0]) / iteration_s
                logged = sum(1 for at in iterations if known_from < at <= part[1] + _SAME_INSTANT_S)
                total += min(n1 - n0, unlogged + logged)
            elif usual_tok_s is not None:
                total += max(0.0, (n1 - n0) - usual_tok_s * outside)
            else:
                total += (n1 - n0) * (1.0 - outside / (t1 - t0))
        return total

    def unlogged_iteration_s(self) -> float | None:
        """How long each prefill iteration before the first progress line took: the time to that line over
        the batches it counts. The batch size is the lines' steps; with one line, it is one batch where no
        two fit: the batch after it (the prompt's rest) is more than half of it, or the line came more than
        twice the lines' delay in (the batch it ends began before the delay). None where it cannot tell."""
        if not self.progress:
            return None
        first_at, first_n = self.progress[0]
        seconds = first_at - self.prefill_start_s
        if seconds <= 0:
            return None
        steps = [n1 - n0 for (_, n0), (_, n1) in itertools.pairwise(self.progress) if n1 > n0]
        if steps:
            batches = first_n / statistics.median(steps)
            return seconds / batches if batches >= 1 else None
        return seconds if self._first_line_ends_the_first_batch() else None

    def _first_line_ends_the_first_batch(self) -> bool:
        """One progress line, and no room for two batches before it: the rest of the prompt after it is more
        than half of it (a batch is at least as large as the last), or it came more than twice the lines'
        delay in (the batch it ends began before the delay, else an earlier one would have printed)."""
        if len(self.progress) != 1:
            return False
        first_at, first_n = self.progress[0]
        rest = (self.prompt_n or 0) - first_n
        return 2 * rest > first_n or first_at - self.prefill_start_s > 2 * _PROGRESS_AFTER_S

    def iteration_ends(self) -> tuple[list[float], float]:
        """The ends of this task's prefill iterations that the log shows, and the time from which it shows
        every one: the progress lines come after each batch once prefill has run `_PROGRESS_AFTER_S` (older
        builds: after every batch), and the last batch ends where decoding starts."""
        ends = [at for at, _ in self.progress if at < self.decode_start_s - _SAME_INSTANT_S]
        ends.append(self.decode_start_s)
        known_from = self.prefill_start_s + _PROGRESS_AFTER_S
        if self._first_line_ends_the_first_batch():
            known_from = self.prefill_start_s  # the line is the first batch's end: none came before it
        elif self.progress:
            known_from = min(known_from, self.progress[0][0])
        elif self.decode_start_s - self.prefill_start_s > _PROGRESS_AFTER_S:
            # A prefill past the lines' delay without one line was one iteration (a batch ending after the
            # delay would have printed one): its only end is where decoding starts, so every end is known.
            known_from = self.prefill_start_s
        return ends, known_from

    def intervals(self) -> list[tuple[float, float, float]]:
        """(start, end, tok/s) of each rate line: the first covers the time since the first token (its `tg`),
        the others the time since the line before (`tg_3s`)."""
        spans = []
        previous = self.decode_start_s
        for index, (at, n_gen, tg_3s) in enumerate(self.samples):
            rate = (n_gen - 1) / (at - previous) if index == 0 and at > previous else tg_3s
            if at > previous:
                spans.append((previous, at, rate))
            previous = at
        return spans

    @property
    def end_s(self) -> float:
        return self.release_s if self.release_s is not None else self.launch_s

    def tokens_between(self, start: float, end: float) -> float:
        """Decode progress in (start, end): the generated count interpolated between the first token,
        the `n_gen` lines and the release (the server-side twin of the client's token times)."""
        points = [(self.decode_start_s, 1.0), *((at, float(n)) for at, n, _ in self.samples)]
        if self.release_s is not None and self.eval_n is not None:
            points.append((self.release_s, float(self.eval_n)))
        points.sort()
        return _interpolate(points, end) - _interpolate(points, start)


def _interpolate(points: Sequence[tuple[float, float]], at: float) -> float:
    if at <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if at <= t1:
            return v0 + (v1 - v0) * ((at - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return points[-1][1]


@dataclass(slots=True)
class LogFacts:
    """What the reader learnt beside the tasks."""

    lines: int = 0
    matched_lines: int = 0
    first_s: float | None = None
    last_s: float | None = None
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    verbose: bool = False
    restarts: int = 0
    epochs_with_slots: dict[int, int] = field(default_factory=dict)
    evictions: list[tuple[float, int]] = field(default_factory=list)  # first few (time, line)
    eviction_count: int = 0
    unfinished: int = 0
    untimed_lines: int = 0
    all_busy_s: float = 0.0
    queued: int = 0
    queued_evidence: list[tuple[float, int, int, int]] = field(default_factory=list)  # (at, task, slot, line)
    errors: list[tuple[float, int, str]] = field(default_factory=list)  # first few error lines, redacted


@dataclass(frozen=True, slots=True)
class Activity:
    """What a task's neighbours were doing in a span: seconds of it covered by another's prefill, by
    another's decode, and by anything of another."""

    prefill_s: float
    decode_s: float
    any_s: float


class Analysis(Protocol):
    """A registered analysis: it sees each task once, with the tasks that overlapped it, then reports."""

    kind: str

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None: ...


@dataclass(slots=True)
class ReadContext:
    """Shared by the analyses: the log's facts, the settings of the read, and the switch evidence."""

    facts: LogFacts
    long_prompt_tokens: int
    min_overlap_s: float
    min_wait_s: float
    since_s: float | None
    until_s: float | None
    reserves: deque[float] = field(default_factory=deque)  # -lv 4 "sched_reserve" times, a short history

    def reserve_near(self, at: float, tolerance: float = 0.05) -> bool:
        return any(abs(r - at) <= tolerance for r in self.reserves)


def covered(task_span: tuple[float, float], spans: Iterable[tuple[float, float]]) -> float:
    """Seconds of `task_span` inside the union of `spans`."""
    start, end = task_span
    clipped = sorted((max(start, a), min(end, b)) for a, b in spans if min(end, b) > max(start, a))
    total, until = 0.0, start
    for a, b in clipped:
        begin = max(a, until)
        if b > begin:
            total += b - begin
            until = b
    return total


def activity(span: tuple[float, float], neighbours: Sequence[Task], exclude: Task) -> Activity:
    others = [n for n in neighbours if n is not exclude and n.complete]
    prefills = [(n.prefill_start_s, n.decode_start_s) for n in others]
    decodes = [(n.decode_start_s, n.end_s) for n in others]
    return Activity(
        prefill_s=covered(span, prefills), decode_s=covered(span, decodes), any_s=covered(span, prefills + decodes)
    )


class _Reader:
    def __init__(self, analyses: Sequence[Analysis], context: ReadContext) -> None:
        self.analyses = analyses
        self.context = context
        self.facts = context.facts
        self.running: dict[int, Task] = {}  # task id -> task (this epoch)
        self.done: list[Task] = []  # released, kept while a later task may need them as neighbours
        self.unseen: list[Task] = []  # released, not yet analyzed
        self.epoch = 0
        self.offset = 0.0  # added to the server's clock: the epochs' clocks joined into one
        self.raw_last: float | None = None
        self.now = 0.0
        self.selection: dict[int, tuple[str, float | None]] = {}
        self.cache_hit = False
        self.lora_change: set[int] = set()
        self.last_prompt: dict[int, int] = {}
        self.last_release: dict[int, float] = {}
        self.last_timed: Task | None = None
        self.busy_since: float | None = None
        self.reserves_this_epoch = 0

    # --- the clock ------------------------------------------------------------------------------------

    def _clock(self, line: str) -> float | None:
        raw = parse_timestamp(line)
        if raw is None:
            return None
        if self.raw_last is not None and raw < self.raw_last - _CLOCK_BACK_S:
            self._new_epoch()
            self.offset = self.now - raw
        self.raw_last = raw
        at = raw + self.offset
        if self.facts.first_s is None:
            self.facts.first_s = at
        self.now = max(self.now, at)
        return at - self.facts.first_s

    def _new_epoch(self) -> None:
        self.facts.unfinished += len(self.running)
        self.running.clear()
        self._close_busy(self.now - (self.facts.first_s or 0.0))
        self.epoch += 1
        self.facts.restarts += 1
        self.selection.clear()
        self.last_prompt.clear()
        self.last_release.clear()
        self.lora_change.clear()
        self.reserves_this_epoch = 0
        self._advance()

    # --- lines ----------------------------------------------------------------------------------------

    def feed(self, number: int, line: str) -> None:
        self.facts.lines = number
        at = self._clock(line)
        if _START.search(line) and (self.running or self.done or self.unseen):
            self._new_epoch()
        if at is None:
            if self.last_timed is not None and (_PROMPT_EVAL.search(line) or _EVAL.search(line)):
                self._timings(self.last_timed, line)
                self.facts.matched_lines += 1
            elif _TASK.search(line) is not None:
                self.facts.untimed_lines += 1
            return
        self.facts.last_s = at
        match = _TASK.search(line)
        if match is None:
            self._server_line(at, number, line)
            return
        self.facts.matched_lines += 1
        function, slot, task_id, message = match[1].strip(), int(match[2]), int(match[3]), match[4]
        self.last_timed = None
        if task_id < 0:
            if (selected := _SELECTED.search(message)) is not None:
                self.selection[slot] = (selected[1], float(selected[3]) if selected[3] else None)
            elif _LORA_CHANGE.search(message):
                self.lora_change.add(slot)
            return
        if "processing task" in message:
            self._launch(at, number, slot, task_id, line)
            return
        task = self.running.get(task_id)
        if task is None:
            return  # a task launched before the log began (or before --since's epoch)
        if (release := _RELEASE.search(message)) is not None:
            task.n_tokens_at_release = int(release[1])
            task.truncated = release[2] == "1"
            self._release(task, at, number)
        elif (rate := _TG.search(message)) is not None:
            task.samples.append((at, int(rate[1]), float(rate[3])))
        elif (progress := _PROGRESS.search(message)) is not None:
            task.progress.append((at, int(progress[1])))
        elif (batch := _BATCH_START.search(message)) is not None:
            task.progress.append((at, int(batch[1])))
        elif _CONTEXT_SHIFT.search(message):
            task.context_shifts += 1
        else:
            self._timings(task, message)
            if function == "print_timing":
                self.last_timed = task

    def _server_line(self, at: float, number: int, line: str) -> None:
        if (slots := _N_SLOTS.search(line)) is not None:
            self.facts.n_slots, self.facts.n_ctx_slot = int(slots[1]), int(slots[2])
            self.facts.matched_lines += 1
        elif _EVICTION.search(line):
            self.facts.eviction_count += 1
            if len(self.facts.evictions) < 20:
                self.facts.evictions.append((at, number))
            self.facts.matched_lines += 1
        elif _CACHE_HIT.search(line):
            self.cache_hit = True
        elif _RESERVE.search(line):
            self.reserves_this_epoch += 1
            if self.reserves_this_epoch > 1:  # the first is the server's first decode, not a switch
                self.context.reserves.append(at)
        elif " E " in line and "send_error" in line and len(self.facts.errors) < 5:
            self.facts.errors.append((at, number, redact(line.strip())[:300]))
        if not self.facts.verbose and _TRACE_LEVEL.search(line):
            self.facts.verbose = True

    def _timings(self, task: Task, text: str) -> None:
        if (prompt := _PROMPT_EVAL.search(text)) is not None:
            task.prompt_ms, task.prompt_n = float(prompt[1]), int(prompt[2])
        elif (decode := _EVAL.search(text)) is not None:
            task.eval_ms, task.eval_n = float(decode[1]), int(decode[2])

    def _slots(self) -> int:
        return self.facts.n_slots or self.facts.epochs_with_slots.get(self.epoch, 1)

    def _launch(self, at: float, number: int, slot: int, task_id: int, line: str) -> None:
        seen = self.facts.epochs_with_slots
        seen[self.epoch] = max(seen.get(self.epoch, 0), slot + 1)
        selection, f_keep = self.selection.pop(slot, (None, None))
        released = self.last_release.get(slot)
        queued = released is not None and at - released <= _SAME_ITERATION_S and len(self.running) >= self._slots() - 1
        task = Task(
            task=task_id,
            slot=slot,
            epoch=self.epoch,
            launch_s=at,
            launch_line=number,
            selection=selection,
            f_keep=f_keep,
            cache_hit=self.cache_hit,
            evictions_before=self.facts.eviction_count,
            lora_change_logged=slot in self.lora_change,
            previous_prompt_on_slot=self.last_prompt.get(slot),
            queued=queued,
            quote=redact(line.strip())[:300],
        )
        self.cache_hit = False
        self.lora_change.discard(slot)
        if queued:
            self.facts.queued += 1
            if len(self.facts.queued_evidence) < 10:
                self.facts.queued_evidence.append((at, task_id, slot, number))
        self.running[task_id] = task
        if len(self.running) >= self._slots() and self.busy_since is None:
            self.busy_since = at

    def _release(self, task: Task, at: float, number: int) -> None:
        task.release_s, task.release_line = at, number
        del self.running[task.task]
        self._close_busy(at)
        self.last_release[task.slot] = at
        if task.prompt_tokens is not None:
            self.last_prompt[task.slot] = task.prompt_tokens
        self.done.append(task)
        self.unseen.append(task)
        self._advance()

    def _close_busy(self, at: float) -> None:
        if self.busy_since is not None and len(self.running) < self._slots():
            self.facts.all_busy_s += max(0.0, at - self.busy_since)
            self.busy_since = None

    def _advance(self, final: bool = False) -> None:
        """Analyzes the released tasks no running or later task can overlap, and drops those no task
        left to analyze can overlap."""
        frontier = math.inf if final else min((t.launch_s for t in self.running.values()), default=math.inf)
        ready = [t for t in self.unseen if t.end_s < frontier]
        if ready:
            self.unseen = [t for t in self.unseen if t.end_s >= frontier]
            for task in sorted(ready, key=lambda t: t.launch_s):
                neighbours = [
                    n for n in self.done if n is not task and n.launch_s < task.end_s and n.end_s > task.launch_s
                ]
                if self._in_range(task):
                    for analysis in self.analyses:
                        analysis.observe(task, neighbours, self.context)
            keep_from = min((t.launch_s for t in (*self.unseen, *self.running.values())), default=math.inf)
            self.done = [t for t in self.done if t.end_s >= keep_from]
            # samples and progress of analyzed tasks are no longer needed once nobody left can see them
            while self.context.reserves and self.context.reserves[0] < keep_from - 1.0:
                self.context.reserves.popleft()

    def _in_range(self, task: Task) -> bool:
        since, until = self.context.since_s, self.context.until_s
        return (since is None or task.launch_s >= since) and (until is None or task.launch_s <= until)

    def finish(self) -> None:
        self.facts.unfinished += len(self.running)
        self._close_busy(self.now - (self.facts.first_s or 0.0))
        self.running.clear()
        self._advance(final=True)


def read_llama_server_log(lines: Iterable[tuple[int, str]], analyses: Sequence[Analysis], context: ReadContext) -> None:
    """Feeds every (line number, text) to the analyses' tasks; `context.facts` holds the rest."""
    reader = _Reader(analyses, context)
    for number, line in lines:
        reader.feed(number, line)
    reader.finish()
