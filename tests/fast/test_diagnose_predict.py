"""`tuner diagnose LOG --predict` (tuner/predict.py): on a log the simulated llama-server writes at
a known speed (its shipped costs times two), the calibration recovers that factor, the predicted baseline
is the stall the log's own client measured, and a smaller n_batch is predicted to win; bad input is one
line. Against the real llama-server and the case study's figures: bench/ (issue 28, point 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner
from tuner.config import PluginSpec
from tuner.diagnose import diagnose_log
from tuner.engines import create_engine
from tuner.errors import ConfigError
from tuner.metrics import compute_metrics
from tuner.models import ReplayRequest, RequestRecord
from tuner.predict import predict
from tuner.sim.inputs import NoiseModel, SimSettings, load_cost_model
from tuner.sim.log_lines import format_log_line, startup_lines
from tuner.sim.model import SimulatedLlamaServer
from tuner.sim.virtual import replay_virtual

LONG = 1500
SLOWER = 2.0  # the log's server: the shipped calibration's costs, twice over


def request(request_id: str, offset: float, prompt: int, output: int) -> ReplayRequest:
    tokens = tuple(100 + (sum(map(ord, request_id)) * 7919 + 31 * i) % 29000 for i in range(prompt))
    return ReplayRequest(
        request_id=request_id, session=request_id, offset_s=offset, prompt_token_ids=tokens, output_tokens=output
    )


def simulated_log(path: Path) -> list[RequestRecord]:
    """A request alone, then two streams beside a long prompt, on the simulated server at n_batch 2048 (the
    default) with costs twice the shipped ones; its log in `path`, the client's records returned."""
    cost = load_cost_model().scaled(SLOWER)
    settings = SimSettings(n_parallel=3, ctx_size=3 * 4096, kv_unified=False)
    lines = [format_log_line(0.0, line) for line in startup_lines(settings)]
    server = SimulatedLlamaServer(
        settings, cost=cost, noise=NoiseModel(), seed=0, log=lambda at, line: lines.append(format_log_line(at, line))
    )
    engine = create_engine(PluginSpec.model_validate({"kind": "llama-server", "binary": "simulated"}))
    requests = [
        request("solo", 0.0, 40, 120),
        request("chat-1", 8.0, 40, 300),
        request("chat-2", 8.1, 40, 300),
        request("long", 11.0, LONG, 4),
    ]
    done = replay_virtual(requests, server, engine=engine, start_s=0.0, request_timeout_s=1e9)
    path.write_text("\n".join(lines) + "\n")
    return done.records


def test_the_prediction_recovers_the_servers_speed_and_its_own_stall_and_names_a_smaller_n_batch(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    records = simulated_log(log)
    measured = compute_metrics(records, long_prompt_tokens=LONG, min_overlap_s=0.5)["stall_tok_s"]
    assert measured is not None
    diagnosis = diagnose_log(log, long_prompt_tokens=LONG)
    prediction = predict(diagnosis, log, long_prompt_tokens=LONG)
    assert prediction.calibration.prefill_factor == pytest.approx(SLOWER, rel=0.15), prediction.calibration.fitted
    assert prediction.calibration.decode_factor == pytest.approx(SLOWER, rel=0.15), prediction.calibration.fitted
    (baseline,) = [c for c in prediction.configs if c.baseline]
    assert baseline.settings == {"n_batch": 2048, "n_ubatch": 512}
    assert baseline.median["stall_tok_s"] == pytest.approx(measured, rel=0.25)
    best = prediction.best
    assert best is not None and int(str(best.settings["n_batch"])) < 2048
    assert best.median["stall_tok_s"] is not None and best.median["stall_tok_s"] > 2 * measured
    assert best.eligible and best is prediction.configs[0]
    assert any("n_ubatch 512" in line for line in prediction.calibration.kept)  # what the log cannot show


def test_predict_prints_the_leaderboard_and_json_carries_it_beside_the_findings(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    simulated_log(log)
    shown = run_tuner("diagnose", str(log), "--long-prompt-tokens", str(LONG), "--predict", "--seeds", "2")
    assert shown.returncode == 0, shown.stderr
    assert "x 2 seeds" in shown.stdout and "(baseline)" in shown.stdout and "predicted best: n_batch" in shown.stdout
    document = json.loads(
        run_tuner("diagnose", str(log), "--long-prompt-tokens", str(LONG), "--predict", "--json").stdout
    )
    assert document["findings"] and document["prediction"]["seeds"] == 3
    assert document["prediction"]["best"]["settings"]["n_batch"] < 2048


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--space", "x.toml"], "--space and --seeds are for --predict; add --predict"),
        (["--predict", "--seeds", "51"], "--seeds 51: at most 50"),
        (["--seeds", "3"], "--space and --seeds are for --predict; add --predict"),
        (["--predict", "--since", "1m"], "--predict replays the whole log, not a stretch of it"),
    ],
)
def test_predict_options_without_predict_or_out_of_range_are_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    done = run_tuner("diagnose", str(log), *args)
    assert done.returncode == 2 and message in one_error_line(done), done.stderr


