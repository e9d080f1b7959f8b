"""Bad input, as a new user or a hostile one writes it: refused in one line naming the problem and the fix,
with the README's exit code (2 for anything the user wrote), before anything is created or started.

Fast tier: no real server. The CLI runs in-process. Every `tuner run` here that should be refused also
points engine.binary at /bin/false, so that if a check under test is broken the run fails its baseline
in a second instead of measuring with the real server.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from tests.support import Outcome, run_cli
from tuner import storage as storage_module
from tuner.config import load_study
from tuner.errors import ConfigError, StudyError
from tuner.runs import RunDirectory
from tuner.search import prepare_study
from tuner.study_record import update_trial_record

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny-study.toml"
# See the module docstring. The model is a stand-in too: the fast tier runs before `tuner setup` has fetched one.
QUICK_FAIL = ('engine.binary="/bin/false"', f'engine.model="{DATA / "stand-in-model.gguf"}"')


def run_tiny(capsys: pytest.CaptureFixture[str], runs: Path, *overrides: str, study: Path = TINY) -> Outcome:
    argv = ["run", str(study), "--runs-dir", str(runs)]
    for override in (*QUICK_FAIL, *overrides):
        argv += ["--set", override]
    return run_cli(capsys, *argv)


def copy_study(tmp_path: Path) -> Path:
    """The tiny study with its workload and search space, in a directory of the test's own."""
    for name in ("tiny-study.toml", "stall-small.jsonl", "batch-space.toml"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path / "tiny-study.toml"


def journal_with(run_dir: Path, *states: TrialState) -> None:
    """A run directory's Optuna journal holding one deployed trial per state."""
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(run_dir / "optuna.journal")))
    study = optuna.create_study(study_name="tiny", storage=storage)
    for state in states:
        trial = study.ask()
        update_trial_record(trial, deployed=True)
        study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)


def stored_spec(run_dir: Path, *overrides: str) -> dict[str, object]:
    spec, _ = load_study(TINY, [*QUICK_FAIL, *overrides])
    dumped = spec.model_dump(mode="json")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(dumped))
    return dumped


# --- Finding 4: mistakes are found before the run directory exists; a fix after a failed start is taken


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("deploy.start_timout_s=5", "deploy: unknown key 'start_timout_s'"),
        ('deploy.kind="systemd"', "deploy: missing required key 'unit'"),
        ('deploy.kind="kubernetes"', "valid kinds"),
        ("host.prot=22", "host: unknown key 'prot'"),
    ],
)
def test_a_mistake_in_the_deploy_or_host_table_leaves_no_run_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, override: str, named: str
) -> None:
    outcome = run_tiny(capsys, tmp_path, override)
    assert outcome.code == 2
    assert named in outcome.error_line()
    assert not (tmp_path / "tiny").exists()


def test_after_a_failed_start_a_fixed_deploy_or_model_is_accepted(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny"
    stored_spec(run_dir, "deploy.start_timeout_s=1", 'engine.model="/wrong/model.gguf"')
    journal_with(run_dir, TrialState.FAIL)  # the baseline did not start: nothing was measured
    assert not storage_module.has_measured_trials(RunDirectory(run_dir))
    fixed, _ = load_study(TINY, [*QUICK_FAIL, 'deploy.kind="container"', 'deploy.container="llm"'])
    RunDirectory(run_dir).check_spec(fixed.model_dump(mode="json"), measured=False)
    assert json.loads((run_dir / "spec.json").read_text())["deploy"]["kind"] == "container"


def test_a_study_with_a_measured_trial_counts_as_measured(tmp_path: Path) -> None:
    journal_with(tmp_path / "tiny", TrialState.FAIL, TrialState.COMPLETE)
    assert storage_module.has_measured_trials(RunDirectory(tmp_path / "tiny"))
    journal_with(tmp_path / "pruned", TrialState.PRUNED)
    assert storage_module.has_measured_trials(RunDirectory(tmp_path / "pruned"))


@pytest.mark.parametrize(
    "change",
    ["deploy.start_timeout_s=300", "deploy.stop_grace_s=30", "budget.trials=9", 'search.sampler="tpe"', "seed=7"],
)
def test_a_change_that_cannot_alter_a_measurement_resumes_a_measured_study(tmp_path: Path, change: str) -> None:
    run_dir = tmp_path / "tiny"
    stored_spec(run_dir)
    resumed, _ = load_study(TINY, [*QUICK_FAIL, change])
    RunDirectory(run_dir).check_spec(resumed.model_dump(mode="json"), measured=True)


def test_a_change_to_what_was_measured_is_refused_showing_the_difference(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny"
    stored_spec(run_dir)
    changed, _ = load_study(TINY, [*QUICK_FAIL, "rounds=3", "engine.settings.n_parallel=8"])
    with pytest.raises(ConfigError) as refused:
        RunDirectory(run_dir).check_spec(changed.model_dump(mode="json"), measured=True)
    message = str(refused.value)
    assert "engine.settings.n_parallel (was 4, now 8)" in message and "rounds (was 2, now 3)" in message
    assert "rename the study" in message


# --- Finding 5: one line, never a traceback


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"\x00\x01\x02binary\xff", "is a binary file, not TOML"),
        (b'\xef\xbb\xbfname = "tiny"\n', "byte-order mark (BOM)"),
        (b'name = "caf\xe9"\n', "is not UTF-8 text"),
    ],
)
def test_an_unreadable_study_file_is_one_line_naming_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, named: str
) -> None:
    study = tmp_path / "study.toml"
    study.write_bytes(content)
    outcome = run_cli(capsys, "run", str(study), "--runs-dir", str(tmp_path / "runs"))
    assert outcome.code == 2
    assert named in outcome.error_line()
    assert not (tmp_path / "runs").exists()


