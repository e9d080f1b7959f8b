"""vLLM's periodic stats lines (`Engine 000: Avg prompt throughput: ... Running: N reqs, Waiting: M reqs
[, Preemptions: P], GPU KV cache usage: K%`), and where given a `/metrics` scrape: queueing,
preemptions and KV-cache pressure over time. Read in one pass; only sums and a few worst lines stay.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tuner.diagnose.report import Evidence, Figure, Finding, Fix, StudyObjective, counted
from tuner.engines.llama_server_log import parse_timestamp

__all__ = ["VLLM_STATS", "VllmReader", "read_metrics_scrape"]

VLLM_STATS = re.compile(
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs(?:, Deferred: \d+ reqs)?(?:, Preemptions: (\d+))?, "
    r"GPU KV cache usage: ([\d.]+)%"
)
# vLLM's own prefix: `INFO 11-29 10:00:00 [loggers.py:123]` (month-day, no year).
_VLLM_TIME = re.compile(r"\b(?:INFO|DEBUG|WARNING) (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?")
_DEFAULT_INTERVAL_S = 10.0  # VLLM_LOG_STATS_INTERVAL
KV_PRESSURE = 90.0  # percent of the KV cache in use from which requests start to be preempted or held back


def _vllm_time(line: str) -> float | None:
    match = _VLLM_TIME.search(line)
    if match is None:
        return parse_timestamp(line)
    _month, day, hours, minutes, seconds = (int(g) for g in match.groups()[:5])
    fraction = float(f"0.{match[6]}") if match[6] else 0.0
    return ((day * 24 + hours) * 60 + minutes) * 60 + seconds + fraction


@dataclass(slots=True)
class VllmReader:
    lines: int = 0
    stats: int = 0
    first_s: float | None = None
    last_s: float | None = None
    previous_s: float | None = None
    waiting_intervals: int = 0
    waiting_s: float = 0.0  # seconds with at least one request waiting
    queued_request_s: float = 0.0  # requests waiting x seconds: the time requests spent queued
    waiting_max: int = 0
    running_max: int = 0
    preemptions: int = 0
    preempting_intervals: int = 0
    kv_max: float = 0.0
    kv_pressure_s: float = 0.0
    worst_wait: list[tuple[int, float, int]] = field(default_factory=list)  # (waiting, at, line)
    worst_preempt: list[tuple[int, float, int]] = field(default_factory=list)

    def feed(self, number: int, line: str) -> bool:
        self.lines = number
        match = VLLM_STATS.search(line)
        if match is None:
            return False
        at = _vllm_time(line)
        self.stats += 1
        if at is not None:
            if self.first_s is None:
                self.first_s = at
            at -= self.first_s
        interval = _DEFAULT_INTERVAL_S
        if at is not None and self.previous_s is not None and 0 < at - self.previous_s < 600:
            interval = at - self.previous_s
        self.previous_s = at if at is not None else None
        self.last_s = at
        running, waiting = int(match[3]), int(match[4])
        preempted = int(match[5]) if match[5] else 0
        kv = float(match[6])
        self.running_max = max(self.running_max, running)
        self.kv_max = max(self.kv_max, kv)
        if kv >= KV_PRESSURE:
            self.kv_pressure_s += interval
        if waiting:
            self.waiting_intervals += 1
            self.waiting_s += interval
            self.queued_request_s += waiting * interval
            self.waiting_max = max(self.waiting_max, waiting)
            self._keep(self.worst_wait, (waiting, at or 0.0, number))
        if preempted:
            self.preemptions += preempted
            self.preempting_intervals += 1
            self._keep(self.worst_preempt, (preempted, at or 0.0, number))
        return True

    @staticmethod
    def _keep(items: list[tuple[int, float, int]], item: tuple[int, float, int]) -> None:
        items.append(item)
        items.sort(key=lambda i: -i[0])
        del items[5:]

    def findings(self, scrape: dict[str, float]) -> list[Finding]:
        span = self.last_s if self.last_s else self.stats * _DEFAULT_INTERVAL_S
        findings = []
        if self.waiting_intervals:
            share = self.waiting_s / span if span else None
            figures = [
                Figure(name="waiting_s", label="time with requests waiting", value=self.waiting_s, unit="s"),
                Figure(name="waiting_share", label="share of the log", value=share),
                Figure(name="waiting_max", label="most requests waiting at once", value=float(self.waiting_max)),
                Figure(name="running_max", label="most requests running at once", value=float(self.running_max)),
                Figure(
                    name="queued_request_s",
                    label="request-seconds spent waiting (sampled)",
                    value=self.queued_request_s,
                    unit="s",
                ),
            ]
            if (
                "vllm:request_queue_time_seconds_count" in scrape
                and scrape["vllm:request_queue_time_seconds_count"] > 0
            ):
                mean = scrape["vllm:request_queue_time_seconds_sum"] / scrape["vllm:request_queue_time_seconds_count"]
                figures.append(
                    Figure(name="queue_time_mean_s", label="mean queue time (/metrics)", value=mean, unit="s")
                )
            findings.append(
                Finding(
                    kind="vllm_queueing",
                    title="requests waiting for the scheduler",
                    summary=f"requests waited in {self.waiting_intervals} of {self.stats} stats intervals "
                    f"({self.waiting_s:.0f} s), up to {self.waiting_max} at once beside {self.running_max} running",
                    user_seconds_lost=round(self.queued_request_s, 3),
                    figures=figures,
                    evidence=[self._evidence(i, "request", "waiting") for i in self.worst_wait],
                    fixes=[
                        Fix(
                            knob="max_num_seqs" if self.kv_max < KV_PRESSURE else "gpu_memory_utilization",
                            action="raise --max-num-seqs (more sequences per step)"
                            if self.kv_max < KV_PRESSURE
                            else "give the KV cache more memory (--gpu-memory-utilization) or shorten --max-model-len: "
                            f"the cache reached {self.kv_max:.0f}%",
                            trade_off="more sequences per step slow each one; more KV memory leaves less for "
                            "activations",
                            study_params=["max_num_seqs", "max_num_batched_tokens"],
                            objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize")],
                        )
                    ],
                )
            )
        preemptions = max(self.preemptions, int(scrape.get("vllm:num_preemptions_total", 0)))
        if preemptions or self.kv_pressure_s:
            findings.append(
                Finding(
                    kind="vllm_kv_pressure",
                    title="KV-cache pressure and preemptions",
                    summary=f"{counted(preemptions, 'preemption')} (recomputed from scratch); the KV cache was at "
                    f"{KV_PRESSURE:.0f}% or more for {self.kv_pressure_s:.0f} s, up to {self.kv_max:.1f}%",
                    user_seconds_lost=None,
                    figures=[
                        Figure(name="preemptions", label="preemptions", value=float(preemptions)),
                        Figure(
                            name="kv_pressure_s",
                            label=f"time at {KV_PRESSURE:.0f}% KV use or more",
                            value=self.kv_pressure_s,
                            unit="s",
                        ),
                        Figure(name="kv_usage_max", label="highest KV-cache use", value=self.kv_max, unit="%"),
                    ],
                    evidence=[self._evidence(i, "preemption", "") for i in self.worst_preempt],
                    fixes=[
                        Fix(
                            knob="gpu_memory_utilization",
                            action="more KV memory (--gpu-memory-utilization), or fewer sequences at once "
                            "(--max-num-seqs)",
                            trade_off="a preempted request is recomputed from its start; fewer sequences queue more",
                            study_params=["gpu_memory_utilization", "max_num_seqs"],
                            objectives=[StudyObjective(metric="ttft_p95_s", direction="minimize")],
                        )
                    ],
                )
            )
        return findings

    @staticmethod
    def _evidence(item: tuple[int, float, int], what: str, doing: str) -> Evidence:
        count, at, line = item
        note = f"{counted(count, what)} {doing} in this interval".replace("  ", " ")
        return Evidence(start_s=round(at, 3), end_s=None, lines=[line], note=note)


def read_metrics_scrape(lines: Iterable[str]) -> dict[str, float]:
    """A Prometheus text scrape: each series' value summed over its labels (NaN and comments skipped)."""
    totals: dict[str, float] = {}
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        labelled = "{" in line.split(" ", 1)[0]
        name, _, rest = line.partition("{") if labelled else line.partition(" ")
        words = (rest.rsplit("}", 1)[-1] if labelled else rest).split()
        value_text = words[0] if words else ""
        try:
            value = float(value_text)
        except ValueError:
            continue
        if math.isfinite(value):
            totals[name] = totals.get(name, 0.0) + value
    return totals
