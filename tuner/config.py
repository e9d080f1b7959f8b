"""What users write: the study file and the search-space file, validated strictly.

Every model forbids unknown keys. The `host`, `deploy` and `engine` tables carry a `kind`; the
plugin registered under that kind validates the rest of its table with its own strict model
(`validate_options`), so that a new kind plugs in without a change here.
"""

from __future__ import annotations

import datetime
import itertools
import json
import operator
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError
from tuner.files import special_file
from tuner.redact import SECRET_REFUSED

__all__ = [
    "BudgetSpec",
    "ConfirmSpec",
    "Constraint",
    "GateSpec",
    "MetricConstraint",
    "MetricsSpec",
    "ObjectiveSpec",
    "ParamSpec",
    "ParamValue",
    "PluginSpec",
    "SearchSpace",
    "SearchSpec",
    "SloSpec",
    "StrictModel",
    "StudySpec",
    "WorkloadSpec",
    "apply_overrides",
    "load_search_space",
    "load_study",
    "validate_options",
    "validate_strictly",
]

ParamValue = int | float | bool | str
OptionsT = TypeVar("OptionsT", bound=BaseModel)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # names of studies and hosts: safe in file names

# Optuna's samplers seed numpy, which takes 0 .. 2**32 - 1.
_MAX_SEED = 2**32 - 1


class StrictModel(BaseModel):
    """Base of every model a user writes: unknown keys are refused, NaN and infinities too.

    What a user wrote is validated with `validate_strictly`, which does not coerce (`rounds = "3"` and
    `trials = true` are refused); code that builds these models from its own values may pass a Path
    where the file has a string."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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


class ParamSpec(StrictModel):
    """One knob: a list of `choices`, or an integer or float range `low`..`high`."""

    description: str = ""
    choices: list[ParamValue] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    default: ParamValue | None = Field(
        default=None, description="The engine's own default: the value the baseline runs with."
    )

    @model_validator(mode="after")
    def _one_form(self) -> ParamSpec:
        has_range = self.low is not None or self.high is not None
        if (self.choices is None) == (not has_range):
            raise ValueError("give either choices = [...] or low and high")
        if has_range:
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError("a range needs low <= high")
        elif not self.choices:
            raise ValueError("choices must not be empty")
        if self.default is not None and not self.allows(self.default):
            raise ValueError(f"default {self.default!r} is not a valid value of this knob")
        return self

    @property
    def ordinal(self) -> bool:
        """Ascending numeric choices (32, 64, ..., 2048): ordered, so samplers see them as an index."""
        choices = self.choices or []
        if len(choices) < 3 or not all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices):
            return False
        return all(float(a) < float(b) for a, b in itertools.pairwise(choices))

    def allows(self, value: ParamValue) -> bool:
        if self.choices is not None:
            return any(type(value) is type(c) and value == c for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*(<=|>=|==|!=|<|>)\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*$")


class Constraint(StrictModel):
    """`left op right`, each side a knob name or a number; e.g. `n_ubatch <= n_batch`."""

    text: str
    left: str
    op: str
    right: str

    @classmethod
    def parse(cls, text: str) -> Constraint:
        match = _CONSTRAINT.match(text)
        if not match:
            raise ValueError(f"constraint {text!r} is not 'knob op knob' with op one of <= < >= > == !=")
        return cls(text=text, left=match[1], op=match[2], right=match[3])

    def names(self) -> list[str]:
        return [side for side in (self.left, self.right) if not _is_number(side)]

    def holds(self, values: Mapping[str, ParamValue]) -> bool:
        def side(token: str) -> Any:
            return float(token) if _is_number(token) else values[token]

        return _COMPARISONS[self.op](side(self.left), side(self.right))


def _is_number(token: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(?:\.\d+)?", token))


class SearchSpace(StrictModel):
    engine: str = Field(description="The engine kind these knobs belong to.")
    description: str = ""
    params: dict[str, ParamSpec]
    constraints: list[Constraint] = Field(default_factory=list)
    line: list[str] = Field(
        default_factory=list,
        description="Knobs the search starts by moving together (tuner/sampling.py): the first trials walk the "
        "line where they take one value, the other knobs at the baseline's.",
    )

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [Constraint.parse(v) if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _constraints_name_knobs(self) -> SearchSpace:
        for constraint in self.constraints:
            unknown = [n for n in constraint.names() if n not in self.params]
            if unknown:
                raise ValueError(f"constraint {constraint.text!r} names unknown knob {unknown[0]!r}")
        unknown = [n for n in self.line if n not in self.params or not self.params[n].ordinal]
        if unknown:
            raise ValueError(f"line names {unknown[0]!r}, which is not a knob with ascending numeric choices")
        if self.line:
            # The walk moves the line's knobs together through the values they share: its middle and both
            # neighbours need three, or the line would be skipped without a word.
            shared = set(self.params[self.line[0]].choices or []).intersection(
                *(self.params[n].choices or [] for n in self.line[1:])
            )
            if len(shared) < 3:
                raise ValueError(f"line {self.line}: its knobs share {len(shared)} choices; the walk needs at least 3")
        return self

    def encode(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """Knob values to what the sampler sees: an ordinal knob's value becomes its index."""
        encoded: dict[str, ParamValue] = {}
        for name, value in settings.items():
            param = self.params[name]
            encoded[name] = param.choices.index(value) if param.ordinal and param.choices else value
        return encoded

    def decode(self, sampled: Mapping[str, Any]) -> dict[str, ParamValue]:
        """What the sampler proposed, back to knob values."""
        decoded: dict[str, ParamValue] = {}
        for name, value in sampled.items():
            param = self.params[name]
            decoded[name] = param.choices[int(value)] if param.ordinal and param.choices else value
        return decoded

    def restricted_to(self, names: Sequence[str] | None) -> SearchSpace:
        if names is None:
            return self
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise ConfigError(
                f"search.params names {unknown[0]!r}, which the search space does not define; "
                f"valid: {', '.join(sorted(self.params))}"
            )
        # A constraint between a tuned knob and one left at its baseline has nothing to choose between.
        kept = [c for c in self.constraints if all(n in names for n in c.names())]
        line = [n for n in self.line if n in names]
        return self.model_copy(update={"params": {n: self.params[n] for n in names}, "constraints": kept, "line": line})


