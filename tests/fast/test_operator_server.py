"""Whose command line starts the server decides what a trial writes and what `auto` means: the operator's
unit (systemd `keep`) keeps its own program, model, address and port, and the trial carries the tuned
knobs alone; the study's own command on another host needs the host's paths; only a server started here
may use this machine's build. No real part: the engines' launches and the rules that read a unit back."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support import run_tuner
from tuner.config import PluginSpec, StudySpec
from tuner.deployers.base import check_launch, running_values, server_command
from tuner.engines import create_engine
from tuner.engines.llama_server import LLAMA_SERVER_LISTEN
from tuner.engines.ollama import OLLAMA_LISTEN
from tuner.engines.vllm import VLLM_LISTEN
from tuner.errors import ConfigError
from tuner.models import OperatorServer, ServerCommand
from tuner.search import prepare_study
from tuner.transports.local import LocalTransport
from tuner.trial_runner import PreparedStudy

DATA = Path(__file__).resolve().parents[1] / "data"
SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def spec(table: Mapping[str, object]) -> PluginSpec:
    return PluginSpec.model_validate(table)


# ---- reading the operator's server back from its command line and environment ---------------------


def test_llama_server_flags_win_over_its_variables_and_the_defaults_fill_the_rest() -> None:
    argv = ["/opt/llama/bin/llama-server", "-m", "/srv/models/a.gguf", "--host", "0.0.0.0", "--port=9001"]
    environ = {"LLAMA_ARG_HOST": "127.0.0.1", "LLAMA_ARG_PORT": "8081", "LLAMA_ARG_MODEL": "/srv/other.gguf"}
    server = LLAMA_SERVER_LISTEN.read(argv, environ)
    assert server == OperatorServer(
        program="/opt/llama/bin/llama-server", model="/srv/models/a.gguf", host="0.0.0.0", port=9001
    )
    assert server.reach_host == "127.0.0.1"  # every interface: reached on the host's loopback
    by_environment = LLAMA_SERVER_LISTEN.read(["/opt/llama/bin/llama-server"], environ)
    assert (by_environment.host, by_environment.port, by_environment.model) == ("127.0.0.1", 8081, "/srv/other.gguf")
    bare = LLAMA_SERVER_LISTEN.read(["llama-server"], {})
    assert (bare.host, bare.port, bare.model) == ("127.0.0.1", 8080, None)


@pytest.mark.parametrize(
    ("ollama_host", "host", "port"),
    [
        (None, "127.0.0.1", 11434),
        ("0.0.0.0", "0.0.0.0", 11434),
        ("0.0.0.0:8000", "0.0.0.0", 8000),
        (" 0.0.0.0:1234 ", "0.0.0.0", 1234),  # Ollama trims spaces
        ("http://10.1.2.3:9000", "10.1.2.3", 9000),
        ("http://0.0.0.0", "0.0.0.0", 80),  # a scheme without a port: its own port, as Ollama does
        ("https://gpu1.example/", "gpu1.example", 443),
        ("[::1]:9000", "::1", 9000),
        ("::1", "::1", 11434),  # a bare IPv6 address is the host, whole
        ("http://[::1]:x", "::1", 80),  # a port that is no number: the default, as Ollama does
        (":9000", "127.0.0.1", 9000),
    ],
)
def test_ollama_reads_its_address_from_ollama_host_as_ollama_does(
    ollama_host: str | None, host: str, port: int
) -> None:
    environ = {} if ollama_host is None else {"OLLAMA_HOST": ollama_host}
    server = OLLAMA_LISTEN.read(["/usr/local/bin/ollama", "serve"], environ)
    assert (server.host, server.port) == (host, port)


def test_an_ipv6_address_is_written_and_reached_in_brackets() -> None:
    server = LLAMA_SERVER_LISTEN.read(["llama-server", "--host", "::1", "--port", "9000"], {})
    assert server.address == "[::1]:9000" and server.reach_host == "::1"
    assert asyncio.run(LocalTransport().reach("::1", 9000)) == "http://[::1]:9000"


def test_vllm_takes_the_model_after_serve_and_listens_everywhere_by_default() -> None:
    server = VLLM_LISTEN.read(["/opt/vllm/bin/vllm", "serve", "Qwen/Qwen3-8B", "--max-num-seqs", "64"], {})
    assert (server.model, server.host, server.port, server.reach_host) == (
        "Qwen/Qwen3-8B",
        "0.0.0.0",
        8000,
        "127.0.0.1",
    )


@pytest.mark.parametrize("port", ["http", "99999", "0", "-1"])
def test_a_port_that_is_no_port_number_is_refused(port: str) -> None:
    with pytest.raises(ValueError):
        LLAMA_SERVER_LISTEN.read(["llama-server", "--port", port], {})


def test_a_flag_given_last_without_its_value_leaves_the_default() -> None:
    assert LLAMA_SERVER_LISTEN.read(["llama-server", "--port"], {}).port == 8080


# ---- whose command: decided by the deploy kind and where the host is ---------------------------------


@pytest.mark.parametrize(
    ("deploy", "local_host", "expected"),
    [
        ({"kind": "systemd", "unit": "llama-server.service"}, False, ServerCommand.UNIT),
        ({"kind": "systemd", "unit": "llama-server.service"}, True, ServerCommand.UNIT),
        ({"kind": "systemd", "unit": "llama-server.service", "exec_start": "replace"}, False, ServerCommand.REMOTE),
        ({"kind": "systemd", "unit": "llama-server.service", "exec_start": "replace"}, True, ServerCommand.LOCAL),
        ({"kind": "container", "container": "vllm"}, True, ServerCommand.REMOTE),
        ({"kind": "process"}, True, ServerCommand.LOCAL),
        ({"kind": "process"}, False, ServerCommand.REMOTE),
    ],
)
def test_the_deploy_says_whose_command_starts_the_server(
    deploy: dict[str, object], local_host: bool, expected: ServerCommand
) -> None:
    assert server_command(spec(deploy), local_host=local_host) is expected


# ---- what a trial carries --------------------------------------------------------------------------


def test_with_the_units_command_a_trial_carries_the_tuned_knobs_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", "sk-test-0123456789abcdef")
    engine = create_engine(
        spec({"kind": "llama-server", "api_key_env": "SERVE_TUNER_TEST_KEY", "settings": {"ctx_size": 4096}}),
        command=ServerCommand.UNIT,
    )
    launch = engine.launch_spec({"n_batch": 128, "n_ubatch": 128})
    assert launch.env == {"LLAMA_ARG_CTX_SIZE": "4096", "LLAMA_ARG_BATCH": "128", "LLAMA_ARG_UBATCH": "128"}
    assert launch.secret_env == {}  # the unit's own key stays; the requests still carry the study's
    assert engine.request_headers() == {"Authorization": "Bearer sk-test-0123456789abcdef"}
    assert launch.listen == LLAMA_SERVER_LISTEN
    assert engine.host_files() == {}  # nothing of the study's to look for on the host
    ollama = create_engine(spec({"kind": "ollama", "model": "llama3.2:3b"}), command=ServerCommand.UNIT)
    assert ollama.launch_spec({"num_parallel": 4}).env == {"OLLAMA_NUM_PARALLEL": "4"}


def test_a_server_started_here_still_gets_its_model_address_and_metrics() -> None:
    engine = create_engine(spec({"kind": "llama-server", "binary": "/bin/true", "model": "/srv/m.gguf"}))
    env = engine.launch_spec({"n_batch": 64}).env
    assert env["LLAMA_ARG_MODEL"] == "/srv/m.gguf" and env["LLAMA_ARG_HOST"] == "127.0.0.1"
    assert env["LLAMA_ARG_ENDPOINT_METRICS"] == "1" and env["LLAMA_ARG_BATCH"] == "64"


@pytest.mark.parametrize("key", ["binary", "model", "host", "port"])
def test_the_operators_program_model_and_address_are_refused_in_the_study_with_keep(key: str) -> None:
    value: object = 8080 if key == "port" else "/opt/x" if key != "host" else "0.0.0.0"
    with pytest.raises(ConfigError, match=rf'engine\.{key} is the operator\'s own: .*remove engine\.{key}.*"replace"'):
        create_engine(spec({"kind": "llama-server", key: value}), command=ServerCommand.UNIT)


@pytest.mark.parametrize("key", ["binary", "model"])
def test_auto_is_refused_for_a_command_run_on_another_host(key: str) -> None:
    table = {"kind": "llama-server", "binary": "/opt/llama/bin/llama-server", "model": "/srv/m.gguf", key: "auto"}
    with pytest.raises(ConfigError, match=rf'engine\.{key} = "auto" means a file of this machine\'s'):
        create_engine(spec(table), command=ServerCommand.REMOTE)
    relative = table | {key: "models/m.gguf"}
    with pytest.raises(
        ConfigError, match=rf"engine\.{key} = 'models/m\.gguf' is relative: .*absolute path on the host"
    ):
        create_engine(spec(relative), command=ServerCommand.REMOTE)
    adapters = {"kind": "llama-server", "lora_adapters": {"style": "auto"}}
    with pytest.raises(ConfigError, match=r'engine\.lora_adapters\.style = "auto"'):
        create_engine(spec(adapters), command=ServerCommand.UNIT)


def test_a_vllm_command_that_systemd_cannot_run_is_refused_naming_engine_command() -> None:
    deploy = spec({"kind": "systemd", "unit": "vllm.service", "exec_start": "replace"})
    engine = create_engine(spec({"kind": "vllm", "model": "Qwen/Qwen3-8B"}), command=ServerCommand.REMOTE)
    with pytest.raises(ConfigError, match=r"absolute path on the host.*engine\.command"):
        check_launch(deploy, engine.launch_spec({}))
    absolute = create_engine(
        spec({"kind": "vllm", "model": "Qwen/Qwen3-8B", "command": ["/opt/vllm/bin/vllm", "serve"]}),
        command=ServerCommand.REMOTE,
    )
    check_launch(deploy, absolute.launch_spec({}))


def test_a_launch_systemd_cannot_run_is_refused_before_the_host_is_reached(tmp_path: Path) -> None:
    """vLLM's default command is `vllm serve`, which ExecStart= cannot run without a path: `tuner run`
    says so in one line, exit 2, with no run directory, and never reaches the host (a closed port)."""
    (tmp_path / "w.jsonl").write_text((DATA / "quick.jsonl").read_text())
    (tmp_path / "vllm.toml").write_text(
        'name = "v"\n[engine]\nkind = "vllm"\nmodel = "Qwen/Qwen3-8B"\n[engine.settings]\nmax_num_seqs = 16\n'
        "max_num_batched_tokens = 2048\n"
        f'[workload]\npath = "w.jsonl"\n[search]\nspace = "{SPACES / "vllm.toml"}"\nparams = ["max_num_seqs"]\n'
        '[[objectives]]\nmetric = "ttft_p95_s"\ndirection = "minimize"\n'
        '[host]\nkind = "ssh"\nhost = "127.0.0.1"\nport = 1\n'
        '[deploy]\nkind = "systemd"\nunit = "vllm.service"\nexec_start = "replace"\n'
    )
    done = run_tuner("run", str(tmp_path / "vllm.toml"), "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "absolute path on the host" in line and "engine.command" in line
    assert not (tmp_path / "runs").exists()


# ---- the baseline is what the operator's server runs (keep) ---------------------------------------


def _prepared(engine: dict[str, object], space: str, params: list[str]) -> PreparedStudy:
    study = StudySpec.model_validate(
        {
            "name": "baseline-read",
            "engine": engine,
            "deploy": {"kind": "systemd", "unit": "server.service"},
            "workload": {"path": str(DATA / "five-users.jsonl")},
            "search": {"space": str(SPACES / space), "params": params},
            "objectives": [{"metric": "ttft_p95_s", "direction": "minimize"}],
        }
    )
    return prepare_study(study, DATA)


def test_an_ollama_override_conf_value_is_the_baselines_not_ollamas_default() -> None:
    # Ollama's FAQ: `systemctl edit ollama.service` writes Environment="OLLAMA_NUM_PARALLEL=4".
    prepared = _prepared({"kind": "ollama", "model": "m"}, "ollama.toml", ["num_parallel", "keep_alive"])
    assert prepared.baseline_settings["num_parallel"] == 1  # the space's default, before the host is read
    found = running_values(
        ["/usr/local/bin/ollama", "serve"],
        {"OLLAMA_NUM_PARALLEL": "4", "HOME": "/usr/share/ollama"},
        prepared.tuned_knobs(),
        env_source=lambda env: f"{env} in ollama.service's Environment=",
    )
    read, said = prepared.with_running_values(found)
    assert read.baseline_settings == {"num_parallel": 4, "keep_alive": "5m"}
    assert said == [
        "num_parallel=4 (OLLAMA_NUM_PARALLEL in ollama.service's Environment=)",
        "keep_alive=5m (set nowhere: the server's default)",
    ]
    assert read.searched_values({}) == {"num_parallel": 4, "keep_alive": "5m"}  # a proposal of 4 is the baseline


def test_a_flag_on_the_units_command_line_decides_over_its_variable_and_booleans_read_as_the_server_does() -> None:
    prepared = _prepared(
        {"kind": "llama-server"},
        "llama-server.toml",
        ["n_batch", "n_ubatch", "kv_unified"],
    )
    argv = ["/opt/llama-server", "-m", "/m.gguf", "-ub", "256", "--kv-unified", "--batch-size=1024"]
    found = running_values(argv, {"LLAMA_ARG_UBATCH": "64"}, prepared.tuned_knobs(), env_source=str)
    read, said = prepared.with_running_values(found)
    assert read.baseline_settings == {"n_batch": 1024, "n_ubatch": 256, "kv_unified": True}
    assert "n_ubatch=256 (the command line's -ub)" in said
    negated = running_values(["/opt/llama-server", "--no-kv-unified"], {}, prepared.tuned_knobs(), env_source=str)
    assert prepared.with_running_values(negated)[0].baseline_settings["kv_unified"] is False
    # A value the server would not read as a number is said, and the baseline keeps the default.
    garbled = running_values(["/opt/llama-server", "-b", "lots"], {}, prepared.tuned_knobs(), env_source=str)
    read, said = prepared.with_running_values(garbled)
    assert read.baseline_settings["n_batch"] == prepared.baseline_settings["n_batch"]
    assert any(line.startswith("n_batch: cannot read the command line's -b") for line in said), said


def test_a_knob_the_study_fixes_in_engine_settings_is_the_studys_in_the_baseline_too() -> None:
    prepared = _prepared(
        {"kind": "ollama", "model": "m", "settings": {"num_parallel": 2}}, "ollama.toml", ["num_parallel"]
    )
    found = running_values(["ollama", "serve"], {"OLLAMA_NUM_PARALLEL": "4"}, prepared.tuned_knobs(), env_source=str)
    read, said = prepared.with_running_values(found)
    assert read.baseline_settings == {"num_parallel": 2} and said == []


def test_boolean_flags_take_no_value_and_every_negation_clears_them() -> None:
    prepared = _prepared({"kind": "llama-server"}, "llama-server.toml", ["kv_unified", "n_batch"])
    tuned = prepared.tuned_knobs()
    # A bare flag before another: not its value; `-b` after it still read.
    found = running_values(["/opt/llama-server", "--kv-unified", "-b", "256"], {}, tuned, env_source=str)
    assert prepared.with_running_values(found)[0].baseline_settings == {"kv_unified": True, "n_batch": 256}
    vllm = _prepared({"kind": "vllm", "model": "m"}, "vllm.toml", ["enable_prefix_caching"])
    argv = ["vllm", "serve", "--enable-prefix-caching", "Qwen/Qwen2", "--no-enable-prefix-caching"]
    found = running_values(argv, {}, vllm.tuned_knobs(), env_source=str)
    assert [(v.text, v.source) for v in found] == [("false", "the command line's --no-enable-prefix-caching")]


def test_a_value_the_search_space_does_not_hold_or_the_server_would_not_read_is_named() -> None:
    prepared = _prepared({"kind": "ollama", "model": "m"}, "ollama.toml", ["num_parallel"])
    tuned = prepared.tuned_knobs()
    outside = running_values(["ollama", "serve"], {"OLLAMA_NUM_PARALLEL": "3"}, tuned, env_source=str)
    with pytest.raises(ConfigError, match=r"num_parallel=3 .*add 3 to num_parallel's values in"):
        prepared.with_running_values(outside)
    quoted = running_values(["ollama", "serve"], {"OLLAMA_NUM_PARALLEL": "'4'"}, tuned, env_source=str)
    assert prepared.with_running_values(quoted)[0].baseline_settings == {"num_parallel": 4}  # as Ollama reads it
    for text in ("1_0", "\uff14", "four"):  # the last but one: a fullwidth 4
        garbled = running_values(["ollama", "serve"], {"OLLAMA_NUM_PARALLEL": text}, tuned, env_source=str)
        read, said = prepared.with_running_values(garbled)
        assert read.baseline_settings == {"num_parallel": 1} and "cannot read" in said[0], (text, said)


def test_a_searched_knob_the_engines_options_cannot_carry_is_refused_before_the_host() -> None:
    with pytest.raises(ConfigError, match=r"params\.num_batch: num_batch reaches Ollama only through its native API"):
        _prepared({"kind": "ollama", "model": "m", "api": "openai"}, "ollama.toml", ["num_batch"])
