from __future__ import annotations

import math

import pytest

from tuner.config import ObjectiveSpec
from tuner.errors import MeasurementError
from tuner.scoring import min_effect, noisy_metrics, score_round, verdict

OBJECTIVES = [
    ObjectiveSpec(metric="stall_tok_s", direction="maximize", weight=1.0),
    ObjectiveSpec(metric="ttft_p95_s", direction="minimize", weight=1.0),
]


def test_score_is_zero_at_the_baseline_and_log_of_the_ratio_elsewhere() -> None:
    base = {"stall_tok_s": 0.2, "ttft_p95_s": 4.0}
    assert score_round(base, base, OBJECTIVES) == pytest.approx(0.0)
    better = {"stall_tok_s": 0.4, "ttft_p95_s": 2.0}
    assert score_round(better, base, OBJECTIVES) == pytest.approx(2 * math.log(2))


def test_a_stall_speed_of_zero_is_a_finite_penalty() -> None:
    score = score_round({"stall_tok_s": 0.0, "ttft_p95_s": 4.0}, {"stall_tok_s": 0.2, "ttft_p95_s": 4.0}, OBJECTIVES)
    assert math.isfinite(score) and score < -4


def test_a_missing_objective_metric_is_an_error_naming_it() -> None:
    with pytest.raises(MeasurementError, match="stall_tok_s"):
        score_round({"stall_tok_s": None, "ttft_p95_s": 1.0}, {"stall_tok_s": 1.0, "ttft_p95_s": 1.0}, OBJECTIVES)


def test_rounds_differing_by_twenty_percent_are_flagged() -> None:
    rounds = [{"stall_tok_s": 1.0, "ttft_p95_s": 2.0}, {"stall_tok_s": 1.25, "ttft_p95_s": 2.1}]
    assert noisy_metrics(rounds, ["stall_tok_s", "ttft_p95_s"]) == ["stall_tok_s"]


def test_a_win_inside_the_baselines_spread_is_not_a_win() -> None:
    assert not verdict([0.05, 0.30], [-0.1, 0.1], min_effect=0.05).better
    assert verdict([0.5, 0.7], [-0.1, 0.1], min_effect=0.05).better


def test_a_coin_toss_above_the_baseline_is_not_a_win() -> None:
    # Same config twice: both candidate rounds happen to land above both baseline rounds.
    decision = verdict([0.03, 0.05], [-0.02, 0.01], min_effect=min_effect(OBJECTIVES))
    assert not decision.better
    assert "within" in decision.reason


def test_a_gap_smaller_than_the_candidates_own_spread_is_not_a_win() -> None:
    assert not verdict([0.3, 1.3], [-0.01, 0.01], min_effect=0.05).better


def test_the_minimum_effect_is_five_percent_on_every_objective() -> None:
    assert min_effect(OBJECTIVES) == pytest.approx(2 * math.log(1.05))


def test_a_metric_constraint_reports_each_broken_bound_and_by_how_much() -> None:
    from tuner.config import MetricConstraint

    ttft = MetricConstraint(metric="ttft_p95_s", max=2.0)
    assert ttft.violations(1.5, None) == []
    ((text, amount),) = ttft.violations(3.0, None)
    assert text == "ttft_p95_s 3 is not <= 2" and amount == pytest.approx(0.5)
    prefill = MetricConstraint(metric="prefill_tok_s", min_vs_baseline=0.95)
    assert prefill.violations(240.0, 250.0) == []
    ((text, _),) = prefill.violations(200.0, 250.0)
    assert text == "prefill_tok_s 200 is not >= 238"
    assert prefill.violations(None, 250.0)[0][0] == "prefill_tok_s had no data"


def test_a_constraint_without_a_bound_is_refused() -> None:
    from pydantic import ValidationError

    from tuner.config import MetricConstraint

    with pytest.raises(ValidationError, match="at least one of max, min"):
        MetricConstraint(metric="ttft_p95_s")


def test_the_median_pruner_waits_for_three_reported_first_rounds() -> None:
    import optuna

    from tuner.study import _PRUNERS

    study = optuna.create_study(direction="maximize", pruner=_PRUNERS["median"]())
    for _ in range(3):  # skipped repeats: COMPLETE, but no first round reported
        study.tell(study.ask(), 1.0)
    baseline = study.ask()
    baseline.report(0.0, step=0)
    study.tell(baseline, 0.0)
    worse = study.ask()
    worse.report(-0.3, step=0)
    assert not worse.should_prune(), "pruned against the baseline alone"
    study.tell(worse, -0.3)
    better = study.ask()
    better.report(1.0, step=0)
    study.tell(better, 1.0)
    worst = study.ask()
    worst.report(-1.0, step=0)
    assert worst.should_prune()


def test_objective_terms_are_signed_so_that_positive_is_better_in_both_directions() -> None:
    from tuner.scoring import objective_terms

    base = {"stall_tok_s": 0.2, "ttft_p95_s": 4.0}
    terms = objective_terms({"stall_tok_s": 0.4, "ttft_p95_s": 8.0}, base, OBJECTIVES)
    assert terms == [pytest.approx(math.log(2)), pytest.approx(-math.log(2))]


def test_two_lucky_pairs_of_a_config_against_itself_are_not_a_certain_win() -> None:
    from tuner.scoring import difference_ci

    # Seen here: cache_ram 8000 vs the baseline's 8192 (the same config) scored +0.14 and +0.22. The
    # bootstrap of two values is just their range, which excluded 0; the t interval does not.
    low, high = difference_ci([0.14, 0.22])
    assert low < 0 < high
    # A real effect measured three times stays a win.
    low, _ = difference_ci([1.6, 1.9, 1.7])
    assert low > 1.0
    assert difference_ci([0.5]) == (float("-inf"), float("inf"))
