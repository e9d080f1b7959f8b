"""The correctness gate: a config that changes what the server answers is not a free speed-up.

Each trial answers a few fixed prompts greedily (temperature 0). Greedy decoding is not bit-exact
across batch sizes or runs, so an answer is compared with the baseline's by the share of its tokens
that agree before the first divergence, and the gate asks the average share to reach a threshold. An
answer that equals another prompt's baseline answer is a different failure: the server restored the
wrong conversation (llama.cpp issue 27148, with --cache-ram), and no threshold excuses it.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from tuner.config import ParamValue
from tuner.engines.base import Engine
from tuner.errors import MeasurementError
from tuner.http import tls_context
from tuner.models import ReplayRequest
from tuner.redact import redact
from tuner.workloads import Trace

__all__ = ["PROBE_PROMPTS", "GateResult", "Prober", "ask_probes", "judge", "lora_answer_changes"]

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
    load_options: tuple[tuple[str, ParamValue], ...] = (),
    together: bool = True,
) -> list[tuple[int, ...]]:
    """The probes' greedy answers, in PROBE_PROMPTS' order. `together`: all at once, which the server decodes
    in one batch; on the real llama-server their answers were the same as one at a time, token for token, at
    five n_batch / n_ubatch settings, while the four took 1.3-1.5 s instead of 2.1-2.4 s (one thread of a
    2-core CPU; bench/probe_batching.py). An engine or device may answer a batch otherwise in its last bits:
    the gate asks one at a time again before it fails a trial. `MeasurementError` for the first probe to
    fail; the others are cancelled."""
    headers = engine.request_headers()
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=headers, verify=tls_context()) as client:

        async def ask(prompt: str) -> tuple[int, ...]:
            call = engine.probe_request(prompt, tokens=tokens, lora=lora, load_options=load_options)
            try:
                response = await client.request(call.method, call.path, json=call.json)
            except httpx.TimeoutException:
                raise MeasurementError(f"correctness probe got no answer within {timeout_s:g} s") from None
            except httpx.HTTPError as exc:
                raise MeasurementError(f"correctness probe failed: {type(exc).__name__}: {exc}") from None
            if response.status_code != 200:
                answer = redact(response.text)[:200]  # a refusal may quote the key it refused
                raise MeasurementError(f"correctness probe got HTTP {response.status_code}: {answer}")
            return engine.parse_probe_answer(response.json())

        if not together:
            return [await ask(prompt) for prompt in PROBE_PROMPTS]
        try:
            async with asyncio.TaskGroup() as group:
                asked = [group.create_task(ask(prompt)) for prompt in PROBE_PROMPTS]
        except ExceptionGroup as failed:  # the first to fail (a bug's exception too: it is the only kind)
            raise failed.exceptions[0] from None
    return [task.result() for task in asked]


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


class Prober(Protocol):
    async def probe_answers(
        self, *, tokens: int, lora: tuple[tuple[str, float], ...] | None = None, together: bool = True
    ) -> list[tuple[int, ...]]: ...


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two answers part, or None if they are the same."""
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def _lora_label(lora: tuple[tuple[str, float], ...]) -> str:
    return "+".join(f"{name}@{scale:g}" for name, scale in lora) or "no adapter"


async def lora_answer_changes(
    prober: Prober, trace: Trace, engine: Engine, settings: Mapping[str, ParamValue], *, tokens: int
) -> tuple[float, str] | None:
    """Asks the probes with each LoRA setting of the workload and with what `settings` turn it into; the
    share of the workload's requests whose answers would change, and a note per setting. None when the
    workload has no adapter setting to change."""
    recorded: Counter[tuple[tuple[str, float], ...]] = Counter()
    for uses, count in trace.lora_mix().items():
        recorded[tuple(sorted(uses))] += count
    if len(recorded) < 2 and () in recorded:
        return None
    samples = [
        ReplayRequest(
            request_id=f"lora-{i}", session="lora", offset_s=0, prompt_token_ids=(1,), output_tokens=1, lora=lora
        )
        for i, lora in enumerate(recorded)
    ]
    changed_requests, notes = 0.0, []
    applied_samples = engine.apply_request_settings(samples, settings, lora_mix=trace.lora_mix())
    for sample, applied in zip(samples, applied_samples, strict=True):
        before, after = tuple(sorted(sample.lora or ())), tuple(sorted(applied.lora or ()))
        if before == after:
            continue
        as_recorded = await prober.probe_answers(tokens=tokens, lora=before)
        as_trial = await prober.probe_answers(tokens=tokens, lora=after)
        diverge = [_first_difference(a, b) for a, b in zip(as_recorded, as_trial, strict=True)]
        differing = [position for position in diverge if position is not None]
        changed_requests += recorded[before] * len(differing) / len(as_recorded)
        where = f" (first different token: {', '.join(str(p + 1) for p in differing)} of {tokens})" if differing else ""
        notes.append(
            f"{_lora_label(before)} -> {_lora_label(after)} ({recorded[before]} requests): "
            f"{len(differing)} of {len(as_recorded)} probe answers differ{where}"
        )
    if not notes:
        return None
    return changed_requests / len(trace), "; ".join(notes)
