"""No restart where none is needed, and none where it would change a measurement (`tuner.server_reuse.Servers.deploy`).

On the simulated server (tests/support/sim_study.py), whose slots and host-RAM prompt cache behave as llama-server's:
a trial that differs from the running server only in its LoRA policy (a request-scope knob) is measured on
it, its slots cleared first and, since no request empties the host-RAM prompt cache, a variant of the
round's prompts replayed; a trial with other server settings, a trial's own next round, and an engine that
cannot clear its server restart as before. tests/real/test_server_reuse_real.py checks the same on llama-server.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.sim_study import ROOT, prepare_simulated, run_simulated
from tuner.config import ParamValue
from tuner.engines.llama_server import LlamaServerEngine
from tuner.models import ReplayRequest
from tuner.sim.model import NoiseModel
from tuner.sim.runner import SimulatedTrialRunner
from tuner.study_record import StudyRecord
from tuner.trial_runner import PreparedStudy, RoundResult

LORA_DEMO = ROOT / "studies" / "lora-demo.toml"
QUIET = NoiseModel()


def _lora_study(*overrides: str) -> PreparedStudy:
    return prepare_simulated(
        ["budget.trials=2", "confirm.pairs=3", "extra_rounds_if_noisy=0", *overrides], study_file=LORA_DEMO
    )


def _servers(runner: SimulatedTrialRunner) -> list[list[int]]:
    """The trials each server measured a round of, one list per server start, in order."""
    servers: list[list[int]] = []
    for kind, number in runner.servers:
        if kind == "start":
            servers.append([])
        servers[-1].append(number)
    return servers


def test_a_trial_differing_only_in_its_lora_policy_is_measured_on_the_running_server(tmp_path: Path) -> None:
    # Answers may change: the confirmation then re-measures the best policy (it never re-measures a trial
    # the recommendation would refuse), and its pairs are among the rounds counted below.
    result = run_simulated(_lora_study("gate.allow_answer_changes=true"), tmp_path / "s", seed=0, noise=QUIET)
    runner = result.runner
    assert StudyRecord.of(result.study).confirmations, "no confirmation ran"
    assert runner.reuses_by_settings, runner.servers
    assert all(set(settings) <= {"lora_policy"} for settings in runner.reuses_by_settings)  # {}: the baseline
    servers = _servers(runner)
    # Fewer starts than measured rounds, and no server measured two rounds of one trial: a trial's rounds
    # and the confirmation's pairs keep their restart-to-restart spread.
    assert len(servers) < runner.rounds_measured
    assert sum(len(trials) for trials in servers) == runner.rounds_measured
    assert all(len(trials) == len(set(trials)) for trials in servers), servers
    assert result.board.recommendation.message  # the study ran to its end


@pytest.mark.parametrize("cache_ram", ["cache_ram=0", "the default cache_ram"])
def test_a_reused_server_serves_no_prompt_from_an_earlier_trials_round(tmp_path: Path, cache_ram: str) -> None:
    # Round k of every trial replays the same prompts: without its slots cleared, a reused server would
    # answer part of the next trial's round from the last one's cached prompts, and with the host-RAM
    # prompt cache on (llama-server's default), which no request empties, from that cache unless the round
    # replays a variant of its prompts. Every round, reused or not, must find in the cache exactly what it
    # finds on a server started for it.
    overrides = ["engine.settings.cache_ram=0"] if cache_ram == "cache_ram=0" else []

    def cached_tokens(reuse: bool, run: str) -> dict[tuple[int, str], int]:
        prepared = _lora_study(*overrides, "confirm.top=0")
        runner = _RecordingRunner(prepared, seed=0, noise=QUIET)
        if not reuse:
            runner.refuse_reuse = True
        result = _run(prepared, runner, tmp_path / run)
        assert bool(result.reuses_by_settings) == reuse
        return runner.cached

    with_reuse, restarted = cached_tokens(True, "reused"), cached_tokens(False, "restarted")
    assert with_reuse.keys() == restarted.keys()
    assert with_reuse == restarted
    assert any(restarted.values())  # the workload's own sharing is found in the cache either way


def test_a_trial_with_other_server_settings_restarts_the_server(tmp_path: Path) -> None:
    # The demo's n_batch x n_ubatch study: every trial's server settings differ.
    prepared = prepare_simulated(["budget.trials=3", "extra_rounds_if_noisy=0"])
    result = run_simulated(prepared, tmp_path / "s", seed=0, noise=QUIET)
    runner = result.runner
    assert runner.reuses_by_settings == []
    assert len(runner.starts_by_settings) == runner.rounds_measured


def test_a_server_the_engine_cannot_clear_is_restarted_for_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ollama and vLLM: nothing is known to clear their caches without a restart (`Engine.reuse_refusal`).
    prepared = _lora_study("confirm.top=0")
    monkeypatch.setattr(prepared.engine, "reuse_refusal", lambda _settings: "no request clears this engine's cache")
    runner = _run(prepared, SimulatedTrialRunner(prepared, seed=0, noise=QUIET), tmp_path / "s")
    assert runner.reuses_by_settings == []
    assert len(runner.starts_by_settings) == runner.rounds_measured


def test_a_server_whose_slots_could_not_all_be_cleared_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = _lora_study("confirm.top=0")
    flush, flushes = prepared.engine.flush_requests, []

    def one_slot_missed(slots: int) -> list[ReplayRequest]:
        flushes.append(slots)
        return flush(slots - 1)  # as if two of them had shared a slot: one slot keeps its earlier prompt

    monkeypatch.setattr(prepared.engine, "flush_requests", one_slot_missed)
    runner = _run(prepared, SimulatedTrialRunner(prepared, seed=0, noise=QUIET), tmp_path / "s")
    assert flushes and runner.reuses_by_settings == []
    assert len(runner.starts_by_settings) == runner.rounds_measured


def test_llama_server_can_be_reused_with_its_prompt_cache_on_and_clears_every_slot() -> None:
    def engine(**options: object) -> LlamaServerEngine:
        from tuner.engines.llama_server import LlamaServerOptions

        return LlamaServerEngine(LlamaServerOptions.model_validate({"binary": "simulated", **options}))

    default = engine()
    assert default.reuse_refusal({}) is None
    assert default.reuse_refusal({"cache_ram": 1024, "lora_policy": "all_on"}) is None
    assert engine(extra_args=["--cache-ram", "512"]).reuse_refusal({}) is None
    # The server settings leave the request-scope knobs out: a LoRA policy alone changes nothing there.
    assert default.server_settings({"lora_policy": "all_off"}) == default.server_settings({})
    assert default.server_settings({"n_batch": 64}) != default.server_settings({})
    assert default.slot_count("I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048") == 4
    assert default.slot_count("no such line") is None
    flush = default.flush_requests(4)
    assert len(flush) == 4 and {r.tag for r in flush} == {"slot-flush"}
    assert len({r.prompt_token_ids[0] for r in flush}) == 4  # no two share a prefix, so each takes its own slot
    low, high = default.prompt_token_range()
    assert all(low <= t < high for r in flush for t in r.prompt_token_ids)


class _RecordingRunner(SimulatedTrialRunner):
    """Counts each round's cached prompt tokens, by trial and round, and the prompts variant of each round
    on each server start; can refuse every reuse."""

    refuse_reuse = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.cached: dict[tuple[int, str], int] = defaultdict(int)
        self.variants: list[list[int]] = []

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        await super().start(settings, number=number, log_path=log_path, warm_up=warm_up)
        self.variants.append([])

    async def reuse(self, settings: Mapping[str, ParamValue], *, number: int, log_path: str) -> str | None:
        if self.refuse_reuse:
            return "refused by the test"
        return await super().reuse(settings, number=number, log_path=log_path)

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
        result = await super().measure_round(
            settings=settings,
            number=number,
            prompts_index=prompts_index,
            prompts_variant=prompts_variant,
            label=label,
            records_name=records_name,
        )
        self.cached[(number, label)] += sum(r.timings.cache_n for r in result.records if r.timings is not None)
        self.variants[-1].append(prompts_variant)
        return result


def test_each_round_a_server_measures_replays_its_own_variant_of_the_prompts(tmp_path: Path) -> None:
    # The host-RAM prompt cache keeps every round a server measured: its third round must not replay the
    # second's prompts either. A server started for a round replays the prompts every earlier version made.
    prepared = _lora_study("confirm.top=0")
    runner = _run(prepared, _RecordingRunner(prepared, seed=0, noise=QUIET), tmp_path / "s")
    assert isinstance(runner, _RecordingRunner)
    assert any(len(rounds) >= 3 for rounds in runner.variants), runner.variants
    assert all(rounds == list(range(len(rounds))) for rounds in runner.variants), runner.variants


def _run(prepared: PreparedStudy, runner: SimulatedTrialRunner, path: Path) -> SimulatedTrialRunner:
    from optuna.storages import InMemoryStorage

    from tuner.runs import RunDirectory
    from tuner.search import open_optuna_study, run_search

    with RunDirectory(path, notice=lambda _line: None) as run_dir:
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=InMemoryStorage())
        asyncio.run(run_search(prepared, run_dir, study, runner))
    return runner


class _ProbeCountingRunner(SimulatedTrialRunner):
    """Counts the correctness probes asked, by trial (the LoRA answer check's, with adapters, apart)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.probed: list[int] = []

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        if lora is None:
            self.probed.append(self.started.number)
        return await super().probe_answers(tokens=tokens, lora=lora, together=together)


def test_a_trial_with_the_baselines_server_settings_asks_no_correctness_probes(tmp_path: Path) -> None:
    # The probes set no request-scope knob: a LoRA-policy trial would get the baseline's answers back, so
    # they are asked only of the baseline (the reference) and of trials with other server settings.
    prepared = _lora_study("confirm.top=0")
    runner = _run(prepared, _ProbeCountingRunner(prepared, seed=0, noise=QUIET), tmp_path / "lora")
    assert isinstance(runner, _ProbeCountingRunner)
    assert runner.probed == [0], runner.probed  # the baseline's only; both policies measured without
    server = prepare_simulated(["budget.trials=2", "confirm.top=0", "extra_rounds_if_noisy=0"])
    runner = _run(server, _ProbeCountingRunner(server, seed=0, noise=QUIET), tmp_path / "batch")
    assert isinstance(runner, _ProbeCountingRunner)
    assert runner.probed[0] == 0 and len(runner.probed) == 3, runner.probed  # every trial of n_batch x n_ubatch
