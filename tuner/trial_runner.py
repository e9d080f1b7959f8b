"""The trial runner: one config on a server, from deployment to a measured round's metrics.

The search loop (`tuner.search`) decides what to measure and in which order; a runner does the measuring:
start the server with the settings and warm it up (`start`), ask the correctness probes
(`probe_answers`), replay one round of the workload and derive its metrics, the client's and the
server's (`measure_round`). `ServerTrialRunner` does it on a real host through a deployer;
`tuner.sim.runner.SimulatedTrialRunner` does it on the simulated server's own clock, so that the search
loop's behaviour can be tested over hundreds of studies in seconds. Both derive a round's metrics with
`round_metrics`, so the figures the loop sees have one definition.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from tuner.config import ParamValue, SearchSpace, StudySpec
from tuner.engines.base import Engine
from tuner.errors import ConfigError, DeployError, MeasurementError, TransportError
from tuner.gate import ask_probes
from tuner.gpu import GpuMemorySampler
from tuner.http import tls_context
from tuner.loadgen import replay, replay_sessions, scrape_prometheus
from tuner.metrics import compute_metrics, fell_behind, join_server_tasks, server_metrics
from tuner.models import ReplayRequest, RequestRecord, RunningValue, TaskTimeline, TunedKnob
from tuner.observers import NullObserver, StudyObserver
from tuner.redact import redact
from tuner.runs import RunDirectory
from tuner.transports.base import Transport
from tuner.workloads import Trace, synthesize_sessions

if TYPE_CHECKING:  # the search loop imports this module; only a server's runner is handed a deployer
    from tuner.deployers.base import Deployer

__all__ = [
    "PreparedStudy",
    "RoundResult",
    "ServerTrialRunner",
    "TrialRunner",
    "round_metrics",
    "round_requests",
    "round_sessions",
    "slots_missed",
    "warm_up_request",
]

# The server logs a task's release just after its last chunk is sent, so the client may see a round end
# before the log does: the round's log is read again until it shows every completed request's task
# released, for at most this long (an engine whose log accounts no tasks waits it in full, as it always did).
_LOG_SETTLE_S = 0.3
_LOG_POLL_S = 0.02


@dataclass(frozen=True, kw_only=True)
class PreparedStudy:
    """A study file resolved and checked: everything is validated before the host is touched."""

    spec: StudySpec
    engine: Engine
    space: SearchSpace
    # Every searched knob's value in the baseline: the engine's base setting, else the space's default.
    baseline_settings: dict[str, ParamValue]
    trace: Trace
    predicted_from: Path | None = None  # `search.predicted_from`, resolved against the study file's directory

    def searched_values(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """Every searched knob's value in a trial with `settings` ({} for the baseline, which sets nothing)."""
        return {**self.baseline_settings, **settings}

    def tuned_knobs(self) -> list[TunedKnob]:
        """The server knobs a trial sets (the searched ones and engine.settings), as a deployer sees them."""
        engine = self.engine
        names = [*self.space.params, *(n for n in engine.base_settings if n not in self.space.params)]
        knobs = [engine.knobs[name] for name in names]
        return [TunedKnob(knob.name, knob.env, knob.flags, knob.value_type) for knob in knobs if knob.scope == "server"]

    def with_running_values(self, found: Sequence[RunningValue]) -> tuple[PreparedStudy, list[str]]:
        """The study with the baseline's searched knobs as the operator's server runs them (what a deployer
        that keeps the operator's command line read), and a line for each value read and where from. A knob
        engine.settings fixes is the study's in the baseline too; one found nowhere runs the default."""
        baseline, said = dict(self.baseline_settings), []
        for value in found:
            if value.knob not in self.space.params or value.knob in self.engine.base_settings:
                continue
            knob = self.engine.knobs[value.knob]
            try:
                parsed = knob.parse(value.text)
            except ValueError as exc:
                said.append(f"{value.knob}: cannot read {value.source} ({exc}); the baseline records the default")
                continue
            try:
                knob.check(parsed)
            except ConfigError as exc:
                raise ConfigError(f"the server runs {exc} ({value.source}); fix the server's value") from None
            if not self.space.params[value.knob].allows(parsed):
                raise ConfigError(
                    f"the server runs {value.knob}={parsed} ({value.source}), which the search space does not hold: "
                    f"add {parsed!r} to {value.knob}'s values in {self.spec.search.space}, so that the baseline is a "
                    "point of the search"
                )
            baseline[value.knob] = parsed
            said.append(f"{value.knob}={parsed} ({value.source})")
        for name in self.space.params:
            if name in self.engine.base_settings or any(v.knob == name for v in found):
                continue
            if self.engine.knobs[name].scope == "request":  # nothing on the host carries it: not read
                said.append(f"{name}={baseline[name]} (not read: a request option, the baseline's requests carry none)")
            else:
                said.append(f"{name}={baseline[name]} (set nowhere: the server's default)")
        return replace(self, baseline_settings=baseline), said


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    metrics: dict[str, float | None]
    records: list[RequestRecord]


