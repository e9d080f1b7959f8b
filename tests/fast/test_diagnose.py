"""`tuner diagnose` on logs written by the simulated llama-server (the real server's log lines, on its own
clock: tests/support/diagnose_logs.py), checked against what its client measured; their journalctl-wrapped
versions; a multi-hour replay; bad input; the study it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_tuner
from tests.support.diagnose_logs import lora_requests, request, simulated_log, stall_requests
from tuner.diagnose import diagnose_log, parse_duration
from tuner.metrics import compute_metrics

ROOT = Path(__file__).resolve().parents[2]


def journal(lines: list[str], *, unit: str = "llama-server", strip_time: bool = False) -> list[str]:
    """The same log as `journalctl -o short-precise -u UNIT` shows it (the server's time kept, or not)."""
    out = []
    for line in lines:
        stamp, _, rest = line.partition(" ")
        minutes, seconds, millis, micros = (int(p) for p in stamp.split("."))
        total = 12 * 3600 + minutes * 60 + seconds
        clock = f"Nov 29 {total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}.{millis:03d}{micros:03d}"
        out.append(f"{clock} gpu1 {unit}[4242]: {rest.split(' ', 1)[1] if strip_time else line}")
    return out


def figures(diagnosis_finding: object) -> dict[str, float | None]:
    return {f.name: f.value for f in diagnosis_finding.figures}  # type: ignore[attr-defined]


@pytest.mark.parametrize("n_batch", [64, 128, 256])
def test_a_stall_beside_a_long_prefill_is_found_at_the_speed_the_client_saw_and_n_batch_named(n_batch: int) -> None:
    log = simulated_log(stall_requests(), n_batch=n_batch, n_ubatch=n_batch)
    client = compute_metrics(log.records, long_prompt_tokens=1000, min_overlap_s=0.5)["stall_tok_s"]
    diagnosis = diagnose_log(log.lines)
    stall = diagnosis.finding("stalls")
    assert stall is not None and client is not None
    assert figures(stall)["stall_tok_s"] == pytest.approx(client, rel=0.25)
    assert diagnosis.server.n_batch == n_batch
    (fix,) = stall.fixes
    assert fix.knob == "n_batch" and fix.estimate is not None and f"n_batch {max(32, n_batch // 4)}" in fix.estimate
    assert diagnosis.findings[0].kind == "stalls"  # the worst, by user-seconds lost


def test_at_the_default_n_batch_the_stall_is_near_zero_and_the_estimate_follows_prefill_speed_over_n_batch() -> None:
    log = simulated_log(stall_requests(), n_batch=2048, n_ubatch=512)
    client = compute_metrics(log.records, long_prompt_tokens=1000, min_overlap_s=0.5)["stall_tok_s"]
    stall = diagnose_log(log.lines).finding("stalls")
    assert stall is not None and client is not None
    # A token or two in nine seconds: the relative error is that of one token; the absolute one is small.
    assert figures(stall)["stall_tok_s"] == pytest.approx(client, abs=0.5)
    unstalled = figures(stall)["unstalled_tok_s"]
    assert unstalled is not None and unstalled > 20 * client
    prefill = figures(stall)["prefill_tok_s"]
    assert prefill is not None
    estimate = stall.fixes[0].estimate
    assert estimate is not None and f"{prefill / 512:.2f} tok/s" in estimate


def test_waits_behind_another_lora_setting_are_classified_as_the_case_study_classifies_them() -> None:
    log = simulated_log(lora_requests(pairs=4), lora=True, n_parallel=2)
    diagnosis = diagnose_log(log.lines, min_wait_s=0.3)
    waits = diagnosis.finding("waits")
    assert waits is not None
    by_name = figures(waits)
    # Every plain request waited while the styled one beside it ran: four waits, all behind another setting.
    waited = [r for r in log.records if r.timings and r.token_s[0] - r.send_s - r.timings.prompt_ms / 1000 > 0.3]
    assert by_name["other_lora_count"] == len(waited) == 4
    assert by_name["same_setting_count"] == 0 and by_name["nothing_count"] == 0
    assert "another LoRA setting" in waits.summary
    assert waits.fixes[0].knob == "lora_policy"
    assert any("does not name LoRA settings" in note for note in diagnosis.notes)  # inferred at -lv 3, said so
    ttft, prompt_only = by_name["ttft_p95_s"], by_name["prompt_eval_p95_s"]
    assert ttft is not None and prompt_only is not None and ttft > prompt_only


def test_a_clean_log_yields_no_finding() -> None:
    # One user at a time, short prompts: nothing waits, nothing stalls.
    quiet = [request(f"r{i}", 4.0 * i, 60, 80) for i in range(5)]
    diagnosis = diagnose_log(simulated_log(quiet).lines)
    assert diagnosis.findings == []
    assert diagnosis.tasks == 5


@pytest.mark.parametrize("strip_time", [False, True])
def test_journalctl_output_gives_the_same_findings(strip_time: bool) -> None:
    log = simulated_log(stall_requests(), n_batch=128, n_ubatch=128)
    plain = diagnose_log(log.lines)
    wrapped = diagnose_log(journal(log.lines, strip_time=strip_time))
    assert [f.kind for f in wrapped.findings] == [f.kind for f in plain.findings]
    assert figures(wrapped.findings[0])["stall_tok_s"] == pytest.approx(
        figures(plain.findings[0])["stall_tok_s"], rel=0.05
    )


def test_a_multi_hour_replay_is_read_in_one_pass_and_since_until_select_part_of_it() -> None:
    # Three hours of a chat: every ten minutes two streams and, once an hour, a long prompt beside them.
    requests = []
    for block in range(18):
        at = 600.0 * block
        requests += [request(f"a{block}", at, 40, 300), request(f"b{block}", at + 0.2, 40, 300)]
        if block % 6 == 0:
            requests.append(request(f"long{block}", at + 4.0, 2500, 4))
    log = simulated_log(requests, n_batch=256, n_ubatch=256)
    diagnosis = diagnose_log(log.lines)
    assert diagnosis.span_s > 2.8 * 3600
    stall = diagnosis.finding("stalls")
    assert stall is not None and figures(stall)["long_prefills"] == 3
    second_hour = diagnose_log(log.lines, since_s=3600.0, until_s=7199.0)
    stall = second_hour.finding("stalls")
    assert stall is not None and figures(stall)["long_prefills"] == 1


def test_bad_input_is_one_line_naming_the_problem_and_the_fix(tmp_path: Path) -> None:
    binary = tmp_path / "log.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00" + bytes(100))
    text = tmp_path / "notes.txt"
    text.write_text("nothing of a server here\n")
    untimed = tmp_path / "untimed.log"
    untimed.write_text("slot launch_slot_: id  0 | task 1 | processing task, is_child = 0\n")
    ollama = tmp_path / "ollama.log"  # Ollama 0.11.4's own lines, as `ollama serve` writes them
    ollama.write_text(
        'time=2026-12-07T20:36:14.592Z level=INFO source=routes.go:1357 msg="Listening on 127.0.0.1:11434 '
        '(version 0.11.4)"\n[GIN] 2026/12/07 - 20:36:18 | 200 |  1.093510512s |       127.0.0.1 | POST '
        '"/api/generate"\n'
    )
    cases = {
        str(ollama): "an Ollama log, whose runner logs no prompt, batch or queue timing per request",
        str(tmp_path / "missing.log"): "file not found",
        str(tmp_path): "is a directory",
        str(binary): "binary file",
        str(text): "no llama-server or vLLM lines",
        str(untimed): "no timestamps",
    }
    for path, words in cases.items():
        done = run_tuner("diagnose", path)
        assert done.returncode == 2, (path, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (path, done.stderr)
        assert done.stdout == ""
    for flag in ("--since", "--until"):
        done = run_tuner("diagnose", str(text), flag, "yesterday")
        assert done.returncode == 2 and "is not a duration" in done.stderr and "e.g. 90s" in done.stderr
    with pytest.raises(ValueError):
        parse_duration("-5m")


def test_json_is_one_versioned_document_and_log_text_is_escaped_and_redacted(tmp_path: Path) -> None:
    lines = simulated_log(lora_requests(pairs=2), lora=True, n_parallel=2).lines
    # A launch line carrying markup and a key, as a hostile or careless log might.
    lines = [
        line.replace("is_child = 0", "is_child = 0 [bold red]Bearer sk-abcdefghijkl0123[/]")
        if "task 1 |" in line
        else line
        for line in lines
    ]
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    done = run_tuner("diagnose", str(path), "--min-wait", "0.3", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["version"] == 1 and document["log_kind"] == "llama-server"
    assert "sk-abcdefghijkl0123" not in done.stdout and "<redacted>" in done.stdout
    shown = run_tuner("diagnose", str(path), "--min-wait", "0.3")
    assert shown.returncode == 0, shown.stderr
    assert "[bold red]" in shown.stdout  # printed as text, not applied as markup
    assert "sk-abcdefghijkl0123" not in shown.stdout


def test_the_study_it_writes_is_one_tuner_run_accepts_and_it_never_overwrites_the_log(tmp_path: Path) -> None:
    from tuner.config import load_study

    log_path = tmp_path / "today.log"
    log_path.write_text("\n".join(simulated_log(stall_requests(), n_batch=2048, n_ubatch=512).lines) + "\n")
    out = tmp_path / "study" / "fix.toml"
    out.parent.mkdir()
    done = run_tuner("diagnose", str(log_path), "--study", str(out))
    assert done.returncode == 0, done.stderr
    spec, _ = load_study(out)
    assert spec.search.params is not None and set(spec.search.params) == {"n_batch", "n_ubatch"}
    assert {o.metric for o in spec.objectives} >= {"stall_tok_s", "prefill_tok_s"}
    assert any(c.metric == "prefill_tok_s" and c.min_vs_baseline == 0.8 for c in spec.constraints)
    workload = out.with_name("fix.workload.jsonl")
    assert len(workload.read_text().splitlines()) == 1 + 3  # header and the log's three requests
    again = run_tuner("diagnose", str(log_path), "--study", str(out))
    assert again.returncode == 2 and "exists; pass --force" in again.stderr
    assert run_tuner("diagnose", str(log_path), "--study", str(out), "--force").returncode == 0
    before = log_path.read_bytes()
    over_log = run_tuner("diagnose", str(log_path), "--study", str(log_path), "--force")
    assert over_log.returncode == 2 and "is the input" in over_log.stderr
    assert log_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study", "today.log"]  # nothing written beside it


def test_a_log_with_nothing_to_tune_writes_no_study(tmp_path: Path) -> None:
    log_path = tmp_path / "quiet.log"
    log_path.write_text("\n".join(simulated_log([request("r0", 0.0, 60, 80)]).lines) + "\n")
    done = run_tuner("diagnose", str(log_path), "--study", str(tmp_path / "s.toml"))
    assert done.returncode == 2 and "names a server knob" in done.stderr
    assert not (tmp_path / "s.toml").exists()


def test_vllm_stats_lines_report_queueing_preemptions_and_kv_pressure(tmp_path: Path) -> None:
    stats = []
    for i in range(30):
        waiting = 3 if 10 <= i < 20 else 0
        preempted = 2 if i == 15 else 0
        kv = 95.0 if 12 <= i < 18 else 40.0
        tail = f", Preemptions: {preempted}" if preempted else ""
        stats.append(
            f"(APIServer pid=7) INFO 11-29 10:{i // 6:02d}:{i % 6 * 10:02d} [loggers.py:123] Engine 000: Avg prompt "
            f"throughput: 812.0 tokens/s, Avg generation throughput: 96.5 tokens/s, Running: 8 reqs, Waiting: "
            f"{waiting} reqs{tail}, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 41.0%"
        )
    diagnosis = diagnose_log(stats)
    assert diagnosis.log_kind == "vllm"
    queueing = diagnosis.finding("vllm_queueing")
    pressure = diagnosis.finding("vllm_kv_pressure")
    assert queueing is not None and figures(queueing)["waiting_s"] == pytest.approx(100.0)
    assert figures(queueing)["queued_request_s"] == pytest.approx(300.0)
    assert pressure is not None and figures(pressure)["preemptions"] == 2
    assert figures(pressure)["kv_pressure_s"] == pytest.approx(60.0)
    clean = [
        line.replace("Waiting: 3", "Waiting: 0").replace("95.0%", "40.0%").replace(", Preemptions: 2", "")
        for line in stats
    ]
    assert diagnose_log(clean).findings == []


def test_an_ollama_journal_whose_runner_writes_llama_server_lines_is_read_by_the_journal_time() -> None:
    log = simulated_log(lora_requests(pairs=3), lora=True, n_parallel=2)
    ollama = journal(log.lines, unit="ollama", strip_time=True)
    ollama.insert(
        0,
        "Nov 29 12:00:00.000000 gpu1 ollama[4242]: "
        'time=2026-11-29T12:00:00.000Z level=INFO msg="starting llama-server"',
    )
    waits = diagnose_log(ollama, min_wait_s=0.3).finding("waits")
    assert waits is not None and figures(waits)["other_lora_count"] == 3


def test_a_short_log_compares_the_stall_with_requests_that_decoded_alone_and_says_so() -> None:
    # A recorded trial's log: every stream overlapped a long prefill from its first token to its last, so
    # no stream printed a rate line elsewhere; the requests that decoded with no long prefill beside them
    # (their eval time lines) are the speed to compare with, and the finding names that evidence.
    diagnosis = diagnose_log(ROOT / "tests" / "data" / "llama-server-trial.log")
    assert diagnosis.tasks == 7 and diagnosis.server.n_slots == 4
    stall = diagnosis.finding("stalls")
    assert stall is not None
    by_name = {figure.name: figure for figure in stall.figures}
    assert by_name["stall_tok_s"].value is not None and by_name["stall_tok_s"].value < 1.0
    assert "requests that decoded with no long prefill beside them" in by_name["unstalled_tok_s"].label


def test_an_ollama_logs_stall_names_ollamas_own_lever_not_a_llama_server_variable() -> None:
    """Ollama's runner writes llama-server's lines, but an Ollama operator has no LLAMA_ARG_BATCH: the fix
    names num_batch, where Ollama reads it (the model's Modelfile), and says serve-tuner cannot tune it there."""
    log = simulated_log(stall_requests(), n_batch=256, n_ubatch=256)
    ollama = journal(log.lines, unit="ollama", strip_time=True)
    ollama.insert(
        0,
        "Nov 29 12:00:00.000000 gpu1 ollama[4242]: "
        'time=2026-11-29T12:00:00.000Z level=INFO msg="starting llama-server"',
    )
    diagnosis = diagnose_log(ollama)
    assert diagnosis.server.engine == "ollama"
    stall = diagnosis.finding("stalls")
    assert stall is not None
    (fix,) = stall.fixes
    assert fix.action.startswith("lower num_batch to about 64: Ollama reads it from the model")
    assert "PARAMETER num_batch 64" in fix.action and "LLAMA_ARG" not in fix.action
    same_log = diagnose_log(log.lines).finding("stalls")  # llama-server's own log keeps its variable
    assert same_log is not None and "LLAMA_ARG_BATCH" in same_log.fixes[0].action
