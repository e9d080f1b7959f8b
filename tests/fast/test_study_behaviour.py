"""The search loop's behaviour, on the simulated server's own clock (tests/support/sim_study.py): seconds, not hours.

The loop, sampler, scoring and leaderboard are the study's own; the simulated server is calibrated against
the real one (docs/simulator.md), whose own tests (tests/real/test_tiny_study.py, tests/real/test_lora_study.py) stay.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from tests.support.sim_study import AA_OVERRIDES, DATA, DEMO, prepare_simulated, run_simulated
from tuner.config import ParamValue
from tuner.errors import StudyError
from tuner.observers import NullObserver
from tuner.report import build_leaderboard
from tuner.runs import RunDirectory
from tuner.search import open_optuna_study, run_search
from tuner.sim.model import NoiseModel
from tuner.sim.runner import SimulatedTrialRunner
from tuner.study_record import StudyRecord, TrialRecord
from tuner.trial_runner import RoundResult

AA_STUDIES = 200
DEMO_SEEDS = 20


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_the_demos_search_lands_in_the_knee_region_on_at_least_18_of_20_seeds(tmp_path: Path) -> None:
    # The demo's study as shipped: its full n_batch x n_ubatch space (27 valid configs, 3 of them in the knee),
    # the line start (tuner/sampling.py), then TPE; 5 trials, 2 rounds, 4 confirmation pairs.
    landed, outcomes = 0, []
    for seed in range(DEMO_SEEDS):
        prepared = prepare_simulated([f"seed={seed}", f"workload.seed={seed}"])
        result = run_simulated(prepared, tmp_path / f"demo-{seed}", seed=seed)
        baseline = next(r for r in result.board.rows if r.baseline)
        chosen = result.board.recommendation.row
        if chosen is None:
            outcomes.append(f"seed {seed}: nothing recommended ({result.board.recommendation.message})")
            continue
        stall = chosen.metrics["stall_tok_s"][0] / baseline.metrics["stall_tok_s"][0]
        prefill = chosen.metrics["prefill_tok_s"][0] / baseline.metrics["prefill_tok_s"][0]
        knee = int(chosen.settings["n_batch"]) <= 256 and stall >= 4 and prefill >= 0.8
        landed += knee
        outcomes.append(f"seed {seed}: {chosen.settings} stall x{stall:.1f} prefill x{prefill:.2f} knee={knee}")
    assert landed >= 18, "\n".join(outcomes)


def test_the_same_config_under_noise_is_recommended_in_at_most_5_percent_of_studies(tmp_path: Path) -> None:
    prepared = prepare_simulated(AA_OVERRIDES)  # every trial the baseline's config, in effect
    false_wins = []
    for seed in range(AA_STUDIES):
        result = run_simulated(prepared, tmp_path / f"aa-{seed}", seed=seed)
        if result.board.recommendation.row is not None:
            false_wins.append(seed)
    # The smallest count that a true rate of 5% reaches with probability under 3% (17 of 200): at or above
    # it, the rate is above 5% (bench/sim_search.py measured 0.4% over 1,000 studies, 2026-12-05).
    limit = next(k for k in range(AA_STUDIES + 1) if _binomial_tail(k, AA_STUDIES, 0.05) < 0.03)
    assert len(false_wins) < limit, f"{len(false_wins)} of {AA_STUDIES} A/A studies recommended something: {false_wins}"


def _small_study(*extra: str) -> list[str]:
    # Two trials around the knee, measured together: small enough to read every step of.
    return [f'search.space="{DATA / "knee-space.toml"}"', 'search.sampler="random"', "budget.trials=2", *extra]


def test_rounds_of_a_batch_are_interleaved_and_the_server_restarts_for_each(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study("interleave=2", "rounds=2", "extra_rounds_if_noisy=0", "confirm.top=0"))
    result = run_simulated(prepared, tmp_path / "s", seed=1, noise=NoiseModel())
    starts = result.runner.starts_by_settings
    trials = [tuple(sorted(s.items())) for s in starts[2:]]
    # The baseline's two rounds alone first, then round 1 of each trial, then round 2 of each.
    assert starts[:2] == [{}, {}]
    assert len(trials) == 4 and trials[0] != trials[1] and trials[:2] == trials[2:]
    assert result.runner.rounds_measured == 6


def test_the_confirmation_alternates_baseline_and_candidate_pair_by_pair(tmp_path: Path) -> None:
    prepared = prepare_simulated(
        _small_study("interleave=2", "confirm.top=1", "confirm.pairs=3", "extra_rounds_if_noisy=0")
    )
    result = run_simulated(prepared, tmp_path / "s", seed=2, noise=NoiseModel())
    confirming = ["baseline" if not s else "candidate" for s in result.runner.starts_by_settings[6:]]
    (confirmation,) = StudyRecord.of(result.study).confirmations.values()
    # A quiet machine and a large effect: decided before the third pair (the sequential test).
    assert len(confirmation.differences) == 2 and confirmation.stopped == "above"
    assert confirming == ["baseline", "candidate", "candidate", "baseline"]
    assert result.board.recommendation.row is not None
    message = result.board.recommendation.message
    assert "paired score difference" in message
    assert "over 2 of at most 3 alternating pairs (stopped early: its interval cleared the minimum effect)" in message


def test_a_trial_whose_rounds_differ_by_20_percent_gets_its_extra_rounds(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study("rounds=2", "extra_rounds_if_noisy=2", "confirm.top=0"))
    # Large restart-to-restart noise: rounds of one config differ by far more than 20%.
    result = run_simulated(prepared, tmp_path / "s", seed=3, noise=NoiseModel(restart=0.6))
    measured = [t for t in result.study.get_trials() if TrialRecord.of(t).deployed and t.state == TrialState.COMPLETE]
    noisy = [t for t in measured if TrialRecord.of(t).noisy]
    assert noisy, "no trial was flagged noisy under 60% restart noise"
    assert all(len(TrialRecord.of(t).rounds) == 4 for t in noisy)
    assert all(len(TrialRecord.of(t).rounds) == 2 for t in measured if not TrialRecord.of(t).noisy)


def test_a_quiet_machine_flags_nothing_noisy(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study("rounds=2", "extra_rounds_if_noisy=2", "confirm.top=0"))
    result = run_simulated(prepared, tmp_path / "s", seed=3, noise=NoiseModel())
    assert all(not TrialRecord.of(t).noisy for t in result.study.get_trials() if TrialRecord.of(t).deployed)


def test_a_trial_far_below_the_others_is_pruned_after_its_first_round_and_the_time_saved_is_told(
    tmp_path: Path,
) -> None:
    # 32/32 prefills at about half the speed, which the prefill objective (weight 2) punishes: after three
    # first rounds are known, a config whose first round is below their median stops there.
    prepared = prepare_simulated(["budget.trials=8", "rounds=3", "confirm.top=0", 'search.sampler="random"', "seed=5"])
    result = run_simulated(prepared, tmp_path / "s", seed=5)
    pruned = [t for t in result.study.get_trials() if TrialRecord.of(t).prune_reason]
    assert pruned, [TrialRecord.of(t).score for t in result.study.get_trials()]
    for trial in pruned:
        assert trial.state == TrialState.PRUNED and len(TrialRecord.of(trial).rounds) == 1
        assert TrialRecord.of(trial).saved_s > 0
    assert result.board.pruned == len(pruned) and result.board.pruning_saved_s > 0


def test_invalid_and_repeated_proposals_cost_no_restart(tmp_path: Path) -> None:
    # knee-space has two valid settings besides the baseline's; asking for three makes the sampler repeat
    # itself and propose n_ubatch > n_batch.
    prepared = prepare_simulated(_small_study("budget.trials=3", "confirm.top=0", "extra_rounds_if_noisy=0"))
    result = run_simulated(prepared, tmp_path / "s", seed=6, noise=NoiseModel())
    trials = result.study.get_trials()
    deployed = [t for t in trials if TrialRecord.of(t).deployed]
    skipped = [t for t in trials if TrialRecord.of(t).skip_reason or TrialRecord.of(t).duplicate_of is not None]
    reasons = {TrialRecord.of(t).skip_reason or f"duplicate of {TrialRecord.of(t).duplicate_of}" for t in skipped}
    assert "violates n_ubatch <= n_batch" in reasons, reasons
    assert any(reason.startswith("duplicate of") for reason in reasons), reasons
    assert len(result.runner.starts_by_settings) == 2 * len(deployed)  # two rounds each, nothing else
    assert {tuple(sorted((TrialRecord.of(t).settings or {}).items())) for t in deployed} == {
        (("n_batch", 2048), ("n_ubatch", 512)),
        (("n_batch", 256), ("n_ubatch", 256)),
        (("n_batch", 2048), ("n_ubatch", 256)),
    }


class _WrongAnswersAt256(SimulatedTrialRunner):
    """A server whose greedy answers change at n_batch = 256, as a broken kernel's would."""

    n_batch: object = None

    async def start(
        self, settings: Mapping[str, ParamValue], *, number: int, log_path: str, warm_up: bool = True
    ) -> None:
        self.n_batch = settings.get("n_batch")
        await super().start(settings, number=number, log_path=log_path, warm_up=warm_up)

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        answers = await super().probe_answers(tokens=tokens, lora=lora, together=together)
        return [tuple(t + 1 for t in answer) for answer in answers] if self.n_batch == 256 else answers


