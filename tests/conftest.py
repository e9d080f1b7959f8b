"""The tier of a test is its directory: tests/fast/ needs no real part, tests/real/ needs at least one
(its fixtures are in tests/real/conftest.py); every test in tests/real/ is marked `real`, so that
`pytest -m "not real"` is still the fast tier. Also: which real parts ran, summed up at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.real_parts import FIXTURE_PARTS, OPT_IN_PARTS, REQUIRED_PARTS, on_ci

REAL_TIER = Path(__file__).resolve().parent / "real"
FAST_TIER = Path(__file__).resolve().parent / "fast"


# ---- which real parts ran ------------------------------------------------------------------------

_PART_OUTCOMES: dict[str, dict[str, str]] = {}  # part -> test id -> passed | failed | skipped
_REPORTS_SEEN: list[bool] = []  # set once any test reported: the summary is printed then


def _parts_of(item: pytest.Item) -> list[str]:
    """The real parts a test needs: through its fixtures, or named by `@pytest.mark.real_part("name")` where
    the test asks `need_real_part` itself."""
    fixtures = getattr(item, "fixturenames", ())
    parts = {part for fixture, part in FIXTURE_PARTS.items() if fixture in fixtures}
    parts.update(str(marker.args[0]) for marker in item.iter_markers("real_part"))
    return sorted(parts)


def tier_mismatch(path: Path, parts: list[str], real_server: bool) -> str | None:
    """Why a test at `path` is in the wrong tier, or None: one in tests/real/ needs a real part (a fixture of
    tests/real/conftest.py, or `real_part` / `real_server` where it asks for one itself), one in tests/fast/
    none, and every test is in one of the two."""
    needs_real = bool(parts) or real_server
    if path.is_relative_to(REAL_TIER):
        return None if needs_real else "is in tests/real/ but needs no real part: move it to tests/fast/"
    if path.is_relative_to(FAST_TIER):
        return None if not needs_real else f"is in tests/fast/ but needs {parts or ['the real llama-server']}"
    return "is in neither tests/fast/ nor tests/real/"


# First: the `-m` selection runs in this hook too, and must see the marks added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in tests/real/ is marked `real`: `pytest -m "not real"` is the fast tier. A test whose
    directory disagrees with the parts it needs stops the collection, naming it."""
    wrong = []
    for item in items:
        why = tier_mismatch(item.path, _parts_of(item), item.get_closest_marker("real_server") is not None)
        if why is not None:
            wrong.append(f"{item.nodeid} {why}")
        if item.path.is_relative_to(REAL_TIER):
            item.add_marker(pytest.mark.real)
        fixtures = getattr(item, "fixturenames", ())
        if "tiny_run" in fixtures:
            # The shared real run is measured where it is made: in the phase with the machine to itself.
            item.add_marker(pytest.mark.measures)
        if "systemd_host" in fixtures:
            # Run by scripts/test.sh in one process of their own: one host, its tests in the order written.
            item.add_marker(pytest.mark.on_systemd_host)
    if wrong:
        raise pytest.UsageError("tests in the wrong tier:\n" + "\n".join(wrong))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # The parts travel in the report's user properties, so that the controller of a pytest-xdist run, where
    # no test is set up, counts them too.
    _REPORTS_SEEN.append(True)
    parts = next((value for key, value in report.user_properties if key == "real_parts"), [])
    missing = _missing_part(report) if report.failed or report.skipped else None
    if missing is not None:
        # The test stopped at the part it could not have; it says nothing of the others it needs (without
        # sshd, the systemd-host tests are no failure of the llama-server build).
        _PART_OUTCOMES.setdefault(missing, {})[report.nodeid] = "missing"
        return
    for part in parts:  # type: ignore[attr-defined]
        seen = _PART_OUTCOMES.setdefault(part, {})
        if report.skipped:
            seen[report.nodeid] = "skipped"
        elif report.failed:
            seen[report.nodeid] = "failed"
        elif report.when == "call":
            seen.setdefault(report.nodeid, "passed")


def _missing_part(report: pytest.TestReport) -> str | None:
    """The part `need_real_part` stopped the test for, read from its message."""
    text = str(report.longrepr)
    return next(
        (
            p
            for p in (*REQUIRED_PARTS, *OPT_IN_PARTS)
            if f"the real {p} (" in text or f"the real {p} is missing" in text
        ),
        None,
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.user_properties.append(("real_parts", _parts_of(item)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many tests ran against each real part: a run that exercised none of them says so."""
    if not _REPORTS_SEEN:
        return
    terminalreporter.section("real parts")
    for part in (*REQUIRED_PARTS, *OPT_IN_PARTS):
        if part == "root":
            continue
        outcomes = list(_PART_OUTCOMES.get(part, {}).values())
        counts = {word: outcomes.count(word) for word in ("passed", "failed", "missing", "skipped")}
        line = f"{part}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        if counts["missing"]:
            line += f"; {counts['missing']} stopped because it is missing" + (" (failures)" if on_ci() else "")
        if part in OPT_IN_PARTS:
            line += f" (opt-in: {OPT_IN_PARTS[part]})"
        terminalreporter.write_line(line)
    if on_ci():
        terminalreporter.write_line("CI=true: a missing required part fails its tests instead of skipping")
