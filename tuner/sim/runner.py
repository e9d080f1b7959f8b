"""`SimulatedTrialRunner`: the trial runner on the simulated server's own clock, for the search loop's tests.

Everything but the sockets is the study's own: the engine's launch (its `LLAMA_ARG_*` variables and
flags, read back by the simulated server's command-line parser), the round's requests
(`tuner.trial_runner.round_requests`), the correctness probes as the engine builds them, the server's
log lines through the engine's parser, and the round's metrics (`tuner.trial_runner.round_metrics`).
A round of the demo's workload takes a few milliseconds, so hundreds of studies run in seconds.

Faults make chosen configs misbehave as on a real host: `refuse-start` (the deployer's start fails),
`die-after=N` (the server dies during a round of more than N requests), `hang-after=N` (the requests of a
round after its first N time out, as if the server stopped answering while its health check passed).
Here N counts a round's requests; the program's `--sim-fault` counts every request since the start,
warm-up and probes included, so one spec can hit a different request in the two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.config import ParamValue
from tuner.errors import MeasurementError, ServerNotReady
from tuner.files import write_atomic
from tuner.models import ReplayRequest, RequestRecord, RequestStatus
from tuner.observers import NullObserver, StudyObserver
from tuner.runs import RunDirectory
from tuner.sim.api import text_tokens
from tuner.sim.command_line import Fault, parse_command_line, parse_fault
from tuner.sim.model import CostModel, NoiseModel, SimulatedLlamaServer, answer_tokens, format_log_line, load_cost_model
from tuner.sim.virtual import replay_virtual
from tuner.trial_runner import (
    PreparedStudy,
    RoundResult,
    check_round,
    round_metrics,
    round_requests,
    slots_missed,
    warm_up_request,
)

__all__ = ["SimulatedTrialRunner", "parse_faults"]

_BETWEEN_ROUNDS_S = 1.0  # the server's clock between the warm-up or a round and the next round
# Keyed by the prepared study's id, the prompts' index and variant, and the settings.
_RequestsKey = tuple[int, int, int, tuple[tuple[str, ParamValue], ...]]
_REQUESTS: dict[_RequestsKey, tuple[PreparedStudy, list[ReplayRequest]]] = {}


def parse_faults(specs: Sequence[str]) -> tuple[Fault, ...]:
    """The simulated server's `--sim-fault` specs, e.g. `n_batch=64:die-after=3`."""
    return tuple(parse_fault(spec) for spec in specs)


@dataclass(kw_only=True)
class _Started:
    server: SimulatedLlamaServer
    log: list[str]
    clock_s: float
    faults: tuple[Fault, ...]
    number: int  # the trial that started it


