"""serve-tuner: tunes self-hosted LLM servers against recorded production traffic.

The public API is re-exported here; the modules behind it are the seams described in
docs/architecture.md.
"""

from __future__ import annotations

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
from tuner.study import run_study
from tuner.workloads import load_trace

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
