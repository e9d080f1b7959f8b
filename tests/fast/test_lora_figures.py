"""LoRA policy figures, measured on hand-made timelines: a request waiting while another adapter setting
runs is counted and the switch cost measured; one setting for everyone has no LoRA figures."""

from __future__ import annotations

import pytest

from tuner.metrics import lora_metrics
from tuner.models import RequestRecord, RequestStatus, ServerTimings

STYLE = (("style", 1.0),)


def record(
    request_id: str, lora: tuple[tuple[str, float], ...], *, send: float, first: float, end: float, prompt_ms: float
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session=request_id,
        tag="chat",
        prompt_tokens=100,
        output_tokens_requested=2,
        lora=lora,
        send_s=send,
        token_s=(first, end),
        end_s=end,
        status=RequestStatus.OK,
        timings=ServerTimings(prompt_n=100, prompt_ms=prompt_ms, predicted_n=2, predicted_ms=1.0),
    )


def test_a_request_waiting_while_another_lora_setting_runs_is_counted_and_the_switch_cost_measured() -> None:
    records = [
        record("a", STYLE, send=0.0, first=0.5, end=2.0, prompt_ms=500),
        # Waited 2.0 s before its prefill began, all of it while `a` (another setting) ran.
        record("b", (), send=0.0, first=2.7, end=3.0, prompt_ms=700),
        record("c", (), send=3.0, first=3.5, end=3.6, prompt_ms=500),
    ]
    metrics = lora_metrics(records)
    assert metrics["lora_wait_p95_s"] == pytest.approx(2.0)
    assert metrics["lora_wait_share"] == pytest.approx(1.0)
    # `c` follows `b` on the same setting at 5 ms per token; `b` followed a switch and took 200 ms more.
    assert metrics["lora_switch_ms"] == pytest.approx(200.0)


def test_one_lora_setting_for_everyone_has_no_lora_figures() -> None:
    records = [
        record("a", STYLE, send=0.0, first=0.5, end=1.0, prompt_ms=500),
        record("b", STYLE, send=0.0, first=0.6, end=1.0, prompt_ms=500),
    ]
    assert lora_metrics(records) == {"lora_wait_p95_s": None, "lora_wait_share": None, "lora_switch_ms": None}
