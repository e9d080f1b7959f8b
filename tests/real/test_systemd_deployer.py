"""The systemd deployer against a real systemd (PID 1 of a PID namespace, on an overlay root, reached
through a real sshd inside it), with the operator's real llama-server unit. Every scenario ends with
`assert_baseline`: no file of ours left, every other file byte-identical, the operator's environment
back, the server healthy and answering a completion."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from tests.support import free_port, run_tuner
from tests.support.quick import QUICK_ROUNDS
from tests.support.real_parts import need_real_part
from tests.support.systemd_host import (
    ENV_UNIT,
    UNIT,
    HostBaseline,
    SystemdHost,
    assert_baseline,
    controller_env,
    host_baseline,
    operator_drop_in,
    running_argv,
    stand_in_unit,
    study_file,
    sudo_login,
)
from tuner.deployers.systemd import (
    SystemdDeployer,
    SystemdOptions,
    parse_show_environment,
    render_drop_in,
)
from tuner.engines.base import Engine
from tuner.engines.llama_server import LLAMA_SERVER_KNOBS, LLAMA_SERVER_LISTEN
from tuner.errors import ConfigError, DeployError, ServerNotReady, StudyError, TunerError
from tuner.faults import CRASH_POINTS
from tuner.models import LaunchSpec, OperatorServer, RequestRecord
from tuner.study_record import TrialRecord
from tuner.transports.base import CommandResult
from tuner.transports.ssh import SshOptions, SshTransport

RUNTIME_DROP_IN = "/run/systemd/system/llama-server.service.d/zz-tuner.conf"


# ---- the drop-in's text, without a host ------------------------------------------------------


def _deployer(host: SystemdHost, **options: object) -> tuple[SshTransport, SystemdDeployer]:
    return _deployer_for(host, host.unit, **options)


def _deployer_for(host: SystemdHost, unit: str, **options: object) -> tuple[SshTransport, SystemdDeployer]:
    transport = SshTransport(SshOptions.model_validate(host.ssh_options()))
    return transport, SystemdDeployer(SystemdOptions(unit=unit, **options), transport=transport)  # type: ignore[arg-type]


def _launch(host: SystemdHost, **settings: str) -> LaunchSpec:
    """A trial as the llama-server engine makes it for the operator's unit: the tuned variables alone, and
    how to read where the unit's server listens (its model, address and port stay the operator's)."""
    return LaunchSpec(executable=host.binary, env=settings, port=0, listen=LLAMA_SERVER_LISTEN)


def _replacing_launch(host: SystemdHost, *args: str, **settings: str) -> LaunchSpec:
    """A trial whose drop-in replaces the unit's ExecStart= (`exec_start = "replace"`): the study's own
    command line, with the host's paths, on the operator's port."""
    command = ("-m", host.model, "--host", "127.0.0.1", "--port", str(host.server_port), *args)
    return LaunchSpec(executable=host.binary, args=command, env=settings, port=host.server_port)


@pytest.fixture
def baseline(systemd_host: SystemdHost) -> Iterator[HostBaseline]:
    """The unit before the test; after it, the host must be exactly on it again."""
    before = host_baseline(systemd_host)
    yield before
    assert_baseline(systemd_host, before)


@pytest.mark.real_server
def test_a_trial_runs_exactly_its_settings_and_the_baseline_comes_back(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: object
) -> None:
    pid_before = systemd_host.main_pid()
    launch = _launch(systemd_host, LLAMA_ARG_BATCH="64", LLAMA_ARG_UBATCH="64")

    async def scenario() -> tuple[int, int, int, str, str | None]:
        transport, deployer = _deployer(systemd_host, start_timeout_s=120)  # a server not reached fails soon
        async with transport, deployer:
            deployment = await deployer.apply(launch, log_path=f"{tmp_path}/server.log")
            environment = systemd_host.process_environment()
            assert environment["LLAMA_ARG_BATCH"] == "64" and environment["LLAMA_ARG_THREADS"] == "1"
            assert systemd_host.read(RUNTIME_DROP_IN) is not None
            again = await deployer.apply(launch, log_path=f"{tmp_path}/server.log")
            log, _ = await deployer.read_log(0)
            alive = await deployer.check_alive()
            # P6: someone edits our drop-in by hand. The same settings applied again must not be taken
            # as already running: the file and the service disagree until it is rewritten and restarted.
            systemd_host.run("sh", "-c", f"echo Environment=LLAMA_ARG_BATCH=999 >> {RUNTIME_DROP_IN}")
            third = await deployer.apply(launch, log_path=f"{tmp_path}/server.log")
            assert systemd_host.process_environment()["LLAMA_ARG_BATCH"] == "64"
            assert systemd_host.show("NeedDaemonReload")["NeedDaemonReload"] == "no"
            return deployment.pid or 0, again.pid or 0, third.pid or 0, log, alive

    first, second, third, log, alive = asyncio.run(scenario())
    assert first not in (0, pid_before)
    assert second == first, "the same settings applied twice restarted the server"
    assert third != first, "a hand-edited drop-in was taken for the running settings"
    assert alive is None
    assert "listening on" in log  # the server's own log, from the journal of this invocation


@pytest.mark.real_server
def test_a_config_that_cannot_start_fails_fast_with_the_reason_even_at_the_start_limit(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: object
) -> None:
    """A bad value makes llama-server exit at once; Restart=on-failure then restarts it until systemd's
    start limit; the trial fails with the reason, and reset-failed lets the baseline start again."""

    async def scenario() -> tuple[str, float]:
        transport, deployer = _deployer(systemd_host, start_timeout_s=60)
        async with transport, deployer:
            started = time.monotonic()
            with pytest.raises(ServerNotReady) as failure:
                await deployer.apply(
                    _launch(systemd_host, LLAMA_ARG_CACHE_TYPE_K="not-a-type"), log_path=f"{tmp_path}/s.log"
                )
            took = time.monotonic() - started
            deadline = time.monotonic() + 30
            # Restart=on-failure goes on until StartLimitBurst: then the unit stays failed, and only
            # reset-failed lets anything (our restore included) start it again.
            while systemd_host.show("ActiveState")["ActiveState"] != "failed":
                assert time.monotonic() < deadline, systemd_host.show("ActiveState", "Result", "NRestarts")
                await asyncio.sleep(0.5)
            return str(failure.value), took

    reason, took = asyncio.run(scenario())
    assert "llama-server.service" in reason and ("exit" in reason or "failed" in reason)
    assert took < 30


@pytest.mark.real_server
def test_an_operator_drop_in_sorting_after_ours_that_sets_a_tuned_key_is_refused(
    systemd_host: SystemdHost, tmp_path: object
) -> None:
    site = "/etc/systemd/system/llama-server.service.d/zzz-site.conf"
    systemd_host.run("sh", "-c", f"printf '[Service]\\nEnvironment=LLAMA_ARG_BATCH=1024\\n' > {site}")
    systemd_host.run("systemctl", "daemon-reload")
    try:
        files = systemd_host.unit_files()

        async def scenario() -> None:
            transport, deployer = _deployer(systemd_host)
            async with transport, deployer:
                await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")

        with pytest.raises(DeployError, match=r"zzz-site\.conf sorts after"):
            asyncio.run(scenario())
        assert systemd_host.read(RUNTIME_DROP_IN) is None and systemd_host.unit_files() == files
    finally:
        systemd_host.run("rm", "-f", site)
        systemd_host.run("systemctl", "daemon-reload")


@pytest.mark.real_server
def test_a_second_controller_is_refused_and_a_dead_ones_leftovers_are_restored_first(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: object
) -> None:
    async def two_at_once() -> None:
        transport, deployer = _deployer(systemd_host)
        other_transport, other = _deployer(systemd_host)
        async with transport, deployer, other_transport:
            with pytest.raises(StudyError, match="another serve-tuner"):
                await other.__aenter__()

    asyncio.run(two_at_once())

    # A controller SIGKILLed mid-trial: its drop-in is in place and its lock names a process that is gone.
    systemd_host.run(
        "sh", "-c",
        f"mkdir -p /run/serve-tuner/llama-server.service.lock && "
        f"printf '{{\"controller\": \"%s\", \"pid\": 999999999, \"beat\": 0}}' \"$(hostname)\" "
        f"> /run/serve-tuner/llama-server.service.lock/owner.json && "
        "mkdir -p /run/systemd/system/llama-server.service.d && "
        f"printf '[Service]\\nEnvironment=LLAMA_ARG_BATCH=32\\n' > {RUNTIME_DROP_IN} && "
        "systemctl daemon-reload && systemctl restart llama-server.service",
    )  # fmt: skip
    assert systemd_host.process_environment().get("LLAMA_ARG_BATCH") == "32"

    async def next_run() -> None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            assert systemd_host.read(RUNTIME_DROP_IN) is None

    asyncio.run(next_run())


@pytest.mark.real_server
def test_the_dead_man_timer_restores_the_host_when_the_controller_vanishes(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: object
) -> None:
    async def vanish() -> None:
        transport, deployer = _deployer(systemd_host, dead_man_s=6)
        async with transport:
            await deployer.__aenter__()
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
            # No restore: the controller is gone as far as the host can tell.

    asyncio.run(vanish())
    assert systemd_host.process_environment().get("LLAMA_ARG_BATCH") == "64"
    _wait_for_dead_man(systemd_host)


def _wait_for_dead_man(host: SystemdHost) -> None:
    """Until the timer's script has run to its last step (removing itself, after the restart)."""
    deadline = time.monotonic() + 60
    while host.read(RUNTIME_DROP_IN) is not None or host.read("/run/serve-tuner/llama-server.service.restore.sh"):
        assert time.monotonic() < deadline, "the dead-man timer did not restore the host"
        time.sleep(0.5)
    host.wait_active()


