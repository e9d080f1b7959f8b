"""Overhead per trial: where a trial's wall time goes on the real llama-server, beside the server's own
load time and the measured rounds.

Runs a small real study (the process deployer on this machine, the llama-server and model `tuner setup`
built) through the study's own code, with every step of the controller timed from outside: the code
under test is not changed, its functions are wrapped for the run (exclusive times: a step's own time,
its timed sub-steps excluded). The server's own load time is what a second poller, asking the health
endpoint every 5 ms from the moment the process is spawned, sees: spawn to its first 200. What the
study's own health wait takes beyond that is its polling granularity, ours.

- Per server start (a round of a trial, or a confirmation measurement): stopping the previous server,
  the server's load, the health poll's overshoot, the startup log check, the warm-up, the correctness
  probes (round 1 of a trial), the round's prompts, the counters, the GPU sampler, the measured round
  (the replay: not overhead), the records, the settle wait, the log read and parse, the round's
  metrics.
- Per trial: the sampler's proposal, the scoring, the journal writes.
- Overhead per trial = the trial's wall time (its server starts and its scoring) minus the server's
  load time and the measured rounds.

    .venv/bin/python bench/trial_overhead.py                       # tests/data/tiny-study.toml: about 3 minutes
    .venv/bin/python bench/trial_overhead.py --set budget.trials=4 # any study value
    .venv/bin/python bench/trial_overhead.py --table               # the table, from bench/results/trial-overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

import tuner.deployers.process as process_deployer  # noqa: E402
import tuner.search.confirm as confirm_module  # noqa: E402
import tuner.search.ending as ending_module  # noqa: E402
import tuner.search.entry as entry_module  # noqa: E402
import tuner.search.gates as gates_module  # noqa: E402
import tuner.search.loop as loop_module  # noqa: E402
import tuner.search.peers as peers_module  # noqa: E402
from tuner import runs, trial_runner  # noqa: E402
from tuner.config import load_study  # noqa: E402
from tuner.deployers.base import wait_until_healthy  # noqa: E402
from tuner.engines.llama_server import LlamaServerEngine  # noqa: E402
from tuner.gpu import GpuMemorySampler  # noqa: E402
from tuner.transports import local  # noqa: E402

DEFAULT_STUDY = ROOT / "tests" / "data" / "tiny-study.toml"
OUT = ROOT / "bench" / "results" / "trial-overhead.json"

# Steps that are not the controller's overhead: the server's own load and the measured rounds.
SERVER_LOAD = "server load (the server's own)"
MEASURED = "measured round (replay)"
NOT_OVERHEAD = (SERVER_LOAD, MEASURED)
# The table's order; a step not listed comes last.
ORDER = [
    "stop the previous server",
    "spawn, state file, reach",
    SERVER_LOAD,
    "health poll overshoot",
    "startup log check",
    "slot flush (reused server)",
    "warm-up",
    "correctness probes",
    "LoRA answer probes",
    "round's prompts",
    "counters (Prometheus)",
    "GPU sampler",
    MEASURED,
    "records written",
    "alive check",
    "settle wait",
    "log read and parse",
    "round metrics",
    "server tasks written",
    "journal writes",
    "scoring",
    "sampler proposal",
    "other (unattributed)",
]


@dataclass
class _Frame:
    phase: str
    started: float
    children: float = 0.0


@dataclass
class Recorder:
    """Exclusive time per step, attributed to the unit (a server start, a trial's scoring) running it."""

    stack: list[_Frame] = field(default_factory=list)
    unit: dict[str, Any] | None = None
    units: list[dict[str, Any]] = field(default_factory=list)
    spawned_at: float | None = None

    @contextlib.contextmanager
    def span(self, phase: str) -> Iterator[None]:
        frame = _Frame(phase, time.monotonic())
        self.stack.append(frame)
        try:
            yield
        finally:
            self.stack.pop()
            elapsed = time.monotonic() - frame.started
            if self.stack:
                self.stack[-1].children += elapsed
            self.add(phase, elapsed - frame.children)

    def add(self, phase: str, seconds: float) -> None:
        if self.unit is not None:
            steps = self.unit["steps"]
            steps[phase] = steps.get(phase, 0.0) + seconds

    def move(self, source: str, target: str, seconds: float) -> None:
        """Moves time measured under one step to another (the server's load out of the health wait)."""
        self.add(source, -seconds)
        self.add(target, seconds)

    @contextlib.contextmanager
    def in_unit(self, kind: str, trial: int | None, label: str) -> Iterator[None]:
        outer, outer_stack = self.unit, self.stack
        self.unit = {"kind": kind, "trial": trial, "label": label, "steps": {}}
        self.stack = []
        started = time.monotonic()
        try:
            yield
        finally:
            self.unit["wall_s"] = time.monotonic() - started
            attributed = sum(self.unit["steps"].values())
            self.unit["steps"]["other (unattributed)"] = self.unit["wall_s"] - attributed
            self.units.append(self.unit)
            self.unit, self.stack = outer, outer_stack


REC = Recorder()


def _wrap(owner: Any, name: str, phase: str | Callable[..., str]) -> None:
    """Times `owner.name` (a function or method, sync or async) under `phase` (or phase(*args))."""
    original = getattr(owner, name)

    if asyncio.iscoroutinefunction(original):

        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            with REC.span(phase(*args, **kwargs) if callable(phase) else phase):
                return await original(*args, **kwargs)

        setattr(owner, name, timed_async)
    else:

        def timed(*args: Any, **kwargs: Any) -> Any:
            with REC.span(phase(*args, **kwargs) if callable(phase) else phase):
                return original(*args, **kwargs)

        setattr(owner, name, timed)


def _unit(owner: Any, name: str, kind: str, describe: Callable[..., tuple[int | None, str]]) -> None:
    original = getattr(owner, name)

    async def in_unit(*args: Any, **kwargs: Any) -> Any:
        trial, label = describe(*args, **kwargs)
        with REC.in_unit(kind, trial, label):
            return await original(*args, **kwargs)

    def in_unit_sync(*args: Any, **kwargs: Any) -> Any:
        trial, label = describe(*args, **kwargs)
        with REC.in_unit(kind, trial, label):
            return original(*args, **kwargs)

    setattr(owner, name, in_unit if asyncio.iscoroutinefunction(original) else in_unit_sync)


def _replay_phase(requests: Any, **_kwargs: Any) -> str:
    tags = {r.tag for r in requests}
    if tags == {"warm-up"}:
        return "warm-up"
    if tags == {"slot-flush"}:
        return "slot flush (reused server)"
    return MEASURED


def _timed_health_wait(original: Callable[..., Awaitable[float]]) -> Callable[..., Awaitable[float]]:
    """The study's health wait, with a 5 ms poller beside it: its first 200 is the end of the server's load."""

    async def wait(launch: Any, *, base_url: str, **kwargs: Any) -> float:
        ready_at: list[float] = []

        async def fast_poll() -> None:
            async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as client:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(base_url + launch.health_path)).status_code == 200:
                            ready_at.append(time.monotonic())
                            return
                    await asyncio.sleep(0.005)

        poller = asyncio.create_task(fast_poll())
        waited_from = time.monotonic()
        try:
            with REC.span("health poll overshoot"):
                took = await original(launch, base_url=base_url, **kwargs)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(poller), 1.0)
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if ready_at and REC.spawned_at is not None:
            ended = waited_from + took
            # The load began at the spawn; the part of it before the health wait began was timed as the spawn's.
            before_wait = waited_from - REC.spawned_at
            REC.move("spawn, state file, reach", SERVER_LOAD, min(before_wait, ready_at[0] - REC.spawned_at))
            REC.move("health poll overshoot", SERVER_LOAD, max(0.0, min(ready_at[0], ended) - waited_from))
        return took

    return wait


