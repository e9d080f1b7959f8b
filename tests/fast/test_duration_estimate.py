"""`tuner run --check`'s duration estimate (tuner/check.py): the rounds of a study's two readings, one where no
trial is measured again and one where every trial is, a fleet's hosts sharing the trials, the budget's hours
cutting the search but for the batch in flight, the probes once a trial. The estimate against a real run on
the systemd host is tests/real/test_check.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.check import estimate_duration
from tuner.config import StudySpec, load_study
from tuner.search import prepare_study

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-study.toml"


def tiny(*overrides: str) -> StudySpec:
    return load_study(TINY, list(overrides))[0]


def test_the_two_readings_count_the_baseline_the_trials_and_the_confirmations_pairs() -> None:
    # 2 rounds for the baseline and each of 2 trials, 3 when noisy; 1 candidate x 3 pairs of 2 rounds.
    estimate = estimate_duration(tiny(), round_s=10.0, probes_s=1.0, fixed_s=5.0)
    assert (estimate.rounds, estimate.rounds_if_noisy) == (3 * 2 + 6, 3 * 3 + 6)
    assert estimate.seconds == 12 * 10.0 + 3 * 1.0 + 5.0  # the probes once for each of the 3 trials
    assert estimate.seconds_if_noisy == 15 * 10.0 + 3 * 1.0 + 5.0


def test_a_study_that_never_measures_again_has_one_reading_and_no_gate_no_probes() -> None:
    spec = tiny("extra_rounds_if_noisy=0", "gate.enabled=false", "confirm.top=0")
    estimate = estimate_duration(spec, round_s=10.0, probes_s=1.0)
    assert estimate.rounds == estimate.rounds_if_noisy == 6
    assert estimate.seconds == estimate.seconds_if_noisy == 60.0


def test_a_fleets_hosts_share_the_trials_but_each_measures_its_own_baseline() -> None:
    spec = tiny("budget.trials=10", "confirm.top=0", "extra_rounds_if_noisy=0")
    assert estimate_duration(spec, round_s=1.0, hosts=1).rounds == (1 + 10) * 2
    assert estimate_duration(spec, round_s=1.0, hosts=3).rounds == (1 + 4) * 2  # ceil(10 / 3) trials


def test_the_budgets_hours_cut_the_search_but_the_batch_in_flight_finishes() -> None:
    spec = tiny("budget.trials=1000", "budget.hours=0.1", "confirm.top=0", "interleave=1")
    estimate = estimate_duration(spec, round_s=60.0)
    assert estimate.rounds == 6 + 2  # 6 minutes of 1-minute rounds, then the trial under way
    assert estimate.rounds_if_noisy == 6 + 3


SIMULATED = Path(__file__).resolve().parents[2] / "studies" / "stall-demo-simulated.toml"


@pytest.mark.parametrize(
    ("extra_args", "speed"),
    [
        ('["--sim-speed", "20"]', 20.0),
        ('["--sim-seed", "3", "--sim-speed=0.5"]', 0.5),
        ("[]", 1.0),  # the simulator's own default
        ('["--sim-speed", "fast"]', 1.0),  # refused by the simulator at its start, not here
        ('["--sim-speed", "5", "--sim-speed", "20"]', 20.0),  # the last one counts, as in the simulator
        ('["--sim-speed", "5000"]', 1.0),  # over the simulator's range: refused at its start
    ],
)
def test_a_simulated_servers_clock_speed_is_its_sim_speed(extra_args: str, speed: float) -> None:
    spec, base = load_study(SIMULATED, [f"engine.extra_args={extra_args}"])
    assert prepare_study(spec, base).engine.clock_speed() == speed


def test_a_real_servers_clock_is_real_time_whatever_its_arguments() -> None:
    spec, base = load_study(TINY, ['engine.binary="/bin/false"', 'engine.extra_args=["--sim-speed", "20"]'])
    assert prepare_study(spec, base).engine.clock_speed() == 1.0