def test_a_binary_workload_is_one_line_for_run_and_for_show(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = copy_study(tmp_path)
    (tmp_path / "stall-small.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    outcome = run_tiny(capsys, tmp_path / "runs", study=study)
    assert outcome.code == 2
    assert "binary file" in outcome.error_line()
    assert not (tmp_path / "runs").exists()
    shown = run_cli(capsys, "workload", "show", str(tmp_path / "stall-small.jsonl"))
    assert shown.code == 2 and "binary file" in shown.error_line()
    (tmp_path / "latin1.jsonl").write_bytes(b'{"format": "serve-tuner-trace", "name": "caf\xe9"}\n')
    latin1 = run_cli(capsys, "workload", "show", str(tmp_path / "latin1.jsonl"))
    assert latin1.code == 2 and "latin1.jsonl:1: not UTF-8" in latin1.error_line()


@pytest.mark.parametrize(
    "flags",
    [["--prefill-tok-s", "0"], ["--decode-tok-s", "-1"], ["--decode-tok-s", "nan"], ["--prefill-tok-s", "inf"]],
)
def test_workload_show_refuses_speeds_that_are_not_positive_and_finite(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    outcome = run_cli(capsys, "workload", "show", str(DATA / "stall-small.jsonl"), *flags)
    assert outcome.code == 2
    assert f"{flags[0]}: must be a positive, finite number" in outcome.error_line()


def test_synth_refuses_a_trace_that_would_not_fit_in_memory_saying_how_much(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The machine is made small rather than the trace big: if the check broke, this test must not fill
    # the real memory.
    from tuner.workloads import synthetic

    monkeypatch.setattr(synthetic, "_available_memory", lambda: 8 * 2**20)
    outcome = run_cli(capsys, "workload", "synth", "chat", "--users", "1000", "--out", str(tmp_path / "x.jsonl"))
    assert outcome.code == 2
    line = outcome.error_line()
    assert "3,000 requests" in line and "need about 12 MiB of memory and 8 MiB is free" in line
    assert "fewer --users" in line
    assert not (tmp_path / "x.jsonl").exists()


def test_a_billion_users_are_refused_before_anything_is_generated() -> None:
    from tuner.workloads import SynthOptions, check_synthesis_fits

    with pytest.raises(ConfigError, match=r"3,000,000,000 requests, which need about [\d,.]+ GiB of memory"):
        check_synthesis_fits("chat", SynthOptions(users=10**9, turns=3, seed=0, long_tokens=8000))


def test_synth_within_memory_still_writes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outcome = run_cli(capsys, "workload", "synth", "stall", "--users", "3", "--out", str(tmp_path / "x.jsonl"))
    assert outcome.code == 0, outcome.err
    assert "wrote 10 requests" in outcome.out  # 3 users x 3 turns and one long prompt


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999", "--out", "{tmp}/r.jsonl"],
        ["trust-host", "127.0.0.1", "--port", "99999"],
        ["trust-host", "127.0.0.1", "--port", "-1"],
    ],
)
def test_an_out_of_range_port_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]) -> None:
    outcome = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert outcome.code == 2
    line = outcome.error_line()
    assert "out of range" in line or "must be a port number (1-65535)" in line
    assert not (tmp_path / "r.jsonl").exists()


