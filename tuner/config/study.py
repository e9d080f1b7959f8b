"""The study file's model: `StudySpec` and its tables (budget, workload, metrics and the SLO, constraints,
the gate, the confirmation, objectives, search, storage, a fleet's hosts), the `[host]`, `[deploy]` and
`[engine]` tables as `PluginSpec` (their plugins validate the rest), and `load_study`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.config.reading import StrictModel, apply_overrides, read_toml, validate_strictly
from tuner.errors import ConfigError

__all__ = [
    "NAME_PATTERN",
    "BudgetSpec",
    "CapacitySpec",
    "ConfirmSpec",
    "GateSpec",
    "HostEntry",
    "MetricConstraint",
    "MetricsSpec",
    "ObjectiveSpec",
    "PluginSpec",
    "SearchSpec",
    "SloSpec",
    "StorageSpec",
    "StudySpec",
    "WorkloadSpec",
    "load_study",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # names of studies and hosts: safe in file names

# Optuna's samplers seed numpy, which takes 0 .. 2**32 - 1.
_MAX_SEED = 2**32 - 1


class PluginSpec(BaseModel):
    """A `[host]`, `[deploy]` or `[engine]` table: a `kind` plus options its plugin validates."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str = Field(description="Which plugin to use; `tuner kinds` lists them.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


_DEFAULT_HOST = PluginSpec(kind="local")
_DEFAULT_DEPLOY = PluginSpec(kind="process")


class BudgetSpec(StrictModel):
    trials: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="Trials to run after the baseline, across resumes (at most 10,000: each restarts the server).",
    )
    hours: float | None = Field(
        default=None, gt=0, le=8760, description="Stop starting trials after this long (at most a year)."
    )


class WorkloadSpec(StrictModel):
    path: Path = Field(description="Trace file (JSONL), relative to the study file.")
    time_scale: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Arrival offsets are multiplied by this (at most 1000: a minute becomes 17 hours).",
    )
    keep_concurrency: bool = Field(
        default=False,
        description="With time_scale below 1, replay about time_scale of the sessions (chosen by seed), so "
        "that a day compressed into 20 minutes keeps its in-flight concurrency over time instead of "
        "multiplying it by the compression.",
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, le=86_400, description="A request taking longer fails (at most a day)."
    )
    seed: int = Field(default=0, ge=0, le=_MAX_SEED, description="Seed for the synthesized prompt tokens.")


class SloSpec(StrictModel):
    """The line a round must hold (the source article's pass mark by default)."""

    ttft_p95_s: float = Field(default=2.0, gt=0, description="Time to first token, p95, at most this.")
    decode_tok_s: float = Field(default=10.0, ge=0, description="Per-user decode speed, median, at least this.")
    min_requests: int = Field(
        default=20, ge=1, le=1_000_000, description="Fewer requests in a round cannot show the line."
    )


class MetricsSpec(StrictModel):
    long_prompt_tokens: int = Field(
        default=1000,
        gt=0,
        le=10_000_000,
        description="A prompt with at least this many new tokens counts as a long prefill (L).",
    )
    min_overlap_s: float = Field(
        default=0.5, gt=0, description="Shortest decode/prefill overlap window that counts for stall tok/s."
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="The pass mark behind `slo_pass`.")


