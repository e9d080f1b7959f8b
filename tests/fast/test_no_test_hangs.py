"""No test can hang: a broken guard fails the suite in seconds, it does not stop it.

Every call that waits on a process (subprocess's run, call, check_call and check_output, a Popen's
communicate and wait, an Event's wait) has a bound (a `timeout=`), and every test runs under pytest-timeout's
limit, which CI enforces (pyproject.toml's `timeout`, the fast tier's own in tests/fast/conftest.py). A FIFO
a test hands a reader is released after seconds (tests/support/bounded.py)."""

from __future__ import annotations

import ast
import tomllib

import pytest

from tests.support import ROOT

# subprocess's functions that wait for the process they start
_WAITING_FUNCTIONS = {"run", "call", "check_call", "check_output"}
# a Popen's methods that wait for it (an Event's wait waits as well: it gets a bound too)
_WAITING_METHODS = {"communicate", "wait"}


def _unbounded_waits(source: str) -> list[tuple[int, str]]:
    """(line, call) of each wait without a timeout. A process's wait after its kill() in the same block
    is bounded by the kill, and an awaited call (asyncio) is the event loop's: neither is reported."""
    tree = ast.parse(source)
    awaited = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Await)}
    found = []
    for owner_node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(owner_node, field, None)
            if not isinstance(block, list):
                continue
            killed: set[str] = set()
            for statement in block:
                for call in _calls_of(statement):
                    if id(call) in awaited or not isinstance(call.func, ast.Attribute):
                        continue
                    owner, name = ast.unparse(call.func.value), call.func.attr
                    if name == "kill":
                        killed.add(owner)
                    if _waits(owner, name) and not _bounded(call, owner, name, killed):
                        found.append((call.lineno, ast.unparse(call)[:100]))
    return sorted(set(found))


def _calls_of(statement: ast.stmt) -> list[ast.Call]:
    """The calls a statement makes itself, in source order: a compound statement's blocks are blocks of
    their own, only its header (a `with`'s items, an `if`'s test) is its own."""
    if any(isinstance(getattr(statement, field, None), list) for field in ("body", "handlers")):
        headers = [getattr(statement, field, None) for field in ("test", "iter", "items", "subject")]
        parts: list[ast.AST] = []
        for header in headers:
            parts += header if isinstance(header, list) else [header] if header is not None else []
    else:
        parts = [statement]
    calls = [node for part in parts for node in ast.walk(part) if isinstance(node, ast.Call)]
    return sorted(calls, key=lambda call: (call.lineno, call.col_offset))


def _waits(owner: str, name: str) -> bool:
    return (name in _WAITING_FUNCTIONS and owner == "subprocess") or name in _WAITING_METHODS


def _bounded(call: ast.Call, owner: str, name: str, killed: set[str]) -> bool:
    if any(keyword.arg == "timeout" for keyword in call.keywords):
        return True
    return (name == "wait" and bool(call.args)) or owner in killed


def test_every_wait_of_a_test_on_a_process_has_a_bound() -> None:
    unbounded = [
        f"{path.relative_to(ROOT)}:{line}: {call}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for line, call in _unbounded_waits(path.read_text())
    ]
    assert unbounded == [], "give each a timeout=:\n" + "\n".join(unbounded)


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        ("import subprocess\nsubprocess.run(['cat'])\n", [2]),
        ("import subprocess\nsubprocess.run(['cat'], timeout=5)\n", []),
        ("p.communicate()\n", [1]),
        ("p.communicate(timeout=5)\n", []),
        ("p.kill()\np.wait()\n", []),
        ("q.kill()\np.wait()\n", [2]),
        ("event.wait()\n", [1]),
        ("event.wait(5)\n", []),
        ("async def f():\n    await p.wait()\n", []),
        ("try:\n    pass\nfinally:\n    p.kill()\n    p.communicate()\n", []),
    ],
)
def test_the_rule_reports_an_unbounded_wait_and_only_that(source: str, reported: list[int]) -> None:
    assert [line for line, _ in _unbounded_waits(source)] == reported


def test_ci_runs_every_test_under_a_timeout() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < float(options["timeout"]) <= 900
    assert "pytest-timeout" in (ROOT / "requirements" / "dev.txt").read_text()
