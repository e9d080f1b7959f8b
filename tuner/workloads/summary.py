"""What a trace will replay, in numbers: counts, arrival rate, length distributions, prefix reuse."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tuner.workloads.trace import Trace

__all__ = ["Distribution", "TraceSummary", "summarize_trace"]


@dataclass(frozen=True, kw_only=True)
class Distribution:
    p50: float
    p95: float
    max: float
    total: int


@dataclass(frozen=True, kw_only=True)
class TraceSummary:
    name: str
    description: str
    requests: int
    sessions: int
    span_s: float
    arrivals_per_min: float | None
    prompt_tokens: Distribution
    new_tokens: Distribution
    output_tokens: Distribution
    prefix_reuse: float  # shared-prefix tokens / all prompt tokens
    long_prompts: int
    tags: dict[str, int]


def _distribution(values: list[int]) -> Distribution:
    data = np.asarray(values, dtype=float)
    return Distribution(
        p50=float(np.percentile(data, 50)),
        p95=float(np.percentile(data, 95)),
        max=float(data.max()),
        total=int(data.sum()),
    )


def summarize_trace(trace: Trace, *, long_prompt_tokens: int = 1000) -> TraceSummary:
    requests = trace.requests
    offsets = [r.offset_s for r in requests]
    span = max(offsets) - min(offsets)
    prompt = _distribution([r.prompt.total_tokens for r in requests])
    return TraceSummary(
        name=trace.header.name,
        description=trace.header.description,
        requests=len(requests),
        sessions=len({r.session for r in requests}),
        span_s=span,
        arrivals_per_min=(len(requests) - 1) / span * 60 if span > 0 else None,
        prompt_tokens=prompt,
        new_tokens=_distribution([r.prompt.new_tokens for r in requests]),
        output_tokens=_distribution([r.output_tokens for r in requests]),
        prefix_reuse=sum(b.tokens for r in requests for b in r.prompt.shared_prefix) / prompt.total,
        long_prompts=sum(1 for r in requests if r.prompt.new_tokens >= long_prompt_tokens),
        tags=dict(Counter(r.tag for r in requests).most_common()),
    )
