"""A capacity sweep as the run directory stores it (`runs/<study>/capacity/<stamp>.json`): the settings
swept, every level's figures per round, and each config's capacity. Written after every level, so an
interrupted sweep keeps what it measured; `finished` says whether it ran to its end."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.capacity.levels import LevelFigures
from tuner.config import ParamValue
from tuner.errors import StudyError
from tuner.files import write_atomic
from tuner.text import count_text

__all__ = [
    "CAPACITY_VERSION",
    "CapacitySweep",
    "SweptConfig",
    "capacity_sentence",
    "read_sweep",
    "unjudged_levels",
    "write_sweep",
]

CAPACITY_VERSION = 1


class _Stored(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SweptConfig(_Stored):
    trial: int | None = Field(description="The study's trial whose settings were swept; null: the baseline.")
    settings: dict[str, ParamValue] = Field(description="Its settings over the engine's base settings.")
    levels: list[LevelFigures] = Field(default_factory=list, description="Every level measured, in order.")
    capacity: int | None = Field(default=None, description="Most users within the SLO in every round.")

    @property
    def label(self) -> str:
        return "the baseline" if self.trial is None else f"trial {self.trial}"

    def level(self, users: int, round_: int) -> LevelFigures | None:
        """The figures of that level and round, if it was measured."""
        return next((f for f in self.levels if f.users == users and f.round == round_), None)


class CapacitySweep(_Stored):
    version: int = CAPACITY_VERSION
    study: str
    host: str | None = Field(description="A fleet's host; null for a one-host study.")
    started: str = Field(description="When the sweep started (local time, ISO 8601).")
    shape: str = Field(description="What the users asked: the study's workload, or seed 004's summaries.")
    users: list[int] = Field(description="The levels the sweep could climb.")
    warm_up_s: float
    window_s: float
    rounds: int
    slo_ttft_p95_s: float
    slo_decode_tok_s: float
    slo_min_requests: int
    configs: list[SweptConfig]
    server: str = Field(description="The engine, its binary and the settings every config shared.")
    finished: bool = False


def write_sweep(path: Path, sweep: CapacitySweep) -> None:
    write_atomic(path, (sweep.model_dump_json(indent=2) + "\n").encode())


def read_sweep(path: Path) -> CapacitySweep:
    """A stored sweep; `StudyError` naming the file if it is not one this version can read."""
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise StudyError(f"{path}: cannot read the capacity sweep ({exc}); run `tuner capacity` again") from None
    version = raw.get("version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version > CAPACITY_VERSION:
        raise StudyError(f"{path} was written by a newer serve-tuner (version {version}); upgrade to read it")
    try:
        return CapacitySweep.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StudyError(
            f"{path}: not a capacity sweep ({where}: {first['msg']}); run `tuner capacity` again"
        ) from None


def unjudged_levels(config: SweptConfig) -> list[int]:
    """The levels above the config's capacity that no round failed and some round could not judge (too
    few requests in its window): the capacity may lie beyond them."""
    verdicts: dict[int, set[str]] = {}
    for level in config.levels:
        verdicts.setdefault(level.users, set()).add(level.verdict)
    return [
        users
        for users, seen in verdicts.items()
        if "too few" in seen and "fail" not in seen and (config.capacity is None or users > config.capacity)
    ]


def capacity_sentence(sweep: CapacitySweep) -> str:
    """What the sweep found, as one sentence: the trial's capacity against the baseline's, and the levels
    it could not judge."""
    if not sweep.finished:
        return "the sweep stopped before its end: no capacity is known (`tuner capacity` measures it again)"

    def served(config: SweptConfig) -> str:
        unjudged = unjudged_levels(config)
        if config.capacity is None and unjudged and all(level.verdict != "fail" for level in config.levels):
            return "no level of users it could judge (too few requests in each window)"
        text = "no level of users" if config.capacity is None else count_text(config.capacity, "user")
        if unjudged:
            text += f" ({', '.join(map(str, unjudged))} users not judged: too few requests in the window)"
        return text

    slo = f"within your SLO (TTFT p95 at most {sweep.slo_ttft_p95_s:g} s, {sweep.slo_decode_tok_s:g} tok/s per user)"
    if sweep.rounds > 1:
        slo += " in both rounds" if sweep.rounds == 2 else f" in all {sweep.rounds} rounds"
    baseline = next((c for c in sweep.configs if c.trial is None), None)
    trial = next((c for c in sweep.configs if c.trial is not None), None)
    if trial is not None and baseline is not None:
        recommended = f"the recommended settings ({trial.label}) serve {served(trial)} {slo}"
        sentence = f"{recommended}; the baseline served {served(baseline)}"
    else:
        only = trial or baseline
        assert only is not None
        sentence = f"{only.label} serves {served(only)} {slo}"
    if any(unjudged_levels(c) for c in sweep.configs):
        sentence += "; lengthen the window (--window) or lower metrics.slo.min_requests to judge every level"
    return sentence
