"""serve-tuner: tunes self-hosted LLM servers against recorded production traffic.

The public API is re-exported here; the modules behind it are the seams described in
docs/architecture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.lazy import lazy_exports

# Imported on first use: a program that needs one part (the simulated server, `tuner --help`) does not pay
# for pandas, optuna and the rest.
_EXPORTS = {
    "SearchSpace": "tuner.config",
    "StudySpec": "tuner.config",
    "load_search_space": "tuner.config",
    "load_study": "tuner.config",
    "AssetError": "tuner.errors",
    "CommandFailed": "tuner.errors",
    "ConfigError": "tuner.errors",
    "DeployError": "tuner.errors",
    "MeasurementError": "tuner.errors",
    "ServerNotReady": "tuner.errors",
    "StudyError": "tuner.errors",
    "TransportError": "tuner.errors",
    "TunerError": "tuner.errors",
    "WorkloadError": "tuner.errors",
    "compute_metrics": "tuner.metrics",
    "LaunchSpec": "tuner.models",
    "ReplayRequest": "tuner.models",
    "RequestRecord": "tuner.models",
    "build_leaderboard": "tuner.report",
    "run_study": "tuner.search",
    "load_trace": "tuner.workloads",
}

if TYPE_CHECKING:
    from tuner.config import SearchSpace, StudySpec, load_search_space, load_study
    from tuner.errors import (
        AssetError,
        CommandFailed,
        ConfigError,
        DeployError,
        MeasurementError,
        ServerNotReady,
        StudyError,
        TransportError,
        TunerError,
        WorkloadError,
    )
    from tuner.metrics import compute_metrics
    from tuner.models import LaunchSpec, ReplayRequest, RequestRecord
    from tuner.report import build_leaderboard
    from tuner.search import run_study
    from tuner.workloads import load_trace


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "AssetError",
    "CommandFailed",
    "ConfigError",
    "DeployError",
    "LaunchSpec",
    "MeasurementError",
    "ReplayRequest",
    "RequestRecord",
    "SearchSpace",
    "ServerNotReady",
    "StudyError",
    "StudySpec",
    "TransportError",
    "TunerError",
    "WorkloadError",
    "build_leaderboard",
    "compute_metrics",
    "load_search_space",
    "load_study",
    "load_trace",
    "run_study",
]
