"""Computing what the morning report says from what was gathered: the rows it compares, the stall windows it
pictures, what each trial's server log says (`tuner diagnose`'s analyses), where the night's time went, the
Pareto front, the parameter importances, the workload's shape and the change to apply. No HTML here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from tuner.config import ParamValue
from tuner.errors import TunerError
from tuner.models import RequestRecord
from tuner.morning_report.gather import Absent, Gathered
from tuner.redact import redact
from tuner.report import LeaderboardRow
from tuner.study_view import is_scored

__all__ = [
    "MIN_TRIALS_FOR_IMPORTANCE",
    "TRIAL_FINDINGS",
    "Change",
    "Computed",
    "Distribution",
    "StallExample",
    "Window",
    "compute_report",
    "directions",
    "long_prompt_tokens",
    "objectives",
    "pareto",
]

MIN_TRIALS_FOR_IMPORTANCE = 5  # below this, an importance ranks noise

# The log findings a trial's settings change, shown beside its score (docs/architecture.md: "A trial's findings").
TRIAL_FINDINGS = ("waits", "queueing", "lora_switch")


@dataclass(frozen=True, kw_only=True)
class Window:
    """A long prompt's prefill as the stall metric sees it, and a stream's speed during it."""

    request_id: str
    prompt_tokens: int
    start_s: float
    end_s: float
    overlap: tuple[float, float]  # the part of the window the stream was decoding in
    rate: float  # the stream's tokens per second in the overlap, as `stall_tok_s` counts them


@dataclass(frozen=True, kw_only=True)
class StallExample:
    """The stream that saw the most of a long prefill, in the first round of a trial that has one."""

    stream: RequestRecord
    window: Window
    round_name: str


@dataclass(frozen=True, kw_only=True)
class When:
    done: int  # trials after the baseline that were deployed
    budget: Any  # the spec's budget.trials, as written
    started: datetime | None  # the first trial's start
    ended: datetime | None  # the last trial's end
    running: bool


@dataclass(frozen=True, kw_only=True)
class TimeSpent:
    wall_s: float
    search_s: float
    rounds: int
    confirm_s: float
    pairs: int
    other_s: float
    phases: dict[str, float]  # as the progress file counted them; {} without one


@dataclass(frozen=True, kw_only=True)
class Importances:
    completed: int  # measured trials after the baseline
    enough: bool
    shares: dict[str, float]
    error: str | None  # why Optuna could not rank them


@dataclass(frozen=True, kw_only=True)
class Distribution:
    mean: float
    median: float
    p95: int
    max: int


@dataclass(frozen=True, kw_only=True)
class Workload:
    records: list[RequestRecord]  # the baseline's first round, for the in-flight chart
    span_s: float
    sessions: int
    prompt_tokens: Distribution | None
    asked_tokens: Distribution | None
    received_tokens: Distribution | None
    tags: dict[str, int]
    lora: dict[str, int]
    long_prefills: str | None  # where they come from, as the baseline's log says


@dataclass(frozen=True, kw_only=True)
class Change:
    """The recommended (or best) trial's change as it is applied: the server's part by environment variable
    or flag, the clients' part as settings."""

    env: list[tuple[str, str]]
    flags: list[str]
    request: dict[str, ParamValue]
    request_advice: list[str]  # how to keep each of `request`, which the host's configuration cannot carry
    server: bool  # any server-scope setting
    deploy_kind: str
    unit: str
    command: str  # how the engine's server is started, after its environment: `ollama serve`, `llama-server ...`


