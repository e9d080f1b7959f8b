"""LoRA policy for real, on llama-server with a generated adapter: mixed adapter settings wait before
prefill and one setting for all removes the wait; the study recommends a policy only if answers may
change."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.support import run_tuner
from tuner.metrics import lora_metrics
from tuner.study_record import update_study_record

STYLE = (("style", 1.0),)
LORA_PAIRS = Path(__file__).resolve().parents[1] / "data" / "lora-pairs.jsonl"

# Waits and a verdict, measured: with the machine to itself.
pytestmark = pytest.mark.measures


@pytest.mark.real_server
def test_mixed_lora_traffic_waits_before_prefill_and_one_setting_for_all_removes_the_wait(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    from tuner import assets
    from tuner.config import PluginSpec
    from tuner.deployers import ProcessDeployer
    from tuner.deployers.process import ProcessOptions
    from tuner.engines import create_engine
    from tuner.loadgen import replay
    from tuner.models import ReplayRequest
    from tuner.transports import LocalTransport

    adapter = str(assets.ensure_test_lora(log=False))
    engine = create_engine(
        PluginSpec.model_validate(
            # One thread: with one per core, a core busy with other work stalls every barrier of the server.
            {"kind": "llama-server", "settings": {"n_parallel": 2, "threads": 1}, "lora_adapters": {"style": adapter}}
        )
    )
    mixed = [
        ReplayRequest(
            request_id=f"r{i}",
            session=f"s{i}",
            offset_s=0.05 * i,
            prompt_token_ids=tuple(range(200 + i, 500 + i)),
            output_tokens=60,
            lora=lora,
        )
        for i, lora in enumerate([STYLE, None])
    ]

    async def scenario() -> dict[str, dict[str, float | None]]:
        results = {}
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            deployment = await deployer.apply(engine.launch_spec({}), log_path=str(tmp_path / "server.log"))
            for policy in ("as_recorded", "all_on", "all_off"):
                requests = engine.apply_request_settings(mixed, {"lora_policy": policy})
                records = await replay(requests, engine=engine, base_url=deployment.base_url, request_timeout_s=120)
                assert all(r.ok for r in records), [r.error for r in records]
                waits = [r.token_s[0] - r.send_s - r.timings.prompt_ms / 1000 for r in records if r.timings]
                results[policy] = {"max_wait_s": max(waits), **lora_metrics(records)}
        return results

    results = asyncio.run(scenario())
    recorded = results["as_recorded"]
    # Under as_recorded the two settings cannot share a batch: requests wait, with the other setting running.
    assert recorded["lora_wait_share"] is not None and recorded["lora_wait_share"] > 0.8, results
    assert recorded["lora_wait_p95_s"] is not None and recorded["lora_wait_p95_s"] > 0.5, results
    mixed_wait = recorded["max_wait_s"]
    assert mixed_wait is not None
    for policy in ("all_on", "all_off"):
        # One setting for all: no LoRA wait at all, and the longest wait is a fraction of the mixed one.
        assert results[policy]["lora_wait_share"] is None, results
        assert (results[policy]["max_wait_s"] or 0.0) < 0.5 * mixed_wait, results


@pytest.mark.real_server
def test_a_lora_study_finds_the_wait_and_recommends_a_policy_only_if_answers_may_change(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    from tuner.report import build_leaderboard
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    study_file = Path(__file__).resolve().parents[2] / "studies" / "lora-demo.toml"
    command = ["run", str(study_file), "--runs-dir", str(tmp_path)]
    # The verdict rests on the confirmation's paired interval (alternating pairs), not on two search
    # rounds whose range a busy machine can widen past the effect (seen on a loaded 2-core machine).
    # At most five pairs: the sequential confirmation stops once the interval is decisive.
    overrides = ["--set", "budget.trials=1", "--set", "confirm.top=1", "--set", "confirm.pairs=5", "--set", "seed=3"]
    # One server thread of two cores: with one per core, a core busy with other work stalls every barrier.
    # At that speed the shipped workload queues (TTFT p95 17 s where its requests arrive within 5 s), which
    # buries the wait under the queue and takes 25 s a round; one pair of users shows the wait alone.
    overrides += ["--set", "engine.settings.threads=1", "--set", f"workload.path={json.dumps(str(LORA_PAIRS))}"]
    # Answers may change in this run: the confirmation re-measures only trials the recommendation may choose
    # (one candidate rule), and the verdict below needs its pairs. The refusal is then read with the study's
    # record saying that answers may not change.
    overrides += ["--set", "gate.allow_answer_changes=true"]
    done = run_tuner(*command, *overrides)
    assert done.returncode == 0, done.stderr

    study = open_optuna_study_readonly(RunDirectory(tmp_path / "lora-demo"))
    board = build_leaderboard(study)
    baseline = next(row for row in board.rows if row.baseline)
    (trial,) = [row for row in board.rows if not row.baseline]
    assert trial.settings["lora_policy"] in ("all_on", "all_off")
    # The baseline's mixed traffic waits for the other LoRA setting; one setting for all does not.
    assert baseline.metrics["lora_wait_p95_s"][0] > 1.0
    assert "lora_wait_p95_s" not in trial.metrics
    # Two search rounds of a tail latency: only a trial slower beyond their own spread fails here (seen at half
    # speed: medians 17.2 s against 16.4 s). Whether it is faster is the confirmation's to say, below.
    assert trial.metrics["ttft_p95_s"][1] < baseline.metrics["ttft_p95_s"][2]
    # Half the requests get another adapter setting: their probe answers change, so no recommendation
    # while the study does not allow it...
    assert trial.answers_changed == pytest.approx(0.5, abs=0.26)
    update_study_record(study, allow_answer_changes=False)
    refused = build_leaderboard(study).recommendation
    assert refused.row is None and "changes answers" in refused.message
    assert "gate.allow_answer_changes = true" in refused.message
    # ...and, as this run allowed it, a recommendation on the confirmation's evidence.
    update_study_record(study, allow_answer_changes=True)
    allowed = build_leaderboard(study).recommendation
    if allowed.row is None:
        # TTFT p95 is a round's slowest request: on a slow or busy machine the paired interval can end below
        # the 5% minimum effect, or reach zero (with the shipped workload at half speed: +0.14 over 5 pairs,
        # 95% interval -0.03..+0.30). The gate then no longer refuses it; the noise does. The pairs' mean must
        # still point the right way: a check of direction, not a proof of the gain, which rests on
        # the wait's own metric above and on the test before this one (one setting for all removes the wait).
        # Or the two search rounds already put the trial behind the baseline within their noise (seen in CI
        # beside other work: -0.05 within 0.07), and there was nothing to confirm.
        # A confirmation that stopped early (its sequential test saw the pairs left could not clear the
        # minimum effect) ran too few pairs for its mean's sign to say anything.
        assert "changes answers" not in allowed.message, allowed.message
        confirmed = "not above the minimum effect" in allowed.message
        assert confirmed or "that noise and the minimum effect ask" in allowed.message, allowed.message
        mean = re.search(r"paired score difference ([+-][0-9.]+)", allowed.message)
        all_pairs = "(all that were planned" in allowed.message
        assert not (confirmed and all_pairs) or (mean is not None and float(mean.group(1)) > 0), allowed.message
    else:
        assert allowed.row.number == trial.number, allowed.message