class MetricConstraint(StrictModel):
    """A bound a trial's median metric must respect to be recommended, absolute or against the baseline."""

    metric: str = Field(description="A metric name, e.g. ttft_p95_s.")
    max: float | None = Field(default=None, description="At most this value.")
    min: float | None = Field(default=None, description="At least this value.")
    max_vs_baseline: float | None = Field(default=None, gt=0, description="At most this times the baseline.")
    min_vs_baseline: float | None = Field(default=None, gt=0, description="At least this times the baseline.")

    @model_validator(mode="after")
    def _has_a_bound(self) -> MetricConstraint:
        if self.max is None and self.min is None and self.max_vs_baseline is None and self.min_vs_baseline is None:
            raise ValueError("give at least one of max, min, max_vs_baseline, min_vs_baseline")
        return self

    def violations(self, value: float | None, baseline: float | None) -> list[tuple[str, float]]:
        """Each broken bound with how far it is broken, relative to the bound (0.1 = 10% past it)."""
        if value is None:
            return [(f"{self.metric} had no data", 1.0)]
        bounds = [("<=", self.max, False), (">=", self.min, True)]
        if baseline is not None:
            bounds += [("<=", None if self.max_vs_baseline is None else self.max_vs_baseline * baseline, False)]
            bounds += [(">=", None if self.min_vs_baseline is None else self.min_vs_baseline * baseline, True)]
        broken = []
        for op, bound, is_min in bounds:
            if bound is None:
                continue
            excess = (bound - value) if is_min else (value - bound)
            if excess > 0:
                broken.append((f"{self.metric} {value:.3g} is not {op} {bound:.3g}", excess / max(abs(bound), 1e-9)))
        return broken


class GateSpec(StrictModel):
    enabled: bool = Field(default=True, description="Check each trial's answers against the baseline's.")
    tokens: int = Field(
        default=24, gt=0, le=4096, description="Tokens generated per probe prompt (at most 4096, per probe)."
    )
    min_agreement: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Average share of each answer's tokens that must match the baseline's before they diverge.",
    )
    allow_answer_changes: bool = Field(
        default=False,
        description="A setting that changes which adapter a request gets (lora_policy) changes its answers; "
        "such a trial is measured and shown, but recommended only when this is true.",
    )


class ConfirmSpec(StrictModel):
    top: int = Field(
        default=1,
        ge=0,
        le=20,
        description="Re-measure this many of the best trials against the baseline (at most 20: each takes pairs "
        "x 2 rounds).",
    )
    pairs: int = Field(
        default=3,
        ge=2,
        le=50,
        description="Baseline/candidate pairs per re-measurement, in alternating order (at most 50: each pair "
        "is two rounds).",
    )


class CapacitySpec(StrictModel):
    """`tuner capacity`: closed-loop users at each level, a warm-up, then a measured window, in rounds."""

    users: list[int] = Field(
        default=[1, 2, 4, 8, 16, 32, 64, 128],
        min_length=1,
        max_length=64,
        description="The levels of concurrent users, climbed in this order until two in a row fail.",
    )
    shape: Literal["workload", "summary"] = Field(
        default="workload",
        description="workload: the study's own requests, each user taking the next in turn; summary: seed 004's "
        "document summaries (about 640 prompt tokens behind a shared 67-token system prompt, 140 tokens out).",
    )
    warm_up_s: float = Field(
        default=15.0,
        ge=0,
        le=3600,
        description="The window opens once this long has passed since the level began and every user has its "
        "first answer.",
    )
    window_s: float = Field(
        default=60.0, gt=0, le=3600, description="The measured window: the requests sent in it are the level's."
    )
    rounds: int = Field(
        default=2, ge=1, le=10, description="Rounds per level (round 1 climbs, round 2 comes back down, ...)."
    )
    after_study: bool = Field(
        default=False,
        description="At the end of `tuner run`, sweep the baseline and the recommendation (one host's study only).",
    )

    @field_validator("users")
    @classmethod
    def _users_climb(cls, users: list[int]) -> list[int]:
        if any(u < 1 or u > 4096 for u in users):
            raise ValueError("takes levels of 1 to 4096 users")
        if any(b <= a for a, b in itertools.pairwise(users)):
            raise ValueError("must climb: each level more users than the one before")
        return users


class ObjectiveSpec(StrictModel):
    metric: str = Field(description="A metric name, e.g. stall_tok_s, prefill_tok_s, ttft_p95_s.")
    direction: Literal["maximize", "minimize"]
    weight: float = Field(
        default=1.0, gt=0, le=1000, description="Weight of this metric's log-ratio in the score (at most 1000)."
    )


