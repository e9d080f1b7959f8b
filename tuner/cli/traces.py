"""The commands that make or read a workload trace: `tuner workload show / synth / import` and `tuner record`."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from tuner.cli.checks import listen_address
from tuner.cli.outputs import check_output_in_existing_directory
from tuner.cli.signals import stop_on_signals
from tuner.files import check_output, write_atomic

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["import_", "record", "show", "synth"]


def show(args: argparse.Namespace, console: Console) -> int:
    from tuner.console import render_trace_summary
    from tuner.workloads import load_trace, summarize_trace

    if args.plot is not None:  # before the work, which can be long on a big trace
        check_output_in_existing_directory("--plot", args.plot, example="trace.png")
    trace = load_trace(args.trace, named_by="the trace's path")
    summary = summarize_trace(
        trace,
        long_prompt_tokens=args.long_prompt_tokens,
        prefill_tok_s=args.prefill_tok_s,
        decode_tok_s=args.decode_tok_s,
    )
    render_trace_summary(summary, console)
    if args.plot is not None:
        from tuner.workloads.plot import plot_trace

        plot_trace(trace, summary, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def synth(args: argparse.Namespace, console: Console) -> int:
    from tuner.console import render_trace_summary
    from tuner.workloads import SynthOptions, check_synthesis_fits, summarize_trace, synthesize_trace, trace_lines

    options = SynthOptions(users=args.users, turns=args.turns, seed=args.seed, long_tokens=args.long_tokens)
    check_synthesis_fits(args.kind, options)
    trace = synthesize_trace(args.kind, options)
    write_atomic(args.out, trace_lines(trace))
    console.print(f"wrote {len(trace)} requests to {args.out}")
    render_trace_summary(summarize_trace(trace), console)
    return 0


def import_(args: argparse.Namespace, console: Console) -> int:
    from tuner.config import apply_overrides
    from tuner.console import render_trace_summary
    from tuner.importers import import_trace
    from tuner.workloads import summarize_trace, trace_lines

    check_output(args.out, inputs=[args.source])  # before the import's work, which can be long
    trace = import_trace(args.kind, args.source, apply_overrides({}, args.options), name=args.name or args.out.stem)
    write_atomic(args.out, trace_lines(trace), inputs=[args.source])
    console.print(f"wrote {len(trace)} requests to {args.out}")
    render_trace_summary(summarize_trace(trace), console)
    return 0


def record(args: argparse.Namespace, console: Console) -> int:
    from tuner.record import Recorder, RecorderOptions

    host, port = listen_address(args.listen)  # checked once already, before this module was imported
    options = RecorderOptions(
        upstream=args.upstream,
        out=args.out,
        name=args.name or args.out.stem,
        listen_host=host,
        listen_port=port,
        tag_header=args.tag_header.lower(),
        max_requests=args.max_requests,
        keep_content=args.keep_content,
    )
    recorder = Recorder(options)
    recorder.on_request = lambda seen, count: console.print(
        f"{count:>5}  {seen.tag:<10} prompt {seen.prompt_tokens:>6}  output {seen.output_tokens:>5}"
        f"  {(seen.end_s or seen.arrival_s) - seen.arrival_s:6.2f} s",
        highlight=False,
    )

    async def main() -> int:
        stop_on_signals([])

        def ready(bound_port: int) -> None:
            console.print(
                f"recording: point your application at http://{host}:{bound_port} (it forwards to "
                f"{args.upstream}); Ctrl-C stops and writes {args.out}"
            )

        try:
            return await recorder.run(ready=ready, duration_s=args.duration)
        except asyncio.CancelledError:
            return recorder.recorded

    # The recorder names its own failures (--out, --listen, a full disk): an OSError here is neither.
    count = asyncio.run(main())
    if count == 0:
        console.print("no completion requests came through; nothing written")
    else:
        console.print(f"wrote {count} requests to {args.out}")
    return 0
