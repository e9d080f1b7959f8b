"""The container deployer against a real runtime: podman on runc, as root (tests/support/containers.py), with
the real llama-server in an image made offline. The operator's container is made here the way a production
host runs one (its own user, a device, a read-only model mount, ulimits, a capability, a group, a security
option, a tmpfs, a label, a secret in its environment, `--init`); `tuner run --check`, a study and its restore
are `tuner` itself in a subprocess, and what the test compares is podman's own `inspect`, never the tuner's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import DATA, free_port, one_error_line, run_tuner
from tests.support.containers import BATCH_STUDY_REST, PodmanHost, make_ollama_image
from tests.support.sshd import SshHost, running_sshd
from tuner import assets

WAIT_S = 90.0
# What changes when a container stops and starts, and nothing else may.
STATE_ONLY = {
    "State", "Created", "RestartCount", "ExecIDs", "NetworkSettings", "Dependencies", "StaticDir",
    "ConmonPidFile", "PidFile", "OCIConfigPath", "Rootfs", "HostsPath", "ResolvConfPath", "HostnamePath",
}  # fmt: skip


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.2)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def start_original(host: PodmanHost, *extra: str, port: int, network: tuple[str, ...] = ("--network", "host")) -> str:
    """The operator's llama-server container, serving on `port`; its name."""
    model = assets.find_model()
    assert model is not None
    name = host.name("llm")
    listen = ("--host", "127.0.0.1", "--port", str(port)) if network[-1] == "host" else ("--host", "0.0.0.0")
    host.podman(
        "run", "-d", "--name", name, *network, "--init",
        "--user", "1000:1000", "--device", "/dev/null:/dev/tuner-null", "-v", f"{model.parent}:/models:ro",
        "--ulimit", "nofile=512:512", "--ulimit", "nproc=1024:1024", "--cap-add", "SYS_NICE", "--group-add", "44",
        "--security-opt", "no-new-privileges", "--tmpfs", "/scratch", "--label", "team=llm",
        "-e", "HF_TOKEN=hf_canary_container", "--workdir", "/tmp", "--pids-limit", "99",
        *extra, "--entrypoint", "/usr/local/bin/llama-server", host.llama_server_image,
        "-m", f"/models/{model.name}", *listen, "-np", "2", "-c", "4096",
    )  # fmt: skip
    return name


def comparable(inspect: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in inspect.items() if key not in STATE_ONLY}


