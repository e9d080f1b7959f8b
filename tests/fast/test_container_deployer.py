"""The container deployer against a recorded CLI contract.

No container engine runs on these machines, so `docker` here is tests/data/fake_docker.py: it keeps
containers in a JSON file, answers `inspect` in docker's documented shape, records every invocation
with its real argv and every env file as it was while `run` read it, and runs the stand-in health
server for a running container with the container's environment. The tests check the exact commands
the deployer issues (the contract) and what a user would see: the user's container, under its own name
throughout, running again whatever happened, and no environment value on any command line (`ps` shows
those to every user of the host).

The watcher's files and the env file live in the host's state directory (/run/serve-tuner as root),
which tests running side by side share: each test's container has a name of its own (`llm-PORT`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pydantic import SecretStr

from tests.support import free_port
from tuner.cli import main
from tuner.config import PluginSpec
from tuner.deployers import ContainerDeployer
from tuner.deployers.container import ContainerOptions
from tuner.engines import create_engine
from tuner.errors import ConfigError, DeployError, ServerNotReady
from tuner.models import CheckLine, LaunchSpec
from tuner.transports import LocalTransport

DATA = Path(__file__).resolve().parents[1] / "data"


class Host(NamedTuple):
    state: Path  # the fake engine's state file
    port: int  # the host port the original publishes, and engine.port
    name: str  # the user's container, `llm-PORT`

    @property
    def trial(self) -> str:
        return self.name + "-tuner-trial"


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """A `docker` on PATH, with the user's vLLM container `llm-PORT` running on a free port."""
    port = free_port()
    name = f"llm-{port}"
    state = tmp_path / "docker-state.json"
    original = {
        "Id": "c0ffee" + str(port),
        "Name": "/" + name,
        "Image": "sha256:0123",
        "Config": {
            "Image": "vllm/vllm-openai:v0.33.0",
            "Entrypoint": ["vllm", "serve"],
            "Cmd": ["Qwen/Qwen2.5-0.5B-Instruct", "--max-num-seqs", "64"],
            "Env": ["PATH=/usr/local/bin:/usr/bin", "HF_TOKEN=hf_canary"],
        },
        "HostConfig": {
            "PortBindings": {f"{port}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]},
            "Binds": ["/srv/hf:/root/.cache/huggingface"],
            "IpcMode": "host",
            "DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}],
        },
        "State": {"Status": "running", "ExitCode": 0},
    }
    state.write_text(json.dumps({"containers": {name: original}, "calls": []}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "docker"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {DATA / "fake_docker.py"} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    yield Host(state, port, name)
    for container in containers(state).values():  # the stand-in servers of containers left running
        if container.get("pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container["pid"], signal.SIGTERM)
    # The deployer's files on this host (a test that plays a killed controller leaves them, as one would);
    # without its heartbeat a watcher ends at its next look.
    for left in Path("/run/serve-tuner").glob(f"container-{name}.*"):
        left.unlink(missing_ok=True)


def vllm_launch(port: int, *, host: str = "0.0.0.0", **settings: Any) -> LaunchSpec:
    """On docker's default network the server listens on all the container's addresses (engine.host)."""
    engine = create_engine(
        PluginSpec.model_validate(
            {"kind": "vllm", "model": "Qwen/Qwen2.5-0.5B-Instruct", "host": host, "port": port, "settings": settings}
        )
    )
    return engine.launch_spec({})


def calls(state: Path) -> list[list[str]]:
    return list(json.loads(state.read_text())["calls"])


def containers(state: Path) -> dict[str, Any]:
    return dict(json.loads(state.read_text())["containers"])


def env_files(state: Path) -> list[dict[str, Any]]:
    """Each env file `run` was given: its path, and its mode and content while `run` read it."""
    return list(json.loads(state.read_text()).get("env_files", []))


def edit_state(state: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(state.read_text())
    change(data)
    part = state.with_name(f".{state.name}.test")  # whole or not at all, as the stand-in writes it
    part.write_text(json.dumps(data))
    part.replace(state)


def set_status(host: Host, name: str, status: str) -> None:
    """What `docker start`/`stop` by someone else shows (no stand-in server runs for it)."""
    edit_state(host.state, lambda data: data["containers"][name].update(State={"Status": status, "ExitCode": 0}))


def process_environment(pid: int) -> dict[str, str]:
    """What the container's server really got (the stand-in runs as a process of ours)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def assert_nowhere_on_a_command_line(state: Path, *values: str) -> None:
    for argv in calls(state):
        for value in values:
            assert not any(value in argument for argument in argv), (value, argv)


def assert_the_original_is_back(host: Host) -> None:
    after = containers(host.state)
    assert set(after) == {host.name} and after[host.name]["State"]["Status"] == "running"


def assert_nothing_changed(host: Host) -> None:
    """Refused before anything stopped: no trial, no stop, no env file."""
    assert not any(c[0] in ("stop", "rename", "run", "start") for c in calls(host.state))
    assert env_files(host.state) == []
    assert_the_original_is_back(host)


def assert_restored_by_the_book(host: Host) -> None:
    """The restore: the trial removed, then the original started again; never a rename."""
    done = calls(host.state)
    assert not any(c[0] == "rename" for c in done)
    removed_at = max(i for i, c in enumerate(done) if c == ["rm", "-f", host.trial])
    assert [c for c in done[removed_at:] if c[0] != "inspect"] == [["rm", "-f", host.trial], ["start", host.name]]
    assert done[-1] == ["inspect", "--type", "container", host.name]  # compared with the snapshot


def test_a_trial_runs_as_a_copy_of_the_users_container_and_the_original_comes_back(
    docker: Host, tmp_path: Path
) -> None:
    state, port, name = docker
    trial = docker.trial
    env_paths: list[str] = []

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            deployment = await deployer.apply(vllm_launch(port, max_num_seqs=32), log_path=str(tmp_path / "t1.log"))
            assert deployment.base_url == f"http://127.0.0.1:{port}"
            assert await deployer.check_alive() is None
            during = containers(state)
            assert set(during) == {name, trial}  # the original keeps its name, stopped beside the trial
            assert during[name]["State"]["Status"] == "exited"
            assert during[trial]["Config"]["Labels"] == {
                "serve-tuner.trial-of": name,
                "serve-tuner.original-was-running": "yes",
            }
            served_by = during[trial]["pid"]
            assert process_environment(served_by)["HF_TOKEN"] == "hf_canary"  # the trial still gets it
            env_paths.append(str(Path(env_files(state)[0]["path"])))
            await deployer.apply(vllm_launch(port, max_num_seqs=64), log_path=str(tmp_path / "t2.log"))

    asyncio.run(scenario())
    after = containers(state)
    assert set(after) == {name} and after[name]["State"]["Status"] == "running"
    assert after[name]["Config"]["Cmd"] == ["Qwen/Qwen2.5-0.5B-Instruct", "--max-num-seqs", "64"]
    assert sum(c[0] == "stop" for c in calls(state)) == 1  # the second trial finds the original stopped
    run = next(c for c in calls(state) if c[0] == "run")
    # The contract: the original's ports, mounts, IPC, GPUs and environment; the image's own entrypoint
    # (`vllm serve`) kept, so only the model and flags follow the image.
    assert run[:4] == ["run", "-d", "--name", trial]
    for pair in (
        ["--label", f"serve-tuner.trial-of={name}"],
        ["--label", "serve-tuner.original-was-running=yes"],
        ["-p", f"127.0.0.1:{port}:{port}/tcp"],
        ["-v", "/srv/hf:/root/.cache/huggingface"],
        ["--ipc", "host"],
        ["--gpus", "all"],
    ):
        assert any(run[i : i + 2] == pair for i in range(len(run))), pair
    # The environment, the original's secret included, went through the env file, never the argv.
    assert "-e" not in run
    assert_nowhere_on_a_command_line(state, "hf_canary", "HF_TOKEN")
    env_file = run[run.index("--env-file") + 1]
    recorded = env_files(state)
    # On the host, in its state directory (not beside the log), one file per container, 0600.
    assert Path(env_file).name == f"container-{name}.env" and not Path(env_file).is_relative_to(tmp_path)
    assert [r["path"] for r in recorded] == [env_file, env_file] == env_paths * 2
    for seen in recorded:
        assert seen["mode"] == 0o600, oct(seen["mode"])
        assert "HF_TOKEN=hf_canary\n" in seen["content"] and "PATH=/usr/local/bin:/usr/bin\n" in seen["content"]
    assert not Path(env_file).exists()
    image_at = run.index("sha256:0123")  # the original's image by its ID, whatever its tag names now
    assert run[image_at + 1 :][:3] == ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "0.0.0.0"]
    assert "--entrypoint" not in run and "--max-num-seqs" in run
    assert_restored_by_the_book(docker)
    saved = (tmp_path / "t1.log.original.json").read_text()
    assert json.loads(saved)["Name"] == "/" + name
    assert "HF_TOKEN=(not saved)" in saved and "hf_canary" not in saved
    # The watcher disarmed: its heartbeat and script are gone with the restore.
    state_dir = Path(env_file).parent
    assert not (state_dir / f"container-{name}.beat").exists()
    assert not (state_dir / f"container-{name}.restore.sh").exists()


def test_a_trial_that_cannot_start_fails_with_its_log_and_the_original_still_comes_back(
    docker: Host, tmp_path: Path
) -> None:
    port, name = docker.port, docker.name
    launch = vllm_launch(port)
    broken = launch.model_copy(update={"args": (*launch.args, "--fail-to-start")})

    async def scenario() -> None:
        options = ContainerOptions(container=name, start_timeout_s=10)
        async with LocalTransport() as transport, ContainerDeployer(options, transport=transport) as deployer:
            with pytest.raises(
                ServerNotReady,
                match=r"stopped while starting: the trial container is exited \(exit code 2\); "
                r"container log ends: error: unrecognized arguments",
            ):
                await deployer.apply(broken, log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    assert_the_original_is_back(docker)
    assert_restored_by_the_book(docker)


def test_a_controller_killed_mid_study_is_cleaned_up_by_the_next_run(docker: Host, tmp_path: Path) -> None:
    state, port, name = docker

    async def killed() -> None:
        transport = LocalTransport()
        deployer = ContainerDeployer(ContainerOptions(container=name), transport=transport)
        await deployer.__aenter__()
        await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
        # No restore: what SIGKILL of the controller leaves behind (the watcher, an hour away, did not act).

    asyncio.run(killed())
    assert set(containers(state)) == {name, docker.trial}
    assert containers(state)[name]["State"]["Status"] == "exited"
    left = Path(f"/run/serve-tuner/container-{name}.env")  # killed between writing it and `run` returning
    left.write_text("HF_TOKEN=hf_canary\n")

    async def next_run() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport),
        ):
            assert set(containers(state)) == {name}
            assert containers(state)[name]["State"]["Status"] == "running"

    asyncio.run(next_run())
    assert_the_original_is_back(docker)
    assert not left.exists()


def test_a_study_another_live_controller_runs_on_the_container_is_refused_not_undone(
    docker: Host, tmp_path: Path
) -> None:
    """Two runs on one container (another runs directory, another machine): the second refuses, naming the
    first, and leaves its trial and watcher alone; a killed controller's (its pid gone here) is put back."""
    state, port, name = docker

    async def first() -> None:
        deployer = ContainerDeployer(ContainerOptions(container=name), transport=LocalTransport())
        await deployer.__aenter__()
        await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))

    asyncio.run(first())
    beat = Path(f"/run/serve-tuner/container-{name}.beat")
    token = beat.read_text().split()[0]
    beat.write_text(f"{token} another-controller 4242")  # a live study driven from another machine

    async def second() -> None:
        async with ContainerDeployer(ContainerOptions(container=name), transport=LocalTransport()):
            pass

    with pytest.raises(DeployError, match=rf"another serve-tuner study is tuning container {name} now"):
        asyncio.run(second())
    assert set(containers(state)) == {name, docker.trial} and beat.exists()
    beat.write_text(f"{token} {socket.gethostname()} 999999999")  # its controller ran here and is gone
    asyncio.run(second())
    assert_the_original_is_back(docker)


def test_an_original_an_older_version_moved_aside_is_put_back_under_its_name(docker: Host) -> None:
    """Before 0.6 a study renamed the original NAME-tuner-baseline; a run finding one puts it back first."""
    state, name = docker.state, docker.name

    def moved_aside(data: dict[str, Any]) -> None:
        original = data["containers"].pop(name)
        data["containers"][name + "-tuner-baseline"] = {**original, "State": {"Status": "exited", "ExitCode": 0}}

    edit_state(state, moved_aside)

    async def next_run() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport),
        ):
            pass

    asyncio.run(next_run())
    assert [c for c in calls(state) if c[0] in ("rename", "start")] == [
        ["rename", name + "-tuner-baseline", name],
        ["start", name],
    ]
    assert_the_original_is_back(docker)


def test_a_killed_controller_s_watcher_puts_the_original_back_by_itself(docker: Host, tmp_path: Path) -> None:
    state, port, name = docker

    async def killed() -> ContainerDeployer:
        transport = LocalTransport()
        deployer = ContainerDeployer(ContainerOptions(container=name, dead_man_s=5), transport=transport)
        await deployer.__aenter__()
        await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
        return deployer

    silent = asyncio.run(killed())
    assert set(containers(state)) == {name, docker.trial}
    deadline = time.monotonic() + 30
    while set(containers(state)) != {name} or containers(state)[name]["State"]["Status"] != "running":
        assert time.monotonic() < deadline, "the watcher put the original back within 30 s"
        time.sleep(0.2)
    assert [c for c in calls(state) if c[0] in ("rm", "start")][-2:] == [["rm", "-f", docker.trial], ["start", name]]
    # A controller that was only slow learns why its trial is gone, and its heartbeat does not come back.
    said = asyncio.run(silent.check_alive())
    assert said is not None and said.startswith(f"the host's watcher put {name} back: this controller was not heard")
    assert not Path(f"/run/serve-tuner/container-{name}.beat").exists()


def test_a_container_name_that_does_not_exist_is_refused_before_anything_changes(docker: Host, tmp_path: Path) -> None:
    port = docker.port

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llama"), transport=transport) as deployer,
        ):
            with pytest.raises(ConfigError, match=r"^no container named 'llama' \(.*\); set deploy\.container"):
                await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    assert_nothing_changed(docker)


