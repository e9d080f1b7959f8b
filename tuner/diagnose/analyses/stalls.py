"""Decode stalls: streams beside another slot's long prefill, their speed there against elsewhere, and
the n_batch that would shorten the stall."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.diagnose.analyses.base import Worst, analysis, bucket, fmt_speed, median
from tuner.diagnose.reader import ReadContext, Task
from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyConstraint, StudyObjective, counted

__all__ = ["UNREADABLE_TOK_S", "Stalls"]

# Below this a stream is a frozen screen, whatever it decodes elsewhere: people read 3 to 5 words a second,
# several tokens; a log with no speed to compare with is still a finding under it.
UNREADABLE_TOK_S = 1.0
# A request's decode speed counts as its server's speed alone from this many tokens: a long prompt's own few
# answer tokens (a summary's first words) time its first steps more than the server's decoding.
_ALONE_MIN_TOKENS = 8
# The smallest n_batch a study of this finding tries (tuner/diagnose/study.py's ladder starts there).
_SMALLEST_N_BATCH = 32


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
        # Set by `findings` (which the notes follow): streams beside long prefills, no speed elsewhere, none
        # under the floor.
        self.nothing_to_compare = False
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
        if not beside_long and task.eval_ms and (task.eval_n or 0) >= _ALONE_MIN_TOKENS:
            self.alone.append((task.eval_n or 0) * 1000.0 / task.eval_ms)
        usual = median(
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
        steps = list(itertools.pairwise(task.progress))
        if task.progress and not steps and task.unlogged_iteration_s() is not None:
            # One progress line, known to end the prefill's first batch (Task.unlogged_iteration_s): a chunk.
            steps = [((task.prefill_start_s, 0), task.progress[0])]
        for (t0, n0), (t1, n1) in steps:
            step, seconds = n1 - n0, t1 - t0
            if step <= 0 or seconds <= 0:
                continue
            self.max_chunk = max(self.max_chunk, step)
            row = self.chunks.setdefault(bucket(step), [0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += step
            row[2] += seconds
            longest = seconds if longest is None else max(longest, seconds)
        return longest

    def n_batch(self) -> int | None:
        return bucket(self.max_chunk) if self.max_chunk >= 16 else None

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
                value=median(values),
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
        normal, elsewhere = median(self.normal), "rate lines outside long prefills"
        if normal is None:  # a short log: the streams printed no rate line outside the prefill
            normal, elsewhere = median(self.alone), "requests that decoded with no long prefill beside them"
        stall = median([o.speed for o in self.overlaps])
        assert stall is not None
        samples = [tg for o in self.overlaps for tg in o.tg_3s]
        stall_tg = median(samples)
        if normal is None and stall >= UNREADABLE_TOK_S:
            self.nothing_to_compare = True
            return []  # nothing to compare with, and not so slow that nobody could read along: no finding
        if normal is not None and stall >= 0.5 * normal:
            return []  # streams kept most of their speed: no finding
        worst = Worst()
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
                    note=f"task {o.stream} (slot {o.slot}) decoded at {fmt_speed(o.speed)} tok/s for "
                    f"{o.end_s - o.start_s:.1f} s while task {w.task} (slot {w.slot}) prefilled "
                    f"{w.prompt_n:,} tokens at {fmt_speed(s)} tok/s",
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
                label=f"decode speed elsewhere ({elsewhere}), median"
                if normal is not None
                else f"decode speed elsewhere: none in this log (a stream under {UNREADABLE_TOK_S:g} tok/s is "
                "a frozen screen whatever its usual speed)",
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
        if normal is None:
            ratio = f", under the {UNREADABLE_TOK_S:g} tok/s a reader can follow (no speed elsewhere in this log)"
        elif stall > 0:
            ratio = f", {normal / stall:,.0f}x slower than their {fmt_speed(normal)} tok/s elsewhere"
        else:
            ratio = ""
        summary = (
            f"streams decoded at {fmt_speed(stall)} tok/s while another slot prefilled a long prompt{ratio} "
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
        if current is not None and current <= _SMALLEST_N_BATCH:
            return self._floor_fix(current, prefill)
        target = max(_SMALLEST_N_BATCH, current // 4) if current is not None else 512
        speed_now = self.chunk_speed(current) if current is not None else None
        speed_then = self.chunk_speed(target)
        base = speed_now or prefill
        estimate = None
        if base is not None and base > 0:
            at_target = speed_then or base
            now = f"now {fmt_speed(stall)} tok/s" + (f" at n_batch {current}" if current else "")
            estimate = (
                f"n_batch {target} would give about {fmt_speed(at_target / target)} tok/s during prefills at this "
                f"server's {fmt_speed(at_target)} tok/s of prefill ({now}): a stream gets one token per iteration, "
                f"and an iteration carries up to n_batch prompt tokens"
            )
        if speed_now and speed_then:
            cost = (
                f"prefill at chunks of {target} ran at {fmt_speed(speed_then)} tok/s in this log against "
                f"{fmt_speed(speed_now)} at {current} ({speed_then / speed_now - 1:+.0%})"
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

    def _floor_fix(self, current: int, prefill: float | None) -> Fix:
        """At the smallest n_batch a study tries, smaller chunks cannot shorten the stall: each iteration
        already carries few prompt tokens, and its cost is the prefill's own speed."""
        iteration = (
            f"takes {current / prefill:.2f} s at this server's {fmt_speed(prefill)} tok/s of prefill"
            if prefill
            else "is the streams' wait for each token"
        )
        return Fix(
            knob=None,
            action=f"n_batch is already {current}, the smallest a study tries: a smaller one would not help the "
            "streams, only slow every long prompt",
            estimate=f"an iteration of {current} prompt tokens {iteration}, and a stream beside it gets one token "
            "per iteration",
            trade_off="what is left is the prefill's speed itself: a faster device or more threads, or fewer "
            "long prompts at once (fewer slots)",
        )
