"""What a user writes: study and search-space files, validated with one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config import Constraint, load_search_space, load_study
from tuner.errors import ConfigError
from tuner.study import prepare_study

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "studies" / "stall-demo.toml"


def write_study(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_the_demo_study_and_its_search_space_are_valid() -> None:
    spec, base = load_study(DEMO)
    prepared = prepare_study(spec, base)
    assert prepared.baseline_params == {"n_batch": 2048, "n_ubatch": 512}
    assert len(prepared.trace.requests) >= 5


def test_an_unknown_key_is_refused_with_the_key_named(tmp_path: Path) -> None:
    text = DEMO.read_text().replace("rounds = 2", "rounds = 2\nround = 3")
    with pytest.raises(ConfigError, match="unknown key 'round'"):
        load_study(write_study(tmp_path, text))


def test_an_unknown_plugin_option_is_refused_where_it_is(tmp_path: Path) -> None:
    spec, _base = load_study(DEMO, ["deploy.start_timout_s=5"])
    from tuner.deployers import create_deployer
    from tuner.transports import LocalTransport

    with pytest.raises(ConfigError, match=r"deploy: unknown key 'start_timout_s'"):
        create_deployer(spec.deploy, transport=LocalTransport())


def test_an_unknown_kind_lists_the_valid_ones() -> None:
    spec, base = load_study(DEMO, ['engine.kind="llama-cpp"'])
    with pytest.raises(ConfigError, match="valid kinds: llama-server"):
        prepare_study(spec, base)


def test_an_out_of_range_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="rounds"):
        load_study(DEMO, ["rounds=1"])


def test_an_invalid_knob_value_in_engine_settings_is_refused() -> None:
    spec, base = load_study(DEMO, ["engine.settings.n_parallel=0"])
    with pytest.raises(ConfigError, match=r"n_parallel.*>= 1"):
        prepare_study(spec, base)


def test_an_unknown_objective_metric_is_refused() -> None:
    spec, base = load_study(DEMO, ['objectives=[{metric="speed", direction="maximize"}]'])
    with pytest.raises(ConfigError, match="objective metric 'speed'"):
        prepare_study(spec, base)


def test_tuning_a_knob_without_a_known_baseline_is_refused() -> None:
    spec, base = load_study(DEMO, ['search.params=["n_batch", "n_parallel"]', "engine.settings={threads = 2}"])
    with pytest.raises(ConfigError, match=r"set engine\.settings\.n_parallel"):
        prepare_study(spec, base)


def test_overrides_are_read_as_toml() -> None:
    spec, _ = load_study(DEMO, ["budget.trials=3", "search.sampler=random"])
    assert spec.budget.trials == 3 and spec.search.sampler == "random"


def test_the_search_space_constraint_is_enforced() -> None:
    space = load_search_space(REPO / "search_spaces" / "llama-server.toml")
    (constraint,) = space.constraints
    assert constraint.holds({"n_batch": 512, "n_ubatch": 512})
    assert not constraint.holds({"n_batch": 128, "n_ubatch": 512})


def test_a_constraint_naming_an_unknown_knob_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "space.toml"
    path.write_text(
        'engine = "llama-server"\nconstraints = ["n_ubatch <= n_bacth"]\n[params.n_ubatch]\nchoices = [1, 2]\n'
    )
    with pytest.raises(ConfigError, match="unknown knob 'n_bacth'"):
        load_search_space(path)


def test_a_malformed_constraint_is_refused() -> None:
    with pytest.raises(ValueError, match="knob op knob"):
        Constraint.parse("n_ubatch <= n_batch; rm -rf /")


def test_a_sampler_whose_dependency_is_missing_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real_find_spec(name, *a)
    )
    spec, base = load_study(DEMO, ['search.sampler="qmc"'])
    with pytest.raises(ConfigError, match=r"needs scipy: .*pip install scipy"):
        prepare_study(spec, base)


def test_a_missing_compiler_is_one_line_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from tuner import assets
    from tuner.errors import AssetError

    monkeypatch.setenv("SERVE_TUNER_CACHE", "/nonexistent-cache")
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "cmake" else "/usr/bin/" + tool)
    with pytest.raises(AssetError, match=r"needs cmake: install them \(Debian/Ubuntu: apt-get install cmake"):
        assets.ensure_llama_server(log=False)


def test_a_constraint_on_an_unknown_metric_is_refused() -> None:
    spec, base = load_study(DEMO, ['constraints=[{metric="latency", max=2.0}]'])
    with pytest.raises(ConfigError, match="constraint metric 'latency' is unknown"):
        prepare_study(spec, base)


def test_a_space_restricted_to_one_knob_drops_constraints_on_knobs_it_does_not_tune() -> None:
    from tuner.config import load_search_space

    space = load_search_space(REPO / "search_spaces" / "llama-server.toml")
    assert [c.text for c in space.restricted_to(["n_batch", "n_ubatch"]).constraints] == ["n_ubatch <= n_batch"]
    assert space.restricted_to(["lora_policy"]).constraints == []
