"""`tuner run STUDY --check` against the production-shaped systemd host (tests/support/systemd_host.py): a good
study passes and its duration estimate holds against the real run; each study broken in one way is
reported with its fix and a non-zero exit; and whatever it finds, the host is byte-identical afterwards:
the units' files, their processes' environment and argv, nothing of serve-tuner's under /run, no timer,
no lock."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port, run_tuner
from tests.support.quick import QUICK_ROUNDS
from tests.support.real_parts import need_real_part
from tests.support.systemd_host import (
    ENV_UNIT,
    UNIT,
    HostBaseline,
    SystemdHost,
    controller_env,
    host_baseline,
    operator_drop_in,
    stand_in_unit,
    study_file,
    sudo_login,
)
from tuner.deployers.systemd import SystemdDeployer

QUICK_STUDY = ["--set", "budget.trials=1", "--set", "confirm.top=0", *QUICK_ROUNDS]


@dataclass(frozen=True)
class WholeHost:
    """Everything --check must leave alone: both operator units as found, and nothing of serve-tuner's."""

    units: tuple[HostBaseline, ...]
    ours: str
    timers: str


def whole_host(host: SystemdHost) -> WholeHost:
    ours = host.run("sh", "-c", "find /run/serve-tuner /run/systemd/system -printf '%p %s\\n' 2>&1; true").stdout
    timers = host.run("systemctl", "list-units", "--all", "--type=timer", "--no-legend", "--plain", "--no-pager").stdout
    return WholeHost(units=tuple(host_baseline(host, unit) for unit in (UNIT, ENV_UNIT)), ours=ours, timers=timers)


@pytest.fixture
def untouched(systemd_host: SystemdHost) -> Iterator[WholeHost]:
    before = whole_host(systemd_host)
    yield before
    after = whole_host(systemd_host)
    assert after.units == before.units, "--check changed a unit's files or what its process runs"
    assert after.ours == before.ours, "--check left something under /run"
    assert after.timers == before.timers and "serve-tuner" not in after.timers, "--check armed a timer"


