"""Queueing for a free slot: requests launched in the iteration that freed a slot while every other slot
was busy (the reader's facts), how long all slots were busy, and more slots as the fix."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.diagnose.analyses.base import analysis
from tuner.diagnose.reader import ReadContext, Task
from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyConstraint, StudyObjective, counted

__all__ = ["Queueing"]


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
