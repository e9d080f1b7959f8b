"""The registered analyses of a llama-server log. Each sees every task once, beside the tasks that ran
with it (`reader.py`), keeps compact aggregates, and reports its findings at the end: a finding only
where something cost the users time, so a clean log yields none.

The mechanisms are those of the source case study (serving-engines.md §1.6): each loop iteration gives
every decoding slot one token and fills the rest of the batch, up to n_batch, with prompt tokens, so a
stream decodes at about prefill speed / n_batch while another slot prefills; a slot whose LoRA setting
differs from the batch's is left out of it, so a request waits before its prefill starts, and that wait
is in no server timing.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tuner.diagnose.reader import Analysis, ReadContext, Task, activity
from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyConstraint, StudyObjective, counted
from tuner.metrics import PrefillStep, SwitchCost, switch_cost

__all__ = ["ANALYSES", "Reporting", "analysis", "new_analyses"]


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


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if len(values) else None


def _p95(values: Sequence[float]) -> float | None:
    if not len(values):
        return None
    ordered = sorted(values)
    rank = 0.95 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _bucket(chunk: int) -> int:
    """The power of two at or above a chunk: the n_batch a chunk of this size fits (2047 -> 2048)."""
    size = 1
    while size < chunk:
        size *= 2
    return size


def _fmt_speed(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


class _Worst:
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


# --- decode stalls during long prefills -----------------------------------------------------------------


@dataclass(slots=True)
class _Window:
    task: int
    slot: int
    start_s: float
    end_s: float
    prompt_n: int
    prompt_ms: float
    lines: tuple[int, int]
    longest_iteration_s: float | None
    stall_cost_s: float = 0.0


@dataclass(slots=True)
class _Overlap:
    window: tuple[int, int]  # (epoch, task) of the long prefill
    stream: int
    slot: int
    start_s: float
    end_s: float
    speed: float  # the stream's progress over the overlap, tok/s
    tg_3s: list[float]  # its tg_3s samples lying mostly inside the window
    line: int


@analysis("stalls")
class Stalls:
    """Streams beside another slot's long prefill: their speed there against elsewhere."""

    kind = "stalls"

    def __init__(self) -> None:
        self.normal = array("d")  # tg_3s samples outside every long prefill
        self.alone = array("d")  # decode speeds (eval time lines) of requests with no long prefill beside them
        self.by_width: dict[int, array[float]] = {}
        self.windows: dict[tuple[int, int], _Window] = {}
        self.overlaps: list[_Overlap] = []
        self.chunks: dict[int, list[float]] = {}  # bucket -> [batches, tokens, seconds]
        self.max_chunk = 0

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None:
        if not task.complete:
            return
        longest = self._chunks(task)
        long_others = [
            n
            for n in neighbours
            if n.complete and (n.prompt_n or 0) >= context.long_prompt_tokens and n.prefill_start_s < n.decode_start_s
        ]
        if (task.prompt_n or 0) >= context.long_prompt_tokens and task.prompt_ms:
            self.windows[(task.epoch, task.task)] = _Window(
                task=task.task,
                slot=task.slot,
                start_s=task.prefill_start_s,
                end_s=task.decode_start_s,
                prompt_n=task.prompt_n or 0,
                prompt_ms=task.prompt_ms,
                lines=(task.launch_line, task.release_line or task.launch_line),
                longest_iteration_s=longest,
            )
        decode = (task.decode_start_s, task.end_s)
        beside_long = any(min(decode[1], o.decode_start_s) > max(decode[0], o.prefill_start_s) for o in long_others)
        if not beside_long and task.eval_ms and (task.eval_n or 0) > 1:
            self.alone.append((task.eval_n or 0) * 1000.0 / task.eval_ms)
        usual = _median(
            [
                tg
                for a, b, tg in task.intervals()
                if not any(min(b, o.decode_start_s) > max(a, o.prefill_start_s) for o in long_others)
            ]
        )
        for other in long_others:
            start, end = max(decode[0], other.prefill_start_s), min(decode[1], other.decode_start_s)
            if end - start < context.min_overlap_s:
                continue
            inside = [tg for a, b, tg in task.intervals() if (min(b, end) - max(a, start)) >= 0.5 * (b - a)]
            self.overlaps.append(
                _Overlap(
                    window=(other.epoch, other.task),
                    stream=task.task,
                    slot=task.slot,
                    start_s=start,
                    end_s=end,
                    speed=task.tokens_inside(start, end, usual, other) / (end - start),
                    tg_3s=inside,
                    line=task.launch_line,
                )
            )
        decoding = [n for n in neighbours if n.complete]
        for a, b, tg in task.intervals():
            if any(min(b, o.decode_start_s) > max(a, o.prefill_start_s) for o in long_others):
                continue
            self.normal.append(tg)
            middle = (a + b) / 2
            width = 1 + sum(1 for n in decoding if n.decode_start_s <= middle <= n.end_s)
            self.by_width.setdefault(width, array("d")).append(tg)

    def _chunks(self, task: Task) -> float | None:
        longest = None
        for (t0, n0), (t1, n1) in itertools.pairwise(task.progress):
            step, seconds = n1 - n0, t1 - t0
            if step <= 0 or seconds <= 0:
                continue
            self.max_chunk = max(self.max_chunk, step)
            row = self.chunks.setdefault(_bucket(step), [0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += step
            row[2] += seconds
            longest = seconds if longest is None else max(longest, seconds)
        return longest

    def n_batch(self) -> int | None:
        return _bucket(self.max_chunk) if self.max_chunk >= 16 else None

    def chunk_speed(self, size: int) -> float | None:
        row = self.chunks.get(size)
        return row[1] / row[2] if row is not None and row[0] >= 2 and row[2] > 0 else None

    def profile(self) -> list[Figure]:
        figures = [
            Figure(
                name=f"prefill_tok_s_chunk_{size}",
                label=f"prefill speed, chunks of {size // 2 + 1}-{size} tokens ({int(row[0])} batches)",
                value=row[1] / row[2],
                unit="tok/s",
                group="prefill speed by chunk size",
            )
            for size, row in sorted(self.chunks.items(), reverse=True)
            if row[2] > 0
        ]
        figures += [
            Figure(
                name=f"decode_tok_s_width_{width}",
                label=f"decode speed with {width} slot{'s' if width > 1 else ''} decoding ({len(values)} rate lines)",
                value=_median(values),
                unit="tok/s",
                group="decode speed by batch width",
            )
            for width, values in sorted(self.by_width.items())
        ]
        return figures

    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]:
        results["stalls"] = self
        if not self.overlaps:
            return []
        normal, elsewhere = _median(self.normal), "rate lines outside long prefills"
        if normal is None:  # a short log: the streams printed no rate line outside the prefill
            normal, elsewhere = _median(self.alone), "requests that decoded with no long prefill beside them"
        stall = _median([o.speed for o in self.overlaps])
        assert stall is not None
        samples = [tg for o in self.overlaps for tg in o.tg_3s]
        stall_tg = _median(samples)
        if normal is None or stall >= 0.5 * normal:
            return []  # no speed elsewhere to compare with, or streams kept most of it: no finding
        worst = _Worst()
        lost_total = 0.0
        for overlap in self.overlaps:
            window = self.windows.get(overlap.window)
            seconds = overlap.end_s - overlap.start_s
            lost = seconds * max(0.0, 1.0 - overlap.speed / normal) if normal else 0.0
            lost_total += lost
            if window is None:
                continue
            window.stall_cost_s += lost
            speed = window.prompt_n / (window.prompt_ms / 1000.0)

            def evidence(o: _Overlap = overlap, w: _Window = window, s: float = speed) -> Evidence:
                return Evidence(
                    start_s=round(o.start_s, 3),
                    end_s=round(o.end_s, 3),
                    tasks=[w.task, o.stream],
                    slots=sorted({w.slot, o.slot}),
                    lines=sorted({w.lines[0], w.lines[1], o.line}),
                    note=f"task {o.stream} (slot {o.slot}) decoded at {_fmt_speed(o.speed)} tok/s for "
                    f"{o.end_s - o.start_s:.1f} s while task {w.task} (slot {w.slot}) prefilled "
                    f"{w.prompt_n:,} tokens at {_fmt_speed(s)} tok/s",
                )

            worst.add(lost if normal else seconds, evidence)
        used = [w for w in self.windows.values() if any(o.window[1] == w.task for o in self.overlaps)]
        prefill_ms = sum(w.prompt_ms for w in used)
        prefill = sum(w.prompt_n for w in used) / (prefill_ms / 1000.0) if prefill_ms > 0 else None
        iterations = [w.longest_iteration_s for w in used if w.longest_iteration_s is not None]
        figures = [
            Figure(
                name="stall_tok_s",
                label="streams' decode speed during another slot's long prefill",
                value=stall,
                unit="tok/s",
            ),
            Figure(
                name="stall_tg_3s",
                label="their tg_3s samples inside those prefills, median",
                value=stall_tg,
                unit="tok/s",
            ),
            Figure(name="stall_tg_3s_samples", label="tg_3s samples inside long prefills", value=float(len(samples))),
            Figure(
                name="unstalled_tok_s",
                label=f"decode speed elsewhere ({elsewhere}), median",
                value=normal,
                unit="tok/s",
            ),
            Figure(name="overlaps", label="stream/prefill overlaps", value=float(len(self.overlaps))),
            Figure(name="long_prefills", label="long prefills beside a stream", value=float(len(used))),
            Figure(
                name="long_prefill_tokens_max",
                label="largest of those prompts",
                value=float(max((w.prompt_n for w in used), default=0)),
                unit="tokens",
            ),
            Figure(name="prefill_tok_s", label="their prefill speed", value=prefill, unit="tok/s"),
            Figure(
                name="longest_iteration_s",
                label="longest loop iteration during them (a stream's longest wait for a token)",
                value=max(iterations) if iterations else None,
                unit="s",
            ),
            Figure(
                name="stalled_s",
                label="stream-seconds spent beside a long prefill",
                value=sum(o.end_s - o.start_s for o in self.overlaps),
                unit="s",
            ),
            Figure(
                name="user_seconds_lost",
                label="time the streams lost against their usual speed",
                value=lost_total,
                unit="s",
            ),
        ]
        ratio = (
            f", {normal / stall:,.0f}x slower than their {_fmt_speed(normal)} tok/s elsewhere"
            if normal and stall > 0
            else ""
        )
        summary = (
            f"streams decoded at {_fmt_speed(stall)} tok/s while another slot prefilled a long prompt{ratio} "
            f"({counted(len(self.overlaps), 'overlap')} beside {counted(len(used), 'prefill')} of up to "
            f"{max((w.prompt_n for w in used), default=0):,} tokens)"
        )
        return [
            Finding(
                kind="stalls",
                title="decode stalls during long prefills",
                summary=summary,
                user_seconds_lost=round(lost_total, 3) if normal else None,
                figures=figures,
                evidence=worst.items(),
                fixes=[self._fix(stall, prefill)],
            )
        ]

    def _fix(self, stall: float, prefill: float | None) -> Fix:
        current = self.n_batch()
        target = max(32, current // 4) if current is not None else 512
        speed_now = self.chunk_speed(current) if current is not None else None
        speed_then = self.chunk_speed(target)
        base = speed_now or prefill
        estimate = None
        if base is not None and base > 0:
            at_target = speed_then or base
            now = f"now {_fmt_speed(stall)} tok/s" + (f" at n_batch {current}" if current else "")
            estimate = (
                f"n_batch {target} would give about {_fmt_speed(at_target / target)} tok/s during prefills at this "
                f"server's {_fmt_speed(at_target)} tok/s of prefill ({now}): a stream gets one token per iteration, "
                f"and an iteration carries up to n_batch prompt tokens"
            )
        if speed_now and speed_then:
            cost = (
                f"prefill at chunks of {target} ran at {_fmt_speed(speed_then)} tok/s in this log against "
                f"{_fmt_speed(speed_now)} at {current} ({speed_then / speed_now - 1:+.0%})"
            )
        else:
            cost = (
                "the log has no prefill at that chunk size, so the study measures it (prefill_tok_s, held to 80% "
                "of the baseline's)"
            )
        return Fix(
            knob="n_batch",
            action=f"lower n_batch (LLAMA_ARG_BATCH) to about {target}, with n_ubatch at most as large",
            estimate=estimate,
            trade_off=f"long prompts prefill more slowly in smaller chunks: {cost}",
            study_params=["n_batch", "n_ubatch"],
            objectives=[
                StudyObjective(metric="stall_tok_s", direction="maximize", weight=1.0),
                StudyObjective(metric="prefill_tok_s", direction="maximize", weight=1.0),
                StudyObjective(metric="ttft_p95_s", direction="minimize", weight=0.5),
            ],
            constraints=[StudyConstraint(metric="prefill_tok_s", min_vs_baseline=0.8)],
        )


# --- waits before prefill -------------------------------------------------------------------------------

WAIT_CLASSES = {
    "other_lora": "another LoRA setting",
    "same_setting": "the same setting (behind another prompt)",
    "nothing": "nothing else running",
}


@analysis("waits")
class Waits:
    """Launch to the start of prefill, classified by what ran meanwhile."""

    kind = "waits"

    def __init__(self) -> None:
        self.with_wait = array("d")
        self.without_wait = array("d")
        self.totals: dict[str, list[float]] = {c: [0.0, 0.0, 0.0] for c in WAIT_CLASSES}  # count, seconds, max
        self.worst: dict[str, _Worst] = {c: _Worst(3) for c in WAIT_CLASSES}
        self.inferred = False

    @staticmethod
    def classify(task: Task, neighbours: Sequence[Task], context: ReadContext) -> tuple[str, bool]:
        """The wait's class and whether it rests on the log's own switch lines (-lv 4) or is inferred."""
        wait = task.wait_s
        act = activity((task.launch_s, task.prefill_start_s), neighbours, task)
        if act.any_s < 0.1 * wait:
            return "nothing", False
        if context.facts.verbose:
            switched = context.reserve_near(task.prefill_start_s) or task.lora_change_logged
            return ("other_lora" if switched else "same_setting"), False
        # Without trace lines: others decoded while it waited, with room in the batch (no prefill filling
        # it), and llama-server leaves out of a batch only the slots it cannot batch with: another LoRA setting.
        if act.decode_s >= 0.5 * wait and act.prefill_s < 0.5 * wait:
            return "other_lora", True
        return "same_setting", False

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None:
        if not task.complete or task.prompt_ms is None:
            return
        wait = task.wait_s
        self.with_wait.append(wait + task.prompt_ms / 1000.0)
        self.without_wait.append(task.prompt_ms / 1000.0)
        if wait < context.min_wait_s:
            return
        kind, inferred = self.classify(task, neighbours, context)
        self.inferred = self.inferred or inferred
        row = self.totals[kind]
        row[0] += 1
        row[1] += wait
        row[2] = max(row[2], wait)
        others = [n.task for n in neighbours if n.launch_s < task.prefill_start_s and n.end_s > task.launch_s][:6]

        def evidence() -> Evidence:
            return Evidence(
                start_s=round(task.launch_s, 3),
                end_s=round(task.prefill_start_s, 3),
                tasks=[task.task, *others],
                slots=[task.slot],
                lines=[task.launch_line, *([task.release_line] if task.release_line else [])],
                note=f"task {task.task} (slot {task.slot}) held its slot {wait:.1f} s before its prefill began; "
                f"meanwhile: {WAIT_CLASSES[kind]}",
                quote=task.quote,
            )

        self.worst[kind].add(wait, evidence)

    def profile(self) -> list[Figure]:
        return []

    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]:
        count = int(sum(row[0] for row in self.totals.values()))
        if count == 0:
            return []
        total = sum(row[1] for row in self.totals.values())
        longest = max(row[2] for row in self.totals.values())
        figures = [
            Figure(
                name="waits",
                label=f"requests that waited over {context.min_wait_s:g} s before prefill",
                value=float(count),
            ),
            Figure(name="wait_s", label="their waits in all", value=total, unit="s"),
            Figure(name="wait_max_s", label="the longest", value=longest, unit="s"),
        ]
        for kind, label in WAIT_CLASSES.items():
            n, seconds, peak = self.totals[kind]
            figures += [
                Figure(name=f"{kind}_count", label="requests", value=n, group=label),
                Figure(name=f"{kind}_s", label="waited in all", value=seconds, unit="s", group=label),
                Figure(name=f"{kind}_max_s", label="longest", value=peak if n else None, unit="s", group=label),
            ]
        figures += [
            Figure(
                name="ttft_p95_s",
                label="launch to first token, p95 (wait included)",
                value=_p95(self.with_wait),
                unit="s",
            ),
            Figure(
                name="prompt_eval_p95_s",
                label="prompt eval time alone, p95 (what the server's timings show)",
                value=_p95(self.without_wait),
                unit="s",
            ),
        ]
        lora = self.totals["other_lora"]
        parts = [
            f"{int(self.totals[k][0])} behind {WAIT_CLASSES[k]} ({self.totals[k][1]:.0f} s)"
            for k in WAIT_CLASSES
            if self.totals[k][0]
        ]
        summary = (
            f"{counted(count, 'request')} waited more than {context.min_wait_s:g} s before their prefill began "
            f"({total:.0f} s in all, up to {longest:.1f} s), a wait prompt eval time does not contain: "
            + ", ".join(parts)
        )
        fixes = []
        if lora[0]:
            how = (
                "inferred: the other slots decoded with room in the batch"
                if self.inferred
                else "from the log's switch lines"
            )
            fixes.append(
                Fix(
                    knob="lora_policy",
                    action="give every request the same adapter setting (lora_policy = all_on or all_off): "
                    "llama-server "
                    f"cannot batch slots whose adapters or scales differ ({how})",
                    estimate=f"removes about {lora[1]:.0f} s of waiting ({counted(lora[0], 'request')})",
                    trade_off="changes the answers of the requests whose setting changes: compare them first "
                    "(the study's correctness probes measure it; gate.allow_answer_changes must allow it)",
                    study_params=["lora_policy"],
                    objectives=[
                        StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0),
                        StudyObjective(metric="wait_p95_s", direction="minimize", weight=1.0),
                    ],
                )
            )
        if self.totals["same_setting"][0]:
            fixes.append(
                Fix(
                    knob="n_batch",
                    action="a prompt waits for the prefills of the slots before it (each batch is filled in slot "
                    "order); fewer or shorter long prompts shorten it (see where the long prefills come from)",
                    trade_off="more slots do not help: they share the same batch",
                    study_params=["n_batch", "n_ubatch"],
                    objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0)],
                )
            )
        return [
            Finding(
                kind="waits",
                title="waits before prefill",
                summary=summary,
                user_seconds_lost=round(total, 3),
                figures=figures,
                evidence=[e for kind in WAIT_CLASSES for e in self.worst[kind].items()],
                fixes=fixes,
            )
        ]


