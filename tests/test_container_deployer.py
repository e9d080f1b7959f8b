"""The container deployer against a recorded CLI contract.

No container engine runs on these machines, so `docker` here is tests/data/fake_docker.py: it keeps
containers in a JSON file, answers `inspect` in docker's documented shape, records every invocation,
and runs the stand-in health server for a running container. The tests check the exact commands the
deployer issues (the contract) and what a user would see: the user's container back under its own
name and running, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.config import PluginSpec
from tuner.deployers import ContainerDeployer
from tuner.deployers.container import ContainerOptions
from tuner.engines import create_engine
from tuner.errors import DeployError, ServerNotReady
from tuner.models import LaunchSpec
from tuner.transports import LocalTransport

DATA = Path(__file__).resolve().parent / "data"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    assert "-e" in run and "HF_TOKEN=hf_canary" in run
    image_at = run.index("vllm/vllm-openai:v0.33.0")
    assert run[image_at + 1 :][:3] == ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1"]
    assert "--entrypoint" not in run and "--max-num-seqs" in run
    assert calls(state)[-3:] == [
        ["inspect", "--type", "container", "llm-tuner-baseline"],
        ["rename", "llm-tuner-baseline", "llm"],
        ["start", "llm"],
    ]
    assert json.loads((tmp_path / "t1.log.baseline.json").read_text())["Name"] == "/llm"


def test_a_trial_that_cannot_start_fails_with_its_log_and_the_original_still_comes_back(
    docker: tuple[Path, int], tmp_path: Path
) -> None:
    state, port = docker
    launch = vllm_launch(port)
    broken = launch.model_copy(update={"args": (*launch.args, "--fail-to-start")})

    async def scenario() -> None:
        options = ContainerOptions(container="llm", start_timeout_s=10)
        async with LocalTransport() as transport, ContainerDeployer(options, transport=transport) as deployer:
            with pytest.raises(ServerNotReady, match="unrecognized arguments"):
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