class TrialRunner(Protocol):
    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        """Starts the server with `settings` over the engine's base settings and warms it up (unless the
        caller's next requests, the correctness probes, do that). `DeployError` if it does not come up or
        ignores a setting, `MeasurementError` if the warm-up fails."""
        ...

    async def reuse(self, settings: Mapping[str, ParamValue], *, number: int, log_path: str) -> str | None:
        """Readies the running server, started with the same server settings, for a round of trial `number`
        without a restart: clears every slot (`Engine.flush_requests`) and checks in the server's log that
        each was. None when done; otherwise why not, and the caller restarts. The caller checks
        `Engine.reuse_refusal` first."""
        ...

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        """The greedy answers to the correctness probes, asked together or one at a time; `MeasurementError` if
        a probe fails."""
        ...

    async def measure_round(
        self,
        *,
        settings: Mapping[str, ParamValue],
        number: int,
        prompts_index: int,
        prompts_variant: int = 0,
        label: str,
        records_name: str | None,
    ) -> RoundResult:
        """One replay of the workload with its metrics; `MeasurementError` if the server died or no request
        of the round succeeded. `prompts_variant`: 0 on a server started for the round, else how many rounds
        the reused server measured before (`round_sessions`)."""
        ...


def warm_up_request(engine: Engine) -> ReplayRequest:
    """One short request first, so that no round pays for the server's cold start."""
    low, _ = engine.prompt_token_range()
    return ReplayRequest(
        request_id="warm-up",
        session="warm-up",
        offset_s=0.0,
        prompt_token_ids=tuple(range(low, low + 16)),
        output_tokens=8,
        tag="warm-up",
    )


def round_requests(
    prepared: PreparedStudy, settings: Mapping[str, ParamValue], *, prompts_index: int, prompts_variant: int = 0
) -> list[ReplayRequest]:
    """The round's requests. Every trial replays the same prompts for the same `prompts_index`, so that
    trials differ only in their settings; rounds of one trial get fresh prompts, so that no round hits
    another's cache. A round on a reused server replays a `prompts_variant` of them: the same shape in
    other tokens, none of which its host-RAM prompt cache holds from the rounds it measured before."""
    return [
        request
        for session in round_sessions(prepared, settings, prompts_index=prompts_index, prompts_variant=prompts_variant)
        for request in session
    ]


def round_sessions(
    prepared: PreparedStudy, settings: Mapping[str, ParamValue], *, prompts_index: int, prompts_variant: int = 0
) -> Iterator[list[ReplayRequest]]:
    """`round_requests` a session at a time, in the order of the sessions' first arrivals, made as the
    load generator takes them: a long round never holds all its prompts."""
    spec, engine, trace = prepared.spec, prepared.engine, prepared.trace
    lora_mix = trace.lora_mix()
    for session in synthesize_sessions(
        trace,
        token_range=engine.prompt_token_range(),
        seed=spec.workload.seed,
        round_index=prompts_index,
        variant=prompts_variant,
        time_scale=spec.workload.time_scale,
    ):
        yield engine.apply_request_settings(session, settings, lora_mix=lora_mix)


def slots_missed(tasks: Sequence[TaskTimeline], slots: int) -> str | None:
    """None if the slot-clearing requests' tasks (in the server's log) were released on every one of the
    server's `slots`; otherwise which slots they reached. Two of them on one slot leave another slot holding
    an earlier round's prompt, which the next round could be served from."""
    cleared = {t.slot for t in tasks if t.n_tokens_at_release is not None}
    if cleared == set(range(slots)):
        return None
    return f"the slot-clearing requests reached slots {sorted(cleared)} of {slots}"


def check_round(records: Sequence[RequestRecord], label: str) -> None:
    if not any(r.ok for r in records):
        first_error = next((r.error for r in records if r.error), "unknown")
        raise MeasurementError(f"no request of {label} succeeded (first error: {first_error})")