def instrument() -> None:
    _unit(
        loop_module.StudyRun,
        "measure_pending",
        "start",
        lambda _self, pending, round_index: (pending.trial.number, f"round {round_index + 1}"),
    )
    _unit(
        confirm_module.Confirmation,
        "measure",
        "start",
        lambda _self, number, _settings, *, candidate, pair, **_: (number, f"confirm {candidate} pair {pair + 1}"),
    )
    _unit(
        loop_module.StudyRun,
        "finish_trial",
        "finish",
        lambda _self, trial, _rounds, *, baseline: (trial.number, "scoring"),
    )
    _unit(loop_module.StudyRun, "ask_batch", "ask", lambda _self: (None, "ask"))

    deployer = process_deployer.ProcessDeployer
    # start's own steps (the startup log's check for ignored settings, the marks after the warm-up) are
    # its exclusive time; what it calls is timed on its own.
    _wrap(trial_runner.ServerTrialRunner, "start", "startup log check")
    _wrap(deployer, "apply", "spawn, state file, reach")
    _wrap(deployer, "_stop_child", "stop the previous server")
    original_spawn = local.LocalTransport.spawn

    async def spawn(self: Any, *args: Any, **kwargs: Any) -> Any:
        REC.spawned_at = time.monotonic()
        with REC.span("spawn, state file, reach"):
            return await original_spawn(self, *args, **kwargs)

    local.LocalTransport.spawn = spawn  # type: ignore[method-assign]
    _wrap(deployer, "_remember", "spawn, state file, reach")
    setattr(process_deployer, "wait_until_healthy", _timed_health_wait(wait_until_healthy))  # noqa: B010
    _wrap(deployer, "check_alive", "alive check")
    # read_log serves the startup check, the warm-up's and probes' marks and the round's log; each is
    # timed under the step that called it, except the round's, timed with its parsing.
    _wrap(trial_runner, "replay", _replay_phase)
    _wrap(trial_runner, "replay_sessions", MEASURED)  # the round, its prompts made as the replay takes them
    _wrap(trial_runner, "scrape_prometheus", "counters (Prometheus)")
    _wrap(GpuMemorySampler, "__aenter__", "GPU sampler")
    _wrap(GpuMemorySampler, "__aexit__", "GPU sampler")
    _wrap(trial_runner, "round_requests", "round's prompts")
    _wrap(trial_runner, "round_metrics", "round metrics")
    # The LoRA answer check asks the probes under adapter settings (`lora`); the correctness gate under none.
    _wrap(
        trial_runner.ServerTrialRunner,
        "probe_answers",
        lambda _self, **kwargs: "correctness probes" if kwargs.get("lora") is None else "LoRA answer probes",
    )
    _wrap(gates_module, "lora_answer_changes", "LoRA answer probes")
    _wrap(runs.RunDirectory, "save_records", "records written")
    _wrap(runs.RunDirectory, "save_server_tasks", "server tasks written")
    _wrap(deployer, "read_log", _read_log_phase)
    original_sleep = asyncio.sleep

    async def settle_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        with REC.span("settle wait"):
            return await original_sleep(delay, *args, **kwargs)

    setattr(trial_runner, "asyncio", _AsyncioShim(settle_sleep))  # noqa: B010
    # The search package's modules each bind the names they use: each binding is wrapped.
    for module in (loop_module, ending_module, gates_module, peers_module):
        for name in ("update_trial_record", "update_study_record"):
            if hasattr(module, name):
                _wrap(module, name, "journal writes")
    _wrap(gates_module, "judge", "scoring")
    _wrap(LlamaServerEngine, "parse_log", "log read and parse")
    import optuna

    _wrap(optuna.Study, "tell", "journal writes")
    _wrap(optuna.Study, "ask", "sampler proposal")
    for module in (loop_module, ending_module, confirm_module):
        _wrap(module, "score_round", "scoring")


