"""Startup: `tuner --help`, every command's `--help`, `tuner kinds` and a command refused before its work
import none of the heavy packages (issue 15: they cost seconds on a small machine). The names the
parser shows come from `tuner.catalog`, checked here against the registries.

What is checked is which modules a separate process imported, never how long it took: the time is
bench/startup.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import tuner
from tuner import catalog

# The packages issue 15 names, and the network clients, which no such command needs either.
HEAVY = {"pandas", "optuna", "numpy", "matplotlib", "scipy", "asyncssh", "httpx"}

ROOT = Path(tuner.__file__).resolve().parent.parent

# Runs `python -m tuner ARGS...` as the entry point does, then writes the top-level packages it
# imported to stderr as its last line.
ENTRY = """
import runpy, sys
sys.argv = ["tuner", *sys.argv[1:]]
try:
    runpy.run_module("tuner", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as stop:
    code = stop.code
sys.stderr.write("\\nimported: " + " ".join(sorted({name.split(".")[0] for name in sys.modules})) + "\\n")
sys.exit(code)
"""

# Runs `tuner.cli.main` on each argument list of a JSON list in one process; writes, per list, its exit
# code, the top-level packages and the modules of `tuner.cli` imported by then (growing sets: the first
# list that shows a module is the one that imported it).
EACH = """
import json, sys
from tuner.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    modules = sorted(sys.modules)
    cli = [name for name in modules if name.startswith("tuner.cli.")]
    seen.append([argv, code, sorted({name.split(".")[0] for name in modules}), cli])
sys.stderr.write("\\n" + json.dumps(seen) + "\\n")
"""

# What parsing and checking the command line may load of `tuner.cli`: never a command's own module.
PARSING = {
    "tuner.cli.main",
    "tuner.cli.commands",
    "tuner.cli.parser",
    "tuner.cli.checks",
    "tuner.cli.signals",
    "tuner.cli.library_warnings",
}


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env
    )


def entry(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    result = python("-c", ENTRY, *args, cwd=cwd)
    last = result.stderr.splitlines()[-1]
    assert last.startswith("imported: "), result.stderr
    return result, set(last.removeprefix("imported: ").split())


def test_tuner_help_imports_no_heavy_package(tmp_path: Path) -> None:
    result, imported = entry("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Tune a self-hosted LLM server" in result.stdout
    assert imported & HEAVY == set()
    assert "rich" not in imported and "pydantic" not in imported  # help is argparse's: neither needed


def test_tuner_kinds_imports_no_heavy_package(tmp_path: Path) -> None:
    result, imported = entry("kinds", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"engine: {', '.join(catalog.ENGINE_KINDS)}" in result.stdout
    assert imported & HEAVY == set()


def test_a_study_file_that_is_missing_is_refused_before_the_study_is_imported(tmp_path: Path) -> None:
    result, imported = entry("run", str(tmp_path / "missing.toml"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "missing.toml" in result.stderr and "Traceback" not in result.stderr
    assert imported & HEAVY == set()


def test_an_argument_error_imports_no_heavy_package(tmp_path: Path) -> None:
    result, imported = entry("workload", "synth", "stall", "--long-tokens", "0", "--out", "t.jsonl", cwd=tmp_path)
    assert result.returncode == 2 and "--long-tokens" in result.stderr
    assert imported & HEAVY == set()


def every_help() -> list[list[str]]:
    """`--help` of every command and subcommand the parser has."""
    from tuner.cli.parser import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        found.append([*prefix, "--help"])
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


def test_every_commands_help_imports_no_heavy_package(tmp_path: Path) -> None:
    helps = every_help()
    assert ["workload", "import", "--help"] in helps and len(helps) > 10
    result = python("-c", EACH, json.dumps(helps), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stderr.splitlines()[-1])
    assert [code for _, code, _, _ in seen] == [0] * len(helps)
    first_heavy = next(((argv, set(imported) & HEAVY) for argv, _, imported, _ in seen if set(imported) & HEAVY), None)
    assert first_heavy is None
    assert set(seen[-1][3]) <= PARSING  # no command's module: each is imported when its command runs
    assert "Azure LLM inference trace CSV" in result.stdout  # `workload import --help` names the formats


def test_the_catalog_names_what_the_registries_hold() -> None:
    from tuner.deployers import DEPLOYERS
    from tuner.engines import ENGINES
    from tuner.importers import IMPORTERS
    from tuner.transports import TRANSPORTS
    from tuner.workloads import GENERATORS, MAX_PROMPT_TOKENS

    assert tuple(TRANSPORTS.kinds()) == catalog.TRANSPORT_KINDS
    assert tuple(DEPLOYERS.kinds()) == catalog.DEPLOYER_KINDS
    assert tuple(ENGINES.kinds()) == catalog.ENGINE_KINDS
    assert tuple(GENERATORS.kinds()) == catalog.GENERATOR_KINDS
    assert {kind: IMPORTERS.get(kind)().description for kind in IMPORTERS.kinds()} == catalog.IMPORTER_FORMATS
    assert MAX_PROMPT_TOKENS == catalog.MAX_PROMPT_TOKENS


def test_the_catalog_imports_nothing() -> None:
    # The parser reads it before anything else is loaded; an import there would undo that.
    tree = ast.parse(Path(catalog.__file__).read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(node) for node in imports] == ["from __future__ import annotations"]


def command_modules() -> set[str]:
    """The modules the table names for running its commands."""
    from tuner.cli.commands import COMMANDS, Command

    def leaves(commands: tuple[Command, ...]) -> list[Command]:
        return [leaf for c in commands for leaf in (leaves(c.subcommands) if c.subcommands else [c])]

    return {leaf.run.partition(":")[0] for leaf in leaves(COMMANDS)}


def test_argument_checks_refuse_before_the_commands_module_is_imported(tmp_path: Path) -> None:
    refused = [
        ["diagnose", "server.log", "--like", "study.toml"],
        ["record", "--upstream", "http://127.0.0.1:8080", "--out", "t.jsonl", "--listen", "127.0.0.1:70000"],
        ["workload", "show", "t.jsonl", "--plot", "t.gif"],
    ]
    result = python("-c", EACH, json.dumps(refused), cwd=tmp_path)
    seen = json.loads(result.stderr.splitlines()[-1])
    assert [code for _, code, _, _ in seen] == [2, 2, 2]
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == [
        "error: --like names the study whose [host], [deploy] and [engine] a written study takes; add --study OUT.toml",
        "error: --listen '127.0.0.1:70000': port 70000 is out of range (0-65535); pass e.g. 127.0.0.1:8081",
        "error: --plot t.gif: use a .png, .svg or .pdf file name",
    ]
    assert set(seen[-1][3]) <= PARSING and set(seen[-1][2]) & HEAVY == set()


def test_a_command_imports_its_own_module_and_no_other_commands(tmp_path: Path) -> None:
    result = python("-c", EACH, json.dumps([["kinds"]]), cwd=tmp_path)
    ((_, code, _, cli_modules),) = json.loads(result.stderr.splitlines()[-1])
    assert code == 0, result.stderr
    assert set(cli_modules) & command_modules() == {"tuner.cli.tools"}  # the table's module for `kinds`