class SearchSpec(StrictModel):
    space: Path = Field(description="Search-space TOML file, relative to the study file.")
    params: list[str] | None = Field(
        default=None, description="Which knobs of the space to tune; the others stay at the baseline."
    )
    sampler: Literal["tpe", "random", "qmc", "gp"] = "tpe"
    pruner: Literal["median", "none"] = Field(
        default="median",
        description="After round 1, stop a trial scoring below the median of earlier trials (Optuna's MedianPruner).",
    )
    predicted_from: Path | None = Field(
        default=None,
        description="A llama-server log of the server this study tunes (relative to the study file): the config "
        "the simulated server, calibrated from it, predicts to win on the study's workload is measured first after "
        "the baseline, and the leaderboard sets the predicted figures beside the measured ones.",
    )

    @field_validator("params")
    @classmethod
    def _params_name_knobs_once(cls, params: list[str] | None) -> list[str] | None:
        if params is None:
            return None
        if not params:
            raise ValueError("names no knob; name at least one, or leave search.params out to tune every knob")
        repeated = sorted({name for name in params if params.count(name) > 1})
        if repeated:
            raise ValueError(f"names {repeated[0]!r} twice; name each knob once")
        return params


class StorageSpec(StrictModel):
    """Where the study's Optuna storage lives: today's journal file in the run directory (no `[storage]`),
    or a database every controller of a fleet shares."""

    url: str = Field(
        min_length=1,
        max_length=2000,
        description="A SQLAlchemy URL, e.g. postgresql://tuner@db.example/tuner; a password in it is never shown "
        "or stored (libpq's PGPASSWORD or ~/.pgpass can supply it instead).",
    )
    heartbeat_s: float = Field(
        default=10.0, gt=0, le=3600, description="How often a controller tells the storage its trials are alive."
    )
    grace_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="A running trial whose controller has been silent this long is failed (and re-queued) by a peer.",
    )

    @model_validator(mode="after")
    def _grace_outlasts_beats(self) -> StorageSpec:
        if self.grace_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"grace_s ({self.grace_s:g}) must be at least twice heartbeat_s ({self.heartbeat_s:g}), or a live "
                "controller's trial could be failed between two beats"
            )
        return self


class HostEntry(StrictModel):
    """One host of a fleet: its name, and the `[host]` / `[deploy]` tables it uses instead of the study's."""

    name: str = Field(
        pattern=NAME_PATTERN, max_length=100, description="The host's name in the records and the leaderboard."
    )
    host: PluginSpec | None = Field(default=None, description="How to reach it; the study's [host] if not set.")
    deploy: PluginSpec | None = Field(default=None, description="How to deploy on it; the study's [deploy] if not set.")
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine options that differ on this host (port, binary, extra_args); never kind or settings, "
        "which every host shares.",
    )

    @field_validator("engine")
    @classmethod
    def _same_engine(cls, engine: dict[str, Any]) -> dict[str, Any]:
        for key in ("kind", "settings"):
            if key in engine:
                raise ValueError(
                    f"sets engine.{key}, which every host of a study shares; set it in the study's [engine]"
                )
        return engine


