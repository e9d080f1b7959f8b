"""A unit that runs the server's container, tuned through that unit (`[deploy] kind = "systemd"`, `exec_start =
"container"`), on the real systemd host with real podman inside it: the operator's docker-run-style unit
(`ExecStart=/usr/bin/podman run --rm --name llm ... IMAGE ARGS`, in the foreground, `Restart=always`). A study
runs each trial as that same `run` with the trial's command line; the test reads what the host runs while a
trial does (the unit's process, podman's own inspect of the container), and after the study the unit's files
are byte-identical and its process runs the operator's command line again.

The host's podman keeps its images on `vfs` (its root is an overlay, on which overlayfs cannot mount), with
the test's containers.conf as the host's own /etc/containers/containers.conf; the llama-server image is
copied in with `podman save` and `podman load`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, run_tuner
from tests.support.containers import BATCH_STUDY_REST, PodmanHost
from tests.support.systemd_host import SystemdHost, controller_env

UNIT = "llm-container.service"
NAME = "llm"


def _exec_start(host: SystemdHost, image: str, port: int) -> str:
    return (
        f"/usr/bin/podman run --rm --name {NAME} --network host --init -v /srv/models:/models:ro "
        f"--entrypoint /usr/local/bin/llama-server {image} -m /models/{Path(host.model).name} "
        f"--host 127.0.0.1 --port {port} -np 2 -c 4096"
    )


def _answers(host: SystemdHost, port: int) -> bool:
    """The unit's server answers its health check (the host shares this machine's network)."""
    try:
        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
            return True
    except httpx.TransportError:
        pass
    said = host.run("systemctl", "is-failed", UNIT, check=False).stdout.strip()
    assert said != "failed", host.run("journalctl", "-u", UNIT, "-n", "20", "--no-pager", check=False).stdout
    return False


def _without(words: list[str], *flags: str) -> list[str]:
    """`words` less each of `flags` and the value after it."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            kept.append(word)
    return kept


@pytest.fixture
def container_unit(systemd_host: SystemdHost, podman_host: PodmanHost, tmp_path: Path) -> Iterator[int]:
    """The operator's container unit installed and serving on the host; yields its port."""
    host = systemd_host
    host.write("/etc/containers/containers.conf", podman_host.conf.read_text())
    host.write(
        "/etc/containers/storage.conf",
        '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers-vfs"\n',
    )
    if host.run("podman", "image", "exists", podman_host.llama_server_image, check=False).returncode != 0:
        archive = tmp_path / "image.tar"
        podman_host.podman("save", "-o", str(archive), podman_host.llama_server_image)
        host.copy_in(archive, "/root/llama-server-image.tar")
        host.run("podman", "load", "-i", "/root/llama-server-image.tar", timeout=300)
        host.run("rm", "-f", "/root/llama-server-image.tar")
    port = free_port()
    host.write(
        f"/etc/systemd/system/{UNIT}",
        "[Unit]\nDescription=llama-server in a container\n\n[Service]\n"
        f"ExecStartPre=-/usr/bin/podman rm -f {NAME}\n"
        f"ExecStart={_exec_start(host, podman_host.llama_server_image, port)}\n"
        f"ExecStop=/usr/bin/podman stop -t 5 {NAME}\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n",
    )
    host.run("sh", "-c", f"systemctl daemon-reload && systemctl start {UNIT}")
    try:
        deadline = time.monotonic() + 120
        while not _answers(host, port):
            assert time.monotonic() < deadline, f"{UNIT} does not answer on {port}"
            time.sleep(0.2)
        yield port
    finally:
        host.run(
            "sh", "-c", f"systemctl stop {UNIT}; rm -f /etc/systemd/system/{UNIT}; systemctl daemon-reload", check=False
        )


def _running(host: SystemdHost) -> list[str]:
    pid = host.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    raw = host.run("cat", f"/proc/{pid}/cmdline", check=False).stdout
    return raw.split("\0")[:-1]


def _study(host: SystemdHost, tmp_path: Path, port: int) -> Path:
    ssh = "\n".join(f"{k} = {json.dumps(v)}" for k, v in {"kind": "ssh", **host.ssh_options()}.items())
    study = tmp_path / "study.toml"
    study.write_text(f"""name = "container-unit"
rounds = 2
[budget]
trials = 1
[host]
{ssh}
[deploy]
kind = "systemd"
unit = "{UNIT}"
exec_start = "container"
start_timeout_s = 120
[engine]
kind = "llama-server"
binary = "/usr/local/bin/llama-server"
model = "/models/{Path(host.model).name}"
host = "127.0.0.1"
port = {port}
[engine.settings]
ctx_size = 4096
n_parallel = 2
threads = 1
{BATCH_STUDY_REST}""")
    return study


@pytest.mark.real_server
def test_a_unit_running_a_container_is_tuned_through_its_own_run_and_left_as_it_was(
    systemd_host: SystemdHost, container_unit: int, tmp_path: Path
) -> None:
    host, port = systemd_host, container_unit
    files_before = host.unit_files(UNIT)
    argv_before = _running(host)
    study, env = _study(host, tmp_path, port), controller_env(tmp_path)
    runs = ("--runs-dir", str(tmp_path))

    check = run_tuner("run", str(study), "--check", *runs, env=env, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "in the foreground: a trial replaces its command after the image" in check.stdout

    seen: list[list[str]] = []
    environments: list[list[str]] = []  # the container's, as podman inspects it
    with subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", str(study), *runs],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as study_run:  # fmt: skip
        pending = False  # a trial's container not inspected yet
        while study_run.poll() is None:  # what the unit runs while trials do
            argv = _running(host)
            if argv and argv != argv_before and argv not in seen:
                seen.append(argv)
                pending = True
            if pending:
                said = json.loads(host.run("podman", "inspect", NAME, check=False).stdout or "[]")
                if said:  # created once `podman run` has got that far
                    environments.append(said[0]["Config"]["Env"])
                    pending = False
            time.sleep(0.5)
        output = study_run.communicate(timeout=60)[0]
    assert study_run.returncode == 0, output[-3000:]
    trial_argv = next(argv for argv in seen if argv and argv[0] == "/usr/bin/podman")
    image = argv_before[argv_before.index("--entrypoint") + 2]
    before_head, trial_head = argv_before[: argv_before.index(image)], trial_argv[: trial_argv.index(image)]
    # The operator's `run` word for word up to the image, the trial's variables by name, its own program.
    assert _without(trial_head, "--env", "--entrypoint") == _without(before_head, "--entrypoint")
    assert trial_head[trial_head.index("--entrypoint") + 1] == "/usr/local/bin/llama-server"
    # The trial's settings reach llama-server as LLAMA_ARG_* variables: named on the command line, their
    # values from the drop-in's Environment=, and in the container as podman shows it.
    named = {argv[i + 1] for argv in seen for i, word in enumerate(argv[: argv.index(image)]) if word == "--env"}
    assert {"LLAMA_ARG_MODEL", "LLAMA_ARG_PORT", "LLAMA_ARG_UBATCH"} <= named, seen
    assert not any("=" in name for name in named)  # no value on the command line
    assert any(f"LLAMA_ARG_UBATCH={value}" in env for env in environments for value in (64, 512)), environments
    # After the study: the unit's files byte for byte, the operator's command line running again.
    assert host.unit_files(UNIT) == files_before
    assert host.read(f"/run/systemd/system/{UNIT}.d/zz-tuner.conf") is None
    deadline = time.monotonic() + 60
    while _running(host) != argv_before:
        assert time.monotonic() < deadline, _running(host)
        time.sleep(0.2)
