"""A fleet's scale: one study of N trials on 1, 2 and 4 simulated hosts, its storage in a real PostgreSQL.

Each host is the study's own search loop on a `SimulatedTrialRunner` (the simulated llama-server on its
virtual clock) that waits a fixed wall time per round and per start (`--round-s`), as a host's measurement
takes time while its controller waits. Two ways to drive H hosts, both measured:

- one controller process per host (`tuner run --host NAME` on each machine), all on one PostgreSQL study;
- one process driving every host concurrently (asyncio), as `tuner run` does without `--host`. Its storage
  calls are synchronous, so they take turns: the fleet pays each trial's storage time one after another.

The confirmation is off (`confirm.top = 0`: it re-measures on every host, a
constant per host, not the search that a fleet divides), and so are pruning and extra rounds, so that every
trial is the same work.

- wall time and speed-up against the hosts: the 1-host study's wall time over the N-host one's; the target
  is at least 0.8 x linear at 4 hosts. The ideal is below linear by the baselines: each host measures its
  own first, so N trials on H hosts are (N + H) trial measurements, not N + 1;
- the storage's overhead per trial: the same study on PostgreSQL minus on Optuna's in-memory storage,
  divided by the trials (every ask, tell, record write and lease of a trial, over loopback).

    .venv/bin/python bench/fleet_scale.py                 # about 3.5 minutes; writes bench/results/fleet-scale.json
    .venv/bin/python bench/fleet_scale.py --table         # the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

from tests.support.postgres import running_postgres  # noqa: E402
from tests.support.sim_study import fleet_overrides, prepare_simulated, run_simulated_fleet  # noqa: E402
from tuner.storage import open_storage  # noqa: E402
from tuner.study_record import TrialRecord  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "fleet-scale.json"


def _prepared(names: list[str], trials: int, name: str) -> Any:
    return prepare_simulated(
        [
            *fleet_overrides(names),
            f"budget.trials={trials}",
            "confirm.top=0",
            'search.pruner="none"',
            "extra_rounds_if_noisy=0",
            f"name={name}",
        ]
    )


def _host_process(job: tuple[str, list[str], str, int, float, str, int], ready: Any) -> None:
    """One host's controller, in a process of its own (multiprocessing's child). Its imports are done when
    this runs; it then waits for the others' (`ready`, a barrier): on separate machines they start in
    parallel, while here four processes importing optuna and pandas at once on two cores would stagger
    their first trials by seconds, start-up that the study's span is meant to leave out."""
    ready.wait()
    url, names, host, trials, round_s, name, seed = job
    with tempfile.TemporaryDirectory() as scratch:
        run_simulated_fleet(
            _prepared(names, trials, name),
            Path(scratch) / "run",
            hosts={host: 1.0},
            seed=seed + names.index(host),
            storage=open_storage(url),
            round_wall_s=round_s,
        )


