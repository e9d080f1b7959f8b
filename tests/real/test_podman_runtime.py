"""The real container runtime the container deployer's tests run on (tests/support/containers.py): Debian's
podman on runc, as root, with the llama-server and Ollama images made offline from `tuner setup`'s builds.
The real llama-server answers from a container run as a production host would run it (its own user, the
model bind-mounted read-only, a device, a ulimit, a capability), and `podman inspect` shows each of them
where the deployer's checks will read them. After each test no container of it is left."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support import free_port
from tests.support.containers import PodmanHost, make_ollama_image
from tuner import assets

READY_S = 60.0


def _wait_until_answering(host: PodmanHost, name: str, url: str) -> None:
    """`url` answers 200 before READY_S; a container that exits first fails the test with its log."""
    deadline = time.monotonic() + READY_S
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        state = host.inspect(name)["State"]
        log = host.podman("logs", name, check=False)
        assert state["Running"], f"{name} exited {state['ExitCode']}: {(log.stdout + log.stderr)[-2000:]}"
        assert time.monotonic() < deadline, f"{url} did not answer 200 in {READY_S:g} s: {log.stderr[-2000:]}"
        time.sleep(0.2)


def test_llama_server_answers_from_a_container_and_inspect_shows_how_it_runs(podman_host: PodmanHost) -> None:
    model = assets.find_model()
    assert model is not None  # podman_host needs llama_server_binary, which needs the model
    name, port = podman_host.name("llama"), free_port()
    podman_host.podman(
        "run", "--detach", "--name", name, "--network", "host", "--user", "1000:1000",
        "--volume", f"{model.parent}:/models:ro", "--device", "/dev/null:/dev/tuner-null",
        # Any --ulimit replaces the default ones whole: nproc is given again, or podman raises it past
        # what this machine grants and the container does not start.
        "--ulimit", "nofile=512:512", "--ulimit", "nproc=1024:1024", "--cap-add", "SYS_NICE",
        podman_host.llama_server_image, "/usr/local/bin/llama-server", "-m", f"/models/{model.name}",
        "--host", "127.0.0.1", "--port", str(port), "-c", "512",
    )  # fmt: skip
    _wait_until_answering(podman_host, name, f"http://127.0.0.1:{port}/health")
    seen = podman_host.inspect(name)
    config, host_config = seen["Config"], seen["HostConfig"]
    assert config["User"] == "1000:1000"
    assert host_config["Devices"] == [
        {"PathOnHost": "/dev/null", "PathInContainer": "/dev/tuner-null", "CgroupPermissions": ""}
    ]
    assert {"Name": "RLIMIT_NOFILE", "Soft": 512, "Hard": 512} in host_config["Ulimits"]
    assert host_config["CapAdd"] == ["CAP_SYS_NICE"]
    assert host_config["Binds"] == [f"{model.parent}:/models:ro,rprivate,rbind"]
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in seen["Mounts"]] == [
        ("bind", str(model.parent), "/models", False)
    ]
    assert host_config["NetworkMode"] == "host" and seen["OCIRuntime"] == "runc"
    assert (seen["Path"], seen["Args"][:2]) == ("/usr/local/bin/llama-server", ["-m", f"/models/{model.name}"])
    # The container's pid 1 is the server itself, as the user it was given.
    status = Path(f"/proc/{seen['State']['Pid']}/status").read_text()
    assert "\nUid:\t1000\t1000\t1000\t1000\n" in status, status


def test_ollama_answers_from_a_container_with_the_models_mounted_read_only(
    podman_host: PodmanHost, ollama_binary: Path
) -> None:
    image = make_ollama_image(env=podman_host.env)
    name, port = podman_host.name("ollama"), free_port()
    podman_host.podman(
        "run", "--detach", "--name", name, "--network", "host", "--user", "1000:1000",
        "--volume", f"{assets.ollama_models_dir()}:/models:ro", "--env", "OLLAMA_MODELS=/models",
        "--env", f"OLLAMA_HOST=127.0.0.1:{port}", image, "/usr/local/bin/ollama", "serve",
    )  # fmt: skip
    _wait_until_answering(podman_host, name, f"http://127.0.0.1:{port}/api/version")
    answer = httpx.post(
        f"http://127.0.0.1:{port}/api/generate",
        json={"model": assets.OLLAMA_MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 4}},
        timeout=120,
    )
    assert answer.status_code == 200 and answer.json()["eval_count"] > 0, answer.text
    assert name in podman_host.containers()  # the teardown removes it (tests/real/conftest.py)
