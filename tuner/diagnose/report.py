"""The `tuner diagnose` document: findings with their figures, evidence and fixes, strict and versioned.

`--json` prints a `Diagnosis` as it is here; a reader of version N refuses anything newer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DIAGNOSIS_VERSION",
    "Diagnosis",
    "Evidence",
    "Figure",
    "Finding",
    "Fix",
    "ServerFacts",
    "StudyConstraint",
    "StudyObjective",
    "counted",
]

DIAGNOSIS_VERSION = 1


def counted(count: float, word: str, many: str | None = None) -> str:
    """`1 request`, `2 requests`, `1,204 requests` (`many` where the plural is not the word and an s)."""
    number = int(count)
    return f"{number:,} {word if number == 1 else many or word + 's'}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Figure(_Strict):
    """One number a finding rests on; `group` names the row of a table it belongs to (a wait class, a
    chunk size), None for a figure of its own."""

    name: str = Field(description="Stable machine name, e.g. stall_tok_s.")
    label: str = Field(description="What it is, in words.")
    value: float | None = Field(description="None where the log cannot give it.")
    unit: str = ""
    group: str | None = None


class Evidence(_Strict):
    """Where in the log to look: a time range on the log's clock, the tasks and slots, the line numbers."""

    start_s: float | None = Field(description="Seconds since the log's first timestamp.")
    end_s: float | None
    tasks: list[int] = Field(default_factory=list)
    slots: list[int] = Field(default_factory=list)
    lines: list[int] = Field(default_factory=list, description="1-based line numbers in the input.")
    note: str = ""
    quote: str | None = Field(default=None, description="A log line, secrets redacted.")


class StudyObjective(_Strict):
    metric: str
    direction: Literal["maximize", "minimize"]
    weight: float = 1.0


class StudyConstraint(_Strict):
    metric: str
    min_vs_baseline: float | None = None
    max: float | None = None


class Fix(_Strict):
    """The knob that addresses a finding, what to expect and what it costs."""

    knob: str | None = Field(description="The setting to change (a search-space knob), or None.")
    action: str
    estimate: str | None = Field(default=None, description="The number the mechanism gives, where it gives one.")
    trade_off: str
    study_params: list[str] = Field(default_factory=list, description="Knobs a study of this finding tunes.")
    objectives: list[StudyObjective] = Field(default_factory=list)
    constraints: list[StudyConstraint] = Field(default_factory=list)


class Finding(_Strict):
    kind: str = Field(description="The analysis that made it: stalls, waits, long_prefills, queueing, lora_switch, ...")
    title: str
    summary: str = Field(description="One line: what happened, with its size.")
    user_seconds_lost: float | None = Field(
        description="What it cost the users, in seconds summed over requests; findings are ordered by it, "
        "worst first (None: the log cannot say, listed after those that can)."
    )
    figures: list[Figure] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    fixes: list[Fix] = Field(default_factory=list)


class ServerFacts(_Strict):
    """What the log says about the server itself."""

    n_slots: int | None = None
    n_ctx_slot: int | None = None
    n_batch: int | None = Field(default=None, description="Inferred from the largest prefill chunk, if seen.")
    verbose_log: bool = Field(default=False, description="Trace-level lines (-lv 4) were present.")
    restarts: int = 0
    engine: Literal["llama-server", "ollama", "vllm"] = Field(
        default="llama-server",
        description="The server that wrote the log: ollama where its own lines or its journal unit appear beside "
        "its runner's llama-server lines.",
    )
    models: list[str] = Field(
        default_factory=list,
        description="Models the log names, first seen first: Ollama's runner.name (debug lines), vLLM's start-up "
        "config.",
    )


class Diagnosis(_Strict):
    version: Literal[1] = 1
    source: str = Field(description="The log's file name (or '-').")
    log_kind: Literal["llama-server", "vllm"]
    lines: int = Field(description="Lines read.")
    tasks: int = Field(description="Requests (llama-server tasks) analyzed.")
    span_s: float = Field(description="Seconds from the log's first timestamp to its last.")
    since_s: float | None = None
    until_s: float | None = None
    long_prompt_tokens: int
    server: ServerFacts = Field(default_factory=ServerFacts)
    findings: list[Finding] = Field(default_factory=list)
    profile: list[Figure] = Field(
        default_factory=list, description="Prefill speed by chunk size, decode speed by batch width: no finding."
    )
    notes: list[str] = Field(default_factory=list, description="What the log could not tell, and why.")

    def finding(self, kind: str) -> Finding | None:
        return next((f for f in self.findings if f.kind == kind), None)