@pytest.mark.real_server
def test_a_server_killed_mid_trial_is_noticed_even_when_restart_brings_it_back(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: object
) -> None:
    async def scenario() -> str | None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            deployment = await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
            systemd_host.run("kill", "-9", str(deployment.pid))
            deadline = time.monotonic() + 30
            while (reason := await deployer.check_alive()) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            return reason

    reason = asyncio.run(scenario())
    assert reason is not None and "llama-server.service" in reason


# ---- property-based: no value can inject anything into a unit file --------------------------

_FUZZ_UNIT = "serve-tuner-fuzz.service"
_TRICKY = st.sampled_from(
    ["\n[Service]\nExecStartPre=/bin/touch /tmp/pwned", "%h", "%%", "$(touch /tmp/pwned)", "`id`", '"', "'", ";",
     "\\", "\\n", "$HOME", "${HOME}", "\0", "[Service]", " ", "é", "=", "a=b", "\\;", "--x"]
)  # fmt: skip
_VALUES = st.lists(st.one_of(_TRICKY, st.text(max_size=12)), min_size=1, max_size=4).map("".join)


@pytest.fixture(scope="module")
def fuzz_unit(systemd_host: SystemdHost) -> Iterator[SystemdHost]:
    systemd_host.run(
        "sh", "-c",
        f"printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > /etc/systemd/system/{_FUZZ_UNIT}"
        " && systemctl daemon-reload",
    )  # fmt: skip
    yield systemd_host
    systemd_host.run("sh", "-c", f"systemctl stop {_FUZZ_UNIT}; rm -rf /etc/systemd/system/{_FUZZ_UNIT} "
                     f"/run/systemd/system/{_FUZZ_UNIT}.d; systemctl daemon-reload")  # fmt: skip


FUZZ_CASES = 60


@pytest.mark.real_server
@settings(max_examples=FUZZ_CASES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_VALUES, argument=_VALUES)
def test_every_value_is_refused_or_reaches_the_process_unchanged(
    fuzz_unit: SystemdHost, value: str, argument: str
) -> None:
    host = fuzz_unit
    launch = LaunchSpec(
        # `sh` stays the process (no exec), so its argv, argument included, is what /proc shows.
        executable="/bin/sh",
        args=("-c", "while :; do sleep 1; done", "sh", argument),
        env={"TUNED": value},
        port=1,
    )
    try:
        text = render_drop_in(launch, exec_start="replace", note="fuzz")
    except ConfigError:
        assert any(ord(char) < 0x20 or ord(char) == 0x7F for char in value + argument)
        return
    path = f"/run/systemd/system/{_FUZZ_UNIT}.d/zz-tuner.conf"
    host.run("mkdir", "-p", path.rsplit("/", 1)[0])
    subprocess.run(
        ["nsenter", "-t", str(host.pid), "-m", "-p", "-u", "-i", "-r", "-w", "sh", "-c", f"cat > {path}"],
        input=text, text=True, check=True, timeout=30,
    )  # fmt: skip
    host.run("systemctl", "daemon-reload")
    host.run("systemctl", "restart", _FUZZ_UNIT)
    shown = host.run("systemctl", "show", _FUZZ_UNIT, "-p", "Environment", "--value").stdout.rstrip("\n")
    assert parse_show_environment(shown) == {"TUNED": value}
    pid = host.run("systemctl", "show", _FUZZ_UNIT, "-p", "MainPID", "--value").stdout.strip()
    # Type=simple: `restart` returns once systemd forked, perhaps before the child exec'd the command.
    deadline = time.monotonic() + 30
    while not (cmdline := host.read(f"/proc/{pid}/cmdline") or b"").startswith(b"/bin/sh\0"):
        assert time.monotonic() < deadline, f"the unit's process never exec'd its command: {cmdline!r}"
        time.sleep(0.05)
    environ = host.read(f"/proc/{pid}/environ") or b""
    assert cmdline.decode().split("\0")[:-1] == list(launch.command)
    assert f"TUNED={value}\0" in environ.decode()
    assert host.read("/tmp/pwned") is None


