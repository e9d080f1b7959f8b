"""P12: the server's API key (a canary here) never appears in anything the tool prints or writes: error
messages of a failed run, launches; also not when the server itself quotes the key back (a stand-in that
refuses it, tests/data/leaky_server.py), and not when the key is pasted where the name of its variable
belongs. The run against the real llama-server is in tests/real/test_api_key_real_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.support.bounded import fifo_nobody_may_open
from tuner.errors import ConfigError
from tuner.redact import SECRET_REFUSED
from tuner.study_record import RECORD_KEY

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny-study.toml"
# Fixed, so that the parametrized test ids are the same in every process (pytest-xdist compares them).
CANARY = "sk-canary-3b2a1f0e9d8c47b6a5f4e3d2c1b0a998"


def everything_under(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file())


def test_an_api_key_variable_that_is_not_set_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions

    monkeypatch.delenv("SERVE_TUNER_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match="SERVE_TUNER_UNSET_KEY"):
        LlamaServerEngine(LlamaServerOptions(api_key_env="SERVE_TUNER_UNSET_KEY"))


def test_a_launch_never_shows_its_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions

    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", CANARY)
    engine = LlamaServerEngine(LlamaServerOptions(api_key_env="SERVE_TUNER_TEST_KEY", binary="/x", model="/y", port=1))
    launch = engine.launch_spec({})
    assert launch.secret_values() == {"LLAMA_API_KEY": CANARY}
    assert CANARY not in repr(launch) and CANARY not in launch.model_dump_json()
    assert engine.request_headers() == {"Authorization": f"Bearer {CANARY}"}


ENGINE_OPTIONS: dict[str, dict[str, object]] = {
    "llama-server": {"binary": "/x", "model": "/y", "port": 1},
    "vllm": {"model": "Qwen/Qwen2.5-0.5B-Instruct"},
    "ollama": {"model": "llama3.2:3b"},
}
# What the server the study starts is given (Ollama has no key of its own: only its proxy sees one).
SERVER_GETS = {"llama-server": {"LLAMA_API_KEY": CANARY}, "vllm": {"VLLM_API_KEY": CANARY}, "ollama": {}}


@pytest.mark.parametrize("kind", sorted(ENGINE_OPTIONS))
@pytest.mark.parametrize("source", ["env", "file"])
def test_every_engine_takes_its_key_from_a_variable_or_a_private_file_and_sends_it_only_as_a_header(
    kind: str, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.config import PluginSpec
    from tuner.engines import create_engine

    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", CANARY)
    key_file = tmp_path / "key"
    key_file.write_text(CANARY + "\n")
    key_file.chmod(0o600)
    given = {"api_key_env": "SERVE_TUNER_TEST_KEY"} if source == "env" else {"api_key_file": str(key_file)}
    table: dict[str, object] = {"kind": kind, **ENGINE_OPTIONS[kind], **given}
    engine = create_engine(PluginSpec.model_validate(table))
    launch = engine.launch_spec({})
    assert engine.request_headers() == {"Authorization": f"Bearer {CANARY}"}
    assert launch.secret_values() == SERVER_GETS[kind]
    assert CANARY not in repr(launch) and CANARY not in launch.model_dump_json()
    assert CANARY not in " ".join(launch.command) and CANARY not in str(launch.env)


def test_a_key_file_others_can_read_or_that_is_missing_or_empty_is_refused_naming_the_fix(tmp_path: Path) -> None:
    from tuner.engines.vllm import VllmEngine, VllmOptions

    key_file = tmp_path / "key"
    with pytest.raises(ConfigError, match="does not exist"):
        VllmEngine(VllmOptions(model="m", api_key_file=str(key_file)))
    key_file.write_text(CANARY)
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"can be read by others \(mode 644\); run chmod 600 "):
        VllmEngine(VllmOptions(model="m", api_key_file=str(key_file)))
    key_file.write_text("\n\n")
    key_file.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        VllmEngine(VllmOptions(model="m", api_key_file=str(key_file)))
    with pytest.raises(ValueError, match="not both"):
        VllmOptions(model="m", api_key_file=str(key_file), api_key_env="SERVE_TUNER_TEST_KEY")


def test_vllm_refuses_a_key_on_its_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.engines.vllm import VllmEngine, VllmOptions

    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", CANARY)
    with pytest.raises(ConfigError, match="--api-key, which would show the key to every user"):
        VllmEngine(VllmOptions(model="m", api_key_env="SERVE_TUNER_TEST_KEY", extra_args=["--api-key", CANARY]))


LEAKY = DATA / "leaky_server.py"


def stand_in_binary(tmp_path: Path) -> Path:
    """llama-server's place taken by the stand-in that quotes the key it refuses."""
    binary = tmp_path / "leaky-llama-server"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{LEAKY}" "$@"\n')
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize(
    ("case", "overrides", "where_the_server_is_quoted"),
    [
        # The warm-up request gets `401 invalid api key Bearer <key>`: the loadgen's record, the trial's
        # fail_reason and the error line all quote the body.
        ("refused", ["gate.enabled=false"], '401, "message": "invalid api key Bearer <redacted>", "type"'),
        # The server logs its key and exits: the failed start quotes its log's last error line.
        ("dies", ['engine.extra_args=["--fail-at-start"]'], "server log: error: key <redacted> is not accepted"),
    ],
)  # fmt: skip
def test_a_key_the_server_quotes_back_is_never_printed_logged_or_stored(
    tmp_path: Path, case: str, overrides: list[str], where_the_server_is_quoted: str
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a stand-in's model")
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "tuner", "--log-level", "debug", "run", str(TINY), "--runs-dir", str(runs)]
    for override in [
        f'engine.binary="{stand_in_binary(tmp_path)}"',
        f'engine.model="{model}"',
        'engine.api_key_env="SERVE_TUNER_TEST_KEY"',
        "budget.trials=0",
        "confirm.top=0",
        *overrides,
    ]:
        command += ["--set", override]
    env = {**os.environ, "SERVE_TUNER_TEST_KEY": CANARY}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)

    assert done.returncode == 1, done.stderr[-2000:]
    error_line = done.stderr.strip().splitlines()[-1]
    assert (
        error_line.startswith("error: the baseline could not be measured: ")
        and where_the_server_is_quoted in error_line
    )
    assert "trial 0 FAIL " in done.stdout and where_the_server_is_quoted in done.stdout  # the marker, not nothing
    assert "DEBUG" in done.stderr  # the debug log really ran
    assert CANARY not in done.stdout + done.stderr
    assert CANARY.encode() not in everything_under(runs)
    journal = (runs / "tiny" / "optuna.journal").read_text().splitlines()
    stored = [json.loads(line) for line in journal]
    records = [entry["user_attr"][RECORD_KEY] for entry in stored if RECORD_KEY in entry.get("user_attr", {})]
    reasons = [record["fail_reason"] for record in records if record.get("fail_reason") is not None]
    assert len(reasons) == 1 and where_the_server_is_quoted in reasons[0]


