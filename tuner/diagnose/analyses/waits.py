"""Waits before prefill: a request's time from launch to the start of its prefill, classified by what ran
meanwhile (another LoRA setting, the same one behind another prompt, nothing), a wait no server timing shows."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from tuner.diagnose.analyses.base import Worst, analysis, p95
from tuner.diagnose.reader import ReadContext, Task, activity
from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyObjective, counted

__all__ = ["WAIT_CLASSES", "Waits"]


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
        self.worst: dict[str, Worst] = {c: Worst(3) for c in WAIT_CLASSES}
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
                value=p95(self.with_wait),
                unit="s",
            ),
            Figure(
                name="prompt_eval_p95_s",
                label="prompt eval time alone, p95 (what the server's timings show)",
                value=p95(self.without_wait),
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
