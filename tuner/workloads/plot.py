"""A picture of a trace: in-flight requests and arrivals over time, prompt and output lengths, tags.

matplotlib is imported here only, on first use, so the rest of the tool starts fast without it.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tuner.files import write_atomic
from tuner.workloads.summary import TraceSummary
from tuner.workloads.trace import Trace

__all__ = ["plot_trace"]

_MOST_STEPS = 20_000


def _bucket_peaks(levels: np.ndarray) -> np.ndarray:
    """Indices of the highest level of each of `_MOST_STEPS // 2` equal runs of steps, with each run's
    first step, so that the line keeps its peaks and its shape."""
    runs = _MOST_STEPS // 2
    edges = np.linspace(0, len(levels), runs + 1).astype(np.int64)
    highest = [int(lo + np.argmax(levels[lo:hi])) for lo, hi in itertools.pairwise(edges.tolist()) if hi > lo]
    return np.unique(np.concatenate((edges[:-1], np.asarray(highest, dtype=np.int64))))


def plot_trace(trace: Trace, summary: TraceSummary, path: Path) -> None:
    """Writes a PNG (or SVG, PDF: by the file's suffix) of the trace's shape, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    concurrency = summary.concurrency
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), layout="constrained")
    figure.suptitle(f"{summary.name}: {summary.requests} requests, {summary.sessions} sessions, {summary.span_s:.0f} s")

    timeline = axes[0][0]
    # Ends before starts at one instant, as the summary counts them.
    event_times = np.concatenate((concurrency.ends, concurrency.starts))
    steps = np.concatenate((np.full(len(concurrency.ends), -1), np.ones(len(concurrency.starts), dtype=np.int64)))
    order = np.lexsort((steps, event_times))
    times = np.concatenate(([0.0], event_times[order]))
    levels = np.concatenate(([0], np.cumsum(steps[order])))
    if len(times) > _MOST_STEPS:
        # A million requests make two million steps, more than a picture shows: each bucket of events keeps
        # its highest level, so no peak is lost.
        keep = _bucket_peaks(levels)
        times, levels = times[keep], levels[keep]
    timeline.step(times, levels, where="post", color="tab:blue", label="in flight")
    timeline.set_xlabel("seconds from the start")
    timeline.set_ylabel("requests in flight")
    timeline.set_title(f"in flight ({concurrency.basis})", fontsize=9)
    arrivals_axis = timeline.twinx()
    first = float(concurrency.starts.min())
    centers = [(i + 0.5) * concurrency.bucket_s + first for i in range(len(concurrency.arrivals))]
    arrivals_axis.bar(centers, concurrency.arrivals, width=concurrency.bucket_s, alpha=0.25, color="tab:orange")
    arrivals_axis.set_ylabel(f"arrivals per {concurrency.bucket_s:.3g} s", color="tab:orange")

    prompts = axes[0][1]
    parts: dict[str, npt.NDArray[np.integer[Any]]] = {
        "shared prefix": trace.prefix_tokens,
        "session history": trace.history_tokens,
        "new": trace.new_tokens,
    }
    totals = parts["shared prefix"] + parts["session history"] + parts["new"]
    prompts.hist(totals, bins=40, color="tab:blue", alpha=0.8)
    prompts.set_title(
        "prompt tokens per request ("
        + ", ".join(f"{name} {int(v.sum()) / max(1, int(totals.sum())):.0%}" for name, v in parts.items())
        + ")",
        fontsize=9,
    )
    prompts.set_xlabel("tokens")
    prompts.set_ylabel("requests")

    outputs = axes[1][0]
    outputs.hist(trace.output_tokens, bins=40, color="tab:green", alpha=0.8)
    outputs.set_title("output tokens per request", fontsize=9)
    outputs.set_xlabel("tokens")
    outputs.set_ylabel("requests")

    mix = axes[1][1]
    labels = [f"tag {t}" for t in summary.tags] + [f"LoRA {name}" for name in summary.lora]
    counts = list(summary.tags.values()) + list(summary.lora.values())
    mix.barh(labels, counts, color=["tab:purple"] * len(summary.tags) + ["tab:red"] * len(summary.lora))
    mix.invert_yaxis()
    mix.set_title("tags and LoRA use", fontsize=9)
    mix.set_xlabel("requests")

    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png", dpi=110)
    plt.close(figure)
    write_atomic(path, buffer.getvalue())
