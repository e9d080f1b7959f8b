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

    from tuner.search.samplers import PRUNERS

    study = optuna.create_study(direction="maximize", pruner=PRUNERS["median"]())
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


# ---- pinned by mutation testing (scripts/mutmut.sh): each rule on its own ----------------------


def test_the_median_of_rounds_skips_missing_values_and_a_metric_with_none_is_none() -> None:
    from tuner.scoring import median_metrics

    rounds = [
        {"stall_tok_s": 1.0, "ttft_p95_s": None},
        {"stall_tok_s": 3.0, "ttft_p95_s": None, "failures": 0.0},
        {"stall_tok_s": 2.0, "ttft_p95_s": None},
    ]
    medians = median_metrics(rounds)
    assert medians == {"failures": 0.0, "stall_tok_s": 2.0, "ttft_p95_s": None}
    assert list(medians) == ["failures", "stall_tok_s", "ttft_p95_s"]  # sorted, so the report's columns are stable


def test_a_metric_at_zero_in_both_trials_is_no_change_and_from_zero_up_is_the_clamped_gain() -> None:
    from tuner.scoring import RATIO_CLAMP, objective_terms

    stall = [ObjectiveSpec(metric="stall_tok_s", direction="maximize")]
    assert objective_terms({"stall_tok_s": 0.0}, {"stall_tok_s": 0.0}, stall) == [0.0]
    assert objective_terms({"stall_tok_s": 0.5}, {"stall_tok_s": 0.0}, stall) == [math.log(RATIO_CLAMP)]
    assert objective_terms({"stall_tok_s": 0.0}, {"stall_tok_s": 0.5}, stall) == [-math.log(RATIO_CLAMP)]
    assert objective_terms({"stall_tok_s": 1e6}, {"stall_tok_s": 1.0}, stall) == [math.log(RATIO_CLAMP)]
    assert objective_terms({"stall_tok_s": 1e-6}, {"stall_tok_s": 1.0}, stall) == [-math.log(RATIO_CLAMP)]


def test_the_missing_metric_error_says_what_the_workload_may_lack() -> None:
    with pytest.raises(MeasurementError) as missing:
        score_round({"stall_tok_s": 1.0}, {"stall_tok_s": 1.0, "ttft_p95_s": 1.0}, OBJECTIVES)
    assert str(missing.value) == "metric ttft_p95_s had no data in this round; the workload may lack what it measures"
    with pytest.raises(MeasurementError) as stall:
        score_round({"ttft_p95_s": 1.0}, {"stall_tok_s": 1.0, "ttft_p95_s": 1.0}, OBJECTIVES)
    assert str(stall.value) == (
        "metric stall_tok_s had no data in this round; it needs a stream decoding for at least "
        "metrics.min_overlap_s while another request's prompt of at least metrics.long_prompt_tokens new tokens "
        "is prefilled"
    )


def test_noise_flags_a_twenty_percent_spread_exactly_not_less_and_not_a_flat_zero() -> None:
    rounds: list[dict[str, float | None]] = [
        {"ttft_p95_s": 2.5, "stall_tok_s": 0.0, "decode_tok_s": 0.8, "itl_max_s": 5.0},
        {"ttft_p95_s": 3.0, "stall_tok_s": 0.0, "decode_tok_s": 0.88, "itl_max_s": None},
    ]
    names = ["itl_max_s", "ttft_p95_s", "stall_tok_s", "decode_tok_s"]
    # itl_max_s has one value (nothing to compare) and must not stop the others being looked at.
    assert noisy_metrics(rounds, names) == ["ttft_p95_s"]
    # From 0 to anything is noise however small the step.
    assert noisy_metrics([{"stall_tok_s": 0.0}, {"stall_tok_s": 0.01}], ["stall_tok_s"]) == ["stall_tok_s"]


def test_the_bootstrap_interval_is_reproducible_and_the_95_percent_one_by_default() -> None:
    import numpy as np

    from tuner.scoring import bootstrap_ci

    rng = np.random.default_rng(7)
    values = list(rng.normal(10.0, 2.0, size=200))
    low, high = bootstrap_ci(values)
    assert (low, high) == bootstrap_ci(values, confidence=0.95, resamples=4000, seed=0)  # the defaults
    assert (low, high) == bootstrap_ci(values)  # seeded: a resumed study shows the same interval
    assert bootstrap_ci(values, seed=1) != (low, high)
    # The interval of a mean of 200 normal values: the mean plus or minus 1.96 standard errors.
    mean, error = float(np.mean(values)), float(np.std(values, ddof=1)) / math.sqrt(len(values))
    assert low == pytest.approx(mean - 1.96 * error, abs=0.06 * error)
    assert high == pytest.approx(mean + 1.96 * error, abs=0.06 * error)
    # A narrower confidence gives a narrower interval inside it.
    low_50, high_50 = bootstrap_ci(values, confidence=0.5)
    assert low < low_50 < high_50 < high
    assert high_50 - low_50 == pytest.approx(2 * 0.674 * error, rel=0.08)


def test_the_bootstrap_interval_is_pinned_to_its_percentiles() -> None:
    # The exact figures of the seeded resampling of 200 values, so that any change to the interval's
    # percentiles (even 95% to 94.95%) shows here first; the test above says why they are right.
    import numpy as np

    from tuner.scoring import bootstrap_ci

    values = list(np.random.default_rng(7).normal(10.0, 2.0, size=200))
    assert bootstrap_ci(values) == pytest.approx((9.497958972457297, 9.972832733615961), rel=1e-12)