def test_a_config_whose_answers_differ_is_failed_by_the_correctness_gate_and_never_scored(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study("budget.trials=2", "confirm.top=1", "extra_rounds_if_noisy=0"))
    runner = _WrongAnswersAt256(prepared, seed=6, noise=NoiseModel())
    with RunDirectory(tmp_path / "s", notice=lambda _line: None) as run_dir:
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=InMemoryStorage())
        asyncio.run(run_search(prepared, run_dir, study, runner))
    records = {t.number: (t, TrialRecord.of(t)) for t in study.get_trials() if TrialRecord.of(t).deployed}
    (gated,) = [(t, r) for t, r in records.values() if (r.settings or {}).get("n_batch") == 256]
    trial, record = gated
    assert trial.state == TrialState.FAIL and record.score is None and not record.rounds
    assert (record.fail_reason or "").startswith("correctness gate: "), record.fail_reason
    # Started once, for the probes; no round measured, no confirmation.
    assert sum(1 for started in runner.starts_by_settings if started.get("n_batch") == 256) == 1
    board = build_leaderboard(study)
    assert board.recommendation.row is None or board.recommendation.row.settings.get("n_batch") != 256


class _BatchedAnswersDifferAt256(_WrongAnswersAt256):
    """A server whose answers change at n_batch = 256 only when the probes come in one batch (a device
    whose batched kernels differ in their last bits); one at a time they are the baseline's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[bool] = []  # how each ask came: together or not

    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]:
        self.asked.append(together)
        answers = await SimulatedTrialRunner.probe_answers(self, tokens=tokens, lora=lora, together=together)
        return [tuple(t + 1 for t in answer) for answer in answers] if self.n_batch == 256 and together else answers


def test_answers_that_differ_only_in_a_batch_are_asked_again_one_at_a_time_before_the_gate_fails_them(
    tmp_path: Path,
) -> None:
    prepared = prepare_simulated(_small_study("budget.trials=2", "confirm.top=0", "extra_rounds_if_noisy=0"))
    runner = _BatchedAnswersDifferAt256(prepared, seed=6, noise=NoiseModel())
    with RunDirectory(tmp_path / "s", notice=lambda _line: None) as run_dir:
        study = open_optuna_study(run_dir, prepared.spec, prepared.space, storage=InMemoryStorage())
        asyncio.run(run_search(prepared, run_dir, study, runner))
    records = [(t, TrialRecord.of(t)) for t in study.get_trials() if TrialRecord.of(t).deployed]
    (trial, record), *_ = [(t, r) for t, r in records if (r.settings or {}).get("n_batch") == 256]
    assert trial.state == TrialState.COMPLETE and record.answer_agreement == [1.0] * 4, record.fail_reason
    # The baseline's reference one at a time; each trial together, the one at 256 again one at a time.
    assert runner.asked[0] is False and runner.asked.count(False) == 2, runner.asked


def test_settings_pruned_once_are_not_deployed_again_when_proposed_again(tmp_path: Path) -> None:
    # Random search over the demo's 28 valid configs with a budget of 25 proposes pruned ones again.
    prepared = prepare_simulated(['search.sampler="random"', "budget.trials=25", "confirm.top=0"])
    result = run_simulated(prepared, tmp_path / "s", seed=0)
    records = [TrialRecord.of(t) for t in result.study.get_trials()]
    deployed = [tuple(sorted((r.settings or {}).items())) for r in records if r.deployed]
    assert len(deployed) == len(set(deployed)), "a config was restarted to be measured again"
    assert any("pruned after its first round" in (r.skip_reason or "") for r in records)


class _ExhaustionCounter(NullObserver):
    def __init__(self) -> None:
        self.exhausted: list[int] = []

    def search_exhausted(self, *, proposals: int) -> None:
        self.exhausted.append(proposals)


def test_a_space_smaller_than_the_budget_is_searched_once_and_the_search_ends(tmp_path: Path) -> None:
    # knee-space holds two configs besides the baseline; a batch of three finds both, then only repeats.
    prepared = prepare_simulated(_small_study("budget.trials=5", "interleave=3", "confirm.top=1", "confirm.pairs=2"))
    observer = _ExhaustionCounter()
    result = run_simulated(prepared, tmp_path / "s", seed=6, noise=NoiseModel(), observer=observer)
    assert observer.exhausted == [200], "the sampler was asked again after it had nothing new to offer"
    deployed = [t for t in result.study.get_trials() if TrialRecord.of(t).deployed]
    assert len(deployed) == 3  # the baseline and the two others, each once
    assert StudyRecord.of(result.study).confirmations, "the confirmation still ran after the search ended"


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("n_batch=256:refuse-start", "before it was healthy"),
        ("n_batch=256:die-after=1", "the server died during round 1/2"),
        ("n_batch=256:hang-after=0", "no request of round 1/2 succeeded"),
    ],
)
def test_a_config_that_cannot_start_dies_or_hangs_fails_with_its_reason_and_the_study_goes_on(
    tmp_path: Path, fault: str, reason: str
) -> None:
    prepared = prepare_simulated(_small_study("confirm.top=0"))
    result = run_simulated(prepared, tmp_path / "s", seed=7, faults=[fault])
    failed = [r for r in result.board.rows if r.state == "FAIL"]
    assert [r.settings["n_batch"] for r in failed] == [256]
    assert failed[0].reason is not None and reason in failed[0].reason
    assert failed[0].score is None and not failed[0].metrics  # no partial score
    assert [r.settings for r in result.board.rows if r.state == "COMPLETE" and not r.baseline] == [
        {"n_batch": 2048, "n_ubatch": 256}
    ]


def test_a_baseline_that_cannot_be_measured_ends_the_study_with_its_reason(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study())
    with pytest.raises(StudyError, match=r"the baseline could not be measured: .*no request of round 1/2 succeeded"):
        run_simulated(prepared, tmp_path / "s", seed=8, faults=["n_batch=2048:hang-after=0"])


class _InterruptedAt(SimulatedTrialRunner):
    """Ctrl-C during the n-th measured round."""

    def __init__(self, *args: Any, at_round: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._at_round = at_round

    async def measure_round(self, **kwargs: Any) -> RoundResult:
        if self.rounds_measured + 1 == self._at_round:
            raise KeyboardInterrupt
        return await super().measure_round(**kwargs)


def test_an_interruption_in_a_batch_costs_only_the_trials_that_started(tmp_path: Path) -> None:
    prepared = prepare_simulated(_small_study("interleave=2", "confirm.top=0"))
    # The baseline's two rounds, then the first trial of the batch is interrupted in its first round, before
    # the second trial's first start.
    runner = _InterruptedAt(prepared, seed=9, noise=NoiseModel(), at_round=3)
    with pytest.raises(KeyboardInterrupt), RunDirectory(tmp_path / "s", notice=lambda _line: None) as run_dir:
        study = open_optuna_study(run_dir, prepared.spec, prepared.space)
        asyncio.run(run_search(prepared, run_dir, study, runner))
    interrupted = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(interrupted) == 2 and all("interrupted" in (TrialRecord.of(t).fail_reason or "") for t in interrupted)
    assert [bool(TrialRecord.of(t).deployed) for t in interrupted] == [True, False]

    resumed = run_simulated(prepared, tmp_path / "s", seed=9, noise=NoiseModel(), in_memory=False)
    measured = [r for r in resumed.board.rows if r.state == "COMPLETE" and not r.baseline]
    # The budget of 2 is one interrupted trial that started and one measured now; the one that never started
    # is not on the board.
    assert len(measured) == 1 and [r.state for r in resumed.board.rows].count("FAIL") == 1


class _Rounds(NullObserver):
    """Which trials the confirmation took up, and every round's trial and label."""

    def __init__(self) -> None:
        self.confirmed: list[int] = []
        self.rounds: list[tuple[int, str]] = []

    def confirm_started(self, *, number: int, settings: Mapping[str, ParamValue], pairs: int) -> None:
        self.confirmed.append(number)

    def round_started(self, *, number: int, label: str, index: int, total: int) -> None:
        self.rounds.append((number, label))


