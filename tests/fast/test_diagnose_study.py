"""`tuner diagnose --study`: the study it writes tunes the server whose log it read. With `--like` it takes that
server's [host], [deploy] and [engine] as written and passes the checks `tuner run` makes before it touches a
host; a `--like` that is no valid study, or one of another engine, is refused in one line with nothing written;
without `--like` the study says in its first lines that it is local; Ollama's and vLLM's logs get studies of
their own engine's knobs."""

from __future__ import annotations

import os
import shutil
import stat
import tomllib
from pathlib import Path

import pytest

from tests.fast.test_diagnose import journal
from tests.fast.test_diagnose_lines import Log
from tests.support import run_tuner
from tests.support.diagnose_logs import simulated_log, stall_requests
from tuner.config import load_search_space, load_study
from tuner.diagnose import Diagnosis, diagnose_log
from tuner.diagnose.identity import ollama_model_name
from tuner.diagnose.study import (
    ENGINE_STUDY_KNOBS,
    LOCAL_STUDY_MARKER,
    is_local_diagnose_study,
    read_like_study,
    write_study,
)
from tuner.errors import ConfigError
from tuner.search import prepare_study

ROOT = Path(__file__).resolve().parents[2]

# Strings a study file may hold that TOML must escape, or may write as they are.
ODD = 'quote" back\\slash tab\t new\nline é 😀 del\x7f bell\x07'

PROD_STUDY = """
name = "prod"
interleave = 1

[host]
kind = "ssh"
host = "gpu1.example"
user = "tuner"
client_keys = ["keys/id_ed25519"]   # relative: to where `tuner run` starts, as any path of this machine
known_hosts = "ODD_STRING"
sudo = true

[deploy]
kind = "systemd"
unit = "llama-server.service"
exec_start = "replace"             # the study's own command line, with the host's paths below
dead_man_s = 1800

[engine]
kind = "llama-server"
binary = "/opt/llama/llama-server"
model = "/srv/models/qwen-7b.gguf"
port = 8080
extra_args = ["--jinja"]
[engine.lora_adapters]
"style.v2" = "/srv/lora/style.gguf"
[engine.settings]
n_batch = 1536                      # not among the space's choices: the written space adds it

[workload]
path = "prod.jsonl"                 # the written study replays the log's traffic instead

[search]
space = "../search_spaces/llama-server.toml"

[[objectives]]
metric = "wait_p95_s"
direction = "minimize"
"""


VLLM_LIKE = (
    PROD_STUDY.split("[engine]", maxsplit=1)[0]
    + '[engine]\nkind = "vllm"\nmodel = "m"\ncommand = ["/opt/vllm/bin/vllm", "serve"]\n\n[workload]'
    + PROD_STUDY.split("[workload]")[1]
)


def prod_study(directory: Path, text: str = PROD_STUDY) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "prod.toml"
    path.write_text(text.replace('"ODD_STRING"', toml_string(ODD)), encoding="utf-8")
    return path


def toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\n", "\\n")
    return '"' + escaped.replace("\x7f", "\\u007F").replace("\x07", "\\u0007") + '"'


def stall_log(tmp_path: Path) -> Path:
    path = tmp_path / "today.log"
    path.write_text("\n".join(simulated_log(stall_requests(), n_batch=2048, n_ubatch=512).lines) + "\n")
    return path


def passes_run_checks(study: Path) -> dict[str, object]:
    """What `tuner run` checks before it touches a host: the study file, then the prepared study. The baseline."""
    spec, base_dir = load_study(study)
    return dict(prepare_study(spec, base_dir).baseline_settings)