def test_the_api_key_reaches_the_container_only_through_a_0600_env_file_removed_after_run(
    docker: Host, tmp_path: Path
) -> None:
    state, port, name = docker
    canary = "sk-canary-4f1e9b"
    launch = vllm_launch(port).model_copy(update={"secret_env": {"VLLM_API_KEY": SecretStr(canary)}})
    run_dir = tmp_path / "run"

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            await deployer.apply(launch, log_path=str(run_dir / "server.log"))
            served_by = containers(state)[docker.trial]["pid"]
            assert process_environment(served_by)["VLLM_API_KEY"] == canary
            for left in Path(env_files(state)[0]["path"]).parent.glob(f"container-{name}.*"):  # the watcher's
                assert canary not in left.read_text(errors="replace"), left

    asyncio.run(scenario())
    (seen,) = env_files(state)
    assert Path(seen["path"]).name == f"container-{name}.env"
    assert seen["mode"] == 0o600, oct(seen["mode"])
    assert f"VLLM_API_KEY={canary}\n" in seen["content"]
    assert_nowhere_on_a_command_line(state, canary)
    assert not Path(seen["path"]).exists()
    for left in run_dir.rglob("*"):  # the original's description and anything else of ours
        assert canary not in left.read_text(errors="replace"), left
    assert_the_original_is_back(docker)


