"""The `tuner` command. It renders every `TunerError` as one line and a non-zero exit code."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

# Only what parsing the command line needs is imported here; each command imports the rest itself.
# The plugins, the study and the reports pull in pydantic, httpx, asyncssh, optuna, pandas, numpy and
# scipy, seconds on a small machine that `tuner --help`, a mistyped flag or `tuner kinds` would pay for
# nothing. The names the parser shows come from `tuner.catalog`; tests/test_startup.py checks both.
from tuner import catalog
from tuner.errors import ConfigError, StudyError, TunerError
from tuner.files import check_output, write_atomic
from tuner.redact import RedactingFilter, redact

if TYPE_CHECKING:
    from rich.console import Console

    from tuner.config import StudySpec
    from tuner.report import Leaderboard

__all__ = ["main"]

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


_T = TypeVar("_T")

# The README's exit codes, shown by `tuner --help`.
EXIT_CODES = """exit codes:
  0    done
  1    the run failed (the host is back on its baseline); with run --check, a check failed
  2    a bad study file, workload file, flag or value, or a study changed on resume: the message
       names it and the fix
  75   the host stayed unreachable past the reconnect window (its dead-man timer restores it)
  130  Ctrl-C; 143 SIGTERM (run, apply and restore put the host's baseline back first)"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line (with where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}; see `{self.prog} --help`\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _long_tokens(text: str) -> int:
    value = _positive(text)
    if value > catalog.MAX_PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {catalog.MAX_PROMPT_TOKENS:,} (a trace's limit), got {text}")
    return value


def _positive_float(text: str) -> float:
    """A positive, finite number of seconds or tokens per second: NaN, infinities, 0 and below are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner",
        description="Tune a self-hosted LLM server against recorded traffic.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        choices=["warning", "info", "debug"],
        default="warning",
        help="library log messages on stderr, for troubleshooting (default: warning)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    _add_run_command(commands)
    _add_status_command(commands)
    _add_apply_commands(commands)
    _add_leaderboard_command(commands)
    _add_report_command(commands)
    _add_diagnose_command(commands)

    workload = commands.add_parser("workload", help="inspect a workload trace")
    workload_commands = workload.add_subparsers(dest="workload_command", required=True)
    show = workload_commands.add_parser("show", help="what a trace will replay, in numbers")
    show.add_argument("trace", type=Path, help="trace file (JSONL)")
    show.add_argument("--long-prompt-tokens", type=_positive, default=1000, help="new tokens that make a prompt long")
    show.add_argument("--plot", type=Path, help="also draw the trace into this image (.png, .svg or .pdf)")
    show.add_argument(
        "--prefill-tok-s",
        type=_positive_float,
        default=1000.0,
        help="prefill speed for estimating durations when the trace has none (default 1000)",
    )
    show.add_argument(
        "--decode-tok-s",
        type=_positive_float,
        default=30.0,
        help="per-request decode speed for that estimate (default 30)",
    )
    synth = workload_commands.add_parser("synth", help="write a synthetic trace of a known traffic shape")
    synth.add_argument("kind", choices=catalog.GENERATOR_KINDS, help="the traffic shape")
    synth.add_argument("--out", type=Path, required=True, help="trace file to write (JSONL)")
    synth.add_argument("--users", type=_positive, default=4, help="simulated users (default 4)")
    synth.add_argument("--turns", type=_positive, default=3, help="turns per user (default 3)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument(
        "--long-tokens",
        type=_long_tokens,
        default=8000,
        help="largest new-token count of a long prompt, for `stall` (default 8000)",
    )

    record = commands.add_parser(
        "record", help="record your traffic's shape through a proxy placed in front of the server (no text kept)"
    )
    record.add_argument("--upstream", required=True, help="the server's URL, e.g. http://127.0.0.1:8080")
    record.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT the application connects to instead")
    record.add_argument("--out", type=Path, required=True, help="trace file to write (JSONL), rewritten atomically")
    record.add_argument("--name", help="trace name (default: the file name)")
    record.add_argument("--tag-header", default="X-Tuner-Tag", help="request header whose value tags a request")
    record.add_argument("--duration", type=_positive_float, help="stop after this many seconds (default: at Ctrl-C)")
    record.add_argument("--max-requests", type=_positive, help="stop after recording this many requests")
    record.add_argument(
        "--keep-content",
        action="store_true",
        help="also write each request's messages or prompt into the trace (default: shape only, no text)",
    )
    imports = workload_commands.add_parser(
        "import",
        help="turn another tool's trace or a server log into a trace",
        description=_importer_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    imports.add_argument("kind", help="the input's format: " + ", ".join(catalog.IMPORTER_FORMATS))
    imports.add_argument("source", type=Path, help="the file to import")
    imports.add_argument("--out", type=Path, required=True, help="trace file to write (JSONL)")
    imports.add_argument("--name", help="trace name (default: the output file name)")
    imports.add_argument(
        "--set", dest="options", action="append", default=[], metavar="KEY=VALUE", help="importer option (repeatable)"
    )

    trust = commands.add_parser("trust-host", help="show a host's SSH key fingerprint and pin it for the ssh host kind")
    trust.add_argument("host", help="host name or address")
    trust.add_argument("--port", type=_port, default=22, help="SSH port (default 22)")
    trust.add_argument("--known-hosts", type=Path, help="pinned keys file (default ~/.config/serve-tuner/known_hosts)")
    trust.add_argument("--yes", action="store_true", help="pin without asking (after checking the fingerprint)")

    commands.add_parser("setup", help="fetch the model and build llama-server (one time)")
    commands.add_parser("kinds", help="list the host, deploy and engine kinds")
    return parser


def _add_storage_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--storage", metavar="URL", help=f"{what}; a password is better left to PGPASSWORD or ~/.pgpass"
    )


def _use_storage(args: argparse.Namespace) -> None:
    """`--storage URL` for the commands that read a run directory: its password becomes a secret at once."""
    if getattr(args, "storage", None):
        from tuner.storage import override_storage

        override_storage(args.storage)


def _holds_study(run_path: Path) -> bool:
    from tuner.storage import holds_study

    return holds_study(run_path)


def _add_status_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    status = commands.add_parser(
        "status", help="where a run stands (also while it runs, from another shell): trials, phase, time left"
    )
    status.add_argument("run_dir", type=Path, help="the study's run directory, e.g. runs/stall-demo")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    _add_storage_flag(status, "read a fleet's hosts from this storage instead of the one the run directory records")


def _add_run_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    run = commands.add_parser("run", help="run or resume a tuning study")
    run.add_argument("study", type=Path, help="study file (TOML)")
    run.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run directories live (default: runs)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a study value, e.g. --set budget.trials=3 (repeatable)",
    )
    run.add_argument(
        "--host",
        dest="hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this host of the study's [[hosts]] (repeatable); the others' controllers share the study",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="change nothing: connect, look at the host, unit, files, knobs and budget, and say whether the study "
        "can run (exit 0) or what to fix (exit 1)",
    )
    _add_storage_flag(run, "the study's storage instead of [storage] url (a fleet's shared database)")


def _add_report_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    report = commands.add_parser(
        "report", help="write a study's morning report: one self-contained HTML page (also made by every run)"
    )
    report.add_argument("run_dir", type=Path, help="the run directory, e.g. runs/stall-demo")
    report.add_argument("--out", type=Path, help="where to write it (default: RUN_DIR/report.html)")
    _add_storage_flag(report, "read the study from this storage instead of the one the run directory records")


def _duration(text: str) -> float:
    from tuner.diagnose import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}: pass a time from the log's first line, e.g. 90s, 15m, 2h or 1h30m"
        ) from None


def _add_diagnose_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    diagnose = commands.add_parser("diagnose", help="why a server is slow, from its own log (changes no host)")
    diagnose.add_argument("log", type=Path, help="llama-server log, journalctl output, Ollama or vLLM log; - for stdin")
    diagnose.add_argument("--json", action="store_true", help="print the findings as one JSON document")
    diagnose.add_argument(
        "--since",
        type=_duration,
        metavar="DURATION",
        help="only requests launched this long after the log's first line (90s, 15m, 2h, 1h30m)",
    )
    diagnose.add_argument(
        "--until", type=_duration, metavar="DURATION", help="only requests launched up to this long after it"
    )
    diagnose.add_argument(
        "--long-prompt-tokens",
        type=_long_tokens,
        default=1000,
        metavar="N",
        help="new prompt tokens from which a prefill counts as long (1000)",
    )
    diagnose.add_argument(
        "--min-wait",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="waits before prefill shorter than this are not reported (1)",
    )
    diagnose.add_argument("--metrics", type=Path, metavar="FILE", help="a vLLM /metrics scrape to read beside its log")
    diagnose.add_argument(
        "--study",
        type=Path,
        metavar="OUT.toml",
        help="also write a study of the knobs the findings name (with OUT.workload.jsonl and OUT.space.toml)",
    )
    diagnose.add_argument(
        "--like",
        type=Path,
        metavar="STUDY.toml",
        help="a study of the server that wrote the log: --study takes its [host], [deploy] and [engine] "
        "(without it, the study starts its own server on this machine)",
    )
    diagnose.add_argument("--force", action="store_true", help="let --study replace files that exist")


def _diagnose(args: argparse.Namespace, console: Console) -> int:
    from tuner.console import make_console
    from tuner.diagnose import diagnose_log
    from tuner.diagnose.study import read_like_study, write_study
    from tuner.diagnose_console import render_diagnosis

    if args.like is not None and args.study is None:
        raise ConfigError(
            "--like names the study whose [host], [deploy] and [engine] a written study takes; add --study OUT.toml"
        )
    # Before the log is read, which may take a while: a wrong --like is refused at once.
    like = read_like_study(args.like) if args.like is not None else None
    diagnosis = diagnose_log(
        args.log,
        long_prompt_tokens=args.long_prompt_tokens,
        min_wait_s=args.min_wait,
        since_s=args.since,
        until_s=args.until,
        metrics_scrape=args.metrics,
    )
    written = None
    if args.study is not None:
        written = write_study(diagnosis, args.log, args.study, like=like, force=args.force)
    if args.json:
        sys.stdout.write(diagnosis.model_dump_json(indent=1) + "\n")
    else:
        render_diagnosis(diagnosis, console)
    if written is not None:
        said = make_console(stderr=True) if args.json else console
        for path in written.paths:
            said.print(f"wrote {path}", markup=False, highlight=False)
        for note in written.notes:
            said.print(note, markup=False, highlight=False, soft_wrap=True)
    return 0


def _add_leaderboard_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    board = commands.add_parser("leaderboard", help="show a study's trials, best first")
    board.add_argument("run_dir", type=Path, help="the study's run directory, e.g. runs/stall-demo")
    board.add_argument("--csv", type=Path, help="also write the leaderboard as CSV")
    board.add_argument("--parquet", type=Path, help="also write the leaderboard as Parquet (the CSV's columns)")
    _add_storage_flag(board, "read the study from this storage instead of the one the run directory records")
    shown = board.add_mutually_exclusive_group()
    shown.add_argument(
        "--wide", action="store_true", help="every column with its full header and ranges, wider than the terminal"
    )
    shown.add_argument(
        "--json", action="store_true", help="the leaderboard as one JSON document on stdout, for scripts (no table)"
    )


def _add_apply_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    apply = commands.add_parser(
        "apply", help="make a study's recommended settings the host's own, after a verification run (systemd)"
    )
    apply.add_argument("study", type=Path, help="the study file the run was made with")
    apply.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run directories live (default: runs)")
    apply.add_argument("--trial", type=int, help="apply this trial instead of the recommendation")
    _add_hosts_flag(apply, "apply on this host of the study's [[hosts]] only (repeatable; default: each in turn)")
    _add_storage_flag(apply, "read the study from this storage instead of the one the run directory records")
    apply.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS
    )
    restore = commands.add_parser("restore", help="remove what `tuner apply` wrote; the unit runs its own config again")
    restore.add_argument("study", type=Path, help="the study file the settings were applied with")
    _add_hosts_flag(restore, "restore this host of the study's [[hosts]] only (repeatable; default: every one)")
    restore.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS
    )


def _add_hosts_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--host", dest="hosts", action="append", default=[], metavar="NAME", help=what)


def _importer_help() -> str:
    lines = [f"{kind}: {description}" for kind, description in catalog.IMPORTER_FORMATS.items()]
    return "Formats:\n  " + "\n  ".join(lines)


def _run(args: argparse.Namespace, console: Console) -> int:
    from tuner.config import load_study

    spec, base_dir = load_study(args.study, args.overrides)
    if args.storage or spec.storage is not None:
        from tuner.config import StorageSpec
        from tuner.storage import remember_url

        if args.storage:
            kept = spec.storage.model_dump() if spec.storage is not None else {}
            spec = spec.model_copy(update={"storage": StorageSpec.model_validate({**kept, "url": args.storage})})
        assert spec.storage is not None
        remember_url(spec.storage.url)  # its password is a secret from here on: redacted wherever it would show
    if args.check:
        return _check(args, spec, base_dir, console)
    # The study's own modules once its file is read: a wrong path or value is refused without them.
    from tuner.live import run_observer
    from tuner.morning_report import REPORT_NAME, ReportWriter
    from tuner.observers import Observers
    from tuner.progress import Plan, ProgressTracker, progress_file
    from tuner.report import leaderboard_frame
    from tuner.study import run_study

    run_path = args.runs_dir / spec.name
    tracker = ProgressTracker(Plan.of(spec), path=run_path / progress_file(args.hosts or ()))

    received: list[int] = []

    report = ReportWriter(run_path, say=lambda line: console.print(line, style="yellow", markup=False))

    async def main() -> None:
        _stop_on_signals(received)
        with run_observer(console, tracker) as observer:
            await run_study(spec, base_dir, run_path, Observers(observer, report), hosts=args.hosts or None)

    started = time.monotonic()
    _run_stoppable(main(), received)
    board = _show(run_path, console, show_all=f"`tuner leaderboard {run_path} --wide` shows all")
    write_atomic(run_path / "leaderboard.csv", leaderboard_frame(board).to_csv(index=False).encode())
    report.write()  # as after every trial: a page that cannot be written is said, the run's outcome stands
    written = "" if report.failed else f", the report in {run_path / REPORT_NAME}"
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    console.print(
        f"this run took {minutes}m{seconds:02d}s; leaderboard also in {run_path / 'leaderboard.csv'}{written}",
        markup=False,
    )
    _raise_if_stopped(received)  # stopped while the leaderboard was written: still 130 or 143
    return 0


def _check(args: argparse.Namespace, spec: StudySpec, base_dir: Path, console: Console) -> int:
    """`tuner run --check`: one line per finding; 0 if the study can run, 1 if something must be fixed first."""
    from tuner.check import check_study

    run_path = args.runs_dir / spec.name
    text = args.study.read_text(errors="replace")  # load_study read it a moment ago
    lines = asyncio.run(check_study(spec, base_dir, run_path, hosts=args.hosts or None, study_text=text))
    for line in lines:
        detail = " ".join(line.detail.split())  # a host command's stderr may hold line breaks
        shown = f"{'ok  ' if line.ok else 'FAIL'}  {line.subject}: {detail}"
        console.print(shown, markup=False, highlight=False, soft_wrap=True)  # one line each, for grep and logs
    failed = [line for line in lines if not line.ok]
    if failed:
        console.print(f"{len(failed)} of {len(lines)} checks failed: fix them before the night, then check again")
        return 1
    console.print(f"the study can run ({len(lines)} checks passed; nothing on the host was changed)")
    return 0


def _status(args: argparse.Namespace, console: Console) -> int:
    import json

    from tuner.progress import controller_statuses, run_status

    _use_storage(args)
    status = run_status(args.run_dir)
    # A fleet's controllers sharing the directory (`--host`): each one's own progress, beside the directory's
    # one controller's where a run without --host left it.
    controllers = controller_statuses(args.run_dir, now=status.now)
    fleet = _fleet_status(args.run_dir)
    if args.json:
        own = status.as_json()
        if controllers and status.progress is None and not status.running:
            # Only `--host` controllers wrote here: the run is running while one of them is.
            running = [c for c in controllers if c.running]
            own["running"] = bool(running)
            own["status"] = f"{len(running)} of {len(controllers)} controllers running; see controllers"
        shown = {
            **own,
            **({"controllers": [c.as_json() for c in controllers]} if controllers else {}),
            **({"fleet": fleet} if fleet is not None else {}),
        }
        print(json.dumps(shown, indent=2))
        return 0
    from tuner.live import render_status

    if status.progress is not None or status.running or not controllers:
        render_status(status, console)
    for controller in controllers:
        render_status(controller, console)
    for host in fleet or []:
        now = f", measuring trial {host['running']}" if host["running"] is not None else ""
        gone = f"; dropped: {host['dropped']}" if host["dropped"] else ""
        base = "baseline measured" if host["baseline"] is not None else "no baseline yet"
        console.print(f"host {host['host']}: {base}, {host['trials']} trials{now}{gone}", highlight=False)
    return 0


def _fleet_status(run_path: Path) -> list[dict[str, Any]] | None:
    """A fleet's hosts, read from the storage the run directory records (None: not a fleet's run)."""
    import json

    try:
        spec = json.loads((run_path / "spec.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(spec, dict) or not spec.get("hosts"):
        return None
    from tuner.fleet import fleet_summary
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    try:
        return fleet_summary(open_optuna_study_readonly(RunDirectory(run_path)))
    except StudyError:
        return None


def _apply(args: argparse.Namespace, console: Console) -> int:
    from tuner.apply import Applied, apply_to_hosts
    from tuner.config import load_study
    from tuner.study import fleet_hosts

    _use_storage(args)
    spec, base_dir = load_study(args.study, args.overrides)
    if args.hosts:
        fleet_hosts(spec, args.hosts)  # a wrong --host is the user's mistake (exit 2), run directory or not
    run_path = args.runs_dir / spec.name
    if not _holds_study(run_path):
        raise StudyError(f"{run_path} holds no study; run `tuner run {args.study}` first")

    received: list[int] = []

    def applied(result: Applied) -> None:  # each host as it is done: a rollout may stop at the next
        settings = ", ".join(f"{k}={v}" for k, v in sorted(result.server_settings.items())) or "(the baseline's)"
        stall, ttft = result.metrics.get("stall_tok_s"), result.metrics.get("ttft_p95_s")
        on = "" if result.host is None else f" on {result.host}"
        console.print(
            f"verification run{on}: {result.requests} requests, all answered"
            + (f"; stall {stall:.2f} tok/s" if stall is not None else "")
            + (f", TTFT p95 {ttft:.2f} s" if ttft is not None else "")
        )
        console.print(f"applied trial {result.trial} ({settings}){on} for good: {result.path}", highlight=False)
        if result.client_settings:
            client = ", ".join(f"{k}={v}" for k, v in sorted(result.client_settings.items()))
            console.print(f"also set on the clients' side, which the host cannot carry: {client}", highlight=False)

    async def main() -> list[Applied]:
        _stop_on_signals(received)
        return await apply_to_hosts(
            spec, base_dir, run_path, trial=args.trial, hosts=args.hosts, say=console.print, applied=applied
        )

    done = _run_stoppable(main(), received)
    named = "".join(f" --host {a.host}" for a in done if a.host is not None) if args.hosts else ""
    console.print(f"`tuner restore {args.study}{named}` removes it", highlight=False)
    return 0


def _restore(args: argparse.Namespace, console: Console) -> int:
    from tuner.apply import restore_hosts
    from tuner.config import load_study

    spec, base_dir = load_study(args.study, args.overrides)

    received: list[int] = []

    def restored(host: str | None, removed: str | None) -> None:
        on = "" if host is None else f"{host}: "
        if removed is None:
            console.print(f"{on}the host has no settings of `tuner apply`; nothing to remove", highlight=False)
        else:
            console.print(
                f"{on}removed {removed}; the unit runs the operator's own configuration again", highlight=False
            )

    async def main() -> None:
        _stop_on_signals(received)
        await restore_hosts(spec, base_dir, hosts=args.hosts, restored=restored)

    _run_stoppable(main(), received)
    return 0


def _stop_on_signals(received: list[int]) -> None:
    """Ctrl-C and SIGTERM cancel the running task, whose `finally` blocks put the host back.

    A library can absorb a cancellation (anyio's shielded scopes, which httpcore uses to close a
    response, may); the job must stop all the same, so the cancellation is repeated while the task runs
    on with none pending. During clean-up one stays pending, so the restore itself is never cut short.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    insisting = False  # one chain of repeats, however many signals arrive

    def insist() -> None:
        nonlocal insisting
        insisting = True
        if task.done():
            return
        if task.cancelling() == 0:
            task.cancel()
        loop.call_later(0.5, insist)

    def on_signal(signum: int, frame: object) -> None:
        # Runs in the main thread between two bytecodes, and a signal arriving meanwhile runs it again
        # inside itself: record, and wake the loop only for the first one.
        first = not received
        received.append(signum)
        if first and not insisting and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(insist)

    # signal.signal, not loop.add_signal_handler: asyncio puts the default action back when its loop
    # closes, and a second signal in that moment would kill the process with -15 instead of 143.
    # These stay until `main` returns: one that arrives after the loop is only recorded, and
    # `_raise_if_stopped` turns it into the exit code (never an exception at an arbitrary line).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)


def _hold_late_signals() -> None:
    """Once the exit code is decided, further signals change nothing: ignored, since Python's own
    shutdown puts the default action back for a handler of ours, and one would end it with -15."""
    stopping = (signal.SIGINT, signal.SIGTERM)
    # Blocked first, so none arrives from here on; then a do-nothing handler, which takes any that
    # Python noted but has not handled yet (one meeting SIG_IGN is reported "ignored due to race
    # condition" with a traceback); then SIG_IGN, which Python's shutdown leaves alone.
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    for signum in stopping:
        signal.signal(signum, _ignore_signal)
    for signum in stopping:
        signal.signal(signum, signal.SIG_IGN)


def _ignore_signal(signum: int, frame: object) -> None:
    """A signal after the exit code was decided: nothing to do."""


def _run_stoppable(command: Coroutine[Any, Any, _T], received: list[int]) -> _T:
    """`asyncio.run` of a host command that called `_stop_on_signals(received)`: a signal's exit code
    wins over the command's result, however the loop ended."""
    try:
        result = asyncio.run(command)
    except asyncio.CancelledError:
        _raise_if_stopped(received)
        raise
    _raise_if_stopped(received)
    return result


def _raise_if_stopped(received: list[int]) -> None:
    """A signal that arrived while the command finished (its clean-up done) still sets its exit code."""
    if signal.SIGINT in received:
        raise KeyboardInterrupt
    if received:
        raise asyncio.CancelledError


def _trust_host(args: argparse.Namespace, console: Console) -> int:
    from tuner.transports.ssh import DEFAULT_KNOWN_HOSTS, fetch_host_key, pin_host_key

    key = asyncio.run(fetch_host_key(args.host, args.port))
    known_hosts = (args.known_hosts or Path(DEFAULT_KNOWN_HOSTS)).expanduser()
    console.print(f"{args.host}:{args.port} offers a {key.get_algorithm()} key with fingerprint")
    console.print(f"  {key.get_fingerprint('sha256')}", highlight=False)
    console.print("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the host itself")
    if not args.yes:
        answer = console.input(f"pin it in {known_hosts}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            console.print("not pinned")
            return 1
    pin_host_key(known_hosts, args.host, args.port, key)
    console.print(f"pinned in {known_hosts}")
    return 0


def _record(args: argparse.Namespace, console: Console) -> int:
    from tuner.record import Recorder, RecorderOptions

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {args.listen!r} is not HOST:PORT; pass e.g. 127.0.0.1:8081")
    if int(port) > 65535:
        raise ConfigError(f"--listen {args.listen!r}: port {port} is out of range (0-65535); pass e.g. 127.0.0.1:8081")
    options = RecorderOptions(
        upstream=args.upstream,
        out=args.out,
        name=args.name or args.out.stem,
        listen_host=host,
        listen_port=int(port),
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
        _stop_on_signals([])

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


def _show(
    run_path: Path,
    console: Console,
    *,
    csv: Path | None = None,
    parquet: Path | None = None,
    wide: bool = False,
    as_json: bool = False,
    show_all: str = "--wide shows all",
) -> Leaderboard:
    """Shows the leaderboard (a table, or JSON on stdout) and writes the report files asked for; their
    paths are checked before the study is read, so a bad one is refused with nothing shown or written."""
    from tuner.console import make_console, render_leaderboard
    from tuner.report import build_leaderboard, leaderboard_document, leaderboard_frame, leaderboard_parquet
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    study_files = [run_path / name for name in _STUDY_FILES]  # never to be overwritten by a report
    for flag, path in (("--csv", csv), ("--parquet", parquet)):
        if path is not None:
            _check_report_path(flag, path, study_files=study_files)
    if csv is not None and parquet is not None and check_output(csv) == check_output(parquet):
        raise ConfigError(f"--csv and --parquet both name {csv}: one would replace the other; pass two file names")
    study = open_optuna_study_readonly(RunDirectory(run_path))
    board = build_leaderboard(study)
    if as_json:
        console.file.write(leaderboard_document(board).model_dump_json(indent=2) + "\n")
    else:
        render_leaderboard(board, console, wide=wide, show_all=show_all)
    notes = make_console(stderr=True) if as_json else console  # stdout holds the JSON document alone
    if csv is not None:
        write_atomic(csv, leaderboard_frame(board).to_csv(index=False).encode(), inputs=study_files)
        notes.print(f"wrote {csv}", highlight=False)
    if parquet is not None:
        write_atomic(parquet, leaderboard_parquet(board), inputs=study_files)
        notes.print(f"wrote {parquet}", highlight=False)
    return board


# What a run directory holds of the study itself: no report may be written over one of them.
_STUDY_FILES = ("optuna.journal", "spec.json")


def _check_report_path(flag: str, path: Path, *, study_files: list[Path]) -> None:
    """`--csv` or `--parquet` names a file in a directory that exists, and none of the study's own."""
    example = "leaderboard." + flag.removeprefix("--")
    _check_output_in_existing_directory(flag, path, example=example)
    check_output(path, inputs=study_files)


def _check_output_in_existing_directory(flag: str, path: Path, *, example: str) -> None:
    """A report file goes into a directory the user already has: a typo in it must not create directories."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; name a file in it, e.g. {path / example}")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: directory {path.parent} does not exist; create it or pick another path")


def _os_error_line(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    fix = ""
    if exc.errno == errno.ENOSPC:
        fix = (
            "; free some space there and run again (a study's run directory keeps its completed trials; "
            "`--runs-dir` puts it on another disk)"
        )
    return f"{exc.strerror or exc}{where}{fix}"


def _workload(args: argparse.Namespace, console: Console) -> int:
    from tuner.console import render_trace_summary
    from tuner.workloads import (
        SynthOptions,
        check_synthesis_fits,
        load_trace,
        summarize_trace,
        synthesize_trace,
        trace_lines,
    )

    if args.workload_command == "show":
        if args.plot is not None:  # before the work, which can be long on a big trace
            if args.plot.suffix.lower() not in (".png", ".svg", ".pdf"):
                raise ConfigError(f"--plot {args.plot}: use a .png, .svg or .pdf file name")
            _check_output_in_existing_directory("--plot", args.plot, example="trace.png")
        trace = load_trace(args.trace)
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
    if args.workload_command == "synth":
        options = SynthOptions(users=args.users, turns=args.turns, seed=args.seed, long_tokens=args.long_tokens)
        check_synthesis_fits(args.kind, options)
        trace = synthesize_trace(args.kind, options)
        write_atomic(args.out, trace_lines(trace))
        console.print(f"wrote {len(trace)} requests to {args.out}")
        render_trace_summary(summarize_trace(trace), console)
        return 0
    if args.workload_command == "import":
        from tuner.config import apply_overrides
        from tuner.importers import import_trace

        check_output(args.out, inputs=[args.source])  # before the import's work, which can be long
        trace = import_trace(args.kind, args.source, apply_overrides({}, args.options), name=args.name or args.out.stem)
        write_atomic(args.out, trace_lines(trace), inputs=[args.source])
        console.print(f"wrote {len(trace)} requests to {args.out}")
        render_trace_summary(summarize_trace(trace), console)
        return 0
    raise ConfigError(f"unknown workload command {args.workload_command!r}")


# Commands that change a host, and so restore it when stopped; the others only read or write files.
_HOST_COMMANDS = ("run", "apply", "restore")


def _after_stop(args: argparse.Namespace) -> str:
    """What a stopped command left: a host command restored the baseline; the others touched no host
    (their output is written atomically, whole or not at all), so they claim nothing."""
    return ": the baseline was restored" if args.command in _HOST_COMMANDS else ""


def entry() -> NoReturn:
    """The `tuner` command: main, then its exit code, with no signal after that deciding another."""
    sys.exit(main(hold_late_signals=True))


def main(argv: Sequence[str] | None = None, *, hold_late_signals: bool = False) -> int:
    """Runs one command; returns its exit code. Signal handlers it sets are put back on return (it may
    be called in-process), unless `hold_late_signals`: then signals are ignored from here on."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(argv)
    finally:
        if hold_late_signals:
            _hold_late_signals()
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _leaderboard(args: argparse.Namespace, console: Console) -> int:
    _use_storage(args)
    if not _holds_study(args.run_dir):
        raise StudyError(f"{args.run_dir} holds no study; pass a directory made by `tuner run`, e.g. runs/stall-demo")
    _show(args.run_dir, console, csv=args.csv, parquet=args.parquet, wide=args.wide, as_json=args.json)
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    _use_storage(args)
    if not _holds_study(args.run_dir):
        raise StudyError(f"{args.run_dir} holds no study; pass a directory made by `tuner run`, e.g. runs/stall-demo")
    out = args.out if args.out is not None else args.run_dir / "report.html"
    study_files = [args.run_dir / name for name in _STUDY_FILES]  # never to be overwritten by a report
    _check_output_in_existing_directory("--out", out, example="report.html")
    check_output(out, inputs=study_files)
    _check_not_in_run_directory(out, args.run_dir)
    from tuner.morning_report import write_report

    console.print(f"wrote {write_report(args.run_dir, out, inputs=study_files)}", markup=False)
    return 0


def _check_not_in_run_directory(out: Path, run_dir: Path) -> None:
    """Inside the run directory a report may only be its own report.html: every other file there is the
    run's evidence or its lock, which the report reads or a running controller holds."""
    target, run = Path(os.path.realpath(out)), Path(os.path.realpath(run_dir))
    if run in target.parents and target != run / "report.html":
        raise ConfigError(
            f"--out {out} is inside the run directory {run_dir}, whose files are the run's own; write the report "
            f"to {run_dir / 'report.html'} (the default) or outside it"
        )


def _setup(_args: argparse.Namespace, console: Console) -> int:
    from tuner import assets

    console.print(f"model: {assets.ensure_model()}")
    console.print(f"llama-server: {assets.ensure_llama_server()}")
    console.print(f"test LoRA adapter: {assets.ensure_test_lora()}")
    return 0


def _kinds(_args: argparse.Namespace, console: Console) -> int:
    console.print(f"host:   {', '.join(catalog.TRANSPORT_KINDS)}")
    console.print(f"deploy: {', '.join(catalog.DEPLOYER_KINDS)}")
    console.print(f"engine: {', '.join(catalog.ENGINE_KINDS)}")
    return 0


# Each subcommand of `_parser()` and the function that runs it.
_COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "run": _run,
    "status": _status,
    "apply": _apply,
    "restore": _restore,
    "leaderboard": _leaderboard,
    "report": _report,
    "diagnose": _diagnose,
    "workload": _workload,
    "record": _record,
    "trust-host": _trust_host,
    "setup": _setup,
    "kinds": _kinds,
}


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    from tuner.console import make_console  # after parsing: `--help` and a mistyped flag print no rich

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # a library's debug line may carry a header or the key
        handler.addFilter(RedactingFilter())
    console = make_console()
    err = make_console(stderr=True)
    try:
        return _COMMANDS[args.command](args, console)
    except TunerError as exc:
        # The last line out: server text an error quotes is scrubbed here whatever raised it.
        err.print(f"error: {redact(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except OSError as exc:
        # Raised by this machine's own files (a full disk under the run directory, say), after the
        # study's `finally` blocks put the host back.
        err.print(f"error: {_os_error_line(exc)}", markup=False, highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print(f"interrupted{_after_stop(args)}", markup=False, highlight=False)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        err.print(f"terminated{_after_stop(args)}", markup=False, highlight=False)
        return EXIT_TERMINATED


if __name__ == "__main__":
    sys.exit(main())
