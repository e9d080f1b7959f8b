"""`tuner capacity`: the sweep of closed-loop users, its table and the sentence an operator passes on."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.cli.reading import holds_study, use_storage
from tuner.cli.signals import run_stoppable, stop_on_signals
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from tuner.capacity.command import CapacityPlan
    from tuner.capacity.record import CapacitySweep, SweptConfig
    from tuner.config import CapacitySpec

__all__ = ["capacity"]


_FLAGS = {
    "users": "--users",
    "shape": "--shape",
    "warm_up_s": "--warm-up",
    "window_s": "--window",
    "rounds": "--rounds",
}


def _options(args: argparse.Namespace, configured: CapacitySpec) -> CapacitySpec:
    """The study's [capacity] table with the command line's values over it, validated as the file is."""
    from tuner.config import CapacitySpec, validate_strictly

    given: dict[str, Any] = {
        "users": args.users, "shape": args.shape, "warm_up_s": args.warm_up, "window_s": args.window,
        "rounds": args.rounds,
    }  # fmt: skip
    merged = {**configured.model_dump(), **{k: v for k, v in given.items() if v is not None}}
    try:
        return validate_strictly(CapacitySpec, merged, source="tuner capacity")
    except ConfigError as exc:  # the flag a value came from, rather than the study file's key
        message = str(exc)
        for key, flag in _FLAGS.items():
            if given[key] is not None:
                message = message.replace(f"tuner capacity: {key}:", f"{flag}:")
        raise ConfigError(message) from None


def capacity(args: argparse.Namespace, console: Console) -> int:
    from tuner.capacity.command import measure_capacity, plan_capacity
    from tuner.capacity.record import capacity_sentence
    from tuner.config import load_study

    storage_url = use_storage(args)
    spec, base_dir = load_study(args.study, args.overrides)
    options = _options(args, spec.capacity)
    run_path = args.runs_dir / spec.name
    if not args.baseline and not holds_study(run_path, storage_url):
        what = f"trial {args.trial}" if args.trial is not None else "the recommendation"
        raise ConfigError(
            f"{run_path} holds no study to take {what} from; run `tuner run {args.study}` first, or pass --baseline "
            "to measure the baseline alone"
        )
    plan = plan_capacity(
        spec, base_dir, run_path, trial=args.trial, baseline_only=args.baseline, host=args.host, options=options,
        storage_url=storage_url,
    )  # fmt: skip
    if args.check:
        if args.json:
            raise ConfigError("--check prints its lines, not JSON: leave out --json")
        return _check(plan, base_dir, run_path, console)

    def say(line: str) -> None:
        if not args.json:
            console.print(line, highlight=False, markup=False)

    received: list[int] = []

    def saved(path: Path) -> None:
        say(f"the sweep is kept in {path}")

    async def main() -> CapacitySweep:
        stop_on_signals(received)
        return await measure_capacity(plan, run_path, say=say, saved=saved)

    sweep = run_stoppable(main(), received)
    report = _rewrite_report(run_path, storage_url, say)
    if args.json:
        print(sweep.model_dump_json(indent=2))
        return 0
    _print_table(sweep, console)
    console.print(capacity_sentence(sweep), highlight=False, markup=False)
    if report is not None:
        console.print(f"the run's report, with the sweep: {report}", highlight=False, markup=False)
    return 0


def _rewrite_report(run_path: Path, storage_url: str | None, say: Callable[[str], None]) -> Path | None:
    """The run's morning report written again with its capacity section; None for a sweep of a study never
    run (no report to add it to) or a page that could not be written (said in a line)."""
    from tuner.morning_report import REPORT_NAME, ReportWriter

    if not holds_study(run_path, storage_url):
        return None
    writer = ReportWriter(run_path, say=say)
    writer.write()
    return None if writer.failed else run_path / REPORT_NAME


def _check(plan: CapacityPlan, base_dir: Path, run_path: Path, console: Console) -> int:
    from tuner.capacity.command import sweep_length
    from tuner.check import assumed_start_s, check_study

    hosts = None if plan.host is None else [plan.host]  # the sweep's one host, not every host of the fleet
    lines = asyncio.run(check_study(plan.spec, base_dir, run_path, hosts=hosts))
    lines = [line for line in lines if not line.subject.endswith(("duration", "capacity"))]
    start_s = assumed_start_s(plan.spec, plan.prepared.engine)
    length = sweep_length(plan.prepared, plan.options, run_path, configs=len(plan.configs), start_s=start_s)
    configs = " and ".join(c.label for c in plan.configs)
    failed = [line for line in lines if not line.ok]
    for line in lines:
        detail = " ".join(line.detail.split())
        console.print(f"{'ok  ' if line.ok else 'FAIL'}  {line.subject}: {detail}", markup=False, highlight=False,
                      soft_wrap=True)  # fmt: skip
    console.print(
        f"ok    duration of {configs}: {length.text(plan.options, start_s=start_s)}",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    if failed:
        console.print(f"{len(failed)} of {len(lines) + 1} checks failed: fix them first, then check again")
        return 1
    console.print(f"the sweep can run ({len(lines) + 1} checks passed; nothing on the host was changed)")
    return 0


def _cell(config: SweptConfig, users: int, round_: int) -> str:
    figures = config.level(users, round_)
    return "" if figures is None else figures.cell


def _print_table(sweep: CapacitySweep, console: Console) -> None:
    from rich.table import Table

    table = Table(
        title=f"total tok/s / per-user tok/s / TTFT p95 per round; ok: within the SLO (TTFT p95 <= "
        f"{sweep.slo_ttft_p95_s:g} s, >= {sweep.slo_decode_tok_s:g} tok/s per user)",
        title_justify="left",
    )
    table.add_column("users", justify="right")
    for config in sweep.configs:
        for round_ in range(1, sweep.rounds + 1):
            table.add_column(f"{config.label}, round {round_}")
    for users in sweep.users:
        cells = [_cell(config, users, r) for config in sweep.configs for r in range(1, sweep.rounds + 1)]
        if any(cells):
            table.add_row(str(users), *cells)
    console.print(table)