def test_a_run_that_fails_leaves_no_env_file_and_the_original_comes_back(docker: Host, tmp_path: Path) -> None:
    state, port, name = docker
    edit_state(state, lambda data: data.update(run_fails="no space left on device"))

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            with pytest.raises(DeployError, match="`docker run` failed: docker: Error response from daemon: no space"):
                await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    (seen,) = env_files(state)  # `run` was reached, and read the file
    assert seen["mode"] == 0o600 and "HF_TOKEN=hf_canary\n" in seen["content"]
    assert not Path(seen["path"]).exists()
    assert_nowhere_on_a_command_line(state, "hf_canary")
    assert_the_original_is_back(docker)
    assert_restored_by_the_book(docker)


@pytest.mark.parametrize("where", ["inherited", "secret", "name"])
def test_a_value_with_a_line_break_is_refused_naming_the_variable_before_anything_changes(
    docker: Host, tmp_path: Path, where: str
) -> None:
    state, port, name = docker
    launch = vllm_launch(port)
    if where == "inherited":
        edit_state(state, lambda data: data["containers"][name]["Config"]["Env"].append("MOTD=line one\nline two"))
        expected = (
            rf"^the environment variable MOTD of container '{name}' has a line break or NUL in its value, which an "
            rf"env file cannot carry \(and no value goes on the command line\); recreate {name} with MOTD on one "
            rf"line \(`docker inspect {name}` shows its Env\)$"
        )
    elif where == "secret":
        launch = launch.model_copy(update={"secret_env": {"VLLM_API_KEY": SecretStr("sk-canary\nINJECTED=1")}})
        expected = r"^the secret VLLM_API_KEY has a line break .*; fix the variable that engine\.api_key_env names"
    else:  # docker would refuse a name with a space; one starting with `#` it would drop as a comment
        launch = launch.model_copy(update={"env": {"VLLM LOGGING": "1"}})
        expected = (
            r"^the server's environment variable VLLM LOGGING has a name an env file cannot carry \(spaces, '=' or "
            r"a leading '#'\); fix it in the study file's engine section$"
        )

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            checked = [line for line in await deployer.check(launch, tuned=[]) if not line.ok]
            assert [line.subject for line in checked] == ["environment"]  # `--check` says it first
            assert re.search(expected, checked[0].detail) and "sk-canary" not in checked[0].detail
            with pytest.raises(ConfigError, match=expected) as refused:
                await deployer.apply(launch, log_path=str(tmp_path / "t.log"))
            assert "sk-canary" not in str(refused.value) and "line two" not in str(refused.value)

    asyncio.run(scenario())
    assert_nothing_changed(docker)


