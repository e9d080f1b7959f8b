"""Where the long prefills come from: first turns, rewritten histories, prompt-cache evictions, long new
messages, prompts cut to the slot's context; each source with its fix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.diagnose.analyses.base import Worst, analysis
from tuner.diagnose.analyses.stalls import Stalls
from tuner.diagnose.reader import ReadContext, Task
from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyObjective, counted

__all__ = ["SOURCES", "LongPrefills"]


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
        worst = Worst()
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
