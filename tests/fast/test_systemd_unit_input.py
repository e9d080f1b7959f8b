"""What the systemd deployer refuses before it reaches a host (a bad unit name, a control character,
flags the unit lacks in keep mode, paths that mean nothing there) and how it writes and reads values
(quoted so systemd expands nothing; `systemctl show` environment read back exactly)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import run_tuner
from tests.support.systemd_host import (
    SystemdHost,
    controller_env,
    study_file,
)
from tuner.deployers.systemd import (
    SystemdOptions,
    check_kept_command,
    parse_show_environment,
    quote_unit_word,
    render_drop_in,
)
from tuner.errors import ConfigError
from tuner.models import LaunchSpec


def test_values_are_quoted_so_systemd_expands_nothing() -> None:
    assert quote_unit_word('a "b" \\ 100% $HOME', in_exec=False, what="x") == '"a \\"b\\" \\\\ 100%% $HOME"'
    assert quote_unit_word("$HOME %h", in_exec=True, what="x") == '"$$HOME %%h"'


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "nul\0", "tab\there", "\x1b[31m"])
def test_a_control_character_is_refused_naming_the_variable(value: str) -> None:
    launch = LaunchSpec(executable="/bin/x", env={"LLAMA_ARG_BATCH": value}, port=1)
    with pytest.raises(ConfigError, match=r"LLAMA_ARG_BATCH.*control character"):
        render_drop_in(launch, exec_start="keep", note="t")


def test_flags_the_units_command_lacks_need_the_replace_mode_and_an_absolute_executable() -> None:
    launch = LaunchSpec(executable="llama-server", args=("--lora-scaled", "a.gguf:0"), port=1)
    shown = "{ path=/usr/bin/llama-server ; argv[]=/usr/bin/llama-server -m m.gguf ; ignore_errors=no ; pid=0 }"
    with pytest.raises(ConfigError, match='exec_start = "replace"'):
        check_kept_command(launch, shown)
    with pytest.raises(ConfigError, match="absolute path"):
        render_drop_in(launch, exec_start="replace", note="t")
    # Ollama's `serve` is already what the unit runs: keep needs nothing more.
    ollama = LaunchSpec(executable="ollama", args=("serve",), port=1)
    check_kept_command(ollama, "{ path=/usr/local/bin/ollama ; argv[]=/usr/local/bin/ollama serve ; pid=0 }")


def test_a_bad_unit_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"NAME\.service"):
        SystemdOptions(unit="llama; rm -rf /")


def test_systemctl_show_environment_is_read_back_exactly() -> None:
    shown = 'LLAMA_ARG_THREADS=1 "A=x y" "B=q\\"uo\\\\te" C=100% "D=\\$(id)" "E=\\`x\\`;"'
    assert parse_show_environment(shown) == {
        "LLAMA_ARG_THREADS": "1", "A": "x y", "B": 'q"uo\\te', "C": "100%", "D": "$(id)", "E": "`x`;",
    }  # fmt: skip


# ---- against the real host --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deploy", "engine", "refusal"),
    [
        ('exec_start = "replace"', "", r'engine\.binary = "auto" means a file of this machine\'s'),
        ("", 'model = "/srv/models/other.gguf"', r"engine\.model is the operator's own"),
    ],
)
def test_paths_that_mean_nothing_on_the_host_are_refused_before_it_is_reached(
    tmp_path: Path, deploy: str, engine: str, refusal: str
) -> None:
    """`auto` is this machine's build: on another host with the study's own command line it is refused;
    with the unit's own command line a model of the study's would be ignored, and is refused too. One
    line, exit 2, no run directory, and no host is reached (the address is a closed port)."""
    host = SystemdHost(pid=0, ssh_port=1, server_port=1, known_hosts=tmp_path / "known_hosts",
                       client_key=tmp_path / "key", env_port=1)  # fmt: skip
    study = study_file(host, tmp_path, deploy=deploy)
    study.write_text(study.read_text().replace('kind = "llama-server"', f'kind = "llama-server"\n{engine}'))
    done = run_tuner("run", str(study), "--runs-dir", str(tmp_path / "runs"), env=controller_env(tmp_path))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert re.search(refusal, line), line
    assert not (tmp_path / "runs").exists()
