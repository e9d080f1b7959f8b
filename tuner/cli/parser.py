"""The argparse parser, built from the table of commands in one loop; a command-line mistake is one line."""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tuner.cli.commands import COMMANDS, Command

__all__ = ["EXIT_CODES", "build_parser"]

# The README's exit codes, shown by `tuner --help`.
EXIT_CODES = """exit codes:
  0    done
  1    the run failed (the host is back on its baseline), or another tuner runs the study now;
       with --check, a check failed
  2    a bad study file, workload file, flag or value, or a study changed on resume: the message
       names it and the fix
  75   the host stayed unreachable past the reconnect window (its dead-man timer restores it)
  130  Ctrl-C; 143 SIGTERM (run, capacity, apply and restore put the host's baseline back first)"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line (with where to look) and exit code 2."""

    _arguments: tuple[str, ...] = ()  # what this parser was given to parse (a command's parser: its own part)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._arguments = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        missing = re.fullmatch(r"argument (--[\w-]+)(?:/-\w)?: expected one argument", message)
        if missing is not None and self._value_like_a_flag(missing[1]):
            # argparse reads a value that starts with "-" and is not a plain number (-5s) as another flag.
            message += f" (a value that starts with '-' is read as a flag: write {missing[1]}=VALUE)"
        self.exit(2, f"error: {self.prog}: {message}; see `{self.prog} --help`\n")

    def _value_like_a_flag(self, option: str) -> bool:
        """Whether `option` was followed by a negative value (-5s, -1.5), which argparse took for a flag."""
        return any(
            word == option and re.match(r"-[\d.]", after) is not None
            for word, after in itertools.pairwise(self._arguments)
        )


def build_parser(commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
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
    _add_commands(parser, commands, dest="command")
    return parser


def _add_commands(parser: argparse.ArgumentParser, commands: tuple[Command, ...], *, dest: str) -> None:
    subparsers = parser.add_subparsers(dest=dest, required=True)
    for command in commands:
        shown: dict[str, Any] = {}
        if command.description is not None:
            shown = {"description": command.description, "formatter_class": argparse.RawDescriptionHelpFormatter}
        sub = subparsers.add_parser(command.name, help=command.help, **shown)
        groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for argument in command.args:
            target: argparse._ActionsContainer = sub
            if argument.exclusive is not None:
                if argument.exclusive not in groups:
                    groups[argument.exclusive] = sub.add_mutually_exclusive_group()
                target = groups[argument.exclusive]
            target.add_argument(*argument.names, **argument.options)
        if command.subcommands:
            _add_commands(sub, command.subcommands, dest=f"{command.name}_command")