def test_predict_from_standard_input_is_refused_before_reading_it() -> None:
    done = run_tuner("diagnose", "-", "--predict", stdin="")
    assert done.returncode == 2 and "give a file, not -" in one_error_line(done), done.stderr


def test_predict_on_a_vllm_log_is_refused_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO 11-29 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 500.0 tokens/s, Avg generation "
        "throughput: 90.0 tokens/s, Running: 4 reqs, Waiting: 2 reqs, GPU KV cache usage: 50.0%, Prefix cache hit "
        "rate: 10.0%\n"
    )
    done = run_tuner("diagnose", str(log), "--predict")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--predict reads llama-server logs" in one_error_line(done)


def test_a_space_with_knobs_the_simulator_does_not_model_predicts_the_others_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    simulated_log(log)
    space = tmp_path / "space.toml"
    space.write_text(
        'engine = "llama-server"\nconstraints = ["n_ubatch <= n_batch", "threads <= n_batch"]\n'
        "[params.n_batch]\nchoices = [256, 2048]\n[params.n_ubatch]\nchoices = [256, 512]\n"
        "[params.threads]\nchoices = [1, 2]\n"
    )
    prediction = predict(diagnose_log(log, long_prompt_tokens=LONG), log, space_path=space, long_prompt_tokens=LONG)
    assert sorted((c.settings["n_batch"], c.settings["n_ubatch"]) for c in prediction.configs) == [
        (256, 256),
        (2048, 256),
        (2048, 512),
    ]
    assert any(line.startswith("threads: not modelled") for line in prediction.calibration.kept)


def test_a_log_of_more_requests_than_a_prediction_replays_is_refused_naming_how_to_cut_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "server.log"
    simulated_log(log)
    monkeypatch.setattr("tuner.predict.MAX_REQUESTS", 3)
    with pytest.raises(ConfigError, match="4 requests, more than the 3 --predict replays; cut the log"):
        predict(diagnose_log(log, long_prompt_tokens=LONG), log, long_prompt_tokens=LONG)


def test_a_space_of_more_configs_than_a_prediction_replays_is_predicted_on_a_seeded_choice_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "server.log"
    simulated_log(log)
    monkeypatch.setattr("tuner.predict._GRID_LIMIT", 5)  # the default space's 28 configs
    diagnosis = diagnose_log(log, long_prompt_tokens=LONG)
    first = predict(diagnosis, log, long_prompt_tokens=LONG, seeds=1)
    again = predict(diagnosis, log, long_prompt_tokens=LONG, seeds=1)
    assert [c.settings for c in first.configs] == [c.settings for c in again.configs]  # the same choice each time
    assert len(first.configs) <= 6 and any(c.baseline for c in first.configs)  # 5 of them, and the baseline
    assert any("5 of the space's 28 configs, chosen at random" in line for line in first.calibration.kept)


@pytest.mark.parametrize("width", [1, 2, 4, 8, 12, 16, 17, 24, 32, 64, 512, 2048])
def test_a_pass_takes_the_decode_factor_up_to_16_tokens_and_the_prefill_factor_above(width: int) -> None:
    """Scaled by two factors, every pass takes its own side's: none a blend of the two (the calibration's
    points are at 1, 4, 32, ..., and a pass of 8 or 24 lay between the sides)."""
    shipped = load_cost_model()
    scaled = shipped.scaled(0.2, decode=2.0)
    factor = 2.0 if width <= 16 else 0.2
    assert scaled.token_s(width) == pytest.approx(factor * shipped.token_s(width), rel=1e-9)


@pytest.mark.parametrize(
    ("figure", "kept"),
    [
        ("decode_tok_s_width_1", "prefill costs: the log times no prefill, so scaled as its decode"),
        ("prefill_tok_s_chunk_512", "decode costs: the log times no decode, so scaled as its prefill"),
    ],
)
def test_a_log_that_times_one_of_prefill_and_decode_scales_both_by_it_and_says_so(figure: str, kept: str) -> None:
    from tuner.diagnose.report import Diagnosis, Figure, ServerFacts
    from tuner.predict import calibrate_from_log

    diagnosis = Diagnosis(
        source="x.log", log_kind="llama-server", lines=1, tasks=1, span_s=1.0, long_prompt_tokens=1000,
        server=ServerFacts(n_batch=2048), profile=[Figure(name=figure, label="a figure (2 lines)", value=50.0)],
    )  # fmt: skip
    calibration = calibrate_from_log(diagnosis)
    assert calibration.prefill_factor == calibration.decode_factor
    assert kept in calibration.kept