def test_the_difference_interval_is_the_t_interval_when_that_is_wider() -> None:
    import numpy as np

    from tuner.scoring import difference_ci

    values = [1.6, 1.9, 1.7]
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = 4.302653 * sd / math.sqrt(3)  # t for 2 degrees of freedom
    assert difference_ci(values) == pytest.approx((mean - half, mean + half))
    low, high = difference_ci([0.14, 0.22])
    assert math.isfinite(low) and math.isfinite(high)
    assert (low, high) == pytest.approx((0.18 - 12.706205 * 0.04 / 1.0, 0.18 + 12.706205 * 0.04 / 1.0))


def test_the_difference_interval_uses_the_exact_t_quantile_for_any_number_of_pairs() -> None:
    # A table read at its next row would give 2.179 for 11 degrees of freedom and 1.96 beyond 30: a little
    # too narrow, so a little too eager to call a win.
    import numpy as np

    from tuner.scoring import difference_ci

    for pairs, t in ((12, 2.200985), (40, 2.022691)):
        values = [0.1 * (i % 4) for i in range(pairs)]
        sd = float(np.std(values, ddof=1))
        low, high = difference_ci(values)
        assert high - low == pytest.approx(2 * t * sd / math.sqrt(pairs), rel=1e-5)


def test_no_rounds_on_either_side_is_not_a_win_and_says_why() -> None:
    from tuner.scoring import Verdict

    expected = Verdict(better=False, reason="not enough rounds to compare")
    assert verdict([], [0.1, 0.2], min_effect=0.05) == expected
    assert verdict([0.1, 0.2], [], min_effect=0.05) == expected


def test_the_verdict_says_by_how_much_and_what_was_needed() -> None:
    from tuner.scoring import Verdict

    # margin 0.9 - 0.3 = 0.6; spread max(1.0 - 0.9, 0.3 - 0.25) = 0.1; needed max(0.05, 0.1) = 0.1
    assert verdict([0.9, 1.0], [0.25, 0.3], min_effect=0.05) == Verdict(
        better=True,
        reason="its worst round beat the baseline's best by 0.60, more than the 0.10 that noise and the minimum "
        "effect ask",
    )
    # margin 0.4 - 0.5 = -0.1; spread max(0.2, 0.5 - (-0.5)) = 1.0
    assert verdict([0.4, 0.6], [-0.5, 0.5], min_effect=0.05) == Verdict(
        better=False,
        reason="its gap to the baseline (-0.10) is within the 1.00 that noise and the minimum effect ask",
    )


def test_a_gap_exactly_at_the_minimum_effect_is_not_a_win() -> None:
    assert not verdict([1.0, 1.0], [0.5, 0.5], min_effect=0.5).better
    assert verdict([1.0, 1.0], [0.5, 0.5], min_effect=0.49).better


def test_a_nan_metric_is_no_data_not_the_best_score() -> None:
    with pytest.raises(MeasurementError, match="metric stall_tok_s had no data"):
        score_round(
            {"stall_tok_s": float("nan"), "ttft_p95_s": 1.0}, {"stall_tok_s": 1.0, "ttft_p95_s": 1.0}, OBJECTIVES
        )


def test_the_bootstrap_interval_of_identical_values_is_that_value_and_of_two_values_their_spread() -> None:
    from tuner.scoring import bootstrap_ci

    assert bootstrap_ci([2.5, 2.5, 2.5]) == (2.5, 2.5)  # nothing to resample
    assert bootstrap_ci([2.5]) == (2.5, 2.5)
    low, high = bootstrap_ci([1.0, 3.0])  # two values that differ are resampled: the interval has a width
    assert 1.0 <= low < high <= 3.0


def test_a_look_with_no_share_of_the_error_has_an_unbounded_interval_even_over_identical_differences() -> None:
    from tuner.scoring import difference_ci

    # At confidence 1 nothing is ruled out; identical differences have no spread, but that proves nothing.
    assert difference_ci([0.2, 0.2], confidence=1.0) == (-math.inf, math.inf)


def test_a_skewed_difference_at_a_strict_look_reaches_as_far_as_the_bootstrap_at_that_confidence() -> None:
    from tuner.scoring import difference_ci

    # 19 pairs at 0 and one at 10: mean 0.5, standard deviation sqrt(95 / 19) = sqrt(5), standard error
    # sqrt(5 / 20) = 0.5; t for 19 degrees of freedom at 99% is 2.860935: t interval 0.5 -/+ 1.430467.
    # A resample's mean is 10 k / 20 for k draws of the 10, k ~ Binomial(20, 0.05): P(k >= 5) = 0.26% and
    # P(k >= 4) = 1.6%, so the bootstrap's 99.5th percentile is k = 4, a mean of 2.0, above the t interval's
    # 1.93 (its 97.5th, of a 95% interval, would be k = 3: 1.5).
    low, high = difference_ci([0.0] * 19 + [10.0], confidence=0.99)
    assert low == pytest.approx(0.5 - 1.430467)
    assert high == pytest.approx(2.0)
