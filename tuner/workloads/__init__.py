"""Workloads: the versioned trace format, its loader, and prompt synthesis with exact token counts."""

from __future__ import annotations

from tuner.workloads.summary import Concurrency, TraceSummary, concurrency_profile, summarize_trace
from tuner.workloads.synthesis import synthesize_requests, synthesize_sessions, thin_sessions
from tuner.workloads.synthetic import (
    GENERATORS,
    SynthOptions,
    check_synthesis_fits,
    synthesis_requests,
    synthesize_trace,
)
from tuner.workloads.trace import Trace, TraceBuilder
from tuner.workloads.trace_file import dump_trace, load_trace, trace_lines
from tuner.workloads.trace_format import (
    MAX_PROMPT_TOKENS,
    TRACE_FORMAT,
    TRACE_VERSION,
    LoraUse,
    PrefixBlock,
    PromptShape,
    TraceHeader,
    TraceRequest,
)

__all__ = [
    "GENERATORS",
    "MAX_PROMPT_TOKENS",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "Concurrency",
    "LoraUse",
    "PrefixBlock",
    "PromptShape",
    "SynthOptions",
    "Trace",
    "TraceBuilder",
    "TraceHeader",
    "TraceRequest",
    "TraceSummary",
    "check_synthesis_fits",
    "concurrency_profile",
    "dump_trace",
    "load_trace",
    "summarize_trace",
    "synthesis_requests",
    "synthesize_requests",
    "synthesize_sessions",
    "synthesize_trace",
    "thin_sessions",
    "trace_lines",
]