class StudySpec(StrictModel):
    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=200,
        description="Names the run directory: letters, digits, _ . - (starting with a letter or digit).",
    )
    description: str = ""
    rounds: int = Field(
        default=2,
        ge=2,
        le=50,
        description="Measurement rounds per trial (at least 2 for a spread; at most 50: each round replays the "
        "whole workload).",
    )
    interleave: int = Field(
        default=3,
        ge=1,
        le=64,
        description="Trials measured together: round 1 of each, then round 2 of each, with a restart per round "
        "(at most 64).",
    )
    extra_rounds_if_noisy: int = Field(
        default=1,
        ge=0,
        le=20,
        description="Rounds added to a trial whose rounds differ by 20% or more on an objective metric (at most 20).",
    )
    seed: int = Field(
        default=0, ge=0, le=_MAX_SEED, description="Sampler seed (0 to 2**32 - 1, what Optuna's samplers take)."
    )
    budget: BudgetSpec = BudgetSpec()
    host: PluginSpec = _DEFAULT_HOST
    deploy: PluginSpec = _DEFAULT_DEPLOY
    engine: PluginSpec
    workload: WorkloadSpec
    search: SearchSpec
    metrics: MetricsSpec = MetricsSpec()
    confirm: ConfirmSpec = ConfirmSpec()
    gate: GateSpec = GateSpec()
    capacity: CapacitySpec = CapacitySpec()
    objectives: list[ObjectiveSpec] = Field(min_length=1)
    combine: Literal["weighted", "pareto"] = Field(
        default="weighted",
        description="weighted: Optuna optimizes the weighted score; pareto: one value per objective, and the "
        "leaderboard marks the trials no other trial beats on every objective.",
    )
    constraints: list[MetricConstraint] = Field(
        default_factory=list, description="Bounds on metrics; a trial that breaks one is never recommended."
    )
    storage: StorageSpec | None = Field(
        default=None, description="A database shared by a fleet's controllers; the run directory's journal if unset."
    )
    hosts: list[HostEntry] = Field(
        default_factory=list,
        max_length=64,
        description="A fleet: one study over these hosts, each measured against its own baseline (at most 64).",
    )

    @field_validator("hosts")
    @classmethod
    def _hosts_named_once(cls, hosts: list[HostEntry]) -> list[HostEntry]:
        names = [h.name for h in hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"names the host {twice[0]!r} twice; give each host its own name")
        return hosts

    def for_host(self, entry: HostEntry) -> StudySpec:
        """The study as one host of the fleet runs it: that host's [host], [deploy] and engine options."""
        engine = PluginSpec.model_validate({**self.engine.model_dump(), **entry.engine})
        return self.model_copy(
            update={"host": entry.host or self.host, "deploy": entry.deploy or self.deploy, "engine": engine}
        )


def load_study(path: Path, overrides: Sequence[str] = ()) -> tuple[StudySpec, Path]:
    """Loads a study file; returns the spec and the directory its relative paths are resolved from."""
    data = apply_overrides(read_toml(path), overrides)
    # A `[deploy]` or `[host]` table (or a --set into one) without a kind keeps the default kind, as the
    # study without that table would: `--set deploy.start_timeout_s=5` needs no `deploy.kind` beside it.
    for table, default in (("host", _DEFAULT_HOST.kind), ("deploy", _DEFAULT_DEPLOY.kind)):
        if isinstance(data.get(table), dict):
            data[table].setdefault("kind", default)
        for entry in data.get("hosts") or []:
            if isinstance(entry, dict) and isinstance(entry.get(table), dict):
                entry[table].setdefault("kind", default)
    if "name" not in data:
        data["name"] = path.stem
        if not re.fullmatch(NAME_PATTERN, path.stem):
            raise ConfigError(
                f"{path}: the study has no name = ..., and its file name {path.stem!r} cannot name a run "
                f'directory (letters, digits, _ . - only); add a line such as name = "{_suggest_name(path.stem)}"'
            )
    try:
        spec = validate_strictly(StudySpec, data, source=str(path))
    except ConfigError as exc:
        raise ConfigError(_blaming_the_override(str(exc), str(path), overrides)) from None
    return spec, path.resolve().parent


def _blaming_the_override(message: str, source: str, overrides: Sequence[str]) -> str:
    """The message of a value that a `--set` gave names that `--set`, not the study file."""
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key and message.startswith((f"{source}: {key}:", f"{source}: {key}.")):
            return f"--set {override}: " + message.removeprefix(f"{source}: ")
    return message


def _suggest_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return name or "my-study"