def round_metrics(
    spec: StudySpec,
    engine: Engine,
    records: Sequence[RequestRecord],
    tasks: Sequence[TaskTimeline],
    *,
    counters: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
) -> tuple[dict[str, float | None], list[tuple[RequestRecord, TaskTimeline]]]:
    """A round's metrics from what the client recorded and what the server logged (and its counters
    before and after, where it has them); also the requests paired with their server tasks."""
    metrics = compute_metrics(
        records,
        long_prompt_tokens=spec.metrics.long_prompt_tokens,
        min_overlap_s=spec.metrics.min_overlap_s,
        slo=spec.metrics.slo,
    )
    if counters is not None and counters[0] and counters[1]:
        metrics.update(engine.round_counters(counters[0], counters[1]))
    metrics.update(
        server_metrics(
            tasks, long_prompt_tokens=spec.metrics.long_prompt_tokens, min_overlap_s=spec.metrics.min_overlap_s
        )
    )
    client_stall, server_stall = metrics.get("stall_tok_s"), metrics.get("server_stall_tok_s")
    metrics["stall_agreement"] = server_stall / client_stall if client_stall and server_stall is not None else None
    joined = join_server_tasks(records, tasks)
    metrics["server_joined_share"] = len(joined) / len(records) if records else None
    return metrics, joined