@dataclass(frozen=True, kw_only=True)
class Computed:
    g: Gathered  # what was read, for the page to show as it is
    baseline: LeaderboardRow | None
    chosen: LeaderboardRow | None  # the recommendation
    compared: LeaderboardRow | None  # the recommendation, else the best candidate
    when: When
    long_prompt_tokens: int
    stalls: list[tuple[LeaderboardRow, StallExample | None]]  # the baseline's, then the compared trial's
    findings: dict[int, list[tuple[str, str]]]  # (kind, summary) of each trial's log findings, worst first
    skipped: list[tuple[dict[str, ParamValue], str]]  # proposals skipped without a run: settings, reason
    pareto: set[int]  # trials on the front of the first two objectives
    importances: Importances
    workload: Workload | None
    workload_absent: tuple[Absent, int] | None  # why, and the file's size
    time_spent: TimeSpent | None  # None before a trial ended
    change: Change | None

    def why(self, row: LeaderboardRow) -> list[str]:
        """What the trial's server log says its settings did, worst first (`TRIAL_FINDINGS`)."""
        return [summary for kind, summary in self.findings.get(row.number, []) if kind in TRIAL_FINDINGS]


def compute_report(g: Gathered) -> Computed:
    board = g.board
    baseline = next((r for r in board.rows if r.baseline and r.score is not None), None)
    recommended = board.recommendation.row
    # Without a recommendation, the pictures compare the best candidate, said as such: the one the
    # confirmation re-measured, else the best scored trial that breaks no constraint.
    confirmed = [r for r in board.rows if r.number in g.view.confirmations()]
    compared = recommended or next((r for r in confirmed + board.rows if is_scored(r) and not r.violates), None)
    long_tokens = long_prompt_tokens(g.spec)
    pictured = ([baseline] + ([compared] if compared is not None else [])) if baseline is not None else []
    findings = {n: _diagnosed(g, n, long_tokens) for n in sorted({0, *(r.number for r in board.rows)})}
    sources = [summary for kind, summary in findings[0] if kind == "long_prefills"]
    workload, absent = _workload(g, long_prefills=sources[0] if sources else None)
    return Computed(
        g=g,
        baseline=baseline,
        chosen=recommended,
        compared=compared,
        when=_when(g),
        long_prompt_tokens=long_tokens,
        stalls=[(row, _stall_example(g, row.number, long_tokens)) for row in pictured],
        findings=findings,
        skipped=[
            (t.settings, t.record.skip_reason)
            for t in g.view.trials
            if t.record.skip_reason and not t.deployed and t.state != TrialState.RUNNING
        ],
        pareto=_objectives_front(g),
        importances=_importances(g),
        workload=workload,
        workload_absent=absent,
        time_spent=_time_spent(g),
        change=_change(g, recommended),
    )


def long_prompt_tokens(spec: Mapping[str, Any]) -> int:
    metrics = spec.get("metrics")
    value = metrics.get("long_prompt_tokens") if isinstance(metrics, dict) else None
    return value if isinstance(value, int) and value > 0 else 1000


def _started_and_ended(g: Gathered) -> tuple[list[datetime], list[datetime]]:
    starts = [t.trial.datetime_start for t in g.view.trials if t.trial.datetime_start is not None]
    ends = [t.trial.datetime_complete for t in g.view.trials if t.trial.datetime_complete is not None]
    return starts, ends


def _when(g: Gathered) -> When:
    starts, ends = _started_and_ended(g)
    budget = g.spec.get("budget", {}).get("trials") if isinstance(g.spec.get("budget"), dict) else None
    return When(
        done=g.view.trials_done(),
        budget=budget,
        started=min(starts) if starts else None,
        ended=max(ends) if ends else None,
        running=bool(g.view.in_state(TrialState.RUNNING)),
    )


def _diagnosed(g: Gathered, number: int, long_tokens: int) -> list[tuple[str, str]]:
    """Why trial `number`'s server was slow, from its own log: the findings' (kind, one-line summary), worst
    first; [] where the log says nothing or cannot be read (the report goes on without)."""
    metrics = g.spec.get("metrics")
    overlap = metrics.get("min_overlap_s") if isinstance(metrics, dict) else None
    min_overlap_s = overlap if isinstance(overlap, int | float) and overlap > 0 else 0.5

    def diagnose(path: Path) -> list[tuple[str, str]]:
        # The one read made here: the diagnosis streams the log, which may be too big to gather whole.
        from tuner.diagnose import diagnose_log

        try:
            diagnosis = diagnose_log(
                path,
                long_prompt_tokens=long_tokens,
                min_overlap_s=min_overlap_s,
                # A wait is worth naming at twice the overlap a stall must have (1 s at the default 0.5 s).
                min_wait_s=2 * min_overlap_s,
            )
        except TunerError:
            return []
        return [(f.kind, redact(f.summary)) for f in diagnosis.findings]

    return g.memo.diagnoses.get(g.server_log(number), diagnose) or []