@pytest.mark.parametrize("why", ["uncarried", "--rm", "foreground", "unpublished", "loopback"])
def test_a_trial_that_could_not_stand_in_for_the_original_is_refused_before_anything_stops(
    docker: Host, tmp_path: Path, why: str
) -> None:
    state, port, name = docker
    launch = vllm_launch(port)
    runner = None
    if why == "uncarried":
        edit_state(state, lambda data: data["containers"][name]["HostConfig"].update(Links=["/db:/llm/db"]))
        subject, expected = "copy", rf"container {name}'s HostConfig\.Links cannot be carried into a trial container"
    elif why == "--rm":
        edit_state(state, lambda data: data["containers"][name]["HostConfig"].update(AutoRemove=True))
        subject, expected = "owner", rf"container {name} was started with --rm: stopping it for a trial would delete it"
    elif why == "foreground":  # a unit's `ExecStart=docker run --name ...`, as `ps` shows it
        runner = subprocess.Popen(
            ["docker", "-c", "import time; time.sleep(60)", "run", "--name", name], executable=sys.executable
        )
        subject, expected = "owner", rf"container {name} is run by `docker run --name {name} \.\.\.` in the foreground"
    elif why == "unpublished":  # engine.port names a container port the original does not publish
        launch = vllm_launch(8000)
        subject = "address"
        expected = rf"container {name} is on network 'default' and publishes no host port for 8000/tcp"
    else:
        launch = vllm_launch(port, host="127.0.0.1")
        subject = "address"
        expected = rf"container {name} is on network 'default', where a server listening on 127\.0\.0\.1 answers only"

    async def scenario() -> list[CheckLine]:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name, start_timeout_s=5), transport=transport) as deployer,
        ):
            with pytest.raises(ConfigError, match=expected):
                await deployer.apply(launch, log_path=str(tmp_path / "t.log"))
            return await deployer.check(launch, tuned=[])

    try:
        lines = asyncio.run(scenario())
    finally:
        if runner is not None:
            runner.kill()
            runner.wait()
    assert [(line.ok, line.subject) for line in lines] == [(True, f"container {name}"), (False, subject)]
    assert re.search(expected, lines[1].detail)
    assert_nothing_changed(docker)


