"""A real Ollama (`tuner setup --ollama`: built from its pinned Go module, SmolLM2 made an Ollama model
offline), tuned through the process deployer: every request of the replay reaches it and is measured
from its own NDJSON stream, its server log lands in the run directory, and nothing of it is left running.
Until this test, the Ollama engine had met transcripts only."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.support import DATA, free_port, run_tuner
from tuner import assets
from tuner.models import RequestRecord

STUDY = DATA / "ollama-five-users.toml"


def _records(path: Path) -> list[RequestRecord]:
    return [RequestRecord.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def _ollama_processes(binary: Path, home: Path) -> list[int]:
    """This test's Ollama processes: the build's, with the test's own HOME (another test's, in the other
    worker, may run beside it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "exe") != os.path.realpath(binary):
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"HOME={home}".encode() in environ:
                found.append(int(entry.name))
    return found


def test_five_users_on_a_real_ollama_are_replayed_measured_and_left_no_server(
    ollama_binary: Path, tmp_path: Path
) -> None:
    # `ollama serve` writes a key pair under ~/.ollama: a home of the test's own, the builds' cache kept.
    env = {**os.environ, "HOME": str(tmp_path), "SERVE_TUNER_CACHE": str(assets.cache_root())}
    args = ["run", str(STUDY), "--runs-dir", str(tmp_path / "runs"), "--set", f"engine.port={free_port()}"]
    done = run_tuner(*args, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "ollama-five"
    baseline = sorted((run / "trials").iterdir())[0]
    rounds = [path for path in sorted(baseline.glob("round-*.jsonl")) if ".server." not in path.name]
    records = [record for path in rounds for record in _records(path)]
    # Two rounds, or more where the study measured a noisy trial again (on a loaded machine, a third).
    assert len(rounds) >= 2 and len(records) == 5 * len(rounds), [path.name for path in rounds]
    assert all(r.ok for r in records), [r.error for r in records]
    # Each answer streamed token by token, and Ollama's own figures read from its last line.
    assert all(len(r.token_s) >= 2 and r.timings is not None and r.timings.predicted_n > 0 for r in records)
    # At OLLAMA_NUM_PARALLEL=1 the five users are served one after the other: in each round, the last
    # user's first token comes after the first user's answer ended.
    for path in rounds:
        by_id = {r.request_id: r for r in _records(path)}
        first_token = by_id["user-5"].first_token_s
        assert first_token is not None and first_token > by_id["user-1"].end_s
    assert "Listening on 127.0.0.1" in (baseline / "server.log").read_text()  # Ollama's own log, kept
    # Which has no timing per request to diagnose: said in one line, with what to do instead.
    diagnosed = run_tuner("diagnose", str(baseline / "server.log"), "--predict", cwd=tmp_path, timeout=120)
    assert diagnosed.returncode == 2 and diagnosed.stderr.count("\n") == 1, diagnosed.stderr
    assert "an Ollama log, whose runner logs no prompt, batch or queue timing" in diagnosed.stderr
    board = json.loads(run_tuner("leaderboard", str(run), "--json", cwd=tmp_path, timeout=120).stdout)
    # The trial ran Ollama with four slots (the study's seed draws it; a draw of the baseline's 1 is skipped).
    assert sorted(row["settings"]["num_parallel"] for row in board["rows"]) == [1, 4], board["rows"]
    assert _ollama_processes(ollama_binary, tmp_path) == []


def _study_of_one_knob(tmp_path: Path, knob: str, choices: str, default: str) -> dict[str, Any]:
    """The five-users study on the real Ollama with a space of one knob (the baseline and one trial); its
    leaderboard as `leaderboard --json` gives it."""
    space = tmp_path / "space.toml"
    space.write_text(f'engine = "ollama"\n[params.{knob}]\nchoices = {choices}\ndefault = {default}\n')
    env = {**os.environ, "HOME": str(tmp_path), "SERVE_TUNER_CACHE": str(assets.cache_root())}
    args = [
        "run", str(STUDY), "--runs-dir", str(tmp_path / "runs"), "--set", f"engine.port={free_port()}",
        "--set", f"search.space={json.dumps(str(space))}",
    ]  # fmt: skip
    done = run_tuner(*args, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    board = run_tuner("leaderboard", str(tmp_path / "runs" / "ollama-five"), "--json", timeout=120)
    return dict(json.loads(board.stdout))


def test_a_setting_ollama_drops_on_this_cpu_fails_its_trial_naming_it_instead_of_measuring_the_default(
    ollama_binary: Path, tmp_path: Path
) -> None:
    # Ollama takes OLLAMA_FLASH_ATTENTION=1, then at the model's load (the warm-up) logs that the device
    # cannot and runs without it: the trial would be the baseline measured again under another name.
    board = _study_of_one_knob(tmp_path, "flash_attention", "[false, true]", "false")
    failed = [row for row in board["rows"] if row["state"] == "FAIL"]
    assert [row["settings"] for row in failed] == [{"flash_attention": True}], board["rows"]
    reason = failed[0]["reason"]
    assert "Ollama ignored flash_attention (OLLAMA_FLASH_ATTENTION)" in reason, reason
    assert "leave flash_attention out of search.params" in reason
    assert _ollama_processes(ollama_binary, tmp_path) == []


def test_num_batch_reaches_ollamas_runner_from_the_requests_and_never_reloads_the_model_mid_trial(
    ollama_binary: Path, tmp_path: Path
) -> None:
    # Ollama has no variable for num_batch: each request carries it. Its runner's command line, which
    # Ollama logs when it loads the model, shows what it took; one load per server start means no request
    # of the trial (warm-up, rounds) came with another value, which would have reloaded the model.
    board = _study_of_one_knob(tmp_path, "num_batch", "[512, 128]", "512")
    run = tmp_path / "runs" / "ollama-five"
    tuned = next(row for row in board["rows"] if not row["baseline"])
    assert tuned["settings"] == {"num_batch": 128} and tuned["state"] == "COMPLETE", board["rows"]
    for number, batch in ((0, 512), (tuned["number"], 128)):
        log = (run / "trials" / f"{number:04d}" / "server.log").read_text()
        loads = re.findall(r'msg="starting llama server" cmd="[^"]* --batch-size (\d+) ', log)
        starts = log.count("Listening on 127.0.0.1")
        assert loads == [str(batch)] * starts and starts >= 2, (number, loads, starts)
