"""How long `tuner --help` takes beyond starting Python at all: `python -c pass` and `python -m tuner
--help`, run interleaved in one run, reported as medians, their difference and their ratio.

    bench/startup.py [--repeat 30] [--compare REV]

Both commands run with the same interpreter and environment, this checkout first on PYTHONPATH, so the
difference is what the package's imports and the parser cost. The order alternates in each repetition
so that drift on the machine hits both alike; one unmeasured run of each warms the file cache first.
`--compare REV` also measures `tuner --help` of that git revision (exported to a temporary directory)
in the same interleaving: a before/after on the same load. Target: at most 0.3 s over `python -c pass`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from provenance import write_result

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "startup.json"
TARGET_S = 0.3


def timed(command: list[str], tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def export_revision(rev: str, into: Path) -> str:
    """The package of `rev` (its `tuner/` only) written under `into`; returns the full commit id."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True)
    archive = subprocess.run(
        ["git", "archive", commit.stdout.strip(), "tuner"], cwd=REPO, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit.stdout.strip()


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(samples), 4),
        "min_s": round(min(samples), 4),
        "max_s": round(max(samples), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="measured runs of each command (default 30)")
    parser.add_argument("--compare", metavar="REV", help="also measure `tuner --help` of this git revision")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file (default bench/results/)")
    args = parser.parse_args()

    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        commands: dict[str, tuple[list[str], Path]] = {
            "python -c pass": ([python, "-c", "pass"], REPO),
            "tuner --help": ([python, "-m", "tuner", "--help"], REPO),
        }
        compared = None
        if args.compare:
            compared = export_revision(args.compare, Path(tmp))
            commands[f"tuner --help at {compared[:7]}"] = ([python, "-m", "tuner", "--help"], Path(tmp))
        load_before = os.getloadavg()
        for command, tree in commands.values():  # warm-up, not counted
            timed(command, tree)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for i in range(args.repeat):
            for name in names if i % 2 == 0 else reversed(names):
                samples[name].append(timed(*commands[name]))
        load_after = os.getloadavg()

    bare, tuner = statistics.median(samples["python -c pass"]), statistics.median(samples["tuner --help"])
    result: dict[str, object] = {
        "command": "bench/startup.py " + " ".join(sys.argv[1:]),
        "repeat": args.repeat,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "commands": {name: summary(values) for name, values in samples.items()},
        "tuner_help_minus_bare_s": round(tuner - bare, 4),
        "tuner_help_over_bare_ratio": round(tuner / bare, 2),
        "target_s": TARGET_S,
        "within_target": tuner - bare <= TARGET_S,
    }
    if compared is not None:
        before = statistics.median(samples[f"tuner --help at {compared[:7]}"])
        result["compared_commit"] = compared
        result["compared_minus_bare_s"] = round(before - bare, 4)
        result["compared_over_bare_ratio"] = round(before / bare, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