class ServerTrialRunner:
    """A runner on a real host: the deployer starts the server, the load generator replays the rounds."""

    def __init__(
        self,
        prepared: PreparedStudy,
        *,
        deployer: Deployer,
        transport: Transport,
        run_dir: RunDirectory | None = None,
        observer: StudyObserver | None = None,
    ) -> None:
        self.prepared = prepared
        self.deployer = deployer
        self.transport = transport  # GPU memory is read on the host
        self.run_dir = run_dir
        self.observer = observer or NullObserver()
        self._base_url: str | None = None
        self._log_mark = 0
        self._slots: int | None = None
        self._server_log: str | None = None  # the running server's log
        self._load_options: tuple[tuple[str, ParamValue], ...] = ()

    @property
    def base_url(self) -> str:
        assert self._base_url is not None, "start() first"
        return self._base_url

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        engine = self.prepared.engine
        self._base_url, self._slots = None, None
        # What every request of this trial carries for the model's load (Ollama's num_batch), probes included.
        self._load_options = engine.apply_request_settings([warm_up_request(engine)], settings)[0].load_options
        deployment = await self.deployer.apply(engine.launch_spec(settings), log_path=log_path)
        self.observer.server_ready(number=number, seconds=deployment.started_in_s)
        startup_log, log_mark = await self.deployer.read_log(0)
        ignored = engine.ignored_settings(startup_log, settings)
        if ignored is not None:
            raise DeployError(ignored)
        self._base_url = deployment.base_url
        self._slots = engine.slot_count(startup_log)
        self._server_log = deployment.log_path
        self._log_mark = log_mark
        if self.run_dir is not None and not self.run_dir.host_facts_path.exists():
            self.run_dir.save_host_facts(await self._host_facts())
        if not warm_up:
            return
        self.observer.warming_up(number=number)
        records = await replay(
            [warm_up_request(engine).model_copy(update={"load_options": self._load_options})],
            engine=engine,
            base_url=deployment.base_url,
            request_timeout_s=self.prepared.spec.workload.request_timeout_s,
        )
        if not records[0].ok:
            raise MeasurementError(f"the warm-up request failed: {records[0].error}")
        warm_up_log, self._log_mark = await self.deployer.read_log(log_mark)
        # Some settings are dropped only when the model loads (Ollama's flash attention on a CPU).
        ignored = engine.ignored_settings(startup_log + warm_up_log, settings)
        if ignored is not None:
            raise DeployError(ignored)

    async def _host_facts(self) -> dict[str, str | None]:
        """The server's build (its version endpoint) and the host's kernel and machine (`uname -srm`), each
        None where it cannot be had: evidence for the report, never in the way of the measurement."""
        engine = self.prepared.engine
        build: str | None = None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            async with httpx.AsyncClient(
                base_url=self.base_url, timeout=5.0, headers=engine.request_headers(), verify=tls_context()
            ) as client:
                response = await client.get(engine.version_path)
                body = response.json() if response.status_code == 200 else None
                build = engine.parse_version(body) if isinstance(body, dict) else None
        host: str | None = None
        with contextlib.suppress(TransportError):
            result = await self.transport.run(["uname", "-srm"], timeout_s=5.0, check=False)
            host = (result.stdout.strip() or None) if result.exit_status == 0 else None
        # With the unit's own command line: what the operator's server runs, as the deployer read it.
        operator = getattr(self.deployer, "operator", None)
        served = redact(operator.describe()) if operator is not None else None
        return {
            "engine": engine.kind,
            "engine_build": redact(build) if build else None,
            "host": host,
            "operator_server": served,
        }

    async def reuse(self, settings: Mapping[str, ParamValue], *, number: int, log_path: str) -> str | None:
        engine = self.prepared.engine
        if self._base_url is None:
            return "no server is running"
        if self._slots is None:
            return "the server's startup log does not say how many slots it runs"
        gone = await self.deployer.check_alive()
        if gone is not None:
            return gone
        requests = engine.flush_requests(self._slots)
        if not requests:
            return f"{engine.kind} has no request that clears a slot"
        records = await replay(
            requests,
            engine=engine,
            base_url=self.base_url,
            request_timeout_s=self.prepared.spec.workload.request_timeout_s,
        )
        failed = next((r for r in records if not r.ok), None)
        if failed is not None:
            return f"a slot-clearing request failed: {failed.error}"
        _, tasks, mark = await self._settled_log(len(records))
        missed = slots_missed(tasks, self._slots)
        if missed is not None:
            return missed
        self._log_mark = mark
        await self._note_in_log(log_path, number)
        return None

    async def _note_in_log(self, log_path: str, number: int) -> None:
        """The reused server keeps writing to the log of the trial that started it; the trial's own log
        says where its round's server lines are (its records and server tasks are in its own directory)."""
        started_log = self._server_log
        if started_log is None or started_log == log_path:
            return
        try:
            before = await self.transport.read_file(log_path)
        except TransportError:
            before = b""
        note = f"serve-tuner: trial {number} reused the running server; its lines are in {started_log}\n"
        with contextlib.suppress(TransportError):  # evidence only: never in the way of the measurement
            await self.transport.write_file(log_path, before + note.encode())

    async def _settled_log(self, completed: int) -> tuple[str, list[TaskTimeline], int]:
        """The log since the mark once it shows `completed` tasks released, or once _LOG_SETTLE_S has passed."""
        engine = self.prepared.engine
        deadline = time.monotonic() + _LOG_SETTLE_S
        while True:
            log_text, mark = await self.deployer.read_log(self._log_mark)
            tasks = engine.parse_log(log_text.splitlines())
            released = sum(1 for t in tasks if t.n_tokens_at_release is not None)
            if released >= completed or time.monotonic() >= deadline:
                return log_text, tasks, mark
            await asyncio.sleep(_LOG_POLL_S)

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        timeout = self.prepared.spec.workload.request_timeout_s
        answers = await ask_probes(
            self.prepared.engine,
            self.base_url,
            tokens=tokens,
            timeout_s=timeout,
            lora=lora,
            load_options=self._load_options,
            together=together,
        )
        _, self._log_mark = await self.deployer.read_log(self._log_mark)  # the probes are not the round's
        return answers

    async def measure_round(
        self,
        *,
        settings: Mapping[str, ParamValue],
        number: int,
        prompts_index: int,
        prompts_variant: int = 0,
        label: str,
        records_name: str | None,
    ) -> RoundResult:
        prepared, engine = self.prepared, self.prepared.engine
        self.observer.replay_started(number=number, label=label)
        counters_before = await scrape_prometheus(engine, self.base_url)
        async with GpuMemorySampler(self.transport) as gpu:
            records = await replay_sessions(
                round_sessions(prepared, settings, prompts_index=prompts_index, prompts_variant=prompts_variant),
                engine=engine,
                base_url=self.base_url,
                request_timeout_s=prepared.spec.workload.request_timeout_s,
            )
        if self.run_dir is not None and records_name is not None:
            self.run_dir.save_records(number, records_name, records)
        behind = fell_behind(records)
        if behind is not None:
            self.observer.replay_fell_behind(number=number, label=label, reason=behind)
        gone = await self.deployer.check_alive()
        if gone is not None:
            raise MeasurementError(f"the server died during {label}: {gone}")
        check_round(records, label)
        _, tasks, self._log_mark = await self._settled_log(sum(1 for r in records if r.ok))
        counters_after = await scrape_prometheus(engine, self.base_url)
        metrics, joined = round_metrics(
            prepared.spec, engine, records, tasks, counters=(counters_before, counters_after)
        )
        if gpu.peak_mib is not None:
            predicted = engine.memory_need(prepared.searched_values(settings))
            metrics["gpu_memory_peak_mib"] = gpu.peak_mib
            metrics["predicted_memory_mib"] = predicted / 2**20 if predicted is not None else None
        if self.run_dir is not None and records_name is not None:
            self.run_dir.save_server_tasks(number, records_name, joined)
        failures = sum(1 for r in records if not r.ok)
        self.observer.round_finished(number=number, label=label, metrics=metrics, failures=failures)
        return RoundResult(metrics=metrics, records=records)