# --- where the long prefills come from ------------------------------------------------------------------

SOURCES = {
    "first_turn": "nothing of it cached: a first turn, or a conversation the server no longer held",
    "history_rewrite": "the conversation continued but its history was rewritten (a summary or an edit): the "
    "slot held its start and the cache missed the rest",
    "after_evictions": "nothing cached, after the RAM prompt cache had evicted entries",
    "long_message": "a long new message in a continuing conversation (its history was cached)",
    "truncated": "its prompt did not fit the slot's context (truncated or context shift)",
}


@dataclass(slots=True)
class _Long:
    task: int
    slot: int
    start_s: float
    prompt_n: int
    cached: int
    previous: int | None
    selection: str | None
    evictions_before: int
    cut: bool
    lines: tuple[int, int]
    key: tuple[int, int]


@analysis("long_prefills")
class LongPrefills:
    kind = "long_prefills"

    def __init__(self) -> None:
        self.long: list[_Long] = []
        self.cold_cached: Counter[int] = Counter()
        self.cut = 0

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None:
        if not task.complete or task.prompt_n is None:
            return
        cached = task.cached_tokens or 0
        previous = task.previous_prompt_on_slot
        continues = previous is not None and cached >= previous
        if not continues and len(self.cold_cached) < 10_000:
            self.cold_cached[cached] += 1
        cut = task.truncated or task.context_shifts > 0
        self.cut += cut
        if task.prompt_n >= context.long_prompt_tokens:
            self.long.append(
                _Long(
                    task=task.task,
                    slot=task.slot,
                    start_s=task.prefill_start_s,
                    prompt_n=task.prompt_n,
                    cached=cached,
                    previous=previous,
                    selection=task.selection,
                    evictions_before=task.evictions_before,
                    cut=cut,
                    lines=(task.launch_line, task.release_line or task.launch_line),
                    key=(task.epoch, task.task),
                )
            )

    def source(self, item: _Long, shared: int) -> str:
        if item.cut:
            return "truncated"
        if item.previous is not None and item.cached >= item.previous:
            return "long_message"
        if item.selection == "LCP" and item.cached > shared:
            return "history_rewrite"
        if item.evictions_before > 0:
            return "after_evictions"
        return "first_turn"

    def profile(self) -> list[Figure]:
        return []

    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]:
        stalls = results.get("stalls")
        windows = stalls.windows if isinstance(stalls, Stalls) else {}
        evictions = context.facts.eviction_count
        caused = {item.key: windows[item.key].stall_cost_s if item.key in windows else 0.0 for item in self.long}
        if not self.long or (sum(caused.values()) <= 0 and evictions == 0 and self.cut == 0):
            return []
        # The prefix every conversation shares (a system prompt) is what cold tasks reuse most often.
        shared = min(self.cold_cached.most_common(1)[0][0] if self.cold_cached else 0, 10**9)
        rows: dict[str, list[float]] = {s: [0.0, 0.0, 0.0] for s in SOURCES}  # count, tokens, stall cost
        worst = _Worst()
        for item in self.long:
            source = self.source(item, shared)
            row = rows[source]
            row[0] += 1
            row[1] += item.prompt_n
            row[2] += caused[item.key]

            def evidence(i: _Long = item, s: str = source) -> Evidence:
                return Evidence(
                    start_s=round(i.start_s, 3),
                    end_s=None,
                    tasks=[i.task],
                    slots=[i.slot],
                    lines=list(i.lines),
                    note=f"task {i.task}: {i.prompt_n:,} new tokens ({i.cached:,} cached): {SOURCES[s]}",
                )

            worst.add(item.prompt_n, evidence)
        figures = []
        for source, label in SOURCES.items():
            count, tokens, cost = rows[source]
            if count:
                figures += [
                    Figure(name=f"{source}_count", label="long prefills", value=count, group=label),
                    Figure(name=f"{source}_tokens", label="new tokens", value=tokens, unit="tokens", group=label),
                    Figure(
                        name=f"{source}_stall_s",
                        label="stream time they cost others",
                        value=cost,
                        unit="s",
                        group=label,
                    ),
                ]
        figures.append(
            Figure(name="prompt_cache_evictions", label="RAM prompt cache evictions", value=float(evictions))
        )
        top = sorted((s for s in SOURCES if rows[s][0]), key=lambda s: -rows[s][1])
        summary = (
            f"{counted(len(self.long), 'prefill')} of at least {context.long_prompt_tokens:,} new tokens: "
            + ", ".join(f"{int(rows[s][0])} {s.replace('_', ' ')} ({int(rows[s][1]):,} tokens)" for s in top)
        )
        if evictions:
            summary += f"; the RAM prompt cache evicted {counted(evictions, 'entry', 'entries')}"
        fixes = []
        if rows["history_rewrite"][0]:
            fixes.append(
                Fix(
                    knob=None,
                    action="when a conversation's history is summarized, keep its start and append (the cache "
                    "reuses only the common prefix); or send such turns when the server is quiet",
                    trade_off="an application change, not a server setting",
                )
            )
        if evictions or rows["after_evictions"][0]:
            fixes.append(
                Fix(
                    knob="cache_ram",
                    action="raise the RAM prompt cache (LLAMA_ARG_CACHE_RAM, MiB) so returning conversations' "
                    f"states stay cached ({counted(evictions, 'eviction')} in this log)",
                    trade_off="host RAM: each cached prompt holds its KV state",
                    study_params=["cache_ram"],
                    objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0)],
                )
            )
        if rows["truncated"][0]:
            fixes.append(
                Fix(
                    knob="kv_unified",
                    action="give slots more context (ctx_size, or kv_unified so one slot may use the whole cache)",
                    trade_off="memory: ctx_size is shared by the slots; kv_unified lets one long conversation "
                    "crowd out others",
                    study_params=["kv_unified"],
                    objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0)],
                )
            )
        cost = sum(caused.values())
        return [
            Finding(
                kind="long_prefills",
                title="where the long prefills come from",
                summary=summary,
                user_seconds_lost=round(cost, 3) if cost > 0 else None,
                figures=figures,
                evidence=worst.items(),
                fixes=fixes,
            )
        ]


