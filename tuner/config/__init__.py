"""What users write: the study file and the search-space file, validated strictly.

Every model forbids unknown keys. The `host`, `deploy` and `engine` tables carry a `kind`; the
plugin registered under that kind validates the rest of its table with its own strict model
(`validate_options`), so that a new kind plugs in without a change here.

The study file's model is `study.py`, the search space's `space.py`, and reading either strictly (the
TOML file, `--set` overrides, validation without coercion and its one-line errors) `reading.py`.
"""

from __future__ import annotations

from tuner.config.reading import StrictModel, apply_overrides, validate_options, validate_strictly
from tuner.config.space import Constraint, ParamSpec, ParamValue, SearchSpace, load_search_space
from tuner.config.study import (
    NAME_PATTERN,
    BudgetSpec,
    CapacitySpec,
    ConfirmSpec,
    GateSpec,
    HostEntry,
    MetricConstraint,
    MetricsSpec,
    ObjectiveSpec,
    PluginSpec,
    SearchSpec,
    SloSpec,
    StorageSpec,
    StudySpec,
    WorkloadSpec,
    load_study,
)

__all__ = [
    "NAME_PATTERN",
    "BudgetSpec",
    "CapacitySpec",
    "ConfirmSpec",
    "Constraint",
    "GateSpec",
    "HostEntry",
    "MetricConstraint",
    "MetricsSpec",
    "ObjectiveSpec",
    "ParamSpec",
    "ParamValue",
    "PluginSpec",
    "SearchSpace",
    "SearchSpec",
    "SloSpec",
    "StorageSpec",
    "StrictModel",
    "StudySpec",
    "WorkloadSpec",
    "apply_overrides",
    "load_search_space",
    "load_study",
    "validate_options",
    "validate_strictly",
]
