"""The table of `tuner`'s commands: each one's name, help, arguments, the checks of them that need no I/O,
and the function that runs it, named as `module:function` and imported only when the command runs.

The parser is built from this table alone (`tuner.cli.parser`), so `tuner --help` and a mistyped flag load
none of the commands' modules; tests/fast/test_startup.py checks it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import catalog
from tuner.cli import checks
from tuner.cli.checks import duration, length, long_tokens, port, positive, positive_float, user_levels

__all__ = ["COMMANDS", "Arg", "Command", "arg", "chosen"]


@dataclass(frozen=True)
class Arg:
    """One `add_argument` call; `exclusive` names a group of the command's arguments that exclude each other."""

    names: tuple[str, ...]
    options: Mapping[str, Any]
    exclusive: str | None = None


def arg(*names: str, exclusive: str | None = None, **options: Any) -> Arg:
    return Arg(names, options, exclusive)


@dataclass(frozen=True)
class Command:
    """A command, or a group of subcommands (`subcommands`, chosen into `args.<name>_command`)."""

    name: str
    help: str
    run: str = ""  # "module:function", taking (args, console) and returning the exit code
    args: tuple[Arg, ...] = ()
    check: Callable[[argparse.Namespace], None] | None = None  # no I/O: runs before `run` is imported
    subcommands: tuple[Command, ...] = ()
    description: str | None = None  # shown as written, line breaks kept
    restores_host: bool = False  # changes a host, so a stop restores it (and the stop line says so)


def _storage(what: str) -> Arg:
    return arg(
        "--storage",
        metavar="URL",
        type=_storage_url,
        help=f"{what}; a password is better left to PGPASSWORD or ~/.pgpass",
    )


