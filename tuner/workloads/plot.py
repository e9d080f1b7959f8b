"""A picture of a trace: in-flight requests and arrivals over time, prompt and output lengths, tags.

matplotlib is imported here only, on first use, so the rest of the tool starts fast without it.
"""

from __future__ import annotations

import io
from pathlib import Path

from tuner.files import write_atomic
from tuner.workloads.summary import TraceSummary
from tuner.workloads.trace import Trace

__all__ = ["plot_trace"]


def plot_trace(trace: Trace, summary: TraceSummary, path: Path) -> None:
    """Writes a PNG (or SVG, PDF: by the file's suffix) of the trace's shape, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    concurrency = summary.concurrency
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), layout="constrained")
    figure.suptitle(f"{summary.name}: {summary.requests} requests, {summary.sessions} sessions, {summary.span_s:.0f} s")

    timeline = axes[0][0]
    points = sorted([(s, 1) for s, _ in concurrency.intervals] + [(e, -1) for _, e in concurrency.intervals])
    times, levels, level = [0.0], [0], 0
    for at, step in points:
        level += step
        times.append(at)
        levels.append(level)
    timeline.step(times, levels, where="post", color="tab:blue", label="in flight")
    timeline.set_xlabel("seconds from the start")
    timeline.set_ylabel("requests in flight")
    timeline.set_title(f"in flight ({concurrency.basis})", fontsize=9)
    arrivals_axis = timeline.twinx()
    centers = [(i + 0.5) * concurrency.bucket_s + times[1] for i in range(len(concurrency.arrivals))]
    arrivals_axis.bar(centers, concurrency.arrivals, width=concurrency.bucket_s, alpha=0.25, color="tab:orange")
    arrivals_axis.set_ylabel(f"arrivals per {concurrency.bucket_s:.3g} s", color="tab:orange")

    prompts = axes[0][1]
    shapes = [r.prompt for r in trace.requests]
    parts = {
        "shared prefix": [p.prefix_tokens for p in shapes],
        "session history": [p.history_tokens for p in shapes],
        "new": [p.new_tokens for p in shapes],
    }
    prompts.hist([p.total_tokens for p in shapes], bins=40, color="tab:blue", alpha=0.8)
    prompts.set_title(
        "prompt tokens per request ("
        + ", ".join(f"{name} {sum(v) / max(1, sum(p.total_tokens for p in shapes)):.0%}" for name, v in parts.items())
        + ")",
        fontsize=9,
    )
    prompts.set_xlabel("tokens")
    prompts.set_ylabel("requests")

    outputs = axes[1][0]
    outputs.hist([r.output_tokens for r in trace.requests], bins=40, color="tab:green", alpha=0.8)
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
