"""The package's shape: sorted public exports, and imports that only flow down the module map."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

import tuner

PACKAGE = Path(tuner.__file__).resolve().parent

# Lower layers first; a module may import only from its own layer or below (docs/architecture.md).
LAYERS = [
    {
        "errors",
        "registry",
        "catalog",
        "assets",
        "files",
        "adapters",
        "faults",
        "redact",
        "http",
        "streaming_http",
        "svg",
        "text",
        "lazy",
    },
    {"models", "config"},
    {
        "metrics",
        "scoring",
        "sequential",
        "study_record",
        "snapshots",
        "transports",
        "workloads",
        "observers",
        "runs",
        "storage",
        "progress",
        "study_view",
        "prediction_record",
        "progress_file",
        "status",
    },
    {"engines", "deployers", "importers", "fleet"},
    {"loadgen", "gate", "record", "gpu", "diagnose"},
    {"trial_runner", "server_reuse"},
    {"sampling"},
    {"search", "report", "apply", "check", "sim", "morning_report", "predict", "capacity"},
    {"console", "live", "diagnose_console"},
    {"cli", "__main__", "__init__"},
]
RICH_ALLOWED = {"console", "live", "diagnose_console", "cli"}


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if module in layer)


def top_module(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def imported_tuner_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tuner."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("tuner."))
    return found


def imports_package(path: Path, package: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package)
        or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == package for a in n.names))
        for n in ast.walk(tree)
    )


def test_public_exports_are_sorted_and_importable() -> None:
    assert tuner.__all__ == sorted(tuner.__all__)
    for name in tuner.__all__:
        assert hasattr(tuner, name), name


def test_no_module_imports_a_layer_above_it() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        module = top_module(path)
        for imported in imported_tuner_modules(path):
            if imported != module and layer_of(imported) > layer_of(module):
                upward.append(f"{path.relative_to(PACKAGE)} imports tuner.{imported}")
    assert upward == []


def test_only_the_console_and_cli_import_rich() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if imports_package(p, "rich") and top_module(p) not in RICH_ALLOWED
    ]
    assert offenders == []


def test_only_the_ssh_transport_may_import_asyncssh() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if imports_package(p, "asyncssh") and p.name != "ssh.py"
    ]
    assert offenders == []


def test_the_search_modules_and_classes_stay_at_most_300_lines() -> None:
    # The search loop (ask, skip, batch, prune) apart from what it calls: the trial runner, the gates, the
    # confirmation, the peers, the one place a trial ends (docs/architecture.md).
    long = []
    for path in (PACKAGE / "search").glob("*.py"):
        tree = ast.parse(path.read_text())
        if len(path.read_text().splitlines()) > 300:
            long.append(path.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None and node.end_lineno - node.lineno >= 300:
                long.append(f"{path.name}: {node.name}")
    assert long == []


def test_every_module_stays_at_most_700_lines_and_every_class_at_most_300() -> None:
    # Issue 27: a module one reader can hold, a class of one responsibility. What outgrows these is split by
    # what it holds (a package, or modules beside it), each part a line of docs/architecture.md's module map.
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(PACKAGE))
        if len(text.splitlines()) > 700:
            long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None and node.end_lineno - node.lineno >= 300:
                long.append(f"{name}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert long == []


def test_the_search_loop_imports_neither_the_fleet_nor_the_deployers() -> None:
    # A fleet is one implementation of the peers protocol (tuner/search/fleet_peers.py), reached by the entry;
    # a deployer is the trial runner's, handed to it. Checked on what importing the loop loads, not its lines.
    code = "import sys, tuner.search.loop; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        ).stdout.split()
    )
    assert {"tuner.search.loop", "tuner.search.peers", "tuner.trial_runner"} <= loaded
    assert not {m for m in loaded if m in ("tuner.fleet", "tuner.search.fleet_peers", "tuner.search.entry")}
    assert not {m for m in loaded if m == "tuner.deployers" or m.startswith("tuner.deployers.")}


def test_every_command_of_the_table_is_in_its_parents_help_and_names_a_function_that_exists() -> None:
    import argparse
    import importlib

    from tuner.cli.commands import COMMANDS, Command
    from tuner.cli.parser import build_parser

    def check(parser: argparse.ArgumentParser, commands: tuple[Command, ...]) -> None:
        (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert list(subcommands.choices) == [command.name for command in commands]
        shown = " ".join(parser.format_help().split())  # `tuner --help`, lines joined where argparse wrapped them
        for command in commands:
            assert f" {command.name} {' '.join(command.help.split())}" in shown, command.name
            if command.subcommands:
                assert command.run == "", command.name  # a group runs nothing itself
                check(subcommands.choices[command.name], command.subcommands)
            else:
                module, _, function = command.run.partition(":")
                assert callable(getattr(importlib.import_module(module), function)), command.run

    check(build_parser(), COMMANDS)


def test_every_guard_mutant_applies_to_the_code_and_names_tests_that_exist() -> None:
    """A refactor that moves a guard must move its mutant too: a catalogue that does not apply would stop
    the mutation run, and a renamed test would leave its guard unchecked (tests/guard_mutants/)."""
    spec = importlib.util.spec_from_file_location("guard_mutants", PACKAGE.parent / "scripts" / "guard_mutants.py")
    assert spec is not None and spec.loader is not None
    guard_mutants = importlib.util.module_from_spec(spec)
    sys.modules["guard_mutants"] = guard_mutants  # its dataclasses look their module up there
    spec.loader.exec_module(guard_mutants)
    mutants = guard_mutants.load_catalogue()  # raises CatalogueError naming the entry
    assert len(mutants) >= 200
    for mutant in mutants:
        for test in mutant.tests:
            path, _, name = test.partition("::")
            source = PACKAGE.parent / path
            assert source.is_file(), f"{mutant.name}: {path} does not exist"
            if name:  # an entry may name a whole file; a test may be defined there or imported (a contract)
                tree = ast.parse(source.read_text())
                names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
                assert name.split("[")[0] in names, f"{mutant.name}: no test {name} in {path}"


def test_the_real_parts_summary_counts_a_missing_part_against_that_part_only() -> None:
    """Without sshd the systemd-host tests stop at sshd; the summary must not count them as failures of the
    llama-server build or the systemd host they also use."""
    from tests import conftest

    def report(outcome: Literal["failed"], message: str) -> pytest.TestReport:
        return pytest.TestReport(
            "tests/test_x.py::test_y", ("tests/test_x.py", 1, "test_y"), {}, outcome, message, "setup",
            user_properties=[("real_parts", ["llama-server", "sshd", "systemd host"])],
        )  # fmt: skip

    saved = {part: dict(seen) for part, seen in conftest._PART_OUTCOMES.items()}
    try:
        conftest._PART_OUTCOMES.clear()
        conftest.pytest_runtest_logreport(
            report("failed", "CI requires the real sshd (Debian's openssh-server), and it is missing: not installed")
        )
        assert conftest._PART_OUTCOMES == {"sshd": {"tests/test_x.py::test_y": "missing"}}
        conftest._PART_OUTCOMES.clear()
        conftest.pytest_runtest_logreport(report("failed", "AssertionError: the restore left a drop-in"))
        assert set(conftest._PART_OUTCOMES) == {"llama-server", "sshd", "systemd host"}
    finally:
        conftest._PART_OUTCOMES.clear()
        conftest._PART_OUTCOMES.update(saved)


def test_a_tests_tier_is_its_directory() -> None:
    """A test in tests/real/ needs a real part (a fixture, or `real_part` / `real_server` where it asks for one
    itself), one in tests/fast/ none; anything else stops the collection (tests/conftest.py)."""
    from tests import conftest

    real, fast = conftest.REAL_TIER / "test_x.py", conftest.FAST_TIER / "test_x.py"
    assert conftest.tier_mismatch(real, ["sshd"], real_server=False) is None
    assert conftest.tier_mismatch(real, [], real_server=True) is None
    assert conftest.tier_mismatch(fast, [], real_server=False) is None
    assert "needs no real part" in str(conftest.tier_mismatch(real, [], real_server=False))
    assert "needs ['postgresql']" in str(conftest.tier_mismatch(fast, ["postgresql"], real_server=False))
    assert "needs" in str(conftest.tier_mismatch(fast, [], real_server=True))
    assert "neither" in str(conftest.tier_mismatch(conftest.REAL_TIER.parent / "test_x.py", [], real_server=False))


def test_every_collected_test_is_in_the_tier_its_directory_names(tmp_path: Path) -> None:
    """The whole suite collects: no test in tests/fast/ needs a real part, none in tests/real/ lacks one, and
    the fast tier is exactly what `-m "not real"` selects (one collection, its markers listed by a plugin)."""
    listing = tmp_path / "tests.txt"
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "-p", "tests.support.tier_listing"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300, check=False,
        env={**os.environ, "TIER_LISTING": str(listing)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    tests = listing.read_text().splitlines()
    not_real = {test for test in tests if not test.startswith("real ")}
    fast = {test for test in tests if test.removeprefix("real ").startswith("tests/fast/")}
    assert fast and not_real == fast
    assert len(tests) > len(fast)  # the real tier was collected too
