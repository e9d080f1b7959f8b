"""The `tuner` command on bad input, each refused in one line before touching anything (an unknown key, an
out-of-range value, a missing binary, a malformed workload, a directory without a study), and the
`workload show` and `workload synth` commands."""

from __future__ import annotations

from pathlib import Path

from tests.support import one_error_line, run_tuner

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny-study.toml"


def test_an_unknown_key_fails_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = run_tuner("run", str(TINY), "--runs-dir", str(tmp_path), "--set", "budget.trails=3")
    assert result.returncode == 2
    assert "unknown key 'budget.trails'" in one_error_line(result)
    assert not (tmp_path / "tiny").exists()


def test_an_out_of_range_value_fails_with_one_line(tmp_path: Path) -> None:
    result = run_tuner("run", str(TINY), "--runs-dir", str(tmp_path), "--set", "rounds=1")
    assert result.returncode == 2
    assert "rounds" in one_error_line(result)


def test_a_missing_binary_fails_with_one_line_before_touching_anything(tmp_path: Path) -> None:
    result = run_tuner(
        "run", str(TINY), "--runs-dir", str(tmp_path), "--set", 'engine.binary="/nonexistent/llama-server"',
        "--set", f'engine.model="{DATA / "stand-in-model.gguf"}"',  # the fast tier runs before `tuner setup`
    )  # fmt: skip
    assert result.returncode == 2  # a study-file value to fix
    assert "/nonexistent/llama-server does not exist" in one_error_line(result)
    assert not (tmp_path / "tiny").exists()


def test_a_malformed_workload_names_its_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "broken.jsonl"
    trace.write_text((DATA / "stall-small.jsonl").read_text() + '{"id": "x", "offset_s": -1}\n')
    result = run_tuner("run", str(TINY), "--runs-dir", str(tmp_path), "--set", f'workload.path="{trace}"')
    assert result.returncode == 2  # a file the study names: the user's to fix
    assert "broken.jsonl:5" in one_error_line(result)


def test_leaderboard_of_a_directory_without_a_study_says_so(tmp_path: Path) -> None:
    result = run_tuner("leaderboard", str(tmp_path))
    assert result.returncode == 2  # a path that is no run: the user's to fix, as `tuner status` says too
    assert "holds no study" in one_error_line(result)


def test_workload_show_summarizes_a_trace_and_names_a_bad_line(tmp_path: Path) -> None:
    shown = run_tuner("workload", "show", str(DATA / "stall-small.jsonl"), "--long-prompt-tokens", "600")
    assert shown.returncode == 0, shown.stderr
    assert "3 requests in 3 sessions" in shown.stdout and "1 long prompts" in shown.stdout
    broken = tmp_path / "broken.jsonl"
    broken.write_text((DATA / "stall-small.jsonl").read_text() + "not json\n")
    result = run_tuner("workload", "show", str(broken))
    assert result.returncode == 2  # the user's file
    assert "broken.jsonl:5: not valid JSON" in one_error_line(result)


def test_workload_synth_writes_a_trace_and_refuses_zero_users(tmp_path: Path) -> None:
    out = tmp_path / "chat.jsonl"
    result = run_tuner("workload", "synth", "chat", "--users", "5", "--turns", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "wrote 10 requests" in result.stdout
    assert len(out.read_text().splitlines()) == 11
    refused = run_tuner("workload", "synth", "chat", "--users", "0", "--out", str(tmp_path / "none.jsonl"))
    assert refused.returncode == 2 and "must be a positive integer" in refused.stderr
    assert not (tmp_path / "none.jsonl").exists()