def test_a_corrupt_spec_json_on_resume_is_one_line_with_the_way_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny"
    run_dir.mkdir()
    (run_dir / "spec.json").write_bytes(b"\x00\xff{not json")
    spec, _ = load_study(TINY)
    with pytest.raises(StudyError, match=r"spec\.json") as refused:
        RunDirectory(run_dir).check_spec(spec.model_dump(mode="json"), measured=True)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_non_finite_time_scale_is_refused_before_the_server_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    outcome = run_tiny(capsys, tmp_path, f"workload.time_scale={value}")
    assert outcome.code == 2
    assert "workload.time_scale: Input should be a finite number" in outcome.error_line()
    assert not (tmp_path / "tiny").exists()


def test_an_azure_trace_mixing_the_2023_and_2024_timestamp_styles_imports(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    csv = tmp_path / "azure-mixed.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,374,44\n"
        "2023-11-16 18:15:50.5000000,396,109\n"
        "2023-11-16 18:15:52.0000000+00:00,100,10\n"
    )
    outcome = run_cli(capsys, "workload", "import", "azure", str(csv), "--out", str(tmp_path / "azure.jsonl"))
    assert outcome.code == 0, outcome.err
    from tuner.workloads import load_trace

    assert [r.offset_s for r in load_trace(tmp_path / "azure.jsonl").requests] == [0.0, 4.5, 6.0]


def test_leaderboard_csv_into_a_missing_directory_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    journal_with(tmp_path / "tiny", TrialState.FAIL)
    outcome = run_cli(capsys, "leaderboard", str(tmp_path / "tiny"), "--csv", str(tmp_path / "nowhere" / "b.csv"))
    assert outcome.code == 2
    assert f"directory {tmp_path / 'nowhere'} does not exist" in outcome.error_line()


# --- Finding 6: what was accepted and should not be


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ('rounds="3"', "rounds: Input should be a valid integer (got '3')"),
        ("budget.trials=true", "budget.trials: Input should be a valid integer (got True)"),
        ("rounds=3.0", "rounds: Input should be a valid integer"),
        ("rounds=1e9", "rounds: Input should be a valid integer"),
        ("rounds=1000000000", "rounds: Input should be less than or equal to 50"),
        ("constraints=[{metric='ttft_p95_s', max=nan}]", "constraints.0.max: Input should be a finite number"),
        ("workload.request_timeout_s=inf", "workload.request_timeout_s: Input should be a finite number"),
        ("search.params=[]", "search.params: names no knob"),
        ('search.params=["n_batch", "n_batch"]', "search.params: names 'n_batch' twice"),
        ("seed=-1", "seed: Input should be greater than or equal to 0"),
        ("description=1979-05-27", "description: a date or time is not a valid value here"),
    ],
)
def test_a_value_of_the_wrong_type_or_size_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, override: str, named: str
) -> None:
    outcome = run_tiny(capsys, tmp_path, override)
    assert outcome.code == 2
    assert named in outcome.error_line()
    assert not (tmp_path / "tiny").exists()


def test_a_size_limit_says_why(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rounds is: .*each round replays the whole workload"):
        load_study(TINY, ["rounds=1000000000"])


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("engine.settings.ctx_size=1e12", "knob 'ctx_size' takes a int"),
        ("engine.settings.ctx_size=1000000000000", "knob 'ctx_size' must be <= 2147483647"),
        ("engine.settings.n_parallel=true", "knob 'n_parallel' takes a int"),
        ("engine.settings.n_parallel=nan", r"engine: settings\.n_parallel: Input should be a finite number"),
    ],
)
def test_an_engine_setting_out_of_its_knobs_range_is_refused(override: str, named: str) -> None:
    spec, base = load_study(TINY, [override])
    with pytest.raises(ConfigError, match=named):
        prepare_study(spec, base)


def test_engine_settings_that_break_the_spaces_constraint_are_refused() -> None:
    spec, base = load_study(TINY, ["engine.settings.n_ubatch=1024", "engine.settings.n_batch=512"])
    with pytest.raises(ConfigError, match=r"constraint 'n_ubatch <= n_batch' \(n_ubatch = 1024, n_batch = 512\)"):
        prepare_study(spec, base)
    spec, base = load_study(TINY, ["engine.settings.n_ubatch=4096"])  # n_batch at its default, 2048
    with pytest.raises(ConfigError, match=r"n_batch = 2048 \(the default\)"):
        prepare_study(spec, base)