@pytest.mark.parametrize(
    "pasted",
    [CANARY, "hf_5d4c3b2a19f84e7d6c5b4a3928170f6e", "0f1e2d3c4b5a69788796a5b4c3d2e1f00a1b2c3d", f"Bearer {CANARY}"],
)
def test_a_key_pasted_where_its_variables_name_belongs_is_refused_without_echoing_it(
    tmp_path: Path, pasted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    override = f"engine.api_key_env={json.dumps(pasted)}"
    assert main(["run", str(TINY), "--runs-dir", str(tmp_path), "--set", override]) == 2
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and "api_key_env: must name the environment variable" in printed.err
    assert (
        "not the key" in printed.err and "export the key as a variable and put the variable's name here" in printed.err
    )
    assert pasted not in printed.out + printed.err and pasted[-12:] not in printed.out + printed.err
    assert not list(tmp_path.rglob("*")) or pasted.encode() not in everything_under(tmp_path)


def test_a_key_file_that_is_no_file_or_holds_no_sendable_key_is_refused_in_one_line(tmp_path: Path) -> None:
    from tuner.engines.vllm import VllmEngine, VllmOptions

    fifo = tmp_path / "fifo"
    with fifo_nobody_may_open(fifo), pytest.raises(ConfigError, match="is a FIFO"):  # read, it would wait forever
        VllmEngine(VllmOptions(model="m", api_key_file=str(fifo)))
    with pytest.raises(ConfigError, match="not a file"):
        VllmEngine(VllmOptions(model="m", api_key_file="/dev/null"))
    key_file = tmp_path / "key"
    key_file.write_bytes(b"\xef\xbb\xbf" + CANARY.encode() + b"\r\n")  # a Windows editor's BOM and CRLF
    key_file.chmod(0o600)
    engine = VllmEngine(VllmOptions(model="m", api_key_file=str(key_file)))
    assert engine.request_headers() == {"Authorization": f"Bearer {CANARY}"}
    key_file.write_text("sk-caf\u00e9-canary-key\n")
    with pytest.raises(ConfigError, match="non-ASCII") as refused:
        VllmEngine(VllmOptions(model="m", api_key_file=str(key_file)))
    assert "caf" not in str(refused.value)
    pasted = "5f4dcc3b5aa765d61d8327deb882cf99"  # a key where its file's path belongs: refused, never shown
    with pytest.raises(ValidationError, match="not the key") as refused_path:
        VllmOptions(model="m", api_key_file=pasted)
    assert refused_path.value.errors()[0]["type"] == SECRET_REFUSED  # the kind the CLI never echoes


def test_a_relative_key_file_is_the_study_files_neighbour(tmp_path: Path) -> None:
    from tuner.config import StudySpec
    from tuner.search import prepare_study

    (tmp_path / "study").mkdir()
    key_file = tmp_path / "study" / "ollama.key"
    key_file.write_text(CANARY)
    key_file.chmod(0o600)
    spec = StudySpec.model_validate(
        {
            "name": "keyed",
            "engine": {"kind": "ollama", "model": "m", "api_key_file": "ollama.key"},
            "workload": {"path": str(DATA / "five-users.jsonl")},
            "search": {"space": str(Path(__file__).resolve().parents[2] / "search_spaces" / "ollama.toml"),
                       "params": ["num_parallel"]},
            "objectives": [{"metric": "ttft_p95_s", "direction": "minimize"}],
        }
    )  # fmt: skip
    engine = prepare_study(spec, tmp_path / "study").engine  # the working directory is elsewhere
    assert engine.request_headers() == {"Authorization": f"Bearer {CANARY}"}