def _storage_url(text: str) -> str:
    """An empty --storage would be passed over as if absent: refused in the command's line instead."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty URL; give one such as postgresql://user@host/db, or leave it out")
    return text


def _hosts(what: str) -> Arg:
    return arg("--host", dest="hosts", action="append", default=[], metavar="NAME", help=what)


def _runs_dir() -> Arg:
    return arg("--runs-dir", type=Path, default=Path("runs"), help="where run directories live (default: runs)")


def _hidden_overrides() -> Arg:
    return arg("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)


def _importer_help() -> str:
    lines = [f"{kind}: {description}" for kind, description in catalog.IMPORTER_FORMATS.items()]
    return "Formats:\n  " + "\n  ".join(lines)


_FROM_STORAGE = "read the study from this storage instead of the one the run directory records"

# In the order `tuner --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "run or resume a tuning study",
        run="tuner.cli.running:run",
        restores_host=True,
        args=(
            arg("study", type=Path, help="study file (TOML)"),
            _runs_dir(),
            arg(
                "--set",
                dest="overrides",
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="override a study value, e.g. --set budget.trials=3 (repeatable)",
            ),
            _hosts("run only this host of the study's [[hosts]] (repeatable); the others' controllers share the study"),
            arg(
                "--check",
                action="store_true",
                help="change nothing: connect, look at the host, unit, files, knobs and budget, and say whether the "
                "study can run (exit 0) or what to fix (exit 1)",
            ),
            _storage("the study's storage instead of [storage] url (a fleet's shared database)"),
            arg(
                "--predicted-from",
                type=Path,
                metavar="LOG",
                help="a llama-server log of the server the study tunes: measure the config the simulated server, "
                "calibrated from it, predicts to win first after the baseline (search.predicted_from)",
            ),
        ),
    ),
    Command(
        "status",
        "where a run stands (also while it runs, from another shell): trials, phase, time left",
        run="tuner.cli.reading:status",
        args=(
            arg("run_dir", type=Path, help="the study's run directory, e.g. runs/stall-demo"),
            arg("--json", action="store_true", help="print it as JSON"),
            _storage("read a fleet's hosts from this storage instead of the one the run directory records"),
        ),
    ),
    Command(
        "apply",
        "make a study's recommended settings the host's own, after a verification run (systemd)",
        run="tuner.cli.hosts:apply",
        restores_host=True,
        args=(
            arg("study", type=Path, help="the study file the run was made with"),
            _runs_dir(),
            arg("--trial", type=int, help="apply this trial instead of the recommendation"),
            _hosts("apply on this host of the study's [[hosts]] only (repeatable; default: each in turn)"),
            _storage(_FROM_STORAGE),
            _hidden_overrides(),
        ),
    ),
    Command(
        "capacity",
        "how many closed-loop users the baseline and the recommended settings each serve within the SLO",
        run="tuner.cli.capacity:capacity",
        restores_host=True,
        description=(
            "Starts each config on the study's host as a trial, then runs levels of closed-loop users (each sends\n"
            "its next request when its answer is in): a warm-up, then a measured window per level, climbing until\n"
            "two levels in a row break metrics.slo, in rounds (round 1 climbs, round 2 comes back down). The\n"
            "capacity is the most users that held the SLO in every round. The host is back on its baseline after.\n"
            "Defaults come from the study's [capacity] table."
        ),
        args=(
            arg("study", type=Path, help="the study file"),
            _runs_dir(),
            arg(
                "--trial",
                type=int,
                exclusive="config",
                help="sweep this trial alone instead of baseline and recommendation",
            ),
            arg("--baseline", action="store_true", exclusive="config", help="sweep the baseline alone (no run needed)"),
            arg("--users", type=user_levels, metavar="N,N,...", help="the levels of users, e.g. 1,2,4,8,16"),
            arg(
                "--shape",
                choices=catalog.CAPACITY_SHAPES,
                help=(
                    "what users ask: the study's workload, or ~640-token documents to summarize (a published "
                    "capacity benchmark's)"
                ),
            ),
            arg("--warm-up", dest="warm_up", type=length, metavar="LENGTH", help="load before each window, e.g. 15s"),
            arg("--window", type=length, metavar="LENGTH", help="each level's measured window, e.g. 60s"),
            arg("--rounds", type=positive, help="rounds per level"),
            arg("--host", metavar="NAME", help="the host of the study's [[hosts]] to measure"),
            arg("--json", action="store_true", help="print the sweep as JSON"),
            arg(
                "--check",
                action="store_true",
                help="change nothing: look at the host as `tuner run --check` does, and say how long the sweep takes",
            ),
            _storage(_FROM_STORAGE),
            _hidden_overrides(),
        ),
    ),
    Command(
        "restore",
        "remove what `tuner apply` wrote; the unit runs its own config again",
        run="tuner.cli.hosts:restore",
        restores_host=True,
        args=(
            arg("study", type=Path, help="the study file the settings were applied with"),
            _hosts("restore this host of the study's [[hosts]] only (repeatable; default: every one)"),
            _hidden_overrides(),
        ),
    ),
    Command(
        "leaderboard",
        "show a study's trials, best first",
        run="tuner.cli.reading:leaderboard",
        args=(
            arg("run_dir", type=Path, help="the study's run directory, e.g. runs/stall-demo"),
            arg("--csv", type=Path, help="also write the leaderboard as CSV"),
            arg("--parquet", type=Path, help="also write the leaderboard as Parquet (the CSV's columns)"),
            _storage(_FROM_STORAGE),
            arg(
                "--wide",
                exclusive="shown",
                action="store_true",
                help="every column with its full header and ranges, wider than the terminal",
            ),
            arg(
                "--json",
                exclusive="shown",
                action="store_true",
                help="the leaderboard as one JSON document on stdout, for scripts (no table)",
            ),
        ),
    ),
    Command(
        "report",
        "write a study's morning report: one self-contained HTML page (also made by every run)",
        run="tuner.cli.reading:report",
        args=(
            arg("run_dir", type=Path, help="the run directory, e.g. runs/stall-demo"),
            arg("--out", type=Path, help="where to write it (default: RUN_DIR/report.html)"),
            _storage(_FROM_STORAGE),
        ),
    ),
    Command(
        "diagnose",
        "why a server is slow, from its own log (changes no host)",
        run="tuner.cli.tools:diagnose",
        check=checks.check_diagnose,
        args=(
            arg(
                "log",
                type=Path,
                help="llama-server log, journalctl output or vLLM log (not Ollama's: no timings); - for stdin",
            ),
            arg("--json", action="store_true", help="print the findings as one JSON document"),
            arg(
                "--since",
                type=duration,
                metavar="DURATION",
                help="only requests launched this long after the log's first line (90s, 15m, 2h, 1h30m)",
            ),
            arg("--until", type=duration, metavar="DURATION", help="only requests launched up to this long after it"),
            arg(
                "--long-prompt-tokens",
                type=long_tokens,
                default=1000,
                metavar="N",
                help="new prompt tokens from which a prefill counts as long (1000)",
            ),
            arg(
                "--min-wait",
                type=positive_float,
                default=1.0,
                metavar="SECONDS",
                help="waits before prefill shorter than this are not reported (1)",
            ),
            arg("--metrics", type=Path, metavar="FILE", help="a vLLM /metrics scrape to read beside its log"),
            arg(
                "--study",
                type=Path,
                metavar="OUT.toml",
                help="also write a study of the knobs the findings name (with OUT.workload.jsonl and OUT.space.toml)",
            ),
            arg(
                "--like",
                type=Path,
                metavar="STUDY.toml",
                help="a study of the server that wrote the log: --study takes its [host], [deploy] and [engine] "
                "(without it, the study starts its own server on this machine)",
            ),
            arg("--force", action="store_true", help="let --study replace files that exist"),
            arg(
                "--predict",
                action="store_true",
                help="also predict which settings win on the log's own traffic: the simulated llama-server at a "
                "calibration from the log, every config of the space, before any restart",
            ),
            arg(
                "--space",
                type=Path,
                metavar="FILE",
                help="with --predict: the search space (default: n_batch x n_ubatch, 32 to 2048)",
            ),
            arg(
                "--seeds",
                type=positive,
                metavar="N",
                help="with --predict: simulator seeds per config, for the spread (3)",
            ),
        ),
    ),
    Command(
        "workload",
        "inspect a workload trace",
        subcommands=(
            Command(
                "show",
                "what a trace will replay, in numbers",
                run="tuner.cli.traces:show",
                check=checks.check_workload_show,
                args=(
                    arg("trace", type=Path, help="trace file (JSONL)"),
                    arg("--long-prompt-tokens", type=positive, default=1000, help="new tokens that make a prompt long"),
                    arg("--plot", type=Path, help="also draw the trace into this image (.png, .svg or .pdf)"),
                    arg(
                        "--prefill-tok-s",
                        type=positive_float,
                        default=1000.0,
                        help="prefill speed for estimating durations when the trace has none (default 1000)",
                    ),
                    arg(
                        "--decode-tok-s",
                        type=positive_float,
                        default=30.0,
                        help="per-request decode speed for that estimate (default 30)",
                    ),
                ),
            ),
            Command(
                "synth",
                "write a synthetic trace of a known traffic shape",
                run="tuner.cli.traces:synth",
                args=(
                    arg("kind", choices=catalog.GENERATOR_KINDS, help="the traffic shape"),
                    arg("--out", type=Path, required=True, help="trace file to write (JSONL)"),
                    arg("--users", type=positive, default=4, help="simulated users (default 4)"),
                    arg("--turns", type=positive, default=3, help="turns per user (default 3)"),
                    arg("--seed", type=int, default=0, help="random seed (default 0)"),
                    arg(
                        "--long-tokens",
                        type=long_tokens,
                        default=8000,
                        help="largest new-token count of a long prompt, for `stall` (default 8000)",
                    ),
                ),
            ),
            Command(
                "import",
                "turn another tool's trace or a server log into a trace",
                run="tuner.cli.traces:import_",
                description=_importer_help(),
                args=(
                    arg("kind", help="the input's format: " + ", ".join(catalog.IMPORTER_FORMATS)),
                    arg("source", type=Path, help="the file to import"),
                    arg("--out", type=Path, required=True, help="trace file to write (JSONL)"),
                    arg("--name", help="trace name (default: the output file name)"),
                    arg(
                        "--set",
                        dest="options",
                        action="append",
                        default=[],
                        metavar="KEY=VALUE",
                        help="importer option (repeatable)",
                    ),
                ),
            ),
        ),
    ),
    Command(
        "record",
        "record your traffic's shape through a proxy placed in front of the server (no text kept)",
        run="tuner.cli.traces:record",
        check=checks.check_record,
        args=(
            arg("--upstream", required=True, help="the server's URL, e.g. http://127.0.0.1:8080"),
            arg("--listen", default="127.0.0.1:8081", help="HOST:PORT the application connects to instead"),
            arg("--out", type=Path, required=True, help="trace file to write (JSONL), rewritten atomically"),
            arg("--name", help="trace name (default: the file name)"),
            arg("--tag-header", default="X-Tuner-Tag", help="request header whose value tags a request"),
            arg("--duration", type=positive_float, help="stop after this many seconds (default: at Ctrl-C)"),
            arg("--max-requests", type=positive, help="stop after recording this many requests"),
            arg(
                "--keep-content",
                action="store_true",
                help="also write each request's messages or prompt into the trace (default: shape only, no text)",
            ),
        ),
    ),
    Command(
        "trust-host",
        "show a host's SSH key fingerprint and pin it for the ssh host kind",
        run="tuner.cli.hosts:trust_host",
        args=(
            arg("host", help="host name or address"),
            arg("--port", type=port, default=22, help="SSH port (default 22)"),
            arg("--known-hosts", type=Path, help="pinned keys file (default ~/.config/serve-tuner/known_hosts)"),
            arg("--yes", action="store_true", help="pin without asking (after checking the fingerprint)"),
        ),
    ),
    Command(
        "setup",
        "fetch the model and build llama-server (one time)",
        run="tuner.cli.tools:setup",
        args=(
            arg(
                "--ollama",
                action="store_true",
                help="also build Ollama from its Go module (needs Go 1.24+) and make the model an Ollama model",
            ),
        ),
    ),
    Command("kinds", "list the host, deploy and engine kinds", run="tuner.cli.tools:kinds"),
)


def chosen(args: argparse.Namespace, commands: tuple[Command, ...] = COMMANDS, dest: str = "command") -> Command:
    """The command the parsed arguments name, down to the subcommand that runs."""
    command = next(c for c in commands if c.name == getattr(args, dest))
    return chosen(args, command.subcommands, f"{command.name}_command") if command.subcommands else command