def test_a_trial_container_whose_server_is_killed_is_reported_dead(docker: Host, tmp_path: Path) -> None:
    state, port, name = docker

    async def scenario() -> str:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
            assert await deployer.check_alive() is None
            os.kill(containers(state)[docker.trial]["pid"], signal.SIGKILL)  # the OOM killer, say
            async with asyncio.timeout(60):  # a generous deadline; it is noticed at once
                while (reason := await deployer.check_alive()) is None:
                    await asyncio.sleep(0.05)
            # Someone removes the dead container by hand: still not taken for a running server.
            edit_state(state, lambda data: data["containers"].pop(docker.trial))
            return f"{reason}; then {await deployer.check_alive()}"

    assert asyncio.run(scenario()) == "the trial container is exited (exit code 137); then the trial container is gone"
    assert_the_original_is_back(docker)


def test_an_original_started_again_beside_the_trial_ends_it(docker: Host, tmp_path: Path) -> None:
    port, name = docker.port, docker.name

    async def scenario() -> str | None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
            assert await deployer.check_alive() is None
            set_status(docker, name, "running")  # its restart policy after an engine restart, say
            reason = await deployer.check_alive()
            set_status(docker, name, "exited")
            return reason

    reason = asyncio.run(scenario())
    assert reason is not None and reason.startswith(f"the original container {name} is running again beside")
    assert_the_original_is_back(docker)


