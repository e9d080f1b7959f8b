"""The LoRA switch cost: what a change of the applied adapter setting costs a batch, measured from the
log (`metrics.switch_cost`)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from tuner.diagnose.analyses.base import analysis
from tuner.diagnose.analyses.waits import Waits
from tuner.diagnose.reader import ReadContext, Task
from tuner.diagnose.report import Figure, Finding, Fix, StudyObjective, counted
from tuner.metrics import PrefillStep, SwitchCost, switch_cost

__all__ = ["LoraSwitch"]


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