def _stall_example(g: Gathered, number: int, long_tokens: int) -> StallExample | None:
    """The stream that saw the most of a long prefill, in the trial's first round that has one: the
    windows and the speed the `stall_tok_s` metric uses."""
    from tuner.metrics import long_prefill_windows, tokens_between

    for round_file in g.pictured_rounds(number):
        ok = [r for r in round_file.records if r.ok]
        by_id = {r.request_id: r for r in ok}
        best: tuple[float, RequestRecord, Window] | None = None
        for window in long_prefill_windows(ok, long_prompt_tokens=long_tokens):
            for stream in ok:
                if stream.request_id == window.request_id or len(stream.token_s) < 2:
                    continue
                start, end = max(stream.token_s[0], window.start_s), min(stream.token_s[-1], window.end_s)
                if end - start > 0 and (best is None or end - start > best[0]):
                    long_request = by_id[window.request_id]
                    rate = tokens_between(stream.token_s, start, end) / (end - start)
                    best = (
                        end - start,
                        stream,
                        Window(
                            request_id=window.request_id,
                            prompt_tokens=long_request.prompt_tokens,
                            start_s=window.start_s,
                            end_s=window.end_s,
                            overlap=(start, end),
                            rate=rate,
                        ),
                    )
        if best is not None:
            return StallExample(stream=best[1], window=best[2], round_name=round_file.name)
    return None


def objectives(spec: Mapping[str, Any]) -> list[str]:
    return [str(o["metric"]) for o in spec.get("objectives", []) if isinstance(o, dict) and o.get("metric")]