def test_like_takes_the_servers_host_deploy_and_engine_as_written_and_passes_the_checks_tuner_run_makes(
    tmp_path: Path,
) -> None:
    log = stall_log(tmp_path)
    like = prod_study(tmp_path / "prod")
    out = tmp_path / "studies" / "fix.toml"  # another directory than the --like study's
    done = run_tuner("diagnose", str(log), "--study", str(out), "--like", str(like))
    assert done.returncode == 0, done.stderr
    assert "local study" not in done.stdout
    written = tomllib.loads(out.read_text(encoding="utf-8"))
    wrote = tomllib.loads(like.read_text(encoding="utf-8"))
    assert written["host"] == wrote["host"] and written["deploy"] == wrote["deploy"]
    assert written["engine"] == wrote["engine"]  # paths, port, odd strings and all, the settings too
    assert written["host"]["client_keys"] == ["keys/id_ed25519"]  # relative to where tuner run starts, as there
    assert written["host"]["known_hosts"] == ODD
    # Only the workload, the knobs, the objectives and the constraints come from the log.
    assert written["workload"]["path"] == "fix.workload.jsonl" and written["search"]["space"] == "fix.space.toml"
    assert {o["metric"] for o in written["objectives"]} == {"stall_tok_s", "prefill_tok_s", "ttft_p95_s"}
    assert "interleave" not in written
    assert passes_run_checks(out) == {"n_batch": 1536, "n_ubatch": 512}
    # It starts from the prediction of the same log, named relative to the study file.
    assert written["search"]["predicted_from"] == "../today.log"
    spec, base_dir = load_study(out)
    assert prepare_study(spec, base_dir).predicted_from == log.resolve()
    text = out.read_text(encoding="utf-8")
    assert not is_local_diagnose_study(text)
    assert f"[host], [deploy] and [engine] are {like}'s, copied as written" in text
    with pytest.raises(ConfigError, match="is the input"):  # the --like study is never written over
        write_study(diagnose_log(log), log, like, like=read_like_study(like), force=True)