# --- queueing for a free slot ---------------------------------------------------------------------------


@analysis("queueing")
class Queueing:
    kind = "queueing"

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None:
        return None

    def profile(self) -> list[Figure]:
        return []

    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]:
        facts = context.facts
        if facts.queued == 0:
            return []
        span = (facts.last_s or 0.0) - 0.0
        slots = facts.n_slots or max(facts.epochs_with_slots.values(), default=0)
        share = facts.all_busy_s / span if span > 0 else None
        summary = (
            f"{counted(facts.queued, 'request')} waited for a free slot: "
            + (f"all {slots} slots were" if slots != 1 else "the one slot was")
            + f" busy {facts.all_busy_s:.0f} s"
            + (f" ({share:.0%} of the log)" if share is not None else "")
            + "; the log does not say since when each had waited"
        )
        evidence = [
            Evidence(
                start_s=round(at, 3),
                end_s=None,
                tasks=[task],
                slots=[slot],
                lines=[line],
                note=f"task {task} launched on slot {slot} in the iteration that freed it, every other slot busy",
            )
            for at, task, slot, line in facts.queued_evidence[:5]
        ]
        return [
            Finding(
                kind="queueing",
                title="requests queued for a free slot",
                summary=summary,
                user_seconds_lost=None,
                figures=[
                    Figure(
                        name="queued",
                        label="requests launched as soon as a slot freed, all others busy",
                        value=float(facts.queued),
                    ),
                    Figure(name="all_slots_busy_s", label="time every slot was busy", value=facts.all_busy_s, unit="s"),
                    Figure(name="all_slots_busy_share", label="share of the log", value=share),
                    Figure(name="slots", label="slots", value=float(slots)),
                ],
                evidence=evidence,
                fixes=[
                    Fix(
                        knob="n_parallel",
                        action="more slots (LLAMA_ARG_N_PARALLEL), with kv_unified so they share the KV cache",
                        trade_off="without kv_unified each slot gets ctx_size / n_parallel of context; the slots "
                        "share the same compute, so each stream gets slower",
                        study_params=["n_parallel", "kv_unified"],
                        objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0)],
                        constraints=[StudyConstraint(metric="failures", max=0.0)],
                    )
                ],
            )
        ]


