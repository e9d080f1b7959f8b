"""The mutation score of the pure modules, from the results `mutmut run` left in mutants/.

    .venv/bin/python scripts/mutmut_report.py            # per module: killed / total, then each survivor
    .venv/bin/python scripts/mutmut_report.py --diffs    # the same, with each survivor's diff

scripts/mutmut.sh runs mutmut and then this. A module's score is (killed + timed out) over its mutants
less the equivalent ones: a mutant that no test can kill because the code means the same with it,
each listed with the reason in scripts/mutmut_equivalent.toml (matched by function and changed lines,
so the list survives renumbering). Of tuner/deployers/systemd/unit_file.py, mutated whole (mutmut mutates
files), only the unit-file rendering functions count; the deployer's lifecycle, in the package's other
modules, is tested against a real systemd, which the fast tests that mutmut runs do not reach.

Exit status: 0 when every module scores at least MIN_SCORE and no survivor is left unexplained, 1 when
not, 2 when mutants/ holds no results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_SCORE = 0.85
# Which functions count, per mutated file; None: all of them.
SCOPE: dict[str, frozenset[str] | None] = {
    "tuner/scoring.py": None,
    "tuner/metrics.py": None,
    "tuner/config/reading.py": None,
    "tuner/config/study.py": None,
    "tuner/config/space.py": None,
    "tuner/deployers/systemd/unit_file.py": frozenset(
        {
            "quote_unit_word",
            "render_secrets_file",
            "render_drop_in",
            "check_kept_command",
            "parse_show_environment",
            "_check_env_name",
            "_check_no_control_characters",
        }
    ),
}
# mutmut's exit codes (mutmut/stats.py): a test failed, pytest broke, or the mutant ran out of CPU time
# (a loop that no longer ends) all mean the tests noticed.
KILLED = {1, 3, 24, -24, 152, 255, 36, 37}
SURVIVED = {0}
NO_TESTS = {33, 5}


@dataclass(frozen=True)
class Mutant:
    name: str
    function: str  # e.g. render_drop_in, or ParamSpec.allows
    exit_code: int | None

    @property
    def status(self) -> str:
        if self.exit_code in KILLED:
            return "killed"
        if self.exit_code in SURVIVED:
            return "survived"
        if self.exit_code in NO_TESTS:
            return "no tests"
        return "not checked" if self.exit_code is None else f"exit {self.exit_code}"


def function_of(mutant_name: str) -> str:
    """`tuner.config.xǁParamSpecǁallows__mutmut_3` -> `ParamSpec.allows`; `...x_verdict__mutmut_1` -> `verdict`."""
    qualified = mutant_name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]
    if qualified.startswith("xǁ"):
        return ".".join(qualified.removeprefix("xǁ").split("ǁ"))
    return qualified.removeprefix("x_")


def load_mutants(workdir: Path) -> dict[str, list[Mutant]]:
    by_file: dict[str, list[Mutant]] = {}
    for path, functions in SCOPE.items():
        meta = workdir / "mutants" / (path + ".meta")
        if not meta.exists():
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        mutants = [Mutant(name=name, function=function_of(name), exit_code=code) for name, code in codes.items()]
        by_file[path] = [m for m in mutants if functions is None or m.function in functions]
    return by_file


def changed_lines(diff: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    removed = tuple(
        line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")
    )
    added = tuple(line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    return removed, added


def load_equivalents() -> list[dict[str, str]]:
    path = ROOT / "scripts" / "mutmut_equivalent.toml"
    return tomllib.loads(path.read_text()).get("equivalent", []) if path.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diffs", action="store_true", help="print each survivor's diff")
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="where mutants/ is (default: here)")
    args = parser.parse_args()
    by_file = load_mutants(args.workdir)
    if not by_file:
        print(f"no mutmut results under {args.workdir / 'mutants'}; run scripts/mutmut.sh", file=sys.stderr)
        return 2
    import os

    os.chdir(args.workdir)  # mutmut reads mutants/ relative to the working directory
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    equivalents = load_equivalents()
    used: set[int] = set()
    failed = False
    rows = []
    details = []
    for path, mutants in by_file.items():
        counts = Counter(m.status for m in mutants)
        explained: list[tuple[Mutant, str]] = []
        unexplained: list[tuple[Mutant, str]] = []
        for mutant in (m for m in mutants if m.status != "killed"):
            diff = get_diff_for_mutant(mutant.name, path=path)
            removed, added = changed_lines(diff)
            why = None
            for index, entry in enumerate(equivalents):
                if (
                    entry["function"] == mutant.function
                    and tuple(entry["before"].splitlines()) == removed
                    and tuple(entry["after"].splitlines()) == added
                ):
                    why = entry["why"]
                    used.add(index)
                    break
            if why is not None and mutant.status == "survived":
                explained.append((mutant, why))
            else:
                unexplained.append((mutant, diff))
        total = len(mutants)
        counted = total - len(explained)
        killed = counts["killed"]
        score = killed / counted if counted else 1.0
        failed |= score < MIN_SCORE or bool(unexplained)
        rows.append((path, killed, counted, total, len(explained), len(unexplained), score))
        for mutant, diff in unexplained:
            removed, added = changed_lines(diff)
            line = f"{mutant.status.upper()} {mutant.name}: {' / '.join(removed)} -> {' / '.join(added)}"
            details.append(line + ("\n" + diff if args.diffs else ""))
        for mutant, why in explained:
            details.append(f"equivalent {mutant.name}: {why}")
    print("| module | killed / counted | score | equivalent (explained) | left (survived or no test) |")
    print("|---|---|---|---|---|")
    for path, killed, counted, _total, explained_count, left, score in rows:
        label = path + (" (unit-file rendering functions)" if SCOPE[path] is not None else "")
        print(f"| `{label}` | {killed} / {counted} | {score:.1%} | {explained_count} | {left} |")
    killed_all = sum(r[1] for r in rows)
    counted_all = sum(r[2] for r in rows)
    print(f"| all | {killed_all} / {counted_all} | {killed_all / counted_all:.1%} | | |")
    print()
    for line in details:
        print(line)
    stale = [e for i, e in enumerate(equivalents) if i not in used]
    for entry in stale:
        print(f"note: scripts/mutmut_equivalent.toml: no mutant matched {entry['function']}: {entry['before']!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