@pytest.mark.parametrize("allowed", [False, True], ids=["answers-may-not-change", "answers-may-change"])
def test_the_confirmation_never_spends_a_round_on_a_trial_the_recommendation_would_refuse(
    tmp_path: Path, allowed: bool
) -> None:
    # The LoRA demo on the simulated server: one adapter setting for everyone beats the mixed baseline
    # (no request waits for the other setting) and changes the answers of half the workload's requests.
    overrides = [f"gate.allow_answer_changes={str(allowed).lower()}", "confirm.top=1", "confirm.pairs=2"]
    prepared = prepare_simulated(overrides, study_file=DEMO.with_name("lora-demo.toml"))
    observer = _Rounds()
    result = run_simulated(prepared, tmp_path / "s", seed=3, observer=observer)
    best = next(row for row in result.board.rows if not row.baseline)
    assert best.score is not None and best.score > 0 and best.answers_changed, best
    confirmation_rounds = [number for number, label in observer.rounds if label.startswith("pair ")]
    recommendation = result.board.recommendation
    if allowed:
        # The control: the same best trial is re-measured (2 pairs) and recommended.
        assert observer.confirmed == [best.number] and len(confirmation_rounds) == 4, observer.rounds
        assert recommendation.row is not None and recommendation.row.number == best.number, recommendation.message
    else:
        # Refused by the recommendation whatever its re-measurement says: no pair of rounds is spent on it.
        assert observer.confirmed == [] and confirmation_rounds == [], observer.rounds
        assert StudyRecord.of(result.study).confirmations == {}
        assert recommendation.row is None and "changes answers" in recommendation.message, recommendation.message