def _read_log_phase(*_args: Any, **_kwargs: Any) -> str:
    outer = REC.stack[-1].phase if REC.stack else None
    if outer in ("startup log check", "correctness probes", "slot flush (reused server)"):
        return outer
    return "log read and parse"


class _AsyncioShim:
    """trial_runner's `asyncio`: its sleep (the settle wait, or a wait for the log) timed, the rest as is."""

    def __init__(self, sleep: Callable[..., Awaitable[Any]]) -> None:
        self.sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


def summarize(units: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """Medians per server start and per trial, and the overhead per trial beyond the server's load."""
    starts = [u for u in units if u["kind"] == "start"]
    per_start: dict[str, list[float]] = defaultdict(list)
    for unit in starts:
        for phase in {p for u in starts for p in u["steps"]}:
            per_start[phase].append(unit["steps"].get(phase, 0.0))
    trials: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    search_starts: dict[int, int] = defaultdict(int)
    for unit in units:
        if unit["trial"] is None or (unit["kind"] == "start" and unit["label"].startswith("confirm")):
            continue
        search_starts[unit["trial"]] += unit["kind"] == "start"
        for phase, seconds in unit["steps"].items():
            trials[unit["trial"]][phase] += seconds
    asks = [u for u in units if u["kind"] == "ask"]
    ask_s = sum(u["wall_s"] for u in asks) / max(1, len(trials) - 1)  # the baseline is queued, not proposed
    whole = {number: steps for number, steps in trials.items() if search_starts[number] == rounds}
    per_trial: dict[str, list[float]] = defaultdict(list)
    overhead: list[float] = []
    without_probes: list[float] = []
    for number, measured in sorted(whole.items()):
        steps = dict(measured)
        if number != 0:
            steps["sampler proposal"] = steps.get("sampler proposal", 0.0) + ask_s
        for phase in {p for s in whole.values() for p in s} | {"sampler proposal"}:
            per_trial[phase].append(steps.get(phase, 0.0))
        overhead.append(sum(s for p, s in steps.items() if p not in NOT_OVERHEAD))
        probes = steps.get("correctness probes", 0.0) + steps.get("LoRA answer probes", 0.0)
        without_probes.append(overhead[-1] - probes)
    confirm = [u for u in starts if u["label"].startswith("confirm")]
    return {
        "server_starts": len(starts),
        "whole_trials": len(whole),
        "per_start_median_s": {p: round(statistics.median(v), 4) for p, v in per_start.items()},
        "per_trial_median_s": {p: round(statistics.median(v), 4) for p, v in per_trial.items()},
        "overhead_per_trial_s": {
            "median": round(statistics.median(overhead), 3) if overhead else None,
            "max": round(max(overhead), 3) if overhead else None,
            "per_trial": [round(o, 3) for o in overhead],
        },
        "overhead_per_trial_without_probes_s": round(statistics.median(without_probes), 3) if overhead else None,
        "overhead_per_confirmation_start_s": round(
            statistics.median(sum(s for p, s in u["steps"].items() if p not in NOT_OVERHEAD) for u in confirm), 3
        )
        if confirm
        else None,
        "server_restarts_skipped": sum(1 for u in starts if "slot flush (reused server)" in u["steps"]),
    }


def table(result: Mapping[str, Any]) -> str:
    """docs/benchmarks.md's table: per server start and per trial, medians; the overhead per trial."""
    summary = summarize(result["units"], result["rounds"])  # from the units: a file an older version wrote too
    start, trial = summary["per_start_median_s"], summary["per_trial_median_s"]
    phases = sorted(set(start) | set(trial), key=lambda p: ORDER.index(p) if p in ORDER else len(ORDER))
    lines = [
        f"| step | per server start (median of {summary['server_starts']}) | "
        f"per trial of {result['rounds']} rounds (median of {summary['whole_trials']}) | |",
        "|---|---|---|---|",
    ]
    for phase in phases:
        kind = "not overhead" if phase in NOT_OVERHEAD else ""
        shown = [f"{s[phase]:.3f} s" if phase in s else "" for s in (start, trial)]
        lines.append(f"| {phase} | {shown[0]} | {shown[1]} | {kind} |")
    figures = summary["overhead_per_trial_s"]
    lines.append(
        f"| **overhead per trial** (all but the server's load and the measured rounds) | | "
        f"**{figures['median']:.3f} s** (max {figures['max']:.3f} s) | target: at most 2 s |"
    )
    lines.append(
        f"| overhead per trial without the correctness probes (the server generating gate.tokens for 4 prompts) | | "
        f"**{summary['overhead_per_trial_without_probes_s']:.3f} s** | |"
    )
    if summary.get("overhead_per_confirmation_start_s") is not None:
        lines.append(
            f"| overhead per confirmation measurement | {summary['overhead_per_confirmation_start_s']:.3f} s | | |"
        )
    return "\n".join(lines)


def _scrub(text: str) -> str:
    """No machine paths in the results: the repository and the home directory become placeholders."""
    return text.replace(str(ROOT), ".").replace(str(Path.home()), "~")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=DEFAULT_STUDY)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--table", action="store_true", help="print the table of --out's figures and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    spec, base_dir = load_study(args.study, args.overrides)
    load_before = [round(x, 2) for x in os.getloadavg()]
    instrument()
    with tempfile.TemporaryDirectory() as scratch:
        started = time.monotonic()
        asyncio.run(entry_module.run_study(spec, base_dir, Path(scratch) / spec.name))
        wall = time.monotonic() - started
    study_path = args.study.resolve()
    result = {
        "command": "bench/trial_overhead.py"
        + (f" --study {_scrub(str(study_path))}" if study_path != DEFAULT_STUDY else "")
        + "".join(f" --set {o}" for o in args.overrides),
        "study": _scrub(str(study_path)),
        "rounds": spec.rounds,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": load_before,
        },
        "study_wall_s": round(wall, 1),
        "summary": summarize(REC.units, spec.rounds),
        "units": [{**u, "steps": {p: round(s, 4) for p, s in u["steps"].items()}} for u in REC.units],
    }
    write_result(args.out, result)
    print(table(result))
    print(f"study wall time {wall:.1f} s; figures in {_scrub(str(args.out.resolve()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