# --- the LoRA switch cost -------------------------------------------------------------------------------


@analysis("lora_switch")
class LoraSwitch:
    """The extra time of the first step after a change of adapter setting (metrics.switch_cost)."""

    kind = "lora_switch"

    def __init__(self) -> None:
        self.prompt_n = array("l")
        self.prompt_ms = array("d")
        self.flags = array("b")  # 1 after a switch, 0 steady, -1 unknown; +10 when it shared its steps
        self.cost: SwitchCost | None = None

    def observe(self, task: Task, neighbours: Sequence[Task], context: ReadContext) -> None:
        if not task.complete or not task.prompt_n or not task.prompt_ms:
            return
        start, first = task.prefill_start_s, task.decode_start_s
        others = [n for n in neighbours if n.complete]
        joined = any(n.prefill_start_s < start - 0.001 < n.end_s for n in others)
        if context.facts.verbose:
            after: int = 1 if context.reserve_near(start) else 0
        elif task.wait_s >= 0.1 and Waits.classify(task, neighbours, context)[0] == "other_lora":
            after = 1
        else:
            after = 0 if joined else -1
        shared = any(n.prefill_start_s < first and start < n.decode_start_s for n in others)
        self.prompt_n.append(task.prompt_n)
        self.prompt_ms.append(task.prompt_ms)
        self.flags.append(after + (10 if shared else 0))

    def measure(self) -> SwitchCost:
        steps = []
        for n, ms, flag in zip(self.prompt_n, self.prompt_ms, self.flags, strict=True):
            shared, after = flag >= 5, flag - 10 if flag >= 5 else flag
            steps.append(
                PrefillStep(prompt_n=n, prompt_ms=ms, after_switch=None if after < 0 else bool(after), shared=shared)
            )
        return switch_cost(steps)

    def profile(self) -> list[Figure]:
        return []

    def findings(self, context: ReadContext, results: dict[str, object]) -> list[Finding]:
        cost = self.cost = self.measure()
        results["lora_switch"] = cost
        if cost.ms is None or cost.ms <= 0 or cost.switches == 0:
            return []
        total = cost.ms * cost.switches / 1000.0
        return [
            Finding(
                kind="lora_switch",
                title="LoRA setting switches",
                summary=f"{counted(cost.switches, 'change')} of adapter setting, about {cost.ms:,.0f} ms each "
                f"({total:.1f} s in all): "
                "the first step after a change re-reserves the scheduler",
                user_seconds_lost=round(total, 3),
                figures=[
                    Figure(
                        name="lora_switch_ms",
                        label="extra time of the first prefill after a switch",
                        value=cost.ms,
                        unit="ms",
                    ),
                    Figure(name="switches", label="changes of adapter setting", value=float(cost.switches)),
                    Figure(
                        name="compared",
                        label="switched prefills compared with steady ones of their length",
                        value=float(cost.compared),
                    ),
                    Figure(name="steady", label="steady prefills to compare with", value=float(cost.steady)),
                ],
                fixes=[
                    Fix(
                        knob="lora_policy",
                        action="remove the switch rather than make it faster: one adapter setting for every request",
                        estimate=f"saves about {total:.1f} s here",
                        trade_off="changes answers of the requests whose setting changes",
                        study_params=["lora_policy"],
                        objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize", weight=1.0)],
                    )
                ],
            )
        ]
