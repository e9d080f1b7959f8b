"""The prediction a study started from (`search.predicted_from`), as the run directory stores it: which
settings the simulated llama-server, calibrated from the server's own log, expected to win on the study's
workload, with each config's predicted figures. The search loop writes it once, at the study's first start;
the leaderboard and the morning report read it to set the predicted figures beside the measured ones."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.config import ParamValue
from tuner.errors import StudyError
from tuner.files import write_atomic

__all__ = ["PREDICTION_VERSION", "PredictedFigures", "PredictionRecord", "read_prediction", "write_prediction"]

# 2: `ranked_by`, `why_none` and each config's `score` (a study's prediction ranked by its own score);
# optional, so a version-1 file reads as ranked by stall speed, and a version-1 reader asks for an upgrade.
PREDICTION_VERSION = 2


class _Stored(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PredictedFigures(_Stored):
    settings: dict[str, ParamValue] = Field(description="The config's value of each knob the prediction varied.")
    baseline: bool = Field(description="The study's baseline.")
    eligible: bool = Field(
        description="Predicted to keep the study's constraints (ranked by stall speed: 80% of the baseline's prefill)."
    )
    score: float | None = Field(
        default=None, description="Its predicted score against the baseline's (ranked by the study's score)."
    )
    median: dict[str, float | None] = Field(description="Each metric's median over the simulator's seeds.")
    spread: dict[str, tuple[float, float] | None] = Field(description="Each metric's lowest and highest.")


class PredictionRecord(_Stored):
    version: int = PREDICTION_VERSION
    log: str = Field(description="The server log it was calibrated from, as the study names it.")
    prefill_factor: float = Field(description="The log's server's prefill costs over the shipped calibration's.")
    decode_factor: float = Field(description="And its decode costs.")
    fitted: list[str] = Field(description="The log's figures the calibration was fitted from.")
    kept: list[str] = Field(description="What the log cannot determine, kept at the shipped calibration's.")
    requests: int = Field(description="Requests a simulated round replayed.")
    seeds: int = Field(description="Simulated rounds per config.")
    axes: list[str] = Field(description="The knobs the prediction varied; the others stayed at the baseline.")
    ranked_by: Literal["stall", "score"] = Field(
        default="stall",
        description="How its configs were ranked: the study's score under its constraints, or stall speed alone "
        "(a prediction stored before serve-tuner ranked by the score).",
    )
    why_none: str | None = Field(
        default=None, description="Ranked by the score, where no config is the predicted best: why."
    )
    configs: list[PredictedFigures] = Field(description="Every config replayed, the predicted best first.")
    best: PredictedFigures | None = Field(
        description="The config predicted to win; null: none beats the baseline (ranked by the score: see why_none)."
    )

    def figures_for(self, settings: Mapping[str, ParamValue]) -> PredictedFigures | None:
        """The predicted figures of the config a trial with `settings` ran (matched on the varied knobs)."""
        if any(axis not in settings for axis in self.axes):
            return None
        wanted = {axis: settings[axis] for axis in self.axes}
        return next((config for config in self.configs if config.settings == wanted), None)


def write_prediction(path: Path, record: PredictionRecord) -> None:
    write_atomic(path, (record.model_dump_json(indent=2) + "\n").encode())


def read_prediction(path: Path) -> PredictionRecord | None:
    """The stored prediction, None where the study started from none; a damaged or newer one is refused."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StudyError(f"{path}: cannot read it ({exc.strerror}); check its permissions") from None
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    # A newer serve-tuner's file may hold fields this one does not know: its version is read first.
    if isinstance(raw, dict) and isinstance(raw.get("version"), int) and raw["version"] > PREDICTION_VERSION:
        raise StudyError(f"{path} was written by a newer serve-tuner (version {raw['version']}); upgrade serve-tuner")
    try:
        return PredictionRecord.model_validate(raw)
    except ValidationError:
        raise StudyError(
            f"{path} is not a prediction serve-tuner wrote (damaged?); remove it to predict again at the next start"
        ) from None