class SimulatedTrialRunner:
    def __init__(
        self,
        prepared: PreparedStudy,
        *,
        seed: int,
        noise: NoiseModel | None = None,
        cost: CostModel | None = None,
        faults: Sequence[Fault] = (),
        observer: StudyObserver | None = None,
        run_dir: RunDirectory | None = None,
        round_wall_s: float = 0.0,
    ) -> None:
        self.prepared = prepared
        # Real seconds each start and round waits (asyncio.sleep), so that several runners of a fleet take turns
        # as hosts do, and a fleet's wall time can be measured; 0: as fast as the virtual clock goes.
        self.round_wall_s = round_wall_s
        # Where the rounds' records go, as a real trial keeps them (the morning report reads them); None: kept nowhere.
        self.run_dir = run_dir
        self.cost = cost or load_cost_model()
        self.noise = noise or NoiseModel()
        self.faults = tuple(faults)
        self.observer = observer or NullObserver()
        self._seed = seed
        self._starts = 0
        self._started: _Started | None = None
        self.rounds_measured = 0
        self.starts_by_settings: list[dict[str, ParamValue]] = []
        self.reuses_by_settings: list[dict[str, ParamValue]] = []
        # ("start" or "reuse", trial number) for each round's server, in order: a "start" begins a server.
        self.servers: list[tuple[str, int]] = []

    @property
    def started(self) -> _Started:
        assert self._started is not None, "start() first"
        return self._started

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        # The warm-up is replayed whatever `warm_up` says: this runner's probes are answered without the
        # simulated server, so they would not warm it (and its model has no cold start to pay).
        engine = self.prepared.engine
        launch = engine.launch_spec(settings)
        command = parse_command_line(launch.args, launch.env)
        values = {**command.values, **vars(command.settings)}
        faults = tuple(f for f in self.faults if f.applies(values))
        self.starts_by_settings.append(dict(settings))
        await asyncio.sleep(self.round_wall_s / 4)
        if any(f.kind == "refuse-start" for f in faults):
            raise ServerNotReady("the server exited with status 1 before it was healthy; server log: simulated fault")
        self._starts += 1
        self.servers.append(("start", number))
        log: list[str] = []
        server = SimulatedLlamaServer(
            command.settings,
            cost=self.cost,
            noise=self.noise,
            seed=self._seed * 1_000_003 + self._starts,  # restart to restart, as on a real host
            log=lambda at, line: log.append(format_log_line(at, line)),
        )
        self._started = _Started(server=server, log=log, clock_s=self.cost.load_s, faults=faults, number=number)
        self.observer.server_ready(number=number, seconds=self.cost.load_s)
        self.observer.warming_up(number=number)
        warm = replay_virtual(
            [warm_up_request(engine)], server, engine=engine, start_s=self.cost.load_s, request_timeout_s=60
        )
        if not warm.records[0].ok:
            raise MeasurementError(f"the warm-up request failed: {warm.records[0].error}")
        self.started.clock_s = warm.ended_s + _BETWEEN_ROUNDS_S

    async def reuse(self, settings: Mapping[str, ParamValue], *, number: int, log_path: str) -> str | None:
        """As on a real host: the engine's slot-clearing requests, and the log checked for every slot."""
        engine, started = self.prepared.engine, self.started
        slots = len(started.server.slots)
        requests = engine.flush_requests(slots)
        if not requests:
            return f"{engine.kind} has no request that clears a slot"
        mark = len(started.log)
        done = replay_virtual(requests, started.server, engine=engine, start_s=started.clock_s, request_timeout_s=60)
        started.clock_s = done.ended_s + _BETWEEN_ROUNDS_S
        failed = next((r for r in done.records if not r.ok), None)
        if failed is not None:
            return f"a slot-clearing request failed: {failed.error}"
        missed = slots_missed(engine.parse_log(started.log[mark:]), slots)
        if missed is not None:
            return missed
        self.reuses_by_settings.append(dict(settings))
        self.servers.append(("reuse", number))
        return None

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        from tuner.gate import PROBE_PROMPTS

        engine, server = self.prepared.engine, self.started.server
        answers = []
        for prompt in PROBE_PROMPTS:
            body = engine.probe_request(prompt, tokens=tokens, lora=lora).json or {}
            field = body.get("lora")
            pairs = [(int(i["id"]), float(i["scale"])) for i in field] if isinstance(field, list) else None
            answers.append(tuple(answer_tokens(text_tokens(str(body["prompt"])), server.normalize_lora(pairs), tokens)))
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
        await asyncio.sleep(self.round_wall_s)
        prepared, engine, started = self.prepared, self.prepared.engine, self.started
        # Synthesizing a round's prompts is most of a simulated round's time, and every trial of a study (and
        # every study of one prepared spec) replays the same ones for the same index.
        key = (id(prepared), prompts_index, prompts_variant, tuple(sorted(settings.items())))
        cached = _REQUESTS.get(key)
        if cached is not None and cached[0] is prepared:  # an id is reused once its object is gone
            requests = cached[1]
        else:
            requests = round_requests(prepared, settings, prompts_index=prompts_index, prompts_variant=prompts_variant)
            _REQUESTS[key] = (prepared, requests)
            if len(_REQUESTS) > 4096:
                _REQUESTS.pop(next(iter(_REQUESTS)))
        mark = len(started.log)
        self.observer.replay_started(number=number, label=label)
        done = replay_virtual(
            requests,
            started.server,
            engine=engine,
            start_s=started.clock_s,
            request_timeout_s=prepared.spec.workload.request_timeout_s,
        )
        started.clock_s = done.ended_s + _BETWEEN_ROUNDS_S
        self.rounds_measured += 1
        records = self._apply_faults(done.records, started.faults, label)
        check_round(records, label)
        tasks = engine.parse_log(started.log[mark:])
        metrics, _ = round_metrics(prepared.spec, engine, records, tasks)
        if self.run_dir is not None and records_name is not None:
            self.run_dir.save_records(number, records_name, records)
            # The server's log since its start, as a real trial keeps it (a reused server's stays its starter's).
            log_path = self.run_dir.trial_dir(started.number) / "server.log"
            write_atomic(log_path, "".join(line + "\n" for line in started.log).encode())
        failures = sum(1 for r in records if not r.ok)
        self.observer.round_finished(number=number, label=label, metrics=metrics, failures=failures)
        return RoundResult(metrics=metrics, records=records)

    def _apply_faults(self, records: list[RequestRecord], faults: tuple[Fault, ...], label: str) -> list[RequestRecord]:
        for fault in faults:
            if fault.kind == "die-after" and len(records) > fault.after:
                raise MeasurementError(f"the server died during {label}: the process was killed by SIGKILL")
            if fault.kind == "hang-after":
                timeout = self.prepared.spec.workload.request_timeout_s
                records = [
                    r
                    if index < fault.after
                    else r.model_copy(
                        update={
                            "status": RequestStatus.TIMEOUT,
                            "error": f"no complete answer within {timeout:g} s",
                            "token_s": (),
                            "timings": None,
                        }
                    )
                    for index, r in enumerate(records)
                ]
        return records