def test_a_search_space_range_outside_the_knobs_limits_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    study = copy_study(tmp_path)
    (tmp_path / "batch-space.toml").write_text(
        'engine = "llama-server"\n[params.n_batch]\nlow = 0\nhigh = 512\ndefault = 512\n'
    )
    outcome = run_tiny(capsys, tmp_path / "runs", study=study)
    assert outcome.code == 2
    assert "params.n_batch.low: knob 'n_batch' must be >= 1, got 0" in outcome.error_line()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("duration", ["-1", "nan", "0"])
def test_record_refuses_a_duration_that_is_not_positive_and_finite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, duration: str
) -> None:
    outcome = run_cli(
        capsys, "record", "--upstream", "http://127.0.0.1:1", "--out", str(tmp_path / "r.jsonl"), "--duration", duration
    )
    assert outcome.code == 2
    assert "--duration: must be a positive" in outcome.error_line()


def test_apply_a_trial_of_a_study_without_completed_trials_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    journal_with(tmp_path / "tiny", TrialState.FAIL)
    outcome = run_cli(capsys, "apply", str(TINY), "--runs-dir", str(tmp_path), "--trial", "99")
    assert outcome.code == 2
    assert "no trial of" in outcome.error_line() and "completed yet" in outcome.error_line()


def test_a_study_named_by_a_file_name_with_spaces_says_where_the_name_came_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    copy_study(tmp_path)
    text = (tmp_path / "tiny-study.toml").read_text().replace('name = "tiny"\n', "")
    (tmp_path / "my study.toml").write_text(text)
    outcome = run_tiny(capsys, tmp_path / "runs", study=tmp_path / "my study.toml")
    assert outcome.code == 2
    line = outcome.error_line()
    assert "its file name 'my study' cannot name a run directory" in line and 'name = "my-study"' in line


# --- Finding 7: exit codes as the README says


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (None, "workload file not found"),
        ("", "empty; expected a header line"),
        ('{"format": "serve-tuner-trace", "version": 1, "name": "x"}\n{"id": "a", "offset_s": -1}\n', ":2:"),
        ('{"format": "serve-tuner-trace", "version": 9, "name": "x"}\n', "trace version 9 is not supported"),
        (
            '{"format": "serve-tuner-trace", "version": 1, "name": "x"}\n'
            '{"id": "a", "offset_s": 0, "session": "s", "prompt": {"new_tokens": "90"}, "output_tokens": 5}\n',
            "stall-small.jsonl:2: prompt.new_tokens: Input should be a valid integer",
        ),
        (
            '{"format": "serve-tuner-trace", "version": 1, "name": "x"}\n'
            '{"id": "a", "offset_s": 0, "session": "s", "prompt": {"new_tokens": 9}, "output_tokens": 1000000000000}\n',
            "stall-small.jsonl:2: output_tokens: Input should be less than or equal to 10000000",
        ),
        (
            '{"format": "serve-tuner-trace", "version": 1, "name": "x"}\n'
            '{"id": "a", "offset_s": NaN, "session": "s", "prompt": {"new_tokens": 9}, "output_tokens": 5}\n',
            "stall-small.jsonl:2: offset_s: Input should be a finite number",
        ),
    ],
)
def test_a_bad_workload_named_by_the_study_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, named: str
) -> None:
    study = copy_study(tmp_path)
    trace = tmp_path / "stall-small.jsonl"
    if content is None:
        trace.unlink()
    else:
        trace.write_text(content)
    outcome = run_tiny(capsys, tmp_path / "runs", study=study)
    assert outcome.code == 2
    assert named in outcome.error_line()
    assert not (tmp_path / "runs").exists()


def test_a_study_path_that_is_a_directory_exits_2_with_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    outcome = run_cli(capsys, "run", str(tmp_path), "--runs-dir", str(tmp_path / "runs"))
    assert outcome.code == 2
    assert "is a directory; pass the TOML file in it" in outcome.error_line()


def test_a_changed_spec_on_resume_exits_2_before_any_server_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stored_spec(tmp_path / "tiny", "rounds=3")
    journal_with(tmp_path / "tiny", TrialState.COMPLETE)
    outcome = run_tiny(capsys, tmp_path)
    assert outcome.code == 2
    assert "rounds (was 3, now 2)" in outcome.error_line()


