"""Settings and durations are written by one formatter each (tuner/text.py); every output keeps its text."""

from __future__ import annotations

import pytest

from tuner.text import duration_text, settings_text


def test_settings_are_written_sorted_as_the_leaderboard_writes_them_and_each_other_form_by_its_parameters() -> None:
    settings = {"n_ubatch": 256, "n_batch": 512}
    assert settings_text(settings) == "n_batch=512 n_ubatch=256"  # the table, the progress lines, apply's flags
    assert settings_text(settings, separator=", ") == "n_batch=512, n_ubatch=256"  # the recommendation
    assert settings_text(settings, separator=", ", equals=" = ") == "n_batch = 512, n_ubatch = 256"  # the page
    assert settings_text({}, empty="(baseline)") == "(baseline)"
    assert settings_text({}) == ""


@pytest.mark.parametrize(
    ("seconds", "clock", "exact", "rough"),
    [
        (3.24, "3 s", "3.2s", "3 s"),
        (59.6, "1m00s", "1m00s", "60 s"),
        (185, "3m05s", "3m05s", "3 min"),
        (7440, "2h04m", "2h04m00s", "2.1 h"),
    ],
)
def test_a_duration_is_written_in_the_style_its_output_always_had(
    seconds: float, clock: str, exact: str, rough: str
) -> None:
    assert duration_text(seconds) == clock  # progress and `tuner status`
    assert duration_text(seconds, style="exact") == exact  # a diagnosis's times
    assert duration_text(seconds, style="rough") == rough  # the morning report's totals


@pytest.mark.parametrize(
    ("seconds", "estimate", "stopwatch"),
    [(44.6, "0m45s", "0m45s"), (185, "3m05s", "3m05s"), (4503, "1h15m", "75m03s"), (7440, "2h04m", "124m00s")],
)
def test_the_checks_estimate_and_the_runs_own_duration_keep_their_minutes(
    seconds: float, estimate: str, stopwatch: str
) -> None:
    assert duration_text(seconds, style="estimate") == estimate  # `tuner run --check`'s duration line
    assert duration_text(seconds, style="stopwatch") == stopwatch  # "this run took ..."
