"""Every check of the command line that needs no I/O: the value types the parser converts with (a bad value
is argparse's one line, exit 2) and the checks across a command's arguments, which `main` runs right after
parsing, before the command's module is imported (a `ConfigError`: one line, exit 2).

Checks that look at files (an output's directory, the run directory) stay with the command that writes.
"""

from __future__ import annotations

import argparse
import math

from tuner import catalog
from tuner.errors import ConfigError

__all__ = [
    "check_diagnose",
    "check_record",
    "check_workload_show",
    "duration",
    "length",
    "user_levels",
    "listen_address",
    "long_tokens",
    "port",
    "positive",
    "positive_float",
]


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def long_tokens(text: str) -> int:
    value = positive(text)
    if value > catalog.MAX_PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {catalog.MAX_PROMPT_TOKENS:,} (a trace's limit), got {text}")
    return value


def positive_float(text: str) -> float:
    """A positive, finite number of seconds or tokens per second: NaN, infinities, 0 and below are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text}")
    return value


def duration(text: str) -> float:
    # tuner.diagnose is loaded only when a duration is given: `--help` and the other commands never pay for it.
    from tuner.diagnose import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}: pass a time from the log's first line, e.g. 90s, 15m, 2h or 1h30m"
        ) from None


def length(text: str) -> float:
    """A length of time such as 60s, 2m or 1m30s, in seconds."""
    from tuner.diagnose import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}: pass a length such as 60s, 2m or 1m30s") from None


def user_levels(text: str) -> list[int]:
    """`--users 1,2,4,8` as its levels."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isascii() and part.isdigit() for part in parts):  # "²" is a digit to isdigit, not to int
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of user counts; pass e.g. 1,2,4,8,16")
    return [int(part) for part in parts]


def listen_address(listen: str) -> tuple[str, int]:
    """`record --listen HOST:PORT` as a host and a port (0 lets the system choose one)."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {listen!r} is not HOST:PORT; pass e.g. 127.0.0.1:8081")
    if int(port) > 65535:
        raise ConfigError(f"--listen {listen!r}: port {port} is out of range (0-65535); pass e.g. 127.0.0.1:8081")
    return host, int(port)


def check_record(args: argparse.Namespace) -> None:
    listen_address(args.listen)


def check_diagnose(args: argparse.Namespace) -> None:
    if args.like is not None and args.study is None:
        raise ConfigError(
            "--like names the study whose [host], [deploy] and [engine] a written study takes; add --study OUT.toml"
        )
    if (args.space is not None or args.seeds is not None) and not args.predict:
        raise ConfigError("--space and --seeds are for --predict; add --predict")
    if args.predict and (args.since is not None or args.until is not None):
        raise ConfigError(
            "--predict replays the whole log, not a stretch of it: cut the log itself (journalctl --since/--until)"
        )
    if args.seeds is None:
        args.seeds = 3
    if args.seeds > 50:
        raise ConfigError(f"--seeds {args.seeds}: at most 50 (each seed replays every config once more)")
    if args.predict and str(args.log) == "-":
        raise ConfigError("--predict reads the log twice (its findings, then its traffic): give a file, not -")


def check_workload_show(args: argparse.Namespace) -> None:
    # Before the trace is read, which can be long on a big one; the directory is the command's to check.
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"--plot {args.plot}: use a .png, .svg or .pdf file name")