def test_an_original_changed_during_the_study_is_reported_by_the_restore(docker: Host, tmp_path: Path) -> None:
    state, port, name = docker

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container=name), transport=transport) as deployer,
        ):
            await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
            edit_state(state, lambda data: data["containers"][name]["Config"].update(Cmd=["another/model"]))

    with pytest.raises(DeployError, match=rf"^container {name} is not as the study found it \(Config differ\)"):
        asyncio.run(scenario())
    assert_the_original_is_back(docker)


def test_tuner_run_refuses_an_inherited_value_with_a_line_break_in_one_line_with_exit_2(
    docker: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, port, name = docker
    edit_state(state, lambda data: data["containers"][name]["Config"]["Env"].append("MOTD=line one\nline two"))
    (tmp_path / "space.toml").write_text('engine = "vllm"\n\n[params.max_num_seqs]\nchoices = [32, 64]\n')
    header = {"format": "serve-tuner-trace", "version": 1, "name": "one-chat"}
    chat = {"id": "c", "offset_s": 0.0, "session": "c", "turn": 0, "prompt": {"new_tokens": 8}, "output_tokens": 4}
    (tmp_path / "trace.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(chat) + "\n")
    study = tmp_path / "study.toml"
    study.write_text(
        f"""name = "containers"
[budget]
trials = 1
[deploy]
kind = "container"
container = "{name}"
[engine]
kind = "vllm"
model = "Qwen/Qwen2.5-0.5B-Instruct"
host = "0.0.0.0"
port = {port}
[engine.settings]
max_num_seqs = 64
[workload]
path = "trace.jsonl"
[search]
space = "space.toml"
[[objectives]]
metric = "ttft_p95_s"
direction = "minimize"
"""
    )

    code = main(["run", str(study), "--runs-dir", str(tmp_path / "runs")])

    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert err == [
        f"error: the environment variable MOTD of container '{name}' has a line break or NUL in its value, which an "
        f"env file cannot carry (and no value goes on the command line); recreate {name} with MOTD on one line "
        f"(`docker inspect {name}` shows its Env)"
    ]
    assert_nothing_changed(docker)


def test_the_check_names_a_missing_container_and_changes_nothing(docker: Host) -> None:
    """`tuner run --check` with deploy.kind = "container": it only inspects (TRANSCRIPT-BASED CLI)."""
    state, port, name = docker

    async def check(container: str) -> list[CheckLine]:
        async with LocalTransport() as transport:
            deployer = ContainerDeployer(ContainerOptions(container=container), transport=transport)
            assert deployer.privileged_commands == ("docker", "sh", "rm", "touch")
            return await deployer.check(vllm_launch(port), tuned=[])

    before = containers(state)
    found, copy = asyncio.run(check(name))
    assert (found.subject, found.ok, found.detail) == (
        f"container {name}",
        True,
        "running, image vllm/vllm-openai:v0.33.0",
    )
    assert copy.ok and copy.detail == (
        f"a trial carries everything but the command line; reached at 127.0.0.1:{port} (published for {port}/tcp)"
    )
    (missing,) = asyncio.run(check("other"))
    assert not missing.ok and "set deploy.container to the container that runs the server" in missing.detail
    assert containers(state) == before
    assert {call[0] for call in calls(state)} == {"inspect"}