@pytest.fixture(scope="module")
def podman_over_ssh(podman_host: PodmanHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    """A real sshd on loopback whose sessions see the test's containers.conf, as a host's own podman would."""
    config = f"SetEnv CONTAINERS_CONF={podman_host.conf}\n"
    with running_sshd(tmp_path_factory.mktemp("sshd-podman"), extra_config=config) as host:
        yield host


def ssh_section(sshd: SshHost) -> str:
    options = sshd.options()
    return (
        f'[host]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {options["port"]}\nuser = "root"\n'
        f'known_hosts = "{options["known_hosts"]}"\nclient_keys = ["{sshd.client_key}"]\n'
    )


def write_study(
    tmp_path: Path,
    container: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    dead_man_s: int = 3600,
    trials: int = 2,
    over: SshHost | None = None,
) -> Path:
    model = assets.find_model()
    assert model is not None
    study = tmp_path / "study.toml"
    study.write_text(f"""name = "containers"
rounds = 2
[budget]
trials = {trials}
{ssh_section(over) if over is not None else ""}[deploy]
kind = "container"
cli = "podman"
container = "{container}"
stop_timeout_s = 5
dead_man_s = {dead_man_s}
start_timeout_s = 120
[engine]
kind = "llama-server"
binary = "/usr/local/bin/llama-server"
model = "/models/{model.name}"
host = "{host}"
port = {port}
[engine.settings]
ctx_size = 4096
n_parallel = 2
threads = 1
{BATCH_STUDY_REST}""")
    return study


def test_a_study_runs_trials_as_faithful_copies_and_leaves_the_original_as_it_found_it(
    podman_host: PodmanHost, tmp_path: Path
) -> None:
    port = free_port()
    original = start_original(podman_host, port=port)
    wait_for("the original answers", lambda: answers(f"http://127.0.0.1:{port}/health"))
    before = podman_host.inspect(original)
    study = write_study(tmp_path, original, port)

    check = run_tuner("run", str(study), "--check", "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"container {original}" in check.stdout and "a trial carries everything" in check.stdout
    assert "request" in check.stdout  # a real request to the running original

    seen: dict[str, Any] = {}
    trial = original + "-tuner-trial"
    with subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", str(study), "--runs-dir", str(tmp_path / "runs")],
        env=podman_host.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as study_run:  # fmt: skip
        # While a trial runs: the copy, field by field, as podman shows it.
        def trial_runs() -> bool:
            done = podman_host.podman("inspect", "--type", "container", trial, check=False)
            if done.returncode == 0 and json.loads(done.stdout)[0]["State"]["Running"]:
                seen.update(json.loads(done.stdout)[0])
                seen["original_state"] = podman_host.inspect(original)["State"]["Status"]
                return True
            return study_run.poll() is not None

        wait_for("a trial container runs", trial_runs, timeout_s=300)
        output, _ = study_run.communicate(timeout=600)
    assert study_run.returncode == 0, output[-3000:]
    assert seen, output[-3000:]
    assert seen["original_state"] == "exited"  # stopped beside the trial, under its own name
    for field in ("Devices", "Ulimits", "Binds", "CapAdd", "CapDrop", "GroupAdd", "SecurityOpt", "Tmpfs",
                  "NetworkMode", "ShmSize", "PidsLimit", "Init"):  # fmt: skip
        assert seen["HostConfig"].get(field) == before["HostConfig"].get(field), field
    assert seen["Mounts"] == before["Mounts"] and seen["OCIRuntime"] == before["OCIRuntime"]
    for field in ("User", "WorkingDir"):
        assert seen["Config"][field] == before["Config"][field], field
    assert seen["Image"] == before["Image"]  # the original's image itself, by its ID, whatever its tag names now
    assert seen["Config"]["Labels"]["team"] == "llm"
    assert "HF_TOKEN=hf_canary_container" in seen["Config"]["Env"]  # the original's environment, carried
    assert "hf_canary_container" not in " ".join(seen["Config"]["CreateCommand"])  # never on a command line
    # The original is back, running, and but for its state what the study found.
    after = podman_host.inspect(original)
    assert after["State"]["Status"] == "running"
    assert comparable(after) == comparable(before)
    assert podman_host.containers() == [original]
    assert answers(f"http://127.0.0.1:{port}/health")
    # Each trial's container log is in the run directory, as on systemd; the baseline saved without values.
    logs = sorted((tmp_path / "runs" / "containers").rglob("server*.log"))
    assert logs and "model loaded" in logs[0].read_text()
    for kept in (tmp_path / "runs").rglob("*"):
        if kept.is_file():
            assert "hf_canary_container" not in kept.read_text(errors="replace"), kept


@pytest.mark.parametrize("reached", ["here", "over ssh"])
def test_a_killed_controller_leaves_the_host_on_the_original_by_itself(
    podman_host: PodmanHost, tmp_path: Path, reached: str, request: pytest.FixtureRequest
) -> None:
    """Over ssh the controller's death also closes its session: the watcher, in a session of its own, stays."""
    over = request.getfixturevalue("podman_over_ssh") if reached == "over ssh" else None
    port = free_port()
    original = start_original(podman_host, port=port)
    wait_for("the original answers", lambda: answers(f"http://127.0.0.1:{port}/health"))
    before = podman_host.inspect(original)
    study = write_study(tmp_path, original, port, dead_man_s=5, over=over)
    trial = original + "-tuner-trial"
    with subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", str(study), "--runs-dir", str(tmp_path / "runs")],
        env=podman_host.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    ) as controller:  # fmt: skip
        wait_for("a trial container runs", lambda: trial in podman_host.containers(), timeout_s=300)
        os.killpg(controller.pid, signal.SIGKILL)  # no restore of its own
        controller.wait(timeout=60)
    # The watcher on the host notices the silence and puts the original back, the trial gone.
    wait_for("the original serves again", lambda: answers(f"http://127.0.0.1:{port}/health"), timeout_s=60)
    wait_for("the trial container is gone", lambda: podman_host.containers() == [original], timeout_s=30)
    after = podman_host.inspect(original)
    assert after["State"]["Status"] == "running" and comparable(after) == comparable(before)
    # Nothing of the study stays on the host: the heartbeat, the watcher's script, and the env file (the
    # original's environment, secrets included) a controller killed before `run` returned would leave.
    wait_for("the watcher's files are gone", lambda: not list(Path("/run/serve-tuner").glob(f"container-{original}.*")))


@pytest.mark.parametrize("owner", ["--rm", "unit label", "foreground run"])
def test_an_original_that_stopping_would_lose_or_restart_is_refused_before_anything_stops(
    podman_host: PodmanHost, tmp_path: Path, owner: str
) -> None:
    port = free_port()
    foreground = None
    if owner == "--rm":
        original = start_original(podman_host, "--rm", port=port)
        expected = "was started with --rm: stopping it for a trial would delete it; recreate it without --rm"
    elif owner == "unit label":
        original = start_original(podman_host, "--label", "PODMAN_SYSTEMD_UNIT=llm.service", port=port)
        expected = "is run by systemd unit llm.service: stopping it for a trial would have it started again"
    else:  # a unit's `ExecStart=podman run --name ...`, attached, as systemd runs it
        model = assets.find_model()
        assert model is not None
        original = podman_host.name("llm")
        foreground = subprocess.Popen(
            ["podman", "run", "--name", original, "--network", "host", "-v", f"{model.parent}:/models:ro",
             "--entrypoint", "/usr/local/bin/llama-server", podman_host.llama_server_image,
             "-m", f"/models/{model.name}", "--host", "127.0.0.1", "--port", str(port)],
            env=podman_host.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        expected = "is run by `podman run --name"
    try:
        wait_for("the original answers", lambda: answers(f"http://127.0.0.1:{port}/health"))
        before = podman_host.inspect(original)
        study = write_study(tmp_path, original, port)
        check = run_tuner("run", str(study), "--check", "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
        assert check.returncode != 0 and expected in check.stdout, check.stdout
        refused = run_tuner("run", str(study), "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert expected in one_error_line(refused)
        after = podman_host.inspect(original)
        assert after["State"]["Status"] == "running" and after["State"]["StartedAt"] == before["State"]["StartedAt"]
        assert podman_host.containers() == [original]
    finally:
        if foreground is not None:
            podman_host.remove(original)
            foreground.wait(timeout=60)


def test_a_bridge_network_is_reached_through_its_published_port_and_a_loopback_host_is_refused(
    podman_host: PodmanHost, podman_over_ssh: SshHost, tmp_path: Path
) -> None:
    """Over ssh, as a production host is reached: the published port on the host's loopback is forwarded."""
    published = free_port()
    original = start_original(podman_host, port=8080, network=("-p", f"127.0.0.1:{published}:8080"))
    wait_for("the original answers", lambda: answers(f"http://127.0.0.1:{published}/health"))
    before = podman_host.inspect(original)

    loopback = write_study(tmp_path, original, 8080, over=podman_over_ssh)
    check = run_tuner("run", str(loopback), "--check", "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
    assert check.returncode != 0
    assert 'answers only inside the container; set engine.host = "0.0.0.0"' in check.stdout, check.stdout

    study = write_study(tmp_path, original, 8080, host="0.0.0.0", trials=1, over=podman_over_ssh)
    check = run_tuner("run", str(study), "--check", "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"reached at 127.0.0.1:{published} (published for 8080/tcp)" in check.stdout
    ran = run_tuner("run", str(study), "--runs-dir", str(tmp_path / "runs"), env=podman_host.env, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    after = podman_host.inspect(original)
    assert after["State"]["Status"] == "running" and comparable(after) == comparable(before)


def test_ollama_run_as_its_docs_say_is_tuned_through_its_published_port(
    podman_host: PodmanHost, ollama_binary: Path, tmp_path: Path
) -> None:
    """`docker run -d -v ollama:/root/.ollama -p 11434:11434 --name ollama ollama/ollama`, as Ollama documents
    it, but with its own user and the models read-only: --check asks it for the model through the published
    port, the study reads its OLLAMA_NUM_PARALLEL as the baseline, and the original comes back as it was."""
    image = make_ollama_image(env=podman_host.env)
    name, published = podman_host.name("ollama"), free_port()
    podman_host.podman(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{published}:11434", "--init", "--user", "1000:1000",
        "-v", f"{assets.ollama_models_dir()}:/models:ro", "-e", "OLLAMA_MODELS=/models",
        "-e", "OLLAMA_HOST=0.0.0.0:11434", "-e", "OLLAMA_NUM_PARALLEL=4",
        "--entrypoint", "/usr/local/bin/ollama", image, "serve",
    )  # fmt: skip
    wait_for("Ollama answers", lambda: answers(f"http://127.0.0.1:{published}/api/version"))
    before = podman_host.inspect(name)
    study = tmp_path / "study.toml"
    study.write_text(f"""name = "ollama-container"
rounds = 2
[budget]
trials = 1
[deploy]
kind = "container"
cli = "podman"
container = "{name}"
stop_timeout_s = 5
start_timeout_s = 120
[engine]
kind = "ollama"
binary = "/usr/local/bin/ollama"
model = "{assets.OLLAMA_MODEL}"
host = "0.0.0.0"
port = 11434
[engine.settings]
context_length = 2048
[workload]
path = "{DATA / "five-users.jsonl"}"
request_timeout_s = 120
[search]
space = "{DATA / "ollama-parallel-space.toml"}"
[[objectives]]
metric = "ttft_p95_s"
direction = "minimize"
""")
    check = run_tuner("run", str(study), "--check", "--runs-dir", str(tmp_path / "runs"), env=podman_host.env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"reached at 127.0.0.1:{published} (published for 11434/tcp)" in check.stdout
    assert "the server runs num_parallel=4" in check.stdout, check.stdout
    ran = run_tuner("run", str(study), "--runs-dir", str(tmp_path / "runs"), env=podman_host.env, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    board = json.loads(run_tuner("leaderboard", str(tmp_path / "runs" / "ollama-container"), "--json").stdout)
    baseline = next(row for row in board["rows"] if row["baseline"])
    assert baseline["settings"] == {"num_parallel": 4} and baseline["state"] == "COMPLETE"  # what the original runs
    assert {row["settings"]["num_parallel"] for row in board["rows"]} == {1, 4}  # and a trial that measured 1
    after = podman_host.inspect(name)
    assert after["State"]["Status"] == "running" and comparable(after) == comparable(before)
    assert podman_host.containers() == [name]