def check(study: Path, tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    done = run_tuner(
        "run", str(study), "--runs-dir", str(tmp_path / "runs"), "--check", *args, env=controller_env(tmp_path)
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists(), "--check made a run directory"
    return done.returncode, done.stdout.splitlines()


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


def the_one_failure(status: int, lines: list[str]) -> str:
    """A study broken one way: --check exits 1 and names exactly that one thing."""
    assert status == 1, "\n".join(lines)
    assert len(failures(lines)) == 1, "\n".join(lines)
    return failures(lines)[0]


@pytest.mark.real_server
@pytest.mark.measures
def test_a_good_study_passes_and_its_duration_estimate_holds_against_the_real_run(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    study = study_file(systemd_host, tmp_path)
    before = whole_host(systemd_host)
    status, lines = check(study, tmp_path, *QUICK_STUDY)
    assert whole_host(systemd_host) == before
    assert status == 0, "\n".join(lines)
    assert not failures(lines)
    shown = "\n".join(lines)
    assert (
        f"runs {systemd_host.binary}, model {systemd_host.model}, listening on 0.0.0.0:{systemd_host.server_port}"
        in shown
    )
    assert "ok    privileges: the login is root" in shown
    assert "nothing in llama-server.service overrides the tuned knobs" in shown
    assert "(the running server's own log)" in shown  # the restart measured from the host, not assumed
    (estimate,) = [line for line in lines if line.startswith("ok    duration:")]
    low_s, high_s, rounds, rounds_if_noisy = estimated_duration(estimate)

    started = time.monotonic()
    done = run_tuner(
        "run", str(study), "--runs-dir", str(tmp_path / "real"), *QUICK_STUDY, env=controller_env(tmp_path)
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    # The run measured the rounds of one of the estimate's two readings or a number between them, and took
    # no longer than 30% over the longer reading, no shorter than 30% under the shorter one.
    rounds_done = json.loads((tmp_path / "real" / "unit" / "progress.json").read_text())["rounds_done"]
    assert rounds <= rounds_done <= rounds_if_noisy, (estimate, rounds_done)
    assert 0.7 * low_s <= took <= 1.3 * high_s, f"{estimate}; the run took {took:.0f} s"


def estimated_duration(line: str) -> tuple[int, int, int, int]:
    """The `duration:` line's two readings: seconds, then rounds."""
    times = [int(m) * 60 + int(s) for m, s in re.findall(r"(\d+)m(\d+)s", line.partition(":")[2].partition(":")[0])]
    counts = re.search(r": (\d+) rounds(?:, or (\d+) if every trial is measured again as noisy)?", line)
    assert times and counts, line
    rounds = int(counts[1])
    return times[0], times[-1], rounds, int(counts[2] or rounds)


@pytest.mark.real_server
def test_the_environment_unit_is_read_where_its_own_lines_put_it(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    status, lines = check(study_file(systemd_host, tmp_path, unit=ENV_UNIT), tmp_path, *QUICK_STUDY)
    assert status == 0, "\n".join(lines)
    assert f"listening on {systemd_host.env_host}:{systemd_host.env_port}" in "\n".join(lines)


@pytest.mark.real_server
def test_a_login_without_a_sudo_right_the_deployer_needs_is_named(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    without = [name for name in SystemdDeployer.privileged_commands if name != "systemd-run"]
    user = sudo_login(systemd_host, "tuner-nosudo", without)
    study = study_file(systemd_host, tmp_path, user=user, sudo=True)
    status, lines = check(study, tmp_path, *QUICK_STUDY)
    line = the_one_failure(status, lines)
    assert "privileges: `sudo -n` refuses systemd-run; add them to the login's sudoers entry" in line


@pytest.mark.real_server
def test_a_missing_file_on_the_host_is_named_with_its_key(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    study = study_file(systemd_host, tmp_path, deploy='exec_start = "replace"')
    engine = f'binary = "{systemd_host.binary}"\nmodel = "/srv/models/missing.gguf"\nport = {systemd_host.server_port}'
    study.write_text(study.read_text().replace('kind = "llama-server"', f'kind = "llama-server"\n{engine}'))
    status, lines = check(study, tmp_path, *QUICK_STUDY)
    line = the_one_failure(status, lines)
    assert "engine.model: /srv/models/missing.gguf does not exist on the host; fix engine.model" in line


@pytest.mark.real_server
def test_a_flag_in_the_units_command_line_that_overrides_a_tuned_knob_is_named(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    command = f"{systemd_host.binary} -m {systemd_host.model} --host 0.0.0.0 --port {systemd_host.server_port}"
    with operator_drop_in(systemd_host, "aa-flags.conf", f"[Service]\nExecStart=\nExecStart={command} -b 2048\n"):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        assert whole_host(systemd_host) == before
    line = the_one_failure(status, lines)
    assert "knob n_batch: llama-server.service's ExecStart= passes -b, which decides n_batch" in line
    assert 'deploy.exec_start = "replace"' in line


@pytest.mark.real_server
def test_an_unpinned_host_key_is_named_with_the_command_that_pins_it(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    other = tmp_path / "other_known_hosts"
    other.write_text("")
    status, lines = check(study_file(systemd_host, tmp_path, known_hosts=str(other)), tmp_path, *QUICK_STUDY)
    line = the_one_failure(status, lines)
    assert line.startswith("FAIL  host:") and "tuner trust-host" in line


@pytest.mark.real_server
def test_a_unit_whose_server_answers_on_no_port_is_named(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """The unit runs, but nothing listens where its command line says (a wrapper that never serves)."""
    closed = 9  # discard: nothing on this machine serves HTTP there
    script = {"/usr/local/bin/silent-server": "sleep infinity\n"}
    silent = f"[Service]\nExecStart=\nExecStart=/bin/sh /usr/local/bin/silent-server --port {closed}\n"
    with operator_drop_in(systemd_host, "aa-silent.conf", silent, files=script):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        assert whole_host(systemd_host) == before
    line = the_one_failure(status, lines)
    assert "server: llama-server.service is active but nothing healthy answers on" in line


@pytest.mark.real_server
def test_a_tuned_knob_set_by_the_units_environment_file_is_named(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """systemd lets an EnvironmentFile= win over every Environment= line, the trial's drop-in included."""
    files = {"/etc/llama/batch.env": "LLAMA_ARG_BATCH=2048\n"}
    with operator_drop_in(systemd_host, "aa-batch.conf", "[Service]\nEnvironmentFile=/etc/llama/batch.env\n", files):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        assert whole_host(systemd_host) == before
    line = the_one_failure(status, lines)
    assert "knob n_batch: LLAMA_ARG_BATCH comes from llama-server.service's EnvironmentFile=" in line


@pytest.mark.real_server
def test_a_unit_another_controller_is_tuning_is_named(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    lock = "/run/serve-tuner/llama-server.service.lock"
    owner = json.dumps({"controller": "elsewhere", "pid": 4242, "beat": time.time()})
    made = systemd_host.run("test", "-d", "/run/serve-tuner", check=False).returncode != 0
    systemd_host.run("mkdir", "-p", lock)
    systemd_host.write(f"{lock}/owner.json", owner)
    try:
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
    finally:
        systemd_host.run("rm", "-rf", lock, *(["/run/serve-tuner"] if made else []))
    line = the_one_failure(status, lines)
    assert "lock: another serve-tuner (pid 4242 on elsewhere) is tuning llama-server.service" in line


@pytest.mark.real_server
def test_a_baseline_over_the_memory_budget_is_named_from_the_models_header_on_the_host(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    """The model is the unit's, on the host: its GGUF header is read from there (never its weights), so
    the memory pre-check runs before the night as for a local model."""
    study = study_file(systemd_host, tmp_path)
    status, lines = check(study, tmp_path, *QUICK_STUDY, "--set", "engine.memory_budget_gib=8")
    assert status == 0, "\n".join(lines)
    assert any(line.startswith("ok    memory: the baseline fits;") for line in lines), "\n".join(lines)
    status, lines = check(study, tmp_path, *QUICK_STUDY, "--set", "engine.memory_budget_gib=0.05")
    line = the_one_failure(status, lines)
    assert re.search(r"memory: the baseline's configuration needs 0\.\d\d GiB .*over the 0\.05 GiB budget", line)


EXAMPLES = Path(__file__).resolve().parents[2] / "studies"


def example_edits(systemd_host: SystemdHost, user: str) -> dict[str, str]:
    """The [host] lines of an example study marked EDIT, filled in for the test host and a plain login."""
    ssh = systemd_host.ssh_options(user=user)
    return {
        "host.host": json.dumps(ssh["host"]),
        "host.port": str(ssh["port"]),
        "host.user": json.dumps(user),
        "host.known_hosts": json.dumps(ssh["known_hosts"]),
        "host.client_keys": json.dumps(ssh["client_keys"]),
    }


def as_overrides(edits: dict[str, str]) -> list[str]:
    return [arg for key, value in edits.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.real_server
@pytest.mark.parametrize("example", ["llama-server-ssh-systemd.toml", "llama-server-ssh-systemd-lora.toml"])
def test_the_example_ssh_systemd_studies_pass_the_check_on_a_production_shaped_host(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path, example: str
) -> None:
    """The studies/ examples as an operator fills them in (the lines marked EDIT: the address, a plain
    login with sudo, the paths on the host), checked against a host laid out as production."""
    user = sudo_login(systemd_host, "tuner", SystemdDeployer.privileged_commands)
    edits = example_edits(systemd_host, user)
    if example.endswith("-lora.toml"):
        if systemd_host.run("test", "-f", systemd_host.adapter, check=False).returncode != 0:
            need_real_part("llama-server", "the test LoRA adapter is missing: run `tuner setup`")
        edits |= {
            "engine.binary": json.dumps(systemd_host.binary),
            "engine.model": json.dumps(systemd_host.model),
            "engine.lora_adapters.style": json.dumps(systemd_host.adapter),
            "engine.port": str(systemd_host.server_port),
            "engine.extra_args": "[]",
        }
    status, lines = check(EXAMPLES / example, tmp_path, *as_overrides(edits))
    assert status == 0, "\n".join(lines)
    assert "ok    privileges: `sudo -n` allows systemctl" in "\n".join(lines)


@pytest.mark.real_server
def test_the_ollama_and_vllm_systemd_examples_pass_the_check_on_their_units(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    """studies/ollama-ssh-systemd.toml (keep) and studies/vllm-ssh-systemd.toml (replace) against units
    that run the transcript stand-in (neither server can run here), as an operator's units would: the
    address each check reaches is the one the unit's own OLLAMA_HOST or `--port` gives. TRANSCRIPT-BASED."""
    user = sudo_login(systemd_host, "tuner", SystemdDeployer.privileged_commands)
    python, script = os.path.realpath(sys.executable), "/etc/serve-tuner-test/fake_engine_server.py"
    ollama_port, vllm_port = free_port(), free_port()
    ollama = f'Environment="OLLAMA_HOST=127.0.0.1:{ollama_port}"\nExecStart={python} {script} serve\n'
    with stand_in_unit(systemd_host, "ollama.service", ollama):
        status, lines = check(
            EXAMPLES / "ollama-ssh-systemd.toml", tmp_path, *as_overrides(example_edits(systemd_host, user))
        )
    assert status == 0, "\n".join(lines)
    assert f"listening on 127.0.0.1:{ollama_port}" in "\n".join(lines)
    model = "/srv/models/Qwen2.5-7B-Instruct"
    vllm = f"ExecStart={python} {script} serve {model} --port {vllm_port} --max-num-seqs 256\n"
    edits = example_edits(systemd_host, user) | {
        "engine.command": json.dumps([python, script, "serve"]),
        "engine.port": str(vllm_port),
        "engine.extra_args": "[]",
    }
    with stand_in_unit(systemd_host, "vllm.service", vllm):
        status, lines = check(EXAMPLES / "vllm-ssh-systemd.toml", tmp_path, *as_overrides(edits))
    assert status == 0, "\n".join(lines)
    assert f"model {model}, listening on 0.0.0.0:{vllm_port}" in "\n".join(lines)


@pytest.mark.real_server
def test_a_unit_the_host_does_not_have_is_named(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    study = study_file(systemd_host, tmp_path, unit="llama.service")
    line = the_one_failure(*check(study, tmp_path, *QUICK_STUDY))
    assert "unit llama.service: the host has no such unit (not-found); set deploy.unit" in line


@pytest.mark.real_server
def test_a_stopped_unit_is_read_from_its_own_lines_and_left_stopped(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """The environment unit stopped: its address comes from its Environment= lines as systemd shows them,
    the study would start it, and --check leaves it stopped."""
    systemd_host.run("systemctl", "stop", ENV_UNIT)
    try:
        status, lines = check(study_file(systemd_host, tmp_path, unit=ENV_UNIT), tmp_path, *QUICK_STUDY)
        assert systemd_host.show("ActiveState", unit=ENV_UNIT)["ActiveState"] == "inactive"
    finally:
        systemd_host.run("systemctl", "start", ENV_UNIT)
        systemd_host.wait_active(unit=ENV_UNIT)
    assert status == 0, "\n".join(lines)
    shown = "\n".join(lines)
    assert f"unit {ENV_UNIT}: inactive; runs {systemd_host.binary}, model {systemd_host.model}" in shown
    assert f"listening on {systemd_host.env_host}:{systemd_host.env_port}" in shown
    assert f"server: {ENV_UNIT} is inactive: the study starts it" in shown


@pytest.mark.real_server
def test_a_plain_login_without_sudo_is_named_with_the_fix(
    systemd_host: SystemdHost, untouched: WholeHost, tmp_path: Path
) -> None:
    user = sudo_login(systemd_host, "tuner", SystemdDeployer.privileged_commands)
    study = study_file(systemd_host, tmp_path, user=user, sudo=False)
    lines = check(study, tmp_path, *QUICK_STUDY)[1]
    (line,) = [line for line in failures(lines) if "privileges" in line]
    assert "the login is not root and host.sudo is false; set host.sudo = true" in line


@pytest.mark.real_server
def test_an_operator_drop_in_sorting_after_the_trials_is_named(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """systemd reads drop-ins in name order: one after serve-tuner's that sets a tuned variable wins."""
    with operator_drop_in(systemd_host, "zzz-site.conf", "[Service]\nEnvironment=LLAMA_ARG_BATCH=64\n"):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        assert whole_host(systemd_host) == before
    line = the_one_failure(status, lines)
    assert "operator drop-ins:" in line and "zzz-site.conf sorts after serve-tuner's zz-tuner.conf" in line


@pytest.mark.real_server
def test_a_baseline_value_the_search_space_lacks_is_named_with_the_fix(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """The baseline is what the unit runs: a value outside the search space (LLAMA_ARG_BATCH=1024 where the
    space holds 64 and 2048) could not be a point of the search, and the check says how to make it one."""
    with operator_drop_in(systemd_host, "aa-batch.conf", "[Service]\nEnvironment=LLAMA_ARG_BATCH=1024\n"):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        assert whole_host(systemd_host) == before
    line = the_one_failure(status, lines)
    assert "baseline: the server runs n_batch=1024 (LLAMA_ARG_BATCH in llama-server.service's Environment=" in line
    assert "add 1024 to n_batch's values in" in line


@pytest.mark.real_server
def test_a_key_the_server_refuses_fails_the_check_with_a_real_request_and_the_right_one_passes(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """/health answers without a key, so only a request as the study sends them finds that the operator's
    llama-server wants one: without it, and with a wrong one, --check fails naming the fix; with it, passes."""
    key = "sk-operator-7f3e1c9a5b2d4e6f8a0c"
    drop_in = f'[Service]\nEnvironment="LLAMA_API_KEY={key}"\n'
    with operator_drop_in(systemd_host, "aa-key.conf", drop_in):
        before = whole_host(systemd_host)
        status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY)
        line = the_one_failure(status, lines)
        assert "the server refused the request (HTTP 401" in line and "set engine.api_key_env" in line, line
        wrong = ["--set", 'engine.api_key_env="SERVE_TUNER_TEST_KEY"']
        os.environ["SERVE_TUNER_TEST_KEY"] = "sk-wrong-0000000000000000"
        try:
            status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY, *wrong)
            assert "is not the server's" in the_one_failure(status, lines)
            os.environ["SERVE_TUNER_TEST_KEY"] = key
            status, lines = check(study_file(systemd_host, tmp_path), tmp_path, *QUICK_STUDY, *wrong)
        finally:
            del os.environ["SERVE_TUNER_TEST_KEY"]
        assert status == 0, "\n".join(lines)
        assert "ok    request: answered POST /completion with the study's model name and key" in "\n".join(lines)
        assert key not in "\n".join(lines)
        assert whole_host(systemd_host) == before
