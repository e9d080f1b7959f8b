from __future__ import annotations

from tuner.gate import judge

REFERENCE = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)]


def test_identical_answers_pass() -> None:
    assert judge(REFERENCE, REFERENCE, min_agreement=0.9).passed


def test_answers_that_diverge_late_pass_and_early_divergence_fails() -> None:
    late = [(1, 2, 3, 99), (5, 6, 7, 8), (9, 10, 11, 12)]
    assert judge(late, REFERENCE, min_agreement=0.5).agreement == [0.75, 1.0, 1.0]
    assert judge(late, REFERENCE, min_agreement=0.5).passed
    early = [(99, 2, 3, 4), (98, 6, 7, 8), (9, 10, 11, 12)]
    result = judge(early, REFERENCE, min_agreement=0.5)
    assert not result.passed and "33%" in result.reason


def test_an_answer_from_another_conversation_fails_whatever_the_threshold() -> None:
    leaked = [(1, 2, 3, 4), (9, 10, 11, 12), (9, 10, 11, 12)]
    result = judge(leaked, REFERENCE, min_agreement=0.0)
    assert not result.passed
    assert "probe 2 was answered with probe 3's answer" in result.reason