def test_like_of_a_fleet_takes_its_hosts_and_storage_and_a_password_keeps_the_study_private(tmp_path: Path) -> None:
    log = stall_log(tmp_path)
    fleet = PROD_STUDY + (
        '\n[storage]\nurl = "postgresql://tuner:hunter2-pass@db.internal/tuner"\ngrace_s = 60\n'
        '\n[[hosts]]\nname = "gpu-a"\nhost = { kind = "ssh", host = "gpu-a.internal" }\n'
        '\n[[hosts]]\nname = "gpu-b"\n[hosts.host]\nkind = "ssh"\nhost = "gpu-b.internal"\n'
        "[hosts.engine]\nport = 8081\n"
    )
    like = read_like_study(prod_study(tmp_path / "prod", fleet))
    out = tmp_path / "fix.toml"
    write_study(diagnose_log(log), log, out, like=like)
    written = tomllib.loads(out.read_text(encoding="utf-8"))
    wrote = tomllib.loads(like.path.read_text(encoding="utf-8"))
    assert written["hosts"] == wrote["hosts"] and written["storage"] == wrote["storage"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600  # the password is copied as written, to a private file
    spec, base_dir = load_study(out)
    for entry in spec.hosts:
        prepare_study(spec.for_host(entry), base_dir)


def test_a_like_that_is_no_valid_study_or_of_another_engine_is_refused_in_one_line_with_nothing_written(
    tmp_path: Path,
) -> None:
    log = stall_log(tmp_path)
    cases = {
        "missing": (tmp_path / "missing.toml", "file not found"),
        "no study": (prod_study(tmp_path / "a", PROD_STUDY.split("[[objectives]]", maxsplit=1)[0]), "'objectives'"),
        "bad deploy": (prod_study(tmp_path / "b", PROD_STUDY.replace('unit = "llama-server.service"', "")), "unit"),
        "vllm": (prod_study(tmp_path / "c", VLLM_LIKE), "engine.kind = 'llama-server'"),
        # What `tuner run` refuses for whose command line starts the server: a model of the study's where
        # the unit keeps its own, and this machine's build on another host.
        "keep and a model": (
            prod_study(tmp_path / "e", PROD_STUDY.replace('exec_start = "replace"', 'exec_start = "keep"')),
            "engine.binary is the operator's own",
        ),
        "auto on the host": (
            prod_study(tmp_path / "f", PROD_STUDY.replace('binary = "/opt/llama/llama-server"', 'binary = "auto"')),
            'engine.binary = "auto"',
        ),
    }
    out_dir = tmp_path / "out"
    for case, (like, words) in cases.items():
        done = run_tuner("diagnose", str(log), "--study", str(out_dir / "fix.toml"), "--like", str(like))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (case, done.stderr)
        assert "--like" in lines[0] and words in lines[0], (case, lines[0])
        assert not out_dir.exists(), case
    alone = run_tuner("diagnose", str(log), "--like", str(prod_study(tmp_path / "d")))
    assert alone.returncode == 2 and "add --study OUT.toml" in alone.stderr and alone.stdout == ""


def test_without_like_the_study_says_first_that_it_is_local_and_how_to_point_it_at_the_server(
    tmp_path: Path,
) -> None:
    log = stall_log(tmp_path)
    out = tmp_path / "fix.toml"
    written = write_study(diagnose_log(log), log, out)
    text = out.read_text()
    assert text.splitlines()[0] == LOCAL_STUDY_MARKER
    assert f"tuner diagnose {log} --study {out} --like PROD.toml --force" in text
    assert "docs/production-host.md" in text
    assert any("local study" in note for note in written.notes)
    assert is_local_diagnose_study(text)
    assert not is_local_diagnose_study(text + '\n[host]\nkind = "ssh"\nhost = "gpu1.example"\n')
    assert not is_local_diagnose_study(text.replace(LOCAL_STUDY_MARKER, "# a study"))
    assert not is_local_diagnose_study(f'name = "x"\n{LOCAL_STUDY_MARKER}\n')  # only the leading comments count
    assert passes_run_checks(out) == {"n_batch": 2048, "n_ubatch": 512}
    # `tuner run --check` says so before the night, with the fix.
    checked = run_tuner("run", str(out), "--check", "--runs-dir", str(tmp_path / "runs"))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "FAIL  study: tuner diagnose wrote this as a local study" in checked.stdout
    assert "--like PRODUCTION.toml" in checked.stdout and not (tmp_path / "runs").exists()
    # Rewritten as the first lines say, it is the server's own study.
    like = prod_study(tmp_path / "prod")
    again = run_tuner("diagnose", str(log), "--study", str(out), "--like", str(like), "--force")
    assert again.returncode == 0, again.stderr
    assert tomllib.loads(out.read_text())["host"]["host"] == "gpu1.example"


def ollama_journal(*, model: bool = True) -> list[str]:
    """Ollama's journal: its own lines and its runner's llama-server lines (one slot of 2048 tokens): a cut
    prompt, two requests that waited for the slot, a conversation prefilled again after evictions."""
    log = Log(slots=1, ctx=2048)
    free = log.task(1, 0, launch=1.0, prompt=2048, prompt_ms=1500, truncated=True)
    free = log.task(2, 0, launch=free + 0.002, prompt=300, prompt_ms=1500)
    free = log.task(3, 0, launch=free + 0.002, prompt=1200, prompt_ms=1500)
    log.evict(free + 1.0)
    log.task(4, 0, launch=free + 2.0, prompt=1300, prompt_ms=3200)
    lines = journal(log.lines, unit="ollama", strip_time=True)
    prefix = "Nov 29 12:00:00.000000 gpu1 ollama[4242]: time=2026-11-29T12:00:00.000Z"
    own = [f'{prefix} level=INFO source=routes.go:1234 msg="Listening on 127.0.0.1:11434 (version 0.9.0)"']
    if model:
        own.append(
            f'{prefix} level=DEBUG source=sched.go:740 msg="finished setting up" '
            "runner.name=registry.ollama.ai/library/llama3.2:3b runner.inference=cuda runner.parallel=1 "
            "runner.pid=4300 runner.model=/usr/share/ollama/.ollama/models/blobs/sha256-dde5aa runner.num_ctx=2048"
        )
    return own + lines


def test_an_ollama_log_gets_a_study_of_ollamas_slots_and_context_with_the_model_it_names(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("\n".join(ollama_journal()) + "\n")
    diagnosis = diagnose_log(log)
    assert diagnosis.server.engine == "ollama" and diagnosis.server.models == ["llama3.2:3b"]
    out = tmp_path / "fix.toml"
    write_study(diagnosis, log, out)
    text = out.read_text()
    study = tomllib.loads(text)
    assert study["engine"] == {
        "kind": "ollama",
        "model": "llama3.2:3b",
        "settings": {"num_parallel": 1, "context_length": 2048},  # the runner's one slot of 2048 tokens
    }
    assert set(study["search"]["params"]) == {"num_parallel", "context_length"}
    assert "predicted_from" not in study["search"]  # the simulated server models llama-server alone
    assert "Not tuned: cache_ram, which the findings name but Ollama does not take" in text
    assert load_search_space(tmp_path / "fix.space.toml").engine == "ollama"
    assert len((tmp_path / "fix.workload.jsonl").read_text().splitlines()) == 1 + 4  # the runner's 4 requests
    assert passes_run_checks(out) == {"num_parallel": 1, "context_length": 2048}
    # A log that does not name the model: the study says to set it, and refuses to run until it is.
    unnamed = tmp_path / "unnamed.log"
    unnamed.write_text("\n".join(ollama_journal(model=False)) + "\n")
    write_study(diagnose_log(unnamed), unnamed, tmp_path / "unnamed.toml")
    text = (tmp_path / "unnamed.toml").read_text()
    assert "engine.model: the server's Ollama model (`ollama ps`); the log does not name it" in text
    assert "model" not in tomllib.loads(text)["engine"]
    with pytest.raises(ConfigError, match=r"engine: missing required key 'model'"):
        passes_run_checks(tmp_path / "unnamed.toml")
    # --like a study of the Ollama unit: the log's slots and context fill what that study leaves unset.
    ollama_like = (
        '[host]\nkind = "ssh"\nhost = "gpu1.example"\n[deploy]\nkind = "systemd"\nunit = "ollama.service"\n'
        '[engine]\nkind = "ollama"\nmodel = "llama3.2:3b"\n[engine.settings]\nflash_attention = true\n'
        '[workload]\npath = "w.jsonl"\n[search]\nspace = "s.toml"\n[[objectives]]\nmetric = "ttft_p95_s"\n'
        'direction = "minimize"\n'
    )
    like = read_like_study(prod_study(tmp_path / "prod", ollama_like))
    write_study(diagnosis, log, out, like=like, force=True)
    settings = tomllib.loads(out.read_text())["engine"]["settings"]
    assert settings == {"flash_attention": True, "num_parallel": 1, "context_length": 2048}
    assert "engine.settings num_parallel = 1, context_length = 2048: the log's" in out.read_text()
    assert passes_run_checks(out) == {"num_parallel": 1, "context_length": 2048}


def test_an_ollama_log_whose_findings_name_no_ollama_setting_writes_no_study(tmp_path: Path) -> None:
    log = tmp_path / "stall.log"
    log.write_text("\n".join(journal(simulated_log(stall_requests()).lines, unit="ollama")) + "\n")
    diagnosis = diagnose_log(log)
    assert diagnosis.server.engine == "ollama" and diagnosis.finding("stalls") is not None
    with pytest.raises(ConfigError, match="n_batch, n_ubatch, which Ollama does not take as a server setting"):
        write_study(diagnosis, log, tmp_path / "fix.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stall.log"]


def vllm_log() -> list[str]:
    lines = [
        "(EngineCore_DP0 pid=200) INFO 11-29 09:59:40 [core.py:124] Initializing a V1 LLM engine (v0.11.0) with "
        "config: model='Qwen/Qwen2.5-0.5B-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-0.5B-Instruct'"
    ]
    for i in range(30):
        waiting, kv = (3, 95.0) if 10 <= i < 20 else (0, 40.0)
        lines.append(
            f"(APIServer pid=7) INFO 11-29 10:{i // 6:02d}:{i % 6 * 10:02d} [loggers.py:123] Engine 000: Avg prompt "
            f"throughput: 812.0 tokens/s, Avg generation throughput: 96.5 tokens/s, Running: 8 reqs, Waiting: "
            f"{waiting} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 41.0%"
        )
    return lines


def test_a_vllm_log_gets_a_vllm_study_whose_workload_tuner_record_writes(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(vllm_log()) + "\n")
    out = tmp_path / "fix.toml"
    done = run_tuner("diagnose", str(log), "--study", str(out))
    assert done.returncode == 0, done.stderr
    assert f"--out {tmp_path / 'fix.workload.jsonl'}" in done.stdout  # the note says how to record it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fix.space.toml", "fix.toml", "vllm.log"]
    text = out.read_text()
    study = tomllib.loads(text)
    assert study["engine"] == {"kind": "vllm", "model": "Qwen/Qwen2.5-0.5B-Instruct", "settings": {}}
    assert set(study["search"]["params"]) == {"max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"}
    assert "tuner record --upstream http://SERVER:8000 --out fix.workload.jsonl" in text
    assert "engine.settings.max_num_seqs: the value the server runs with now" in text
    with pytest.raises(ConfigError, match=r"set engine.settings.max_num_seqs so the baseline is known"):
        passes_run_checks(out)
    # Once the traffic is recorded and the server's settings written, it is a study tuner run takes.
    shutil.copy(ROOT / "tests" / "data" / "quick.jsonl", tmp_path / "fix.workload.jsonl")
    edited = text.replace(
        "[engine.settings]\n", "[engine.settings]\nmax_num_seqs = 256\nmax_num_batched_tokens = 2048\n"
    )
    out.write_text(edited)
    assert passes_run_checks(out) == {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "gpu_memory_utilization": 0.92,
    }


def test_the_log_says_which_server_wrote_it_and_the_model_it_ran() -> None:
    llama = simulated_log(stall_requests()).lines
    assert diagnose_log(llama).server.engine == "llama-server"
    # llama-server loading a model from Ollama's store is still llama-server.
    on_a_blob = ["0.00.100.000 I main: loading model '/root/.ollama/models/blobs/sha256-dde5aa'", *llama]
    assert diagnose_log(on_a_blob).server.engine == "llama-server"
    vllm = diagnose_log(vllm_log())
    assert vllm.server.engine == "vllm" and vllm.server.models == ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert ollama_model_name("registry.ollama.ai/library/llama3.2:latest") == "llama3.2:latest"
    assert ollama_model_name("registry.ollama.ai/someone/tuned:q4") == "someone/tuned:q4"
    assert ollama_model_name("hf.co/org/repo-GGUF:Q4_K_M") == "hf.co/org/repo-GGUF:Q4_K_M"
    document = Diagnosis.model_validate_json(diagnose_log(ollama_journal()).model_dump_json())
    assert document.server.engine == "ollama" and document.version == 1


@pytest.mark.parametrize("engine", sorted(ENGINE_STUDY_KNOBS))
def test_the_knobs_a_study_may_tune_are_those_of_the_engines_search_space(engine: str) -> None:
    space = load_search_space(ROOT / "search_spaces" / f"{engine}.toml")
    for name, knob in ENGINE_STUDY_KNOBS[engine].items():
        assert list(knob.choices) == space.params[name].choices, name
        assert knob.default == space.params[name].default, name