_BOUND_ERRORS = ("less_than", "less_than_equal", "greater_than", "greater_than_equal")


def _field_description(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The description of the field at `loc`, following nested models; None where there is none."""
    current: Any = model
    description = None
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            continue  # a list index, a dict key, a union branch
        info = fields[part]
        description = info.description
        current = info.annotation
        for arg in getattr(current, "__args__", ()):  # `X | None`, `list[X]`: follow the model in it
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return description


# pydantic names the branch of a union (`int | float | bool | str`) in an error's location: not a key.
_UNION_BRANCHES = frozenset({"int", "float", "bool", "str"})


def _key_path(loc: Sequence[int | str]) -> tuple[int | str, ...]:
    return tuple(part for part in loc if part not in _UNION_BRANCHES)


def _format_validation_error(source: str, error: ValidationError, model: type[BaseModel] | None = None) -> str:
    errors = error.errors()
    first = errors[0]
    # A value no branch of a union takes fails once per branch; the non-finite number is the telling one.
    same_key = [e for e in errors if _key_path(e["loc"]) == _key_path(first["loc"])]
    first = next((e for e in same_key if e["type"] == "finite_number"), first)
    where = ".".join(str(p) for p in _key_path(first["loc"])) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {where!r}; remove it or check its spelling"
    if first["type"] == "missing":
        return f"{source}: missing required key {where!r}"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == SECRET_REFUSED:  # the input may be a key: never echoed
        return f"{source}: {where}: {message}"
    line = f"{source}: {where}: {message} (got {first.get('input')!r})"
    description = _field_description(model, first["loc"]) if model is not None else None
    if first["type"] in _BOUND_ERRORS and description:
        line += f"; {where} is: {description}"
    return line


def _first_non_json(value: Any, where: str) -> str | None:
    """Where a value TOML has and a study cannot use (a date or time) sits; None if there is none."""
    if isinstance(value, datetime.date | datetime.time):
        return where or "(top level)"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_non_json(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_non_json(item, f"{where}.{index}")
            if found:
                return found
    return None


def validate_strictly(model: type[OptionsT], data: Mapping[str, Any], *, source: str) -> OptionsT:
    """Validates what a user wrote without coercing it: a string is not a number, a boolean or a float is
    not an integer, NaN and infinities are refused. Errors are one line naming `source` and the key.

    The data goes through pydantic's strict JSON mode, in which a file path may be written as a string and
    a list stands for a tuple, as the user writes them; only dates and times (TOML has them) have no JSON
    form, and no setting takes one."""
    found = _first_non_json(dict(data), "")
    if found:
        raise ConfigError(f"{source}: {found}: a date or time is not a valid value here; quote it if it is text")

    def as_text(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"{type(value).__name__} is not a value a study file can hold")

    try:
        text = json.dumps(dict(data), default=as_text, allow_nan=True)
        return model.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc, model)) from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def validate_options(model: type[OptionsT], options: Mapping[str, Any], *, where: str) -> OptionsT:
    """Validates a plugin's table with its strict model, without coercion; errors name `where.key`."""
    return validate_strictly(model, options, source=where)


_BOM = b"\xef\xbb\xbf"


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML file's tables; every way it can be unreadable is one line saying what to do."""
    special = special_file(path)
    if special is not None:
        raise ConfigError(f"{path} is {special}, not a TOML file; pass the path of the study's .toml file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; pass the TOML file in it, e.g. {path / 'study.toml'}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}; check the path and its permissions") from None
    if raw.startswith(_BOM):
        raise ConfigError(f"{path}: starts with a byte-order mark (BOM); save it as UTF-8 without a BOM")
    if b"\x00" in raw:
        raise ConfigError(f"{path}: is a binary file, not TOML text; pass the study's .toml file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: arrays or tables nested too deeply to be a study file") from None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Applies `--set a.b=value` overrides; `value` is read as TOML, or as a string if it is not TOML."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        parts = [part.strip() for part in key.split(".")]
        if not sep or not all(parts):
            raise ConfigError(f"--set {override!r}: expected KEY=VALUE, e.g. budget.trials=3")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        except RecursionError:
            raise ConfigError(f"--set {key}: the value is nested too deeply; give a plain value") from None
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {override!r}: {part!r} is not a table")
            node = child
        node[parts[-1]] = value
    return data


def load_study(path: Path, overrides: Sequence[str] = ()) -> tuple[StudySpec, Path]:
    """Loads a study file; returns the spec and the directory its relative paths are resolved from."""
    data = apply_overrides(_read_toml(path), overrides)
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
    spec = validate_strictly(StudySpec, data, source=str(path))
    return spec, path.resolve().parent


def _suggest_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return name or "my-study"


def load_search_space(path: Path) -> SearchSpace:
    return validate_strictly(SearchSpace, _read_toml(path), source=str(path))