def test_ctrl_c_during_an_import_does_not_claim_a_restore(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner.importers

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    # The CLI imports the importers when the command runs (tests/fast/test_startup.py): patched where it looks.
    monkeypatch.setattr(tuner.importers, "import_trace", interrupted)
    outcome = run_cli(
        capsys, "workload", "import", "azure", str(DATA / "import" / "azure.csv"), "--out", str(tmp_path / "a.jsonl")
    )
    assert outcome.code == 130
    assert "interrupted" in outcome.err and "baseline" not in outcome.err
    assert not (tmp_path / "a.jsonl").exists()


def test_the_exit_codes_are_in_tuner_help(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = run_cli(capsys, "--help")
    assert outcome.code == 0
    for code, meaning in (("0", "done"), ("1", "the run failed"), ("2", "a bad study file"), ("75", "unreachable")):
        assert any(line.split()[:1] == [code] and meaning in line for line in outcome.out.splitlines()), code
    assert "130  Ctrl-C; 143 SIGTERM" in outcome.out


def test_a_mistyped_flag_is_one_line_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = run_cli(capsys, "workload", "synth", "chat", "--users", "many", "--out", "x.jsonl")
    assert outcome.code == 2
    assert "--users: must be a positive integer, got 'many'" in outcome.error_line()


def test_workload_show_plot_into_a_missing_directory_is_one_line_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "nowhere" / "trace.png"
    outcome = run_cli(capsys, "workload", "show", str(DATA / "stall-small.jsonl"), "--plot", str(plot))
    assert outcome.code == 2
    assert f"--plot {plot}: directory {plot.parent} does not exist" in outcome.error_line()
    assert not plot.parent.exists()


def test_synth_refuses_a_long_prompt_larger_than_a_trace_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "x.jsonl"
    outcome = run_cli(capsys, "workload", "synth", "stall", "--long-tokens", "99999999999", "--out", str(out))
    assert outcome.code == 2
    assert "--long-tokens: must be at most 10,000,000" in outcome.error_line()
    assert not out.exists()


def test_after_a_failed_baseline_the_corrected_study_runs_again_end_to_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    process = 'deploy.kind="process"'
    first = run_tiny(capsys, tmp_path, process, "deploy.start_timeout_s=5")  # /bin/false cannot start
    assert first.code == 1 and "baseline" in first.error_line()
    again = run_tiny(capsys, tmp_path, process, "deploy.start_timeout_s=60", "engine.settings.threads=1")
    assert again.code == 1, again.err  # it ran (and failed to start again), instead of refusing the change
    assert "holds a study" not in again.err
    assert json.loads((tmp_path / "tiny" / "spec.json").read_text())["engine"]["settings"]["threads"] == 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["capacity", str(TINY), "--window", "-5s"],
            "error: tuner capacity: argument --window: '-5s' is not a duration of zero or more: pass a length such "
            "as 60s, 2m or 1m30s; see `tuner capacity --help`",
        ),
        (
            ["diagnose", str(DATA / "missing.log"), "--since", "-90s"],
            "error: tuner diagnose: argument --since: '-90s' is not a duration of zero or more: pass a time from the "
            "log's first line, e.g. 90s, 15m, 2h or 1h30m; see `tuner diagnose --help`",
        ),
    ],
)
def test_a_negative_value_is_refused_by_its_options_own_check_not_taken_for_a_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    # argparse alone reads "-5s" as another flag and says only "expected one argument".
    outcome = run_cli(capsys, *argv)
    assert outcome.code == 2
    assert outcome.error_line() == said


def test_a_missing_value_before_the_next_flag_is_still_a_missing_value(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = run_cli(capsys, "run", str(TINY), "--set", "--check")
    assert outcome.code == 2
    assert outcome.error_line() == "error: tuner run: argument --set: expected one argument; see `tuner run --help`"


def test_words_after_a_double_dash_and_the_top_level_options_are_left_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    after_dashes = run_cli(capsys, "run", str(TINY), "--check", "--", "--runs-dir", "-5")
    assert after_dashes.code == 2
    assert after_dashes.error_line() == "error: tuner: unrecognized arguments: -- --runs-dir -5; see `tuner --help`"
    top_level = run_cli(capsys, "run", str(TINY), "--log-level", "-1", "--check")
    assert top_level.code == 2
    assert top_level.error_line() == "error: tuner: unrecognized arguments: --log-level -1; see `tuner --help`"
