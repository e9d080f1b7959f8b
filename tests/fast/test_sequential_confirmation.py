"""The confirmation's sequential test (tuner/sequential.py): its pairs stop once the answer is decided, and
stopping early calls no more wins than running every pair would."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from scipy import stats

from tests.support.sim_study import DATA, prepare_simulated, run_simulated
from tuner.console import ConsoleObserver
from tuner.sequential import look, spending
from tuner.study_record import Confirmation, StudyRecord


@pytest.mark.parametrize("planned", [2, 3, 4, 5, 8, 20, 50])
def test_the_5_percent_is_spent_over_the_looks_and_adds_up_to_it(planned: int) -> None:
    spent = spending(planned)
    assert len(spent) == planned - 1  # one look after each pair from the second
    assert math.isclose(sum(spent), 0.05) and all(share >= 0 for share in spent) and spent[-1] > 0
    assert spent == sorted(spent)  # little at the first looks, most at the last
    if planned == 2:
        assert spent == [0.05]  # one look: the fixed-n interval


def _misses(planned: int, *, sequential: bool, confirmations: int = 400) -> int:
    """Confirmations of a candidate as good as the baseline (true mean 0) where some look's interval misses 0."""
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(confirmations):
        differences = rng.normal(0.0, 1.0, planned)
        for pairs in range(2, planned + 1):
            seen = differences[:pairs]
            if sequential:
                decided = look(list(seen), planned=planned, min_effect=10.0)  # an effect no look stops on
                low, high = decided.low, decided.high
            else:  # the fixed-n 95% t interval, looked at after every pair
                half = stats.t.ppf(0.975, pairs - 1) * seen.std(ddof=1) / math.sqrt(pairs)
                low, high = seen.mean() - half, seen.mean() + half
            if not low <= 0.0 <= high:
                misses += 1
                break
    return misses


def test_the_intervals_of_a_confirmation_hold_the_true_mean_together_unlike_a_fixed_one_at_each_pair() -> None:
    # 400 confirmations of 6 pairs each: a 5% rate misses about 20 times, 30 is 2.3 standard deviations beyond.
    assert _misses(6, sequential=True) < 30
    # The naive way, stopping at the first fixed-n interval that excludes zero, misses far more often.
    assert _misses(6, sequential=False) > 40


def test_a_large_effect_stops_as_soon_as_its_interval_clears_the_minimum_effect() -> None:
    differences = [1.62, 1.95, 1.71]  # the shape of the demo's confirmation on a real 2-core machine
    assert look(differences[:2], planned=4, min_effect=0.17).stop is None  # one degree of freedom: not yet
    decided = look(differences, planned=4, min_effect=0.17)
    assert decided.stop == "above" and decided.low > 0.17


def test_a_candidate_no_better_than_the_baseline_stops_without_running_every_pair() -> None:
    decided = look([0.05, -0.12], planned=5, min_effect=0.17)
    assert decided.stop == "futile" and decided.low < 0.17 < decided.high


def test_an_effect_that_may_still_clear_the_minimum_effect_runs_another_pair() -> None:
    assert look([0.6, 0.2, 0.45], planned=8, min_effect=0.17).stop is None


def test_the_last_pair_always_ends_the_confirmation() -> None:
    decided = look([0.3, 0.1, 0.2, 0.25], planned=4, min_effect=0.17)
    assert decided.stop == "all pairs" and decided.low < 0.17 < decided.high


def test_a_confirmation_stored_before_the_sequential_test_reads_as_all_its_pairs() -> None:
    old = Confirmation.model_validate({"differences": [1.4, 1.6, 1.5], "mean": 1.5, "ci": [1.25, 1.75]})
    assert old.pairs_told() == "3 alternating pairs"
    stopped = old.model_copy(update={"planned_pairs": 6, "stopped": "above"})
    assert stopped.pairs_told() == (
        "3 of at most 6 alternating pairs (stopped early: its interval cleared the minimum effect)"
    )
    # Decided at the last look: no pair was saved, and the line does not say "early".
    last = old.model_copy(update={"planned_pairs": 3, "stopped": "above"})
    assert last.pairs_told() == "3 alternating pairs (all that were planned; its interval cleared the minimum effect)"


def test_a_study_whose_candidate_is_the_baseline_again_stops_its_confirmation_early_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A/A: the cache_ram values change nothing this workload feels; seed 0's best trial scores above 0 by
    # chance and is re-measured.
    prepared = prepare_simulated(
        [
            f'search.space="{DATA / "aa-space.toml"}"',
            'search.params=["cache_ram"]',
            f'workload.path="{DATA / "stall-small.jsonl"}"',
            "metrics.long_prompt_tokens=600",
            "budget.trials=3",
            "confirm.pairs=5",
        ]
    )
    result = run_simulated(prepared, tmp_path / "aa", seed=0, observer=ConsoleObserver(Console(width=1000)))
    (confirmation,) = StudyRecord.of(result.study).confirmations.values()
    assert len(confirmation.differences) < 5 and confirmation.stopped in ("futile", "below")
    message = result.board.recommendation.message
    assert result.board.recommendation.row is None and "not above the minimum effect" in message
    assert f"over {len(confirmation.differences)} of at most 5 alternating pairs (stopped early: " in message
    printed = capsys.readouterr().out
    assert "up to 5 pairs in alternating order, fewer once the answer is clear" in printed
    assert f"over {len(confirmation.differences)} of at most 5 alternating pairs (stopped early" in printed