def served_by(host: SystemdHost, unit: str) -> OperatorServer:
    """What the unit's running process serves, read from its own argv and environment in /proc."""
    return LLAMA_SERVER_LISTEN.read(running_argv(host, unit), host.process_environment(unit))


def _assert_secret_nowhere_else(
    host: SystemdHost, secret: str, *, printed: str, run_dir: Path, unit: str | None = None
) -> None:
    """Not in systemctl show (D-Bus shows it to every user), the unit's files, the journal, the run
    directory, or anything printed."""
    unit = unit or host.unit
    unit_dir = f"/etc/systemd/system/{unit}.d"
    visible = host.run("systemctl", "show", unit).stdout
    visible += host.run("sh", "-c", f"cat {unit_dir}/* /run/serve-tuner/* 2>/dev/null; true").stdout
    visible += host.run("journalctl", "--no-pager", "-o", "cat").stdout + printed
    assert secret not in visible
    assert secret.encode() not in b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())


def _assert_applied_as_the_operators_own(
    host: SystemdHost, baseline: HostBaseline, served: OperatorServer, settings: Mapping[str, object]
) -> None:
    """After `tuner apply` on the operator's unit: its applied drop-in sets tuned knobs alone, the server
    was not restarted after its verification run, and it runs the operator's model, address, port,
    environment file and command line, answering where the operator put it."""
    unit = baseline.unit
    applied = f"/etc/systemd/system/{unit}.d/zz-tuner-applied.conf"
    assert host.read(f"/run/systemd/system/{unit}.d/zz-tuner.conf") is None
    written = (host.read(applied) or b"").decode()
    assigned = re.findall(r'^Environment="([A-Z_]+)=', written, flags=re.MULTILINE)
    knobs = {knob.env for knob in LLAMA_SERVER_KNOBS.values() if knob.env}
    assert assigned and set(assigned) <= knobs, f"the applied drop-in sets more than tuned knobs: {written}"
    assert "ExecStart" not in written and "EnvironmentFile" not in written
    # No second restart: the process running now is the one that served the verification run.
    invocation = host.show("InvocationID", unit=unit)["InvocationID"]
    served_log = host.run("journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager")
    assert "processing task" in served_log.stdout, "the server was restarted after its verification run"
    environment = host.process_environment(unit)
    for name, value in settings.items():
        assert environment[LLAMA_SERVER_KNOBS[name].env or ""] == str(value)
    # The operator's model, address, port, EnvironmentFile and command line, as before the study.
    assert served_by(host, unit) == served
    assert running_argv(host, unit) == baseline.argv
    changed = {k for k in {*environment, *baseline.environment} if environment.get(k) != baseline.environment.get(k)}
    assert changed <= {*assigned, "INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"}
    assert "LLAMA_API_KEY" not in environment
    props = httpx.get(f"{host.address(unit)}/props", timeout=10).json()
    assert props["model_path"] == host.model
    assert host.show("NeedDaemonReload", unit=unit)["NeedDaemonReload"] == "no"


