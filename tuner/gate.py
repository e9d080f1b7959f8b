"""The correctness gate: a config that changes what the server answers is not a free speed-up.

Each trial answers a few fixed prompts greedily (temperature 0). Greedy decoding is not bit-exact
across batch sizes or runs, so an answer is compared with the baseline's by the share of its tokens
that agree before the first divergence, and the gate asks the average share to reach a threshold. An
answer that equals another prompt's baseline answer is a different failure: the server restored the
wrong conversation (llama.cpp issue 27148, with --cache-ram), and no threshold excuses it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tuner.engines.base import Engine
from tuner.errors import MeasurementError
from tuner.redact import redact

__all__ = ["PROBE_PROMPTS", "GateResult", "ask_probes", "judge"]

PROBE_PROMPTS = (
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "Q: What is 12 times 7?\nA:",
    "def fibonacci(n):\n",
)


@dataclass(frozen=True, kw_only=True)
class GateResult:
    passed: bool
    agreement: list[float]
    reason: str


async def ask_probes(
    engine: Engine,
    base_url: str,
    *,
    tokens: int,
    timeout_s: float,
    lora: tuple[tuple[str, float], ...] | None = None,
) -> list[tuple[int, ...]]:
    answers = []
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=engine.request_headers()) as client:
        for prompt in PROBE_PROMPTS:
            call = engine.probe_request(prompt, tokens=tokens, lora=lora)
            try:
                response = await client.request(call.method, call.path, json=call.json)
            except httpx.HTTPError as exc:
                raise MeasurementError(f"correctness probe failed: {type(exc).__name__}: {exc}") from None
            if response.status_code != 200:
                answer = redact(response.text)[:200]  # a refusal may quote the key it refused
                raise MeasurementError(f"correctness probe got HTTP {response.status_code}: {answer}")
            answers.append(engine.parse_probe_answer(response.json()))
    return answers


def _agreement(answer: Sequence[int], reference: Sequence[int]) -> float:
    if not reference:
        return 1.0
    same = 0
    for got, want in zip(answer, reference, strict=False):
        if got != want:
            break
        same += 1
    return same / len(reference)


def judge(answers: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], *, min_agreement: float) -> GateResult:
    agreement = [_agreement(a, r) for a, r in zip(answers, reference, strict=True)]
    for i, answer in enumerate(answers):
        for j, other in enumerate(reference):
            if i != j and tuple(answer) != tuple(reference[i]) and tuple(answer) == tuple(other) and answer:
                return GateResult(
                    passed=False,
                    agreement=agreement,
                    reason=f"probe {i + 1} was answered with probe {j + 1}'s answer: another conversation leaked in",
                )
    mean = statistics.fmean(agreement)
    if mean < min_agreement:
        return GateResult(
            passed=False,
            agreement=agreement,
            reason=f"answers agree with the baseline's on {mean:.0%} of their tokens, below {min_agreement:.0%}",
        )
    return GateResult(passed=True, agreement=agreement, reason=f"answers agree with the baseline's on {mean:.0%}")