def _one(  # noqa: PLR0917
    hosts: int, trials: int, round_s: float, storage: optuna.storages.BaseStorage, seed: int, url: str | None = None
) -> dict[str, Any]:
    """H hosts on `storage`; with `url`, one process per host on that database, else one controller."""
    names = [f"host-{i + 1}" for i in range(hosts)]
    name = f"scale-{hosts}-{seed}-{time.time_ns()}"
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        cpu_before = _cpu_s()
        if url is None:
            study = run_simulated_fleet(
                _prepared(names, trials, name),
                Path(scratch) / "run",
                hosts=dict.fromkeys(names, 1.0),
                seed=seed,
                storage=storage,
                round_wall_s=round_s,
            ).study
        else:
            context = multiprocessing.get_context("spawn")
            ready = context.Barrier(len(names))
            children = [
                context.Process(target=_host_process, args=((url, names, host, trials, round_s, name, seed), ready))
                for host in names
            ]
            for child in children:
                child.start()
            for child in children:
                child.join()
                assert child.exitcode == 0, f"a host's controller exited {child.exitcode}"
            study = optuna.load_study(study_name=name, storage=storage)
        total = time.perf_counter() - started
        cpu = _cpu_s() - cpu_before
    trials_done = study.get_trials()
    records = [TrialRecord.of(t) for t in trials_done]
    # The study's own span, from its first trial's start to its last one's end: without the controllers'
    # start-up (a process importing optuna and pandas takes seconds on a small machine, four at once longer).
    starts = [t.datetime_start for t in trials_done if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials_done if t.datetime_complete is not None]
    wall = (max(ends) - min(starts)).total_seconds()
    deployed = [r for r in records if r.deployed]
    return {
        "hosts": hosts,
        "wall_s": wall,
        "with_start_up_s": total,
        # The controllers' CPU time against what the machine's cores offered meanwhile: near 1, the
        # controllers waited for a core (several controllers on one machine, which a fleet spreads out).
        "controllers_cpu_s": cpu,
        "cpu_share": cpu / (total * len(os.sched_getaffinity(0))),
        "deployed_trials": sum(1 for r in deployed if not r.baseline),
        "baselines": sum(1 for r in deployed if r.baseline),
        "per_host": {n: sum(1 for r in deployed if r.host == n) for n in names},
    }


def _cpu_s() -> float:
    """User and system CPU seconds of this process and of its children that ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(trials: int, round_s: float, seed: int) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory() as base, running_postgres(Path(base) / "pg") as url:
        storage = open_storage(url)
        for mode in ("processes", "one-controller"):
            for hosts in (1, 2, 4):
                on_pg = _one(hosts, trials, round_s, storage, seed, url if mode == "processes" else None)
                on_pg["mode"] = mode
                if mode == "one-controller":  # the storage's own time: the same study in memory, subtracted
                    in_memory = _one(hosts, trials, round_s, optuna.storages.InMemoryStorage(), seed)
                    on_pg["storage_overhead_s_per_trial"] = (on_pg["wall_s"] - in_memory["wall_s"]) / (
                        on_pg["deployed_trials"] + on_pg["baselines"]
                    )
                    on_pg["in_memory_wall_s"] = in_memory["wall_s"]
                rows.append(on_pg)
                print(json.dumps(on_pg), flush=True)
    for row in rows:
        one = next(r["wall_s"] for r in rows if r["mode"] == row["mode"] and r["hosts"] == 1)
        row["speed_up"] = one / row["wall_s"]
        row["of_linear"] = row["speed_up"] / row["hosts"]
        # What the baselines allow: (N + 1) trial measurements on one host, (N + H) / H per host on H.
        row["ideal_speed_up"] = (trials + 1) / ((trials + row["hosts"]) / row["hosts"])
    return {"trials": trials, "round_s": round_s, "seed": seed, "rounds_per_trial": 2, "rows": rows}


def table(results: dict[str, Any]) -> str:
    lines = [
        "| controllers | hosts | wall time | speed-up | of linear | ideal (baselines) | storage time per trial "
        "| cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        overhead = row.get("storage_overhead_s_per_trial")
        shown = "-" if overhead is None else f"{overhead * 1000:.0f} ms"
        who = "one per host" if row["mode"] == "processes" else "one for all"
        lines.append(
            f"| {who} | {row['hosts']} | {row['wall_s']:.1f} s | {row['speed_up']:.2f}x | {row['of_linear']:.2f} | "
            f"{row['ideal_speed_up']:.2f}x | {shown} | {_share(row)} |"
        )
    return "\n".join(lines)


def _share(row: dict[str, Any]) -> str:
    share = row.get("cpu_share")
    return "-" if share is None else f"{share:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--round-s", type=float, default=0.5, help="wall seconds a round takes on a host")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="print the table from the saved results")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file (default: %(default)s)")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    results = run(args.trials, args.round_s, args.seed)
    write_result(args.out, results, indent=2)
    print(table(results))


if __name__ == "__main__":
    main()