@pytest.mark.real_server
@pytest.mark.parametrize("unit", [UNIT, ENV_UNIT], ids=["flags-unit", "environment-unit"])
def test_a_study_tunes_the_operators_unit_over_ssh_and_apply_keeps_its_model_address_and_port(
    systemd_host: SystemdHost, tmp_path: Path, unit: str
) -> None:
    """The product's path on a production host: trials as drop-ins on the operator's own unit, reached
    over ssh from a controller without any build or model, the replay through a forwarded port to where
    the unit listens (every interface for one unit, 127.0.0.2 for the other); `tuner apply` writes the
    tuned knobs alone, and the server then answers where the operator put it, with the operator's model."""
    from tuner.report import build_leaderboard
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    baseline = host_baseline(systemd_host, unit)
    served = served_by(systemd_host, unit)
    assert served.model == systemd_host.model and served.program == systemd_host.binary
    study = study_file(systemd_host, tmp_path, unit=unit)
    # The requests carry the study's API key; the operator's server (which has none) is not given it.
    canary = f"sk-canary-{uuid.uuid4().hex}"
    env = controller_env(tmp_path, SERVE_TUNER_TEST_KEY=canary)
    quick = [] if unit == UNIT else QUICK_ROUNDS  # the stall is measured once; the other unit's path is the point
    settings = ["--set", "budget.trials=1", "--set", "confirm.top=0", *quick]
    key = ["--set", 'engine.api_key_env="SERVE_TUNER_TEST_KEY"']
    done = run_tuner("run", str(study), "--runs-dir", str(tmp_path), *settings, *key, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(tmp_path / "unit")))
    assert [row.state for row in board.rows] == ["COMPLETE", "COMPLETE"]
    tuned = next(row for row in board.rows if not row.baseline)
    if unit == UNIT:
        assert tuned.metrics["stall_tok_s"][0] > 0
    # The server's log came from the journal of the trial's own invocation.
    assert "listening on" in (tmp_path / "unit" / "trials" / f"{tuned.number:04d}" / "server.log").read_text()
    # The unit's own server, as the run read it, is on record for the report.
    assert json.loads((tmp_path / "unit" / "host.json").read_text())["operator_server"] == served.describe()
    assert_baseline(systemd_host, baseline)

    # `tuner apply` whose verification run fails (every request past its deadline): nothing is made
    # permanent, and the host is back on its baseline.
    # The verification run only has to succeed: two short chats will do, whatever the study measured.
    apply = ["apply", str(study), "--runs-dir", str(tmp_path), "--trial", str(tuned.number), *QUICK_ROUNDS, *key]
    applied = f"/etc/systemd/system/{unit}.d/zz-tuner-applied.conf"
    refused = run_tuner(*apply, "--set", "workload.request_timeout_s=0.001", env=env, timeout=600)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "the verification run failed" in refused.stderr and "stays on its baseline" in refused.stderr
    assert systemd_host.read(applied) is None
    assert_baseline(systemd_host, baseline)

    # `tuner apply`: the tuned trial, verified once more, written under /etc without a second restart.
    done = run_tuner(*apply, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verification run:" in done.stdout and "zz-tuner-applied.conf" in done.stdout
    _assert_applied_as_the_operators_own(systemd_host, baseline, served, tuned.settings)
    _assert_secret_nowhere_else(systemd_host, canary, printed=done.stdout + done.stderr, run_dir=tmp_path, unit=unit)

    # `tuner restore` removes exactly that file; then the whole baseline is back.
    done = run_tuner("restore", str(study), env=env, timeout=600)
    assert done.returncode == 0 and "removed" in done.stdout, done.stderr[-3000:]
    assert systemd_host.read(applied) is None
    done = run_tuner("restore", str(study), env=env, timeout=600)
    assert done.returncode == 0 and "nothing to remove" in done.stdout
    assert_baseline(systemd_host, baseline)


@pytest.mark.real_server
def test_replace_mode_runs_the_studys_command_with_the_hosts_paths_and_its_key_through_a_0600_file(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """`exec_start = "replace"`: the drop-in carries the study's whole command line, with the paths the
    study names on the host (the controller has none of them), and the server's API key only through a
    file of mode 0600; `tuner apply` makes that permanent and `tuner restore` takes it back."""
    engine = f'binary = "{systemd_host.binary}"\nmodel = "{systemd_host.model}"\nport = {systemd_host.server_port}'
    study = study_file(systemd_host, tmp_path, deploy='exec_start = "replace"')
    study.write_text(study.read_text().replace('kind = "llama-server"', f'kind = "llama-server"\n{engine}'))
    canary = f"sk-canary-{uuid.uuid4().hex}"
    env = controller_env(tmp_path, SERVE_TUNER_TEST_KEY=canary)
    key = ["--set", 'engine.api_key_env="SERVE_TUNER_TEST_KEY"']
    done = run_tuner(
        "run", str(study), "--runs-dir", str(tmp_path), "--set", "budget.trials=1", "--set", "confirm.top=0",
        *QUICK_ROUNDS, *key, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from tuner.report import build_leaderboard
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(tmp_path / "unit")))
    tuned = next(
        row for row in board.rows if not row.baseline and row.state == "COMPLETE"
    )  # its number is the sampler's
    apply = ["apply", str(study), "--runs-dir", str(tmp_path), "--trial", str(tuned.number), *QUICK_ROUNDS, *key]
    done = run_tuner(*apply, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert running_argv(systemd_host)[0] == systemd_host.binary  # the study's program, by its host path...
    environment = systemd_host.process_environment()
    assert environment["LLAMA_ARG_MODEL"] == systemd_host.model  # ...and model
    assert environment["LLAMA_API_KEY"] == canary  # in force...
    secrets = f"/etc/serve-tuner/{systemd_host.unit}.secret.env"
    assert systemd_host.run("stat", "-c", "%a", secrets).stdout.strip() == "600"
    _assert_secret_nowhere_else(systemd_host, canary, printed=done.stdout + done.stderr, run_dir=tmp_path)
    done = run_tuner("restore", str(study), env=env, timeout=600)
    assert done.returncode == 0 and "removed" in done.stdout, done.stderr[-3000:]
    assert systemd_host.read(secrets) is None


@pytest.mark.real_server
@pytest.mark.parametrize("step", CRASH_POINTS)
def test_a_controller_killed_at_any_step_is_recovered_by_running_it_again(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path, step: str
) -> None:
    """P2: SIGKILL at each named step; the same command run again puts the host back first, fails the
    interrupted trial instead of leaving it RUNNING, and measures the baseline exactly once."""
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    command = [
        sys.executable,
        "-m",
        "tuner",
        "run",
        str(study_file(systemd_host, tmp_path)),
        "--runs-dir",
        str(tmp_path),
    ]
    command += ["--set", "budget.trials=0", "--set", "confirm.top=0", *QUICK_ROUNDS]
    crashed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=controller_env(tmp_path, SERVE_TUNER_CRASH_AT=step),
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    again = subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False, env=controller_env(tmp_path)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    trials = open_optuna_study_readonly(RunDirectory(tmp_path / "unit")).get_trials()
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert len([t for t in trials if TrialRecord.of(t).baseline and t.state.name == "COMPLETE"]) == 1
    if step != "mid-restore":  # killed while restoring, the baseline had already been measured
        assert any(t.state.name == "FAIL" and "interrupted" in (TrialRecord.of(t).fail_reason or "") for t in trials)


# ---- the other engines' launches on real units (servers: TRANSCRIPT-BASED stand-ins) ---------


async def _replay_one(engine: Engine, base_url: str) -> list[RequestRecord]:
    from tuner.loadgen import replay
    from tuner.models import ReplayRequest

    request = ReplayRequest(
        request_id="a", session="s", offset_s=0, prompt_token_ids=tuple(range(100, 140)), output_tokens=8
    )
    return list(await replay([request], engine=engine, base_url=base_url, request_timeout_s=30))


@pytest.mark.real_server
def test_ollama_settings_go_on_ollama_service_as_environment_lines(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """Ollama is configured by OLLAMA_* variables only: `exec_start = "keep"`, as its install script's unit
    runs `ollama serve`. TRANSCRIPT-BASED server."""
    from tuner.engines.ollama import OllamaEngine, OllamaOptions

    port = free_port()
    python = os.path.realpath(sys.executable)
    service = (
        f'Environment="OLLAMA_HOST=127.0.0.1:{port}"\n'
        f"ExecStart={python} /etc/serve-tuner-test/fake_engine_server.py serve\n"
    )
    engine = OllamaEngine(OllamaOptions(model="llama3.2:3b", port=port))
    launch = engine.launch_spec({"num_parallel": 2, "flash_attention": True, "keep_alive": "30m"})
    with stand_in_unit(systemd_host, "ollama.service", service) as files:
        before = systemd_host.main_pid("ollama.service")

        async def scenario() -> int:
            transport, deployer = _deployer_for(systemd_host, "ollama.service")
            async with transport, deployer:
                deployment = await deployer.apply(launch, log_path=f"{tmp_path}/ollama.log")
                environment = systemd_host.process_environment("ollama.service")
                assert environment["OLLAMA_NUM_PARALLEL"] == "2" and environment["OLLAMA_FLASH_ATTENTION"] == "1"
                async with httpx.AsyncClient(timeout=10) as client:  # what the server itself parsed
                    parsed = (await client.get(f"{deployment.base_url}/stand-in/launch")).json()
                assert parsed["settings"] == {"num_parallel": 2, "flash_attention": True, "keep_alive": "30m"}
                return deployment.pid or 0

        pid = asyncio.run(scenario())
        assert pid not in (0, before)
        # What the replay sends to it and reads back, through the same engine.
        (record,) = asyncio.run(_replay_one(engine, f"http://127.0.0.1:{port}"))
        assert record.ok
        after = systemd_host.process_environment("ollama.service")
        assert "OLLAMA_NUM_PARALLEL" not in after and after["OLLAMA_HOST"] == f"127.0.0.1:{port}"
        assert systemd_host.read("/run/systemd/system/ollama.service.d/zz-tuner.conf") is None
        assert {k: hashlib.sha256(systemd_host.read(k) or b"").hexdigest() for k in files} == files


@pytest.mark.real_server
def test_vllm_flags_replace_the_units_command_line_and_the_operators_comes_back(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """vLLM takes its settings as flags: `exec_start = "replace"` resets ExecStart= to the launch's command
    line, verified against the process's argv. TRANSCRIPT-BASED server."""
    from tuner.engines.vllm import VllmEngine, VllmOptions

    port = free_port()
    python = os.path.realpath(sys.executable)
    script = "/etc/serve-tuner-test/fake_engine_server.py"
    operator = [python, script, "serve", "Qwen/Qwen2.5-0.5B-Instruct", "--port", str(port), "--max-num-seqs", "256"]
    engine = VllmEngine(VllmOptions(command=[python, script, "serve"], model="Qwen/Qwen2.5-0.5B-Instruct", port=port))
    launch = engine.launch_spec({"max_num_seqs": 8, "enable_chunked_prefill": True, "max_num_batched_tokens": 512})
    with stand_in_unit(systemd_host, "vllm.service", f"ExecStart={' '.join(operator)}\n"):

        async def scenario() -> list[str]:
            transport, deployer = _deployer_for(systemd_host, "vllm.service", exec_start="replace")
            async with transport, deployer:
                deployment = await deployer.apply(launch, log_path=f"{tmp_path}/vllm.log")
                cmdline = systemd_host.read(f"/proc/{deployment.pid}/cmdline") or b""
                async with httpx.AsyncClient(timeout=10) as client:  # what the server itself parsed
                    parsed = (await client.get(f"{deployment.base_url}/stand-in/launch")).json()
                assert parsed["settings"] == {
                    "max_num_seqs": 8, "enable_chunked_prefill": True, "max_num_batched_tokens": 512,
                }  # fmt: skip
                (record,) = await _replay_one(engine, deployment.base_url)
                assert record.ok
                return cmdline.decode().split("\0")[:-1]

        assert asyncio.run(scenario()) == list(launch.command)
        assert launch.command[launch.command.index("--max-num-seqs") + 1] == "8"
        restored = systemd_host.read(f"/proc/{systemd_host.main_pid('vllm.service')}/cmdline") or b""
        assert restored.decode().split("\0")[:-1] == operator


@pytest.mark.real_server
def test_lora_adapters_reach_the_unit_through_an_execstart_override(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """Issue 6 on systemd: `--lora-scaled` has no environment variable, so the drop-in carries the whole
    command line; the real server then lists the adapter, loaded at scale 0."""
    adapter = systemd_host.adapter  # the host's own copy: this machine's is hidden there
    if systemd_host.run("test", "-f", adapter, check=False).returncode != 0:
        need_real_part("llama-server", "the test LoRA adapter is missing: run `tuner setup`")
    launch = _replacing_launch(systemd_host, "--lora-scaled", f"{adapter}:0", LLAMA_ARG_BATCH="64")

    async def scenario() -> list[dict[str, object]]:
        transport, deployer = _deployer(systemd_host, exec_start="replace")
        async with transport, deployer:
            deployment = await deployer.apply(launch, log_path=f"{tmp_path}/server.log")
            cmdline = (systemd_host.read(f"/proc/{deployment.pid}/cmdline") or b"").decode().split("\0")[:-1]
            assert cmdline == list(launch.command)
            async with httpx.AsyncClient(timeout=10) as client:  # through the forwarded port, on this loop
                return list((await client.get(f"{deployment.base_url}/lora-adapters")).json())

    (loaded,) = asyncio.run(scenario())
    assert loaded["path"] == adapter and loaded["scale"] == 0


@pytest.mark.real_server
def test_an_ssh_outage_is_ridden_out_and_a_longer_one_is_left_to_the_dead_man_timer(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P9: the link to the host cut for 5 s is re-opened with backoff and the study's calls go on; cut
    for longer than the reconnect window, the controller stops with exit code 75's error, and the
    host's dead-man timer restores the baseline without it."""
    from tests.support.tcp_proxy import CuttableProxy
    from tuner.errors import HostUnreachable

    pinned = systemd_host.known_hosts.read_text().split(" ", 1)[1]
    with CuttableProxy(systemd_host.ssh_port) as proxy:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {pinned}")

        def through_proxy(dead_man_s: float, **options: object) -> tuple[SshTransport, SystemdDeployer]:
            ssh_options = {**systemd_host.ssh_options(), "port": proxy.port, "known_hosts": str(known_hosts)}
            transport = SshTransport(SshOptions.model_validate({**ssh_options, "connect_timeout_s": 2, **options}))
            options_ = SystemdOptions(unit=systemd_host.unit, dead_man_s=dead_man_s)
            deployer = SystemdDeployer(options_, transport=transport)
            return transport, deployer

        async def short_outage() -> float:
            transport, deployer = through_proxy(60, reconnect_window_s=30)
            async with transport, deployer:
                await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/a.log")
                proxy.cut(5)
                started = time.monotonic()
                assert await deployer.check_alive() is None
                return time.monotonic() - started

        took = asyncio.run(short_outage())
        assert 3 < took < 30
        assert systemd_host.read(RUNTIME_DROP_IN) is None  # restored through the re-opened link

        async def long_outage() -> None:
            transport, deployer = through_proxy(8, reconnect_window_s=3)
            async with transport:
                await deployer.__aenter__()
                await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/b.log")
                proxy.cut(120)
                with pytest.raises(HostUnreachable, match="dead-man timer"):
                    await deployer.__aexit__(None, None, None)

        asyncio.run(long_outage())
        _wait_for_dead_man(systemd_host)
        proxy.cut(0)

        # The same outage seen from the command line: `tuner run` stops with exit 75 and one line that
        # names the dead-man timer, and the timer puts the host back without it.
        study = study_file(systemd_host, tmp_path, port=proxy.port, known_hosts=str(known_hosts))
        command = [sys.executable, "-m", "tuner", "run", str(study), "--runs-dir", str(tmp_path / "runs")]
        command += ["--set", "budget.trials=0", "--set", "confirm.top=0", "--set", "deploy.dead_man_s=8"]
        command += ["--set", "host.reconnect_window_s=3", "--set", "host.connect_timeout_s=2"]
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=controller_env(tmp_path)
        ) as run:
            deadline = time.monotonic() + 300
            while systemd_host.read(RUNTIME_DROP_IN) is None:  # the baseline's drop-in: a change to undo
                assert run.poll() is None and time.monotonic() < deadline, "the run applied nothing"
                time.sleep(0.2)
            proxy.cut(120)
            _, stderr = run.communicate(timeout=300)
        assert run.returncode == 75, stderr[-2000:]
        (line,) = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert "dead-man timer" in line and "Traceback" not in stderr
        _wait_for_dead_man(systemd_host)
        proxy.cut(0)


@pytest.fixture(scope="module")
def tuner_user(systemd_host: SystemdHost) -> str:
    """An unprivileged login on the host, allowed exactly the commands the deployer runs as root."""
    return sudo_login(systemd_host, "tuner", SystemdDeployer.privileged_commands)


@pytest.mark.real_server
def test_an_unprivileged_login_changes_the_unit_only_through_sudo(
    systemd_host: SystemdHost, baseline: HostBaseline, tuner_user: str, tmp_path: Path
) -> None:
    """Production hosts are reached as a plain user: privileged steps go through `sudo -n` (never asking),
    and without it the run stops on the first of them with the host unchanged."""

    def as_user(*, sudo: bool) -> tuple[SshTransport, SystemdDeployer]:
        options = SshOptions.model_validate({**systemd_host.ssh_options(), "user": tuner_user, "sudo": sudo})
        transport = SshTransport(options)
        return transport, SystemdDeployer(SystemdOptions(unit=systemd_host.unit), transport=transport)

    async def without_sudo() -> None:
        transport, deployer = as_user(sudo=False)
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/a.log")

    with pytest.raises(TunerError, match="Permission denied"):
        asyncio.run(without_sudo())
    assert systemd_host.read(RUNTIME_DROP_IN) is None

    async def with_sudo() -> tuple[dict[str, str], str]:
        transport, deployer = as_user(sudo=True)
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/b.log")
            owner = systemd_host.run("stat", "-c", "%U %a", RUNTIME_DROP_IN).stdout.split()
            return systemd_host.process_environment(), " ".join(owner)

    environment, owner = asyncio.run(with_sudo())
    assert environment["LLAMA_ARG_BATCH"] == "64"
    assert owner == "root 644"  # written by root through sudo, readable by systemd, not writable by the login


# ---- each guard's failure path, on the real host ------------------------------------------------
# Faults that a racing operator, a config-management agent or a flaky bus would cause between two of
# the deployer's steps, injected at the transport seam: the real ssh transport, one step meddled with.

AfterRun = Callable[[Sequence[str], CommandResult], Awaitable[CommandResult]]


class MeddlingTransport(SshTransport):
    """The real ssh transport; `after_run` sees (and may replace) each command's result, `on_write`
    each file written, `skip_removal` names files whose removal silently does not happen."""

    def __init__(
        self,
        options: SshOptions,
        *,
        after_run: AfterRun | None = None,
        on_write: Callable[[str, bytes], bytes] | None = None,
        skip_removal: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(options)
        self._after_run, self._on_write, self._skip_removal = after_run, on_write, skip_removal

    async def run(
        self, argv: Sequence[str], *, timeout_s: float, check: bool = True, privileged: bool = False,
        idempotent: bool = False,
    ) -> CommandResult:  # fmt: skip
        result = await super().run(argv, timeout_s=timeout_s, check=check, privileged=privileged, idempotent=idempotent)
        return await self._after_run(argv, result) if self._after_run else result

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await super().write_file(path, self._on_write(path, data) if self._on_write else data, mode=mode)

    async def remove_file(self, path: str) -> None:
        if path not in self._skip_removal:
            await super().remove_file(path)


def _meddled(host: SystemdHost, **meddling: Any) -> tuple[SshTransport, SystemdDeployer]:
    options = meddling.pop("options", {})
    transport = MeddlingTransport(SshOptions.model_validate(host.ssh_options()), **meddling)
    return transport, SystemdDeployer(SystemdOptions(unit=host.unit, **options), transport=transport)


def _is_restart(argv: Sequence[str]) -> bool:
    return list(argv[-3:]) == ["restart", "--no-block", "llama-server.service"]


@contextlib.contextmanager
def operator_override_restored(host: SystemdHost) -> Iterator[Callable[[], None]]:
    """Yields an edit of the operator's override.conf (a comment added); the original is put back after."""
    override = f"/etc/systemd/system/{host.unit}.d/override.conf"
    original = (host.read(override) or b"").decode()
    try:
        yield lambda: host.write(override, original + "# the operator's late edit\n")
    finally:
        host.write(override, original)
        host.run("sh", "-c", f"systemctl daemon-reload && systemctl restart {host.unit}")


def _apply_expecting(deployer_pair: tuple[SshTransport, SystemdDeployer], launch: LaunchSpec, tmp_path: Path) -> str:
    """Apply `launch` through the deployer; the DeployError it must raise, as a user would read it."""

    async def scenario() -> str:
        transport, deployer = deployer_pair
        async with transport, deployer:
            with pytest.raises(DeployError) as refused:
                await deployer.apply(launch, log_path=f"{tmp_path}/server.log")
            return str(refused.value)

    return asyncio.run(scenario())


@pytest.mark.real_server
def test_a_trial_whose_unit_files_change_while_it_starts_is_not_scored(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P6: the drop-in edited by someone else right after our restart leaves a pending daemon-reload:
    what runs may not be what the files say, so the trial is refused, and the host restored."""

    edited = False

    async def edit_after_restart(argv: Sequence[str], result: CommandResult) -> CommandResult:
        nonlocal edited
        if _is_restart(argv) and not edited:  # the trial's restart, not the restore's
            edited = True
            systemd_host.run("sh", "-c", f"echo '# edited by someone else' >> {RUNTIME_DROP_IN}")
        return result

    reason = _apply_expecting(_meddled(systemd_host, after_run=edit_after_restart), _launch(systemd_host), tmp_path)
    assert "pending daemon-reload" in reason


@pytest.mark.real_server
def test_a_trial_that_did_not_restart_the_unit_is_not_scored(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P6: the restart never happens, and a stale bus answer once reports a new invocation: the old
    process, on the old settings, still answers, and the trial must not be measured on it."""
    pid_before = systemd_host.main_pid()
    restart_lost = lied = False

    async def lost_restart(argv: Sequence[str], result: CommandResult) -> CommandResult:
        nonlocal restart_lost, lied
        if _is_restart(argv):
            restart_lost = True  # it was sent, but stopped here: undo it before it runs
            return result
        if restart_lost and not lied and list(argv[:2]) == ["systemctl", "show"]:
            lied = True
            stdout = re.sub(r"InvocationID=\w*", f"InvocationID={uuid.uuid4().hex}", result.stdout)
            return CommandResult(argv=result.argv, exit_status=0, stdout=stdout, stderr="")
        return result

    class LosingRestart(MeddlingTransport):
        async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
            if _is_restart(argv) and not restart_lost:
                return await lost_restart(argv, CommandResult(argv=tuple(argv), exit_status=0, stdout="", stderr=""))
            return await super().run(argv, **kwargs)

    transport = LosingRestart(SshOptions.model_validate(systemd_host.ssh_options()), after_run=lost_restart)
    deployer = SystemdDeployer(SystemdOptions(unit=systemd_host.unit), transport=transport)
    reason = _apply_expecting((transport, deployer), _launch(systemd_host, LLAMA_ARG_BATCH="64"), tmp_path)
    assert "did not restart" in reason and str(pid_before) in reason


@pytest.mark.real_server
def test_a_setting_overridden_by_an_operator_environment_file_is_not_scored(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """P6: an operator's EnvironmentFile= wins over our Environment= line; the process's own environment
    shows it, the trial is refused naming the variable, and the host goes back to the operator's state."""
    site = "[Service]\nEnvironmentFile=/etc/serve-tuner-test/site.env\n"
    with operator_drop_in(
        systemd_host, "aa-site.conf", site, {"/etc/serve-tuner-test/site.env": "LLAMA_ARG_BATCH=1024\n"}
    ):
        before = host_baseline(systemd_host)
        reason = _apply_expecting(_deployer(systemd_host), _launch(systemd_host, LLAMA_ARG_BATCH="64"), tmp_path)
        assert "LLAMA_ARG_BATCH='1024', not '64'" in reason
        assert_baseline(systemd_host, before)


@pytest.mark.real_server
def test_a_secret_the_unit_drops_is_not_scored_and_not_shown(systemd_host: SystemdHost, tmp_path: Path) -> None:
    """P6 and P12: the unit's UnsetEnvironment= removes the API key we passed; the trial is refused,
    and the refusal names the variable, never the value."""
    canary = f"sk-canary-{uuid.uuid4().hex}"
    launch = _launch(systemd_host).model_copy(update={"secret_env": {"LLAMA_API_KEY": SecretStr(canary)}})
    with operator_drop_in(systemd_host, "aa-site.conf", "[Service]\nUnsetEnvironment=LLAMA_API_KEY\n"):
        before = host_baseline(systemd_host)
        reason = _apply_expecting(_deployer(systemd_host), launch, tmp_path)
        assert "does not run with the LLAMA_API_KEY" in reason and canary not in reason
        assert_baseline(systemd_host, before)


@pytest.mark.real_server
def test_a_command_line_other_than_the_trials_is_not_scored(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P6 with `exec_start = "replace"`: the drop-in that lands on the host carries one more argument than
    ours (an agent rewrote it); the process's argv shows it, and the trial is refused."""

    def rewritten(path: str, data: bytes) -> bytes:
        if path != RUNTIME_DROP_IN:
            return data
        return data.rstrip(b"\n") + f' "--port" "{systemd_host.server_port}"\n'.encode()

    pair = _meddled(systemd_host, on_write=rewritten, options={"exec_start": "replace"})
    reason = _apply_expecting(pair, _replacing_launch(systemd_host, LLAMA_ARG_BATCH="64"), tmp_path)
    assert "not the trial's command line" in reason


@pytest.mark.real_server
def test_the_restore_names_an_operator_file_changed_during_the_study(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P1: the operator edits their own override.conf while a trial runs. The restore removes ours and
    restarts, then says the unit no longer matches its snapshot (for a person to check), with nothing
    of ours left armed."""

    async def scenario() -> None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
            edit_operator_override()

    with operator_override_restored(systemd_host) as edit_operator_override:
        with pytest.raises(DeployError, match=r"override\.conf differs from the snapshot"):
            asyncio.run(scenario())
        assert systemd_host.read(RUNTIME_DROP_IN) is None


@pytest.mark.real_server
def test_the_restore_notices_when_our_drop_in_did_not_go(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P1: the removal of our drop-in silently does not happen. The unit's files (ours excluded) match
    the snapshot, but its effective environment does not: the restore says so instead of succeeding."""

    async def scenario() -> None:
        transport, deployer = _meddled(systemd_host, skip_removal=frozenset({RUNTIME_DROP_IN}))
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")

    try:
        with pytest.raises(DeployError, match="environment differs from the one before the study"):
            asyncio.run(scenario())
    finally:
        systemd_host.run("rm", "-f", RUNTIME_DROP_IN)
        systemd_host.run("sh", "-c", f"systemctl daemon-reload && systemctl restart {systemd_host.unit}")


def _abandon_trial(host: SystemdHost, tmp_path: Path) -> None:
    """A controller that applied a trial and was then SIGKILLed: its drop-in, snapshot and timer stay on
    the host, and its lock names a process that is gone."""

    async def vanish() -> None:
        transport, deployer = _deployer(host)
        async with transport:
            await deployer.__aenter__()
            await deployer.apply(_launch(host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")

    asyncio.run(vanish())
    owner = "/run/serve-tuner/llama-server.service.lock/owner.json"
    host.run("sh", "-c", f'sed -i \'s/"pid": [0-9]*/"pid": 999999999/\' {owner}')


@pytest.mark.real_server
def test_a_killed_runs_leftovers_are_held_to_its_snapshot(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P2: the next run restores what a killed one left, and compares the unit with the snapshot that
    run took (kept on the host), not with nothing: an operator file changed meanwhile is named."""

    async def next_run() -> None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            pass

    with operator_override_restored(systemd_host) as edit_operator_override:
        _abandon_trial(systemd_host, tmp_path)
        edit_operator_override()  # while no controller watched
        with pytest.raises(DeployError, match=r"override\.conf differs from the snapshot"):
            asyncio.run(next_run())
        assert systemd_host.read(RUNTIME_DROP_IN) is None
    asyncio.run(next_run())  # with the operator's file back, the leftovers are gone and nothing is refused


def _timer_elapses_at(host: SystemdHost) -> int:
    timer = "serve-tuner-restore-llama-server.timer"
    shown = host.show("NextElapseUSecMonotonic", unit=timer)["NextElapseUSecMonotonic"]
    assert shown and shown != "infinity", "the dead-man timer is not armed"
    return _usec(shown)


def _usec(shown: str) -> int:
    """systemd's time span text ('1h 2min 3.5s', '45.123s', '900ms') in microseconds."""
    units = {"us": 1, "ms": 1000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*(us|ms|min|s|h|d)", shown):
        total += float(number) * units[unit]
    return int(total)


@pytest.mark.real_server
def test_the_dead_man_timer_is_pushed_back_while_the_study_is_alive_and_disarmed_after(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """P3: during a long study the timer must not fire while the controller is alive: every heartbeat
    (the check after each round) re-arms it later; a clean restore disarms it (assert_baseline)."""

    async def scenario() -> tuple[int, int]:
        transport, deployer = _deployer(systemd_host, dead_man_s=5)
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
            armed = _timer_elapses_at(systemd_host)
            beat_due = time.monotonic() + 5 / 4
            while time.monotonic() < beat_due:  # the heartbeat's interval: dead_man_s / 4
                await asyncio.sleep(0.1)
            assert await deployer.check_alive() is None
            return armed, _timer_elapses_at(systemd_host)

    armed, rearmed = asyncio.run(scenario())
    assert rearmed > armed, "a heartbeat did not push the dead-man timer back"
    # In the test itself, not only in the fixture's teardown (assert_baseline): a guard it alone catches is
    # an error of the teardown, which says nothing certain of the guard.
    timer = systemd_host.show("ActiveState", unit="serve-tuner-restore-llama-server.timer")
    assert timer["ActiveState"] != "active", "the dead-man timer is still armed after a clean restore"


@pytest.mark.real_server
@pytest.mark.parametrize(("silent_for_s", "taken_over"), [(3600, True), (0, False)])
def test_a_lock_is_taken_over_only_from_a_holder_silent_past_lock_stale_s(
    systemd_host: SystemdHost, baseline: HostBaseline, silent_for_s: int, taken_over: bool
) -> None:
    """P14: a lock held from another machine (its PID cannot be checked here) is taken over when its
    heartbeat is older than lock_stale_s, and refused while it is fresh."""
    lock = "/run/serve-tuner/llama-server.service.lock"
    owner = json.dumps({"controller": "another-controller", "pid": 1, "beat": time.time() - silent_for_s})
    systemd_host.run("mkdir", "-p", lock)
    systemd_host.write(f"{lock}/owner.json", owner)

    async def enter() -> None:
        transport, deployer = _deployer(systemd_host, lock_stale_s=900)
        async with transport, deployer:
            pass

    try:
        if taken_over:
            asyncio.run(enter())
        else:
            with pytest.raises(StudyError, match=r"another serve-tuner .* on another-controller"):
                asyncio.run(enter())
    finally:
        systemd_host.run("rm", "-rf", lock)


@pytest.mark.real_server
def test_keep_mode_refuses_a_launch_whose_flags_the_unit_does_not_pass_before_touching_the_host(
    systemd_host: SystemdHost, baseline: HostBaseline, tmp_path: Path
) -> None:
    """With `exec_start = "keep"` the unit's own command line runs: a launch that needs a flag it lacks
    (a LoRA adapter) is refused with the fix, and nothing is written to the host."""
    launch = _launch(systemd_host).model_copy(update={"args": ("--lora-scaled", "/srv/adapter.gguf:0")})

    async def scenario() -> None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            await deployer.apply(launch, log_path=f"{tmp_path}/s.log")

    with pytest.raises(ConfigError, match=r'deploy\.exec_start = "replace"'):
        asyncio.run(scenario())
    assert systemd_host.read("/run/serve-tuner/llama-server.service.json") is None


@pytest.mark.real_server
def test_a_tuned_setting_the_units_own_flag_overrides_is_named_from_the_servers_log(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """The unit's ExecStart passes `-b 2048`; llama-server then ignores LLAMA_ARG_BATCH and says so in its
    log, and the engine names the setting and the fix from that log (what fails the trial)."""
    from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions

    command = f"{systemd_host.binary} -m {systemd_host.model} --host 127.0.0.1 --port {systemd_host.server_port}"
    flags = f"[Service]\nExecStart=\nExecStart={command} -b 2048\n"
    engine = LlamaServerEngine(LlamaServerOptions())

    async def scenario() -> str | None:
        transport, deployer = _deployer(systemd_host)
        async with transport, deployer:
            await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
            log, _ = await deployer.read_log(0)
            return engine.ignored_settings(log)

    with operator_drop_in(systemd_host, "aa-flags.conf", flags):
        before = host_baseline(systemd_host)
        ignored = asyncio.run(scenario())
        assert_baseline(systemd_host, before)
    assert ignored is not None and "n_batch" in ignored and "-b" in ignored and "exec_start" in ignored


@pytest.mark.real_server
def test_a_unit_that_stops_slowly_is_measured_only_once_its_new_process_runs(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """A server that drains for a while on stop (`ExecStop=` taking 3 s) keeps answering /health on the old
    settings meanwhile: the deployer waits for the new invocation before it checks health, so the trial
    starts on its own settings instead of being taken for started by the old process."""
    with operator_drop_in(systemd_host, "aa-drain.conf", "[Service]\nExecStop=/bin/sleep 3\n"):
        before = host_baseline(systemd_host)

        async def scenario() -> dict[str, str]:
            transport, deployer = _deployer(systemd_host)
            async with transport, deployer:
                await deployer.apply(_launch(systemd_host, LLAMA_ARG_BATCH="64"), log_path=f"{tmp_path}/s.log")
                return systemd_host.process_environment()

        environment = asyncio.run(scenario())
        assert environment["LLAMA_ARG_BATCH"] == "64"
        assert_baseline(systemd_host, before)


@pytest.mark.real_server
def test_a_config_that_cannot_start_on_a_unit_without_restart_fails_fast_with_the_reason(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    """P7 with `Restart=no`: the unit goes straight to failed, with no restart to count; the trial still
    fails at once with systemd's result, not after the whole start timeout."""
    with operator_drop_in(systemd_host, "aa-no-restart.conf", "[Service]\nRestart=no\n"):
        before = host_baseline(systemd_host)

        async def scenario() -> tuple[str, float]:
            transport, deployer = _deployer(systemd_host, start_timeout_s=300)
            async with transport, deployer:
                started = time.monotonic()
                with pytest.raises(ServerNotReady) as failure:
                    await deployer.apply(
                        _launch(systemd_host, LLAMA_ARG_CACHE_TYPE_K="not-a-type"), log_path=f"{tmp_path}/s.log"
                    )
                return str(failure.value), time.monotonic() - started

        reason, took = asyncio.run(scenario())
        assert_baseline(systemd_host, before)
    assert "llama-server.service failed" in reason and "exit status" in reason
    assert took < 150, "the failure was found only at the start timeout"
