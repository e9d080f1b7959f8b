"""The container deployer against a recorded CLI contract.

No container engine runs on these machines, so `docker` here is tests/data/fake_docker.py: it keeps
containers in a JSON file, answers `inspect` in docker's documented shape, records every invocation
with its real argv and every env file as it was while `run` read it, and runs the stand-in health
server for a running container with the container's environment. The tests check the exact commands
the deployer issues (the contract) and what a user would see: the user's container back under its own
name and running, whatever happened, and no environment value on any command line (`ps` shows those to
every user of the host).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int]]:
    """A `docker` on PATH, with the user's vLLM container `llm` running on a free port."""
    port = free_port()
    state = tmp_path / "docker-state.json"
    original = {
        "Name": "/llm",
        "Image": "sha256:0123",
        "Config": {
            "Image": "vllm/vllm-openai:v0.33.0",
            "Entrypoint": ["vllm", "serve"],
            "Cmd": ["Qwen/Qwen2.5-0.5B-Instruct", "--max-num-seqs", "64"],
            "Env": ["PATH=/usr/local/bin:/usr/bin", "HF_TOKEN=hf_canary"],
        },
        "HostConfig": {
            "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]},
            "Binds": ["/srv/hf:/root/.cache/huggingface"],
            "IpcMode": "host",
            "DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}],
        },
        "State": {"Status": "running", "ExitCode": 0},
    }
    state.write_text(json.dumps({"containers": {"llm": original}, "calls": []}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "docker"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {DATA / "fake_docker.py"} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    yield state, port
    for container in containers(state).values():  # the stand-in servers of containers left running
        if container.get("pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container["pid"], signal.SIGTERM)


def vllm_launch(port: int, **settings: Any) -> LaunchSpec:
    engine = create_engine(
        PluginSpec.model_validate(
            {
                "kind": "vllm",
                "model": "Qwen/Qwen2.5-0.5B-Instruct",
                "host": "127.0.0.1",
                "port": port,
                "settings": settings,
            }
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
    state.write_text(json.dumps(data))


def process_environment(pid: int) -> dict[str, str]:
    """What the container's server really got (the stand-in runs as a process of ours)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def assert_nowhere_on_a_command_line(state: Path, *values: str) -> None:
    for argv in calls(state):
        for value in values:
            assert not any(value in argument for argument in argv), (value, argv)


def assert_the_original_is_back(state: Path) -> None:
    after = containers(state)
    assert set(after) == {"llm"} and after["llm"]["State"]["Status"] == "running"


def test_a_trial_runs_as_a_copy_of_the_users_container_and_the_original_comes_back(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport) as deployer,
        ):
            deployment = await deployer.apply(vllm_launch(port, max_num_seqs=32), log_path=str(tmp_path / "t1.log"))
            assert deployment.base_url == f"http://127.0.0.1:{port}"
            assert await deployer.check_alive() is None
            assert set(containers(state)) == {"llm-tuner-baseline", "llm-tuner-trial"}
            served_by = containers(state)["llm-tuner-trial"]["pid"]
            assert process_environment(served_by)["HF_TOKEN"] == "hf_canary"  # the trial still gets it
            await deployer.apply(vllm_launch(port, max_num_seqs=64), log_path=str(tmp_path / "t2.log"))

    asyncio.run(scenario())
    after = containers(state)
    assert set(after) == {"llm"} and after["llm"]["State"]["Status"] == "running"
    assert after["llm"]["Config"]["Cmd"] == ["Qwen/Qwen2.5-0.5B-Instruct", "--max-num-seqs", "64"]
    run = next(c for c in calls(state) if c[0] == "run")
    # The contract: the original's ports, mounts, IPC, GPUs and environment; the image's own entrypoint
    # (`vllm serve`) kept, so only the model and flags follow the image.
    assert run[:4] == ["run", "-d", "--name", "llm-tuner-trial"]
    assert ["-p", f"127.0.0.1:{port}:8000/tcp"] == run[4:6]
    for pair in (["-v", "/srv/hf:/root/.cache/huggingface"], ["--ipc", "host"], ["--gpus", "all"]):
        assert any(run[i : i + 2] == pair for i in range(len(run))), pair
    # The environment, the original's secret included, went through the env file, never the argv.
    assert "-e" not in run
    assert_nowhere_on_a_command_line(state, "hf_canary", "HF_TOKEN")
    env_file = run[run.index("--env-file") + 1]
    recorded = env_files(state)
    assert [r["path"] for r in recorded] == [env_file, str(tmp_path / "t2.log.env")]
    assert env_file == str(tmp_path / "t1.log.env")
    for seen in recorded:
        assert seen["mode"] == 0o600, oct(seen["mode"])
        assert "HF_TOKEN=hf_canary\n" in seen["content"] and "PATH=/usr/local/bin:/usr/bin\n" in seen["content"]
    assert not Path(env_file).exists() and not (tmp_path / "t2.log.env").exists()
    image_at = run.index("vllm/vllm-openai:v0.33.0")
    assert run[image_at + 1 :][:3] == ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1"]
    assert "--entrypoint" not in run and "--max-num-seqs" in run
    assert calls(state)[-3:] == [
        ["inspect", "--type", "container", "llm-tuner-baseline"],
        ["rename", "llm-tuner-baseline", "llm"],
        ["start", "llm"],
    ]
    saved = (tmp_path / "t1.log.baseline.json").read_text()
    assert json.loads(saved)["Name"] == "/llm"
    assert "HF_TOKEN=(not saved)" in saved and "hf_canary" not in saved


def test_a_trial_that_cannot_start_fails_with_its_log_and_the_original_still_comes_back(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker
    launch = vllm_launch(port)
    broken = launch.model_copy(update={"args": (*launch.args, "--fail-to-start")})

    async def scenario() -> None:
        options = ContainerOptions(container="llm", start_timeout_s=10)
        async with LocalTransport() as transport, ContainerDeployer(options, transport=transport) as deployer:
            with pytest.raises(
                ServerNotReady,
                match=r"stopped while starting: the trial container is exited \(exit code 2\); "
                r"container log ends: error: unrecognized arguments",
            ):
                await deployer.apply(broken, log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    assert set(containers(state)) == {"llm"} and containers(state)["llm"]["State"]["Status"] == "running"


def test_a_controller_killed_mid_study_is_cleaned_up_by_the_next_run(docker: tuple[Path, int], tmp_path: Path) -> None:
    state, port = docker

    async def killed() -> None:
        transport = LocalTransport()
        deployer = ContainerDeployer(ContainerOptions(container="llm"), transport=transport)
        await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
        # No restore: what SIGKILL of the controller leaves behind.

    asyncio.run(killed())
    assert set(containers(state)) == {"llm-tuner-baseline", "llm-tuner-trial"}

    async def next_run() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport),
        ):
            assert set(containers(state)) == {"llm"}

    asyncio.run(next_run())
    assert containers(state)["llm"]["State"]["Status"] == "running"


def test_a_container_name_that_does_not_exist_is_refused_before_anything_changes(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llama"), transport=transport) as deployer,
        ):
            with pytest.raises(DeployError, match=r"no container named 'llama'; set deploy\.container"):
                await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    assert containers(state)["llm"]["State"]["Status"] == "running"
    assert not any(c[0] in ("stop", "rename", "run") for c in calls(state))


def test_the_api_key_reaches_the_container_only_through_a_0600_env_file_removed_after_run(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker
    canary = "sk-canary-4f1e9b"
    launch = vllm_launch(port).model_copy(update={"secret_env": {"VLLM_API_KEY": SecretStr(canary)}})
    run_dir = tmp_path / "run"

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport) as deployer,
        ):
            await deployer.apply(launch, log_path=str(run_dir / "server.log"))
            served_by = containers(state)["llm-tuner-trial"]["pid"]
            assert process_environment(served_by)["VLLM_API_KEY"] == canary

    asyncio.run(scenario())
    (seen,) = env_files(state)
    assert seen["path"] == str(run_dir / "server.log.env")
    assert seen["mode"] == 0o600, oct(seen["mode"])
    assert f"VLLM_API_KEY={canary}\n" in seen["content"]
    assert_nowhere_on_a_command_line(state, canary)
    assert not Path(seen["path"]).exists()
    for left in run_dir.rglob("*"):  # the baseline's description and anything else of ours
        assert canary not in left.read_text(errors="replace"), left
    assert_the_original_is_back(state)


def test_a_run_that_fails_leaves_no_env_file_and_the_original_comes_back(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker
    edit_state(state, lambda data: data.update(run_fails="no space left on device"))

    async def scenario() -> None:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport) as deployer,
        ):
            with pytest.raises(DeployError, match="docker run failed: docker: Error response from daemon: no space"):
                await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))

    asyncio.run(scenario())
    (seen,) = env_files(state)  # `run` was reached, and read the file
    assert seen["mode"] == 0o600 and "HF_TOKEN=hf_canary\n" in seen["content"]
    assert not Path(seen["path"]).exists()
    assert_nowhere_on_a_command_line(state, "hf_canary")
    assert_the_original_is_back(state)


@pytest.mark.parametrize("where", ["inherited", "secret", "name"])
def test_a_value_with_a_line_break_is_refused_naming_the_variable_before_anything_changes(
    docker: tuple[Path, int], tmp_path: Path, where: str
) -> None:
    state, port = docker
    launch = vllm_launch(port)
    if where == "inherited":
        edit_state(state, lambda data: data["containers"]["llm"]["Config"]["Env"].append("MOTD=line one\nline two"))
        expected = (
            r"^the environment variable MOTD of container 'llm' has a line break or NUL in its value, which an env "
            r"file cannot carry \(and no value goes on the command line\); recreate llm with MOTD on one line "
            r"\(`docker inspect llm` shows its Env\)$"
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
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport) as deployer,
        ):
            with pytest.raises(ConfigError, match=expected) as refused:
                await deployer.apply(launch, log_path=str(tmp_path / "t.log"))
            assert "sk-canary" not in str(refused.value) and "line two" not in str(refused.value)

    asyncio.run(scenario())
    assert not any(c[0] in ("stop", "rename", "run") for c in calls(state))
    assert env_files(state) == [] and not (tmp_path / "t.log.env").exists()
    assert_the_original_is_back(state)


def test_a_trial_container_whose_server_is_killed_is_reported_dead(docker: tuple[Path, int], tmp_path: Path) -> None:
    state, port = docker

    async def scenario() -> str:
        async with (
            LocalTransport() as transport,
            ContainerDeployer(ContainerOptions(container="llm"), transport=transport) as deployer,
        ):
            await deployer.apply(vllm_launch(port), log_path=str(tmp_path / "t.log"))
            assert await deployer.check_alive() is None
            os.kill(containers(state)["llm-tuner-trial"]["pid"], signal.SIGKILL)  # the OOM killer, say
            async with asyncio.timeout(60):  # a generous deadline; it is noticed at once
                while (reason := await deployer.check_alive()) is None:
                    await asyncio.sleep(0.05)
            # Someone removes the dead container by hand: still not taken for a running server.
            edit_state(state, lambda data: data["containers"].pop("llm-tuner-trial"))
            return f"{reason}; then {await deployer.check_alive()}"

    assert asyncio.run(scenario()) == "the trial container is exited (exit code 137); then the trial container is gone"
    assert_the_original_is_back(state)


def test_tuner_run_refuses_an_inherited_value_with_a_line_break_in_one_line_with_exit_2(
    docker: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, port = docker
    edit_state(state, lambda data: data["containers"]["llm"]["Config"]["Env"].append("MOTD=line one\nline two"))
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
container = "llm"
[engine]
kind = "vllm"
model = "Qwen/Qwen2.5-0.5B-Instruct"
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
        "error: the environment variable MOTD of container 'llm' has a line break or NUL in its value, which an env "
        "file cannot carry (and no value goes on the command line); recreate llm with MOTD on one line "
        "(`docker inspect llm` shows its Env)"
    ]
    assert not any(c[0] in ("stop", "rename", "run") for c in calls(state))
    assert_the_original_is_back(state)


def test_the_check_names_a_missing_container_and_changes_nothing(docker: tuple[Path, int]) -> None:
    """`tuner run --check` with deploy.kind = "container": it only inspects (TRANSCRIPT-BASED CLI)."""
    state, port = docker

    async def check(name: str) -> list[CheckLine]:
        async with LocalTransport() as transport:
            deployer = ContainerDeployer(ContainerOptions(container=name), transport=transport)
            assert deployer.privileged_commands == ("docker", "sh", "rm")
            return await deployer.check(vllm_launch(port), tuned=[])

    before = containers(state)
    (found,) = asyncio.run(check("llm"))
    assert found.ok and found.detail == "running"
    (missing,) = asyncio.run(check("other"))
    assert not missing.ok and "set deploy.container to the container that runs the server" in missing.detail
    assert containers(state) == before
    assert {call[0] for call in calls(state)} == {"inspect"}
