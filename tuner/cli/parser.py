"""The argparse parser, built from the table of commands in one loop; a command-line mistake is one line."""

from __future__ import annotations

import argparse
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

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self._negative_values_joined(sys.argv[1:] if args is None else args), namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}; see `{self.prog} --help`\n")

    def _negative_values_joined(self, words: Sequence[str]) -> list[str]:
        """`--window -5s` as `--window=-5s`: argparse reads a word that starts with "-" and is not a plain
        number as another flag and says only "expected one argument", where the option's own check names
        what is wrong with the value."""
        if self._subparsers is not None:  # `tuner`'s own parser: the command's parser joins its own words
            return list(words)
        joined: list[str] = []
        index = 0
        while index < len(words):
            word = words[index]
            if word == "--":  # the words after it are not options
                return [*joined, *words[index:]]
            action = self._option_string_actions.get(word)
            takes_one = action is not None and action.nargs is None and action.option_strings
            if takes_one and index + 1 < len(words) and re.match(r"-[\d.]", words[index + 1]):
                joined.append(f"{word}={words[index + 1]}")
                index += 2
                continue
            joined.append(word)
            index += 1
        return joined


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
