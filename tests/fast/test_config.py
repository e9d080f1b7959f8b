"""What a user writes: study and search-space files, validated with one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bounded import fifo_nobody_may_open
from tuner.config import Constraint, load_search_space, load_study
from tuner.errors import ConfigError
from tuner.search import prepare_study

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "studies" / "stall-demo.toml"


def write_study(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_the_demo_study_and_its_search_space_are_valid() -> None:
    spec, base = load_study(DEMO)
    prepared = prepare_study(spec, base)
    assert prepared.baseline_settings == {"n_batch": 2048, "n_ubatch": 512}
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
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    spec, base = load_study(DEMO, ['search.sampler="gp"'])
    with pytest.raises(ConfigError, match=r"needs torch: .*pip install torch"):
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


# ---- pinned by mutation testing (scripts/mutmut.sh): each rule on its own ----------------------


def test_a_constraint_reports_every_broken_bound_with_its_relative_excess() -> None:
    from tuner.config import MetricConstraint

    def rounded(violations: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return [(text, round(excess, 9)) for text, excess in violations]

    # The excess is relative to the bound, also below 1.
    assert MetricConstraint(metric="itl_p95_s", max=0.5).violations(0.75, None) == [
        ("itl_p95_s 0.75 is not <= 0.5", 0.5)
    ]
    ttft = MetricConstraint(metric="ttft_p95_s", max=2.0, max_vs_baseline=1.5)
    assert ttft.violations(None, 1.0) == [("ttft_p95_s had no data", 1.0)]
    assert ttft.violations(2.0, None) == []  # at the bound is within it
    assert rounded(ttft.violations(4.0, 2.0)) == [
        ("ttft_p95_s 4 is not <= 2", 1.0),
        ("ttft_p95_s 4 is not <= 3", round(1 / 3, 9)),  # 1.5 x the baseline's 2
    ]
    prefill = MetricConstraint(metric="prefill_tok_s", min=100.0, min_vs_baseline=0.8)
    assert prefill.violations(150.0, 100.0) == []  # above a minimum is fine
    assert rounded(prefill.violations(50.0, 250.0)) == [
        ("prefill_tok_s 50 is not >= 100", 0.5),
        ("prefill_tok_s 50 is not >= 200", 0.75),
    ]
    # Without a baseline, the bounds against it are not checked; with one, absent bounds are skipped.
    assert rounded(prefill.violations(50.0, None)) == [("prefill_tok_s 50 is not >= 100", 0.5)]
    assert MetricConstraint(metric="x", max=1.0).violations(0.5, 10.0) == []
    # A negative bound's excess is relative to its size.
    assert MetricConstraint(metric="x", min=-2.0).violations(-3.0, None) == [("x -3 is not >= -2", 0.5)]


def test_a_knobs_choices_match_by_type_and_a_range_includes_its_ends() -> None:
    from tuner.config import ParamSpec

    batch = ParamSpec(choices=[1, 2, 4])
    assert batch.allows(2)
    assert not batch.allows(True)  # True == 1 in Python, but it is not the integer 1
    assert not batch.allows(2.0)
    assert not batch.allows(3)
    threads = ParamSpec(low=1, high=8)
    assert threads.allows(1) and threads.allows(8) and threads.allows(4.5)
    assert not threads.allows(0) and not threads.allows(9)
    assert not threads.allows(True)
    assert not threads.allows("4")


def test_a_constraint_compares_a_knob_with_a_number() -> None:
    constraint = Constraint.parse("n_batch >= 64")
    assert constraint.names() == ["n_batch"]
    assert constraint.holds({"n_batch": 64})
    assert not constraint.holds({"n_batch": 32})
    assert Constraint.parse("-1.5 < n_batch").holds({"n_batch": 0})


def test_ordinal_knobs_are_encoded_as_their_index_and_decoded_back(tmp_path: Path) -> None:
    path = tmp_path / "space.toml"
    path.write_text(
        'engine = "llama-server"\n'
        "[params.n_batch]\nchoices = [32, 64, 128]\n"
        '[params.policy]\nchoices = ["as_recorded", "all_on", "all_off"]\n'
        "[params.threads]\nlow = 1\nhigh = 8\n"
    )
    space = load_search_space(path)
    settings: dict[str, int | float | bool | str] = {"n_batch": 128, "policy": "all_on", "threads": 3}
    encoded = space.encode(settings)
    assert encoded == {"n_batch": 2, "policy": "all_on", "threads": 3}
    assert space.decode(encoded) == settings
    assert space.decode({"n_batch": 1.0}) == {"n_batch": 64}  # a sampler may hand back a float index


def test_restricting_to_an_unknown_knob_names_it_and_the_valid_ones() -> None:
    space = load_search_space(REPO / "search_spaces" / "llama-server.toml")
    with pytest.raises(ConfigError) as refused:
        space.restricted_to(["n_batch", "n_bacth", "threds"])
    assert str(refused.value) == (
        "search.params names 'n_bacth', which the search space does not define; valid: cache_ram, kv_unified, "
        "lora_policy, n_batch, n_parallel, n_ubatch"
    )
    assert space.restricted_to(None) is space


def test_a_value_out_of_bounds_is_one_line_with_the_key_the_bound_what_was_given_and_what_the_key_is() -> None:
    from tuner.config import BudgetSpec, MetricsSpec, ObjectiveSpec, SloSpec

    def refusal(override: str) -> str:
        with pytest.raises(ConfigError) as refused:
            load_study(DEMO, [override])
        return str(refused.value)

    trials = BudgetSpec.model_fields["trials"].description
    assert refusal("budget.trials=-1") == (
        "--set budget.trials=-1: budget.trials: Input should be greater than or equal to 0 (got -1); "
        f"budget.trials is: {trials}"
    )
    # Through a list of tables, and through a table inside a table.
    weight = ObjectiveSpec.model_fields["weight"].description
    assert refusal('objectives=[{metric="stall_tok_s", direction="maximize", weight=0}]') == (
        '--set objectives=[{metric="stall_tok_s", direction="maximize", weight=0}]: '
        f"objectives.0.weight: Input should be greater than 0 (got 0); objectives.0.weight is: {weight}"
    )
    slo = SloSpec.model_fields["ttft_p95_s"].description
    assert refusal("metrics.slo.ttft_p95_s=0") == (
        "--set metrics.slo.ttft_p95_s=0: metrics.slo.ttft_p95_s: Input should be greater than 0 (got 0); "
        f"metrics.slo.ttft_p95_s is: {slo}"
    )
    assert MetricsSpec.model_fields["slo"].description  # the description followed is the leaf's, not this
    hours = BudgetSpec.model_fields["hours"].description  # a `float | None` field
    assert refusal("budget.hours=0") == (
        f"--set budget.hours=0: budget.hours: Input should be greater than 0 (got 0); budget.hours is: {hours}"
    )
    # Not a bound: the reason alone, without the description.
    assert refusal('search.sampler="bogus"') == (
        "--set search.sampler=\"bogus\": search.sampler: Input should be 'tpe', 'random', 'qmc' or 'gp' (got 'bogus')"
    )


def test_a_value_of_the_wrong_type_is_refused_not_coerced() -> None:
    for override, message in [
        ('rounds="3"', "rounds: Input should be a valid integer (got '3')"),
        ("budget.trials=true", "budget.trials: Input should be a valid integer (got True)"),
        ("budget.hours=nan", "budget.hours: Input should be a finite number (got nan)"),
        ("budget.hours=inf", "budget.hours: Input should be a finite number (got inf)"),
    ]:
        with pytest.raises(ConfigError) as refused:
            load_study(DEMO, [override])
        assert str(refused.value) == f"--set {override}: {message}"  # the --set named, not the file


def test_a_date_or_time_anywhere_in_a_study_is_named_where_it_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ["budget.hours=1979-05-27"])
    assert str(refused.value) == (
        "--set budget.hours=1979-05-27: budget.hours: a date or time is not a valid value here; quote it if it is text"
    )
    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ["description=07:32:00"])
    assert str(refused.value).startswith("--set description=07:32:00: description: a date or time")
    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ['objectives=[{metric="stall_tok_s", direction="maximize"}, {metric=1979-05-27}]'])
    assert ": objectives.1.metric: a date or time is not a valid value here" in str(refused.value)


def test_code_may_pass_a_path_where_a_file_has_a_string_and_nothing_else_that_json_lacks() -> None:
    from tuner.config import WorkloadSpec, validate_strictly

    spec = validate_strictly(WorkloadSpec, {"path": Path("traces/day.jsonl")}, source="workload")
    assert spec.path == Path("traces/day.jsonl")
    with pytest.raises(ConfigError) as refused:
        validate_strictly(WorkloadSpec, {"path": "a.jsonl", "seed": {1, 2}}, source="workload")
    assert str(refused.value) == "workload: set is not a value a study file can hold"


def test_a_plugin_option_of_the_wrong_type_names_the_plugin_table() -> None:
    from tuner.config import validate_options
    from tuner.deployers.systemd import SystemdOptions

    with pytest.raises(ConfigError) as refused:
        validate_options(SystemdOptions, {"unit": "llama-server.service", "dead_man_s": "60"}, where="deploy")
    assert str(refused.value) == "deploy: dead_man_s: Input should be a valid number (got '60')"


def test_a_validator_message_loses_pydantics_prefix_and_a_whole_file_error_says_top_level(tmp_path: Path) -> None:
    path = tmp_path / "space.toml"
    path.write_text('engine = "llama-server"\n[params.n_batch]\nchoices = [1, 2]\nlow = 1\n')
    with pytest.raises(ConfigError) as refused:
        load_search_space(path)
    assert str(refused.value).startswith(f"{path}: params.n_batch: give either choices = [...] or low and high (got ")
    path.write_text('engine = "llama-server"\nconstraints = ["a <= b"]\n[params.a]\nchoices = [1, 2]\n')
    with pytest.raises(ConfigError) as refused:
        load_search_space(path)
    assert str(refused.value).startswith(f"{path}: (top level): constraint 'a <= b' names unknown knob 'b' (got ")


def test_a_missing_required_key_is_named(tmp_path: Path) -> None:
    text = "\n".join(line for line in DEMO.read_text().splitlines() if not line.startswith("[engine"))
    text = text.replace('kind = "llama-server"', "").replace('binary = "auto"', "").replace('model = "auto"', "")
    text = "\n".join(
        line
        for line in text.splitlines()
        if not line.split("#")[0].strip().startswith(("ctx_size", "n_parallel", "threads"))
    )
    path = write_study(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_study(path)
    assert str(refused.value) == f"{path}: missing required key 'engine'"


def test_an_unreadable_study_file_is_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as refused:
        load_study(missing)
    assert str(refused.value) == f"{missing}: file not found; check the path"
    broken = write_study(tmp_path, "rounds = = 2\n")
    with pytest.raises(ConfigError) as refused:
        load_study(broken)
    assert str(refused.value).startswith(f"{broken}: not valid TOML: ")


def test_a_set_without_a_key_or_an_equals_sign_is_refused_with_an_example() -> None:
    from tuner.config import apply_overrides

    for bad in ["budget.trials", "=3", " =3"]:
        with pytest.raises(ConfigError) as refused:
            apply_overrides({}, [bad])
        assert str(refused.value) == f"--set {bad!r}: expected KEY=VALUE, e.g. budget.trials=3"


def test_a_set_creates_the_tables_it_names_and_refuses_to_descend_into_a_value() -> None:
    from tuner.config import apply_overrides

    data: dict[str, object] = {"rounds": 2}
    assert apply_overrides(data, ["engine.settings.threads=4", "engine.kind=llama-server"]) == {
        "rounds": 2,
        "engine": {"settings": {"threads": 4}, "kind": "llama-server"},
    }
    with pytest.raises(ConfigError) as refused:
        apply_overrides(data, ["rounds.x=1"])
    assert str(refused.value) == "--set 'rounds.x=1': 'rounds' is a value, not a table; --set rounds=VALUE sets it"
    # An array of tables ([[objectives]]) has no key path into it: the line says how to change it instead.
    with pytest.raises(ConfigError) as refused:
        apply_overrides({"objectives": [{"metric": "stall_tok_s", "weight": 1.0}]}, ["objectives.0.weight=2"])
    assert "'objectives' is a list of tables, which --set cannot reach into; edit it in the study file" in str(
        refused.value
    )


def test_a_study_without_a_name_is_named_after_its_file(tmp_path: Path) -> None:
    text = DEMO.read_text().replace('name = "stall-demo"', "")
    path = tmp_path / "nightly-run.toml"
    path.write_text(
        text.replace("../workloads", str(REPO / "workloads")).replace("../search_spaces", str(REPO / "search_spaces"))
    )
    spec, base = load_study(path)
    assert spec.name == "nightly-run"
    assert base == tmp_path.resolve()


def test_a_study_path_that_is_not_a_readable_utf8_text_file_is_one_line_with_the_fix(tmp_path: Path) -> None:
    def refusal(path: Path) -> str:
        with pytest.raises(ConfigError) as refused:
            load_study(path)
        return str(refused.value)

    assert refusal(tmp_path) == f"{tmp_path} is a directory; pass the TOML file in it, e.g. {tmp_path / 'study.toml'}"
    a_file = write_study(tmp_path, "rounds = 2\n")
    assert refusal(a_file / "study.toml") == (
        f"{a_file / 'study.toml'}: cannot read it: Not a directory; check the path and its permissions"
    )
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbfrounds = 2\n")
    assert refusal(bom) == f"{bom}: starts with a byte-order mark (BOM); save it as UTF-8 without a BOM"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"rounds = 2\n\x00\x01")
    assert refusal(binary) == f"{binary}: is a binary file, not TOML text; pass the study's .toml file"
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'description = "caf\xe9"\n')
    assert refusal(latin) == f"{latin}: is not UTF-8 text (byte 0xe9 at offset 18); save it as UTF-8"


def test_a_study_named_in_the_file_may_have_any_file_name_and_an_unnamed_one_needs_a_usable_one(
    tmp_path: Path,
) -> None:
    text = DEMO.read_text()
    text = text.replace("../workloads", str(REPO / "workloads")).replace(
        "../search_spaces", str(REPO / "search_spaces")
    )
    named = tmp_path / "X Files (copy).toml"
    named.write_text(text)
    assert load_study(named)[0].name == "stall-demo"
    unnamed = tmp_path / "X Files (copy).toml"
    unnamed.write_text(text.replace('name = "stall-demo"', ""))
    with pytest.raises(ConfigError) as refused:
        load_study(unnamed)
    assert str(refused.value) == (
        f"{unnamed}: the study has no name = ..., and its file name 'X Files (copy)' cannot name a run directory "
        '(letters, digits, _ . - only); add a line such as name = "X-Files-copy"'
    )
    hopeless = tmp_path / "???.toml"
    hopeless.write_text(text.replace('name = "stall-demo"', ""))
    with pytest.raises(ConfigError, match=r'add a line such as name = "my-study"$'):
        load_study(hopeless)


def test_a_host_or_deploy_table_without_a_kind_keeps_the_default_kind(tmp_path: Path) -> None:
    text = DEMO.read_text().replace('kind = "local"', "").replace('kind = "process"', "")
    text = text.replace("../workloads", str(REPO / "workloads")).replace(
        "../search_spaces", str(REPO / "search_spaces")
    )
    spec, _ = load_study(write_study(tmp_path, text))
    assert (spec.host.kind, spec.host.options()) == ("local", {})
    assert (spec.deploy.kind, spec.deploy.options()) == ("process", {"start_timeout_s": 60})


def test_an_error_inside_a_list_or_a_union_names_the_item(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ['search.params=["n_batch", 3]'])
    assert str(refused.value) == (
        '--set search.params=["n_batch", 3]: search.params.1: Input should be a valid string (got 3)'
    )
    path = tmp_path / "space.toml"
    path.write_text('engine = "llama-server"\n[params.n_batch]\nchoices = [1, {a = 1}]\n')
    with pytest.raises(ConfigError) as refused:
        load_search_space(path)
    assert str(refused.value) == f"{path}: params.n_batch.choices.1: Input should be a valid integer (got {{'a': 1}})"


def test_a_non_finite_number_for_a_union_knob_is_named_as_such_not_as_a_wrong_type(tmp_path: Path) -> None:
    # `low` takes an int or a float: NaN fails both branches, and the float branch's reason is the one to show.
    path = tmp_path / "space.toml"
    path.write_text('engine = "llama-server"\n[params.threads]\nlow = nan\nhigh = 8\n')
    with pytest.raises(ConfigError) as refused:
        load_search_space(path)
    assert str(refused.value) == f"{path}: params.threads.low: Input should be a finite number (got nan)"
    path.write_text('engine = "llama-server"\n[params.threads]\nlow = "one"\nhigh = 8\n')
    with pytest.raises(ConfigError) as refused:
        load_search_space(path)
    assert str(refused.value) == f"{path}: params.threads.low: Input should be a valid integer (got 'one')"


def test_an_engines_own_counter_is_a_metric_of_that_engine_only() -> None:
    # server_preemptions comes from vLLM's /metrics; llama-server has none, so a study on it cannot score it.
    spec, base = load_study(DEMO, ['objectives=[{metric = "server_preemptions", direction = "minimize"}]'])
    with pytest.raises(ConfigError, match=r"objective metric 'server_preemptions' is unknown for llama-server"):
        prepare_study(spec, base)
    spec, base = load_study(DEMO, ['objectives=[{metric = "server_tokens_per_decode", direction = "maximize"}]'])
    assert prepare_study(spec, base).spec.objectives[0].metric == "server_tokens_per_decode"


def test_a_study_path_that_is_a_fifo_is_refused_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "study.toml"
    with fifo_nobody_may_open(fifo), pytest.raises(ConfigError) as refused:  # a read of it waits for ever
        load_study(fifo, [])
    assert (
        str(refused.value) == f"{fifo} is a FIFO (named pipe), not a TOML file; pass the path of the study's .toml file"
    )


def test_a_study_file_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "study.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as refused:
        load_study(deep, [])
    assert str(refused.value) == f"{deep}: arrays or tables nested too deeply to be a study file"


def test_a_set_value_nested_too_deeply_is_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ["budget.trials=" + "[" * 100_000 + "]" * 100_000])
    assert str(refused.value) == "--set budget.trials: the value is nested too deeply; give a plain value"


def test_a_line_whose_knobs_share_fewer_than_three_values_is_refused(tmp_path: Path) -> None:
    space = tmp_path / "space.toml"
    space.write_text(
        'engine = "llama-server"\nline = ["n_batch", "n_ubatch"]\n'
        "[params.n_batch]\nchoices = [64, 256, 1024]\ndefault = 1024\n"
        "[params.n_ubatch]\nchoices = [32, 128, 1024]\ndefault = 1024\n"
    )
    with pytest.raises(ConfigError, match=r"line \['n_batch', 'n_ubatch'\]: its knobs share 1 choices; the walk"):
        load_search_space(space)


def test_a_restricted_space_starts_its_walk_on_the_line_knobs_it_still_tunes() -> None:
    # The space's line is n_batch = n_ubatch; a knob not tuned stays at the baseline, off the line.
    space = load_search_space(REPO / "search_spaces" / "llama-server.toml")
    assert space.restricted_to(["lora_policy", "n_ubatch", "n_batch"]).line == ["n_batch", "n_ubatch"]
    assert space.restricted_to(["cache_ram", "n_batch"]).line == ["n_batch"]
    assert space.restricted_to(["cache_ram"]).line == []


def test_a_set_into_a_nested_value_names_the_whole_key_to_set_instead() -> None:
    from tuner.config import apply_overrides

    with pytest.raises(ConfigError) as refused:
        apply_overrides({"budget": {"trials": 3}}, ["budget.trials.max=1"])
    assert str(refused.value) == (
        "--set 'budget.trials.max=1': 'trials' is a value, not a table; --set budget.trials=VALUE sets it"
    )


def test_of_several_sets_the_refusal_names_the_one_that_gave_the_bad_value() -> None:
    from tuner.config import StudySpec

    with pytest.raises(ConfigError) as refused:
        load_study(DEMO, ["budget.trials=3", "rounds=1"])
    rounds = StudySpec.model_fields["rounds"].description
    assert str(refused.value) == (
        f"--set rounds=1: rounds: Input should be greater than or equal to 2 (got 1); rounds is: {rounds}"
    )


def test_each_fleet_host_runs_with_its_own_deploy_table_and_engine_options() -> None:
    from tuner.config import PluginSpec

    fleet = 'hosts=[{name="gpu-a"}, {name="gpu-b", deploy={kind="systemd", unit="llama.service"}, engine={port=8081}}]'
    spec, _ = load_study(DEMO, [fleet])
    gpu_a, gpu_b = (spec.for_host(entry) for entry in spec.hosts)
    assert (gpu_a.deploy, gpu_a.engine) == (spec.deploy, spec.engine)  # the study's own
    assert gpu_b.deploy == PluginSpec.model_validate({"kind": "systemd", "unit": "llama.service"})
    assert gpu_b.engine == PluginSpec.model_validate({**spec.engine.model_dump(), "port": 8081})


def test_a_fleet_hosts_deploy_table_without_a_kind_keeps_the_default_kind(tmp_path: Path) -> None:
    from tuner.config import PluginSpec

    fleet = '\n[[hosts]]\nname = "gpu-a"\ndeploy = { start_timeout_s = 5 }\n'
    spec, _ = load_study(write_study(tmp_path, DEMO.read_text() + fleet))
    assert spec.hosts[0].deploy == PluginSpec.model_validate({"kind": "process", "start_timeout_s": 5})