def directions(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {str(o.get("metric")): o.get("direction") for o in spec.get("objectives", []) if isinstance(o, dict)}


def _objectives_front(g: Gathered) -> set[int]:
    names = objectives(g.spec)
    if len(names) < 2:
        return set()
    x, y = names[0], names[1]
    rows = [r for r in g.board.rows if r.score is not None and x in r.metrics and y in r.metrics]
    return pareto(rows, x, y, directions(g.spec))


def pareto(rows: Sequence[LeaderboardRow], x: str, y: str, directions: Mapping[str, Any]) -> set[int]:
    def oriented(row: LeaderboardRow, metric: str) -> float:
        value = row.metrics[metric][0]
        return -value if directions.get(metric) == "minimize" else value

    front = set()
    for row in rows:
        dominated = any(
            oriented(o, x) >= oriented(row, x)
            and oriented(o, y) >= oriented(row, y)
            and (oriented(o, x) > oriented(row, x) or oriented(o, y) > oriented(row, y))
            for o in rows
        )
        if not dominated:
            front.add(row.number)
    return front


def _importances(g: Gathered) -> Importances:
    complete = [
        t for t in g.view.in_state(TrialState.COMPLETE) if t.deployed and not t.baseline
    ]  # measured ones: a repeat told with an earlier trial's values adds no evidence
    enough = len(complete) >= MIN_TRIALS_FOR_IMPORTANCE and len(g.study.directions) == 1
    if not enough or not any(r.score is not None for r in g.board.rows):
        return Importances(completed=len(complete), enough=enough, shares={}, error=None)
    try:
        from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

        shares = get_param_importances(g.study, evaluator=PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError) as exc:
        return Importances(completed=len(complete), enough=enough, shares={}, error=str(exc))
    return Importances(completed=len(complete), enough=enough, shares=dict(shares), error=None)


def _workload(g: Gathered, *, long_prefills: str | None) -> tuple[Workload | None, tuple[Absent, int] | None]:
    round_file, absent, size = g.workload_round()
    if round_file is None:
        assert absent is not None
        return None, (absent, size)
    records = round_file.records
    sends = [r.send_s for r in records]
    tags: dict[str, int] = {}
    for r in records:
        tags[r.tag] = tags.get(r.tag, 0) + 1
    lora: dict[str, int] = {}
    for r in records:
        key = ", ".join(f"{name}:{scale:g}" for name, scale in r.lora) or "none"
        lora[key] = lora.get(key, 0) + 1
    workload = Workload(
        records=records,
        span_s=max(sends) - min(sends),
        sessions=len({r.session for r in records}),
        prompt_tokens=_distribution([r.prompt_tokens for r in records]),
        asked_tokens=_distribution([r.output_tokens_requested for r in records]),
        received_tokens=_distribution([len(r.token_s) for r in records]),
        tags=tags,
        lora=lora,
        long_prefills=long_prefills,
    )
    return workload, None


def _distribution(values: Sequence[int]) -> Distribution | None:
    if not values:
        return None
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return Distribution(mean=statistics.fmean(ordered), median=statistics.median(ordered), p95=p95, max=ordered[-1])


def _time_spent(g: Gathered) -> TimeSpent | None:
    starts, ends = _started_and_ended(g)
    if not starts or not ends:
        return None
    search = confirm = 0.0
    rounds = pairs = 0
    newest = max(ends).timestamp()
    for span in g.round_spans:
        # Confirmations end after the last trial did: their files say when.
        newest = max(newest, span.mtime)
        if span.confirm:
            confirm += span.span_s
            pairs += 1
        else:
            search += span.span_s
            rounds += 1
    wall = newest - min(starts).timestamp()
    return TimeSpent(
        wall_s=wall,
        search_s=search,
        rounds=rounds,
        confirm_s=confirm,
        pairs=pairs,
        other_s=max(0.0, wall - search - confirm),
        phases=g.phase_seconds,
    )


def _engine_knobs(kind: str) -> Mapping[str, Any]:
    from tuner.engines import ENGINES

    try:
        factory = ENGINES.get(kind)
    except TunerError:
        return {}
    knobs = getattr(factory, "knobs", {})
    return knobs if isinstance(knobs, Mapping) else {}


def _change(g: Gathered, row: LeaderboardRow | None) -> Change | None:
    if row is None:
        return None
    engine_kind = str(g.spec.get("engine", {}).get("kind", "")) if isinstance(g.spec.get("engine"), dict) else ""
    deploy = g.spec.get("deploy", {}) if isinstance(g.spec.get("deploy"), dict) else {}
    knobs = _engine_knobs(engine_kind)
    server = {k: v for k, v in row.changed.items() if k not in knobs or knobs[k].scope == "server"}
    request = {k: v for k, v in row.changed.items() if k in knobs and knobs[k].scope == "request"}
    env: list[tuple[str, str]] = []
    flags: list[str] = []
    from tuner.engines.base import render_env_value, request_setting_advice

    if server:
        for name, value in sorted(server.items()):
            knob = knobs.get(name)
            if knob is None:
                flags.append(f"{name}={value}")
            elif knob.env:
                env.append((knob.env, render_env_value(knob, value)))
            elif knob.flag:
                flags.append(f"{knob.flag} {render_env_value(knob, value)}")
    return Change(
        env=env,
        flags=flags,
        request=request,
        request_advice=request_setting_advice(knobs, request),
        server=bool(server),
        deploy_kind=str(deploy.get("kind", "")),
        unit=str(deploy.get("unit", "UNIT.service")),
        command=_SERVER_COMMANDS.get(engine_kind, "the server's command ..."),
    )


_SERVER_COMMANDS = {"llama-server": "llama-server ...", "ollama": "ollama serve", "vllm": "vllm serve MODEL ..."}
