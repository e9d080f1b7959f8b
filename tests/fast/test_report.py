"""The leaderboard and the recommendation, built from an in-memory Optuna study with hand-made trials."""

from __future__ import annotations

from typing import Any

import optuna

from tuner.report import build_leaderboard
from tuner.study_record import Confirmation, TrialRecord, new_trial_attrs, update_study_record

ROUNDS: list[dict[str, float | None]] = [
    {"stall_tok_s": 1.0, "prefill_tok_s": 200.0},
    {"stall_tok_s": 1.1, "prefill_tok_s": 190.0},
]


def add(
    study: optuna.Study,
    values: list[float],
    *,
    score: float,
    n_batch: int,
    baseline: bool = False,
    **attrs: Any,
) -> None:
    study.add_trial(
        optuna.trial.create_trial(
            params={"n_batch": n_batch},
            distributions={"n_batch": optuna.distributions.IntDistribution(1, 4096)},
            values=values,
            user_attrs=new_trial_attrs(
                TrialRecord(
                    deployed=True,
                    baseline=baseline,
                    settings={"n_batch": n_batch},
                    score=score,
                    round_scores=[score - 0.01, score + 0.01],
                    rounds=ROUNDS,
                    **attrs,
                )
            ),
        )
    )


def test_the_pareto_front_is_marked_and_rows_are_sorted_by_score() -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    add(study, [0.0, 0.0], score=0.0, n_batch=2048, baseline=True)
    add(study, [2.0, -0.4], score=1.2, n_batch=64)  # faster streams, slower prefill: on the front
    add(study, [0.5, -0.5], score=-0.5, n_batch=512)  # worse than 64 on stalls and on prefill: dominated
    board = build_leaderboard(study)
    assert [(r.number, r.pareto) for r in board.rows] == [(1, True), (0, True), (2, False)]


def test_without_a_re_measurement_a_win_must_clear_the_spread_and_the_minimum_effect() -> None:
    study = optuna.create_study(direction="maximize")
    update_study_record(study, min_effect=0.1)
    add(study, [0.0], score=0.0, n_batch=2048, baseline=True)
    add(study, [0.05], score=0.05, n_batch=1024)
    board = build_leaderboard(study)
    assert board.recommendation.row is None
    assert "no setting beat the baseline" in board.recommendation.message


def test_a_confirmed_win_is_recommended_with_its_interval() -> None:
    study = optuna.create_study(direction="maximize")
    update_study_record(study, min_effect=0.1)
    add(study, [0.0], score=0.0, n_batch=2048, baseline=True)
    add(study, [1.5], score=1.5, n_batch=128)
    update_study_record(study, confirmations={1: Confirmation(differences=[1.4, 1.6], mean=1.5, ci=[1.4, 1.6])})
    board = build_leaderboard(study)
    assert board.recommendation.row is not None and board.recommendation.row.changed == {"n_batch": 128}
    assert "95% interval +1.40..+1.60" in board.recommendation.message


def test_when_every_trial_breaks_a_constraint_the_message_says_so_not_that_nothing_was_measured() -> None:
    study = optuna.create_study(direction="maximize")
    add(study, [0.0], score=0.0, n_batch=2048, baseline=True)
    add(study, [0.9], score=0.9, n_batch=32, violates=["prefill_tok_s 96 is not >= 198"])
    message = build_leaderboard(study).recommendation.message
    assert message.startswith("keep the baseline: every trial measured beside it breaks a constraint")
    assert "n_batch=32" in message and "prefill_tok_s 96" in message


def test_a_win_that_changes_answers_is_held_back_unless_the_study_allows_it() -> None:
    study = optuna.create_study(direction="maximize")
    update_study_record(study, min_effect=0.1)
    add(study, [0.0], score=0.0, n_batch=2048, baseline=True)
    add(study, [1.5], score=1.5, n_batch=128, answers_changed=0.5, answers_changed_note="style@1 -> no adapter")
    held = build_leaderboard(study).recommendation
    assert held.row is None and "gate.allow_answer_changes = true" in held.message
    update_study_record(study, allow_answer_changes=True)
    assert build_leaderboard(study).recommendation.row is not None
