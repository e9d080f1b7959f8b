"""A run prints no library deprecation warning (Optuna 5 warned about `constraints_func` in every run
with `[[constraints]]`), and the constraints still reach Optuna's samplers, now through the trial."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from tests.support import run_tuner
from tuner.config import MetricConstraint, load_search_space
from tuner.search import record_constraints
from tuner.search.samplers import SAMPLERS

DATA = Path(__file__).resolve().parents[1] / "data"
DEMO_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "llama-server.toml"


def test_a_run_with_constraints_prints_no_warning(tmp_path: Path) -> None:
    """The stand-in server refuses every request, so the run ends after the baseline's warm-up: the
    sampler, where the warning came from, has been made by then."""
    binary = tmp_path / "server"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DATA / "leaky_server.py"}" "$@"\n')
    binary.chmod(0o755)
    (tmp_path / "model.gguf").write_bytes(b"")
    overrides = [
        f'engine.binary="{binary}"',
        f'engine.model="{tmp_path / "model.gguf"}"',
        'engine.api_key_env="SERVE_TUNER_TEST_KEY"',
        "gate.enabled=false",
        'search.sampler="tpe"',
        'constraints=[{metric = "prefill_tok_s", min_vs_baseline = 0.8}, {metric = "ttft_p95_s", max = 2.0}]',
    ]
    command = ["run", str(DATA / "tiny-study.toml"), "--runs-dir", str(tmp_path / "r")]
    command += [arg for override in overrides for arg in ("--set", override)]
    env = {**os.environ, "SERVE_TUNER_TEST_KEY": "a-key-of-the-test-0123"}
    done = run_tuner(*command, timeout=120, env=env)
    assert done.returncode == 1 and "the warm-up request failed" in done.stderr
    assert "Warning" not in done.stderr and "deprecated" not in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc", "gp"])
def test_no_sampler_warns_when_it_is_made(sampler: str) -> None:
    """Neither a deprecated argument (constraints_func) nor, for qmc, Optuna's experimental-class note."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SAMPLERS[sampler](0, load_search_space(DEMO_SPACE))


def test_a_trials_constraint_violations_reach_the_sampler_through_the_trial() -> None:
    """TPE and GP read `FrozenTrial.constraints`: one value per study constraint, > 0 when broken."""
    study = optuna.create_study(sampler=SAMPLERS["tpe"](0, load_search_space(DEMO_SPACE)), direction="maximize")
    trial = study.ask()
    constraints = [
        MetricConstraint(metric="prefill_tok_s", min_vs_baseline=0.8),
        MetricConstraint(metric="ttft_p95_s", max=2.0),
    ]
    spec = SimpleNamespace(constraints=constraints)
    medians = {"prefill_tok_s": 60.0, "ttft_p95_s": 1.0}
    record_constraints(trial, spec, medians, {"prefill_tok_s": 100.0})  # type: ignore[arg-type]
    study.tell(trial, 1.0)
    # 60 tok/s against a bound of 80: a quarter past it; the TTFT bound holds.
    assert study.trials[0].constraints == {"0": pytest.approx(0.25), "1": 0.0}
