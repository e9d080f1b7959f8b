"""A real Ollama on the production-shaped systemd host, laid out as Ollama's install script lays it out:
`/usr/local/bin/ollama serve` as its own user `ollama`, models under that user's home, and the FAQ's
`systemctl edit ollama.service` override setting OLLAMA_HOST and OLLAMA_NUM_PARALLEL. The study keeps the
unit's command line: `--check` reads the operator's values, trial 0 records them as the baseline's (so a
proposal of Ollama's own default, 1, is measured, not taken for the baseline), `apply` writes the tuned
knob alone, and after `restore` the unit's files, its process's environment and command line are as the
operator left them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, run_tuner
from tests.support.systemd_host import SystemdHost, controller_env, running_argv
from tuner import assets

UNIT = "ollama.service"
MODELS = "/usr/share/ollama/.ollama/models"  # the install script's home for the `ollama` user, Ollama's default
# Ollama's own unit, as its install script writes it (the PATH line shortened).
SERVICE = """[Unit]
Description=Ollama Service
After=network-online.target

[Service]
ExecStart=/usr/local/bin/ollama serve
User=ollama
Group=ollama
Restart=always
RestartSec=3
Environment="PATH=/usr/local/bin:/usr/bin:/bin"

[Install]
WantedBy=default.target
"""
DATA = Path(__file__).resolve().parents[1] / "data"


def _override(port: int) -> str:
    # The FAQ's way: `systemctl edit ollama.service`, which writes override.conf.
    return f'[Service]\nEnvironment="OLLAMA_HOST=0.0.0.0:{port}"\nEnvironment="OLLAMA_NUM_PARALLEL=4"\n'


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_answering(host: SystemdHost, port: int) -> None:
    host.wait_active(unit=UNIT)
    for _ in range(600):  # bounded: 60 s of 0.1 s polls
        if _answers(port):
            return
        host.run("sleep", "0.1")
    raise AssertionError(f"{UNIT} does not answer on port {port}")


@pytest.fixture
def ollama_unit(systemd_host: SystemdHost, ollama_binary: Path) -> Iterator[int]:
    """ollama.service installed and running on the host; yields its port, removes it all afterwards."""
    port = free_port()
    host = systemd_host
    host.copy_in(ollama_binary, "/usr/local/bin/ollama", mode="0755")
    host.run("sh", "-c", "id ollama || useradd -r -s /bin/false -U -m -d /usr/share/ollama ollama")
    models = assets.ollama_models_dir()
    for path in models.rglob("*"):
        if path.is_file():
            host.copy_in(path, f"{MODELS}/{path.relative_to(models)}")
    host.run("chown", "-R", "ollama:ollama", "/usr/share/ollama")
    host.write(f"/etc/systemd/system/{UNIT}", SERVICE)
    host.run("mkdir", "-p", f"/etc/systemd/system/{UNIT}.d")
    host.write(f"/etc/systemd/system/{UNIT}.d/override.conf", _override(port))
    host.run("sh", "-c", f"systemctl daemon-reload && systemctl start {UNIT}")
    try:
        _wait_answering(host, port)
        yield port
    finally:
        host.run(
            "sh", "-c",
            f"systemctl stop {UNIT}; rm -rf /etc/systemd/system/{UNIT} /etc/systemd/system/{UNIT}.d; "
            "systemctl daemon-reload",
        )  # fmt: skip


def _files(host: SystemdHost) -> dict[str, bytes | None]:
    listing = host.run("sh", "-c", f"ls -1 /etc/systemd/system/{UNIT} /etc/systemd/system/{UNIT}.d/*").stdout
    return {path: host.read(path) for path in listing.split()}


def _process(host: SystemdHost) -> tuple[dict[str, str], list[str], str]:
    """The running server's environment (less what systemd gives each start), argv and user."""
    environment = host.process_environment(UNIT)
    for name in ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"):
        environment.pop(name, None)
    pid = host.main_pid(UNIT)
    user = host.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip()
    return environment, running_argv(host, UNIT), user


def _study(host: SystemdHost, tmp_path: Path) -> Path:
    ssh = "\n".join(f"{k} = {json.dumps(v)}" for k, v in {"kind": "ssh", **host.ssh_options()}.items())
    (tmp_path / "space.toml").write_text(
        'engine = "ollama"\n[params.num_parallel]\nchoices = [1, 4]\ndefault = 1\n'  # Ollama's own default
    )
    (tmp_path / "ollama.toml").write_text(
        f"""name = "ollama-unit"
rounds = 2
seed = 1
[budget]
trials = 1
[host]
{ssh}
[deploy]
kind = "systemd"
unit = "{UNIT}"
[engine]
kind = "ollama"
model = "serve-tuner-smollm2"
[workload]
path = {json.dumps(str(DATA / "five-users.jsonl"))}
request_timeout_s = 120
[search]
space = "space.toml"
sampler = "random"
[gate]
enabled = false
[confirm]
top = 0
[[objectives]]
metric = "ttft_p95_s"
direction = "minimize"
"""
    )
    return tmp_path / "ollama.toml"


@pytest.mark.real_server
def test_ollama_installed_as_its_install_script_does_is_tuned_applied_and_restored_leaving_only_the_knob(
    systemd_host: SystemdHost, ollama_unit: int, tmp_path: Path
) -> None:
    host, port = systemd_host, ollama_unit
    files, process = _files(host), _process(host)
    assert process[1] == ["/usr/local/bin/ollama", "serve"] and process[2] == "ollama"
    study, env = _study(host, tmp_path), controller_env(tmp_path)
    runs = ["--runs-dir", str(tmp_path)]

    # --check reads what the unit runs and where it comes from, and changes nothing.
    done = run_tuner("run", str(study), "--check", *runs, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    baseline_line = next(line for line in done.stdout.splitlines() if "baseline" in line and "runs" in line)
    assert "num_parallel=4 (OLLAMA_NUM_PARALLEL in ollama.service's Environment=" in baseline_line, done.stdout
    assert "answered POST /api/show with the study's model name and key" in done.stdout, done.stdout
    assert _files(host) == files and _process(host) == process
    # A model the server does not have fails the check, named, instead of the night at its warm-up.
    wrong = run_tuner("run", str(study), "--check", *runs, "--set", 'engine.model="no-such-model"', env=env)
    assert wrong.returncode == 1, wrong.stdout[-3000:] + wrong.stderr[-3000:]
    assert "has no model by the name the study sends (HTTP 404" in wrong.stdout and "no-such-model" in wrong.stdout

    # The study: trial 0 is the unit as it runs (4 slots), so the proposal of 1 is a trial of its own.
    done = run_tuner("run", str(study), *runs, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the baseline is the server as it runs: num_parallel=4" in done.stdout
    board = json.loads(run_tuner("leaderboard", str(tmp_path / "ollama-unit"), "--json", timeout=120).stdout)
    measured = sorted((row["number"], row["settings"]["num_parallel"]) for row in board["rows"])
    assert [value for _, value in measured] == [4, 1] and measured[0][0] == 0, board["rows"]
    assert all(row["state"] == "COMPLETE" for row in board["rows"]), board["rows"]
    tuned = measured[1][0]
    log = (tmp_path / "ollama-unit" / "trials" / f"{tuned:04d}" / "server.log").read_text()
    assert f"Listening on [::]:{port}" in log and "OLLAMA_NUM_PARALLEL:1" in log  # the trial's own journal
    assert _files(host) == files and _process(host) == process

    # apply: the tuned knob alone, in an /etc drop-in, on the operator's own server.
    done = run_tuner("apply", str(study), *runs, "--trial", str(tuned), env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    applied = (host.read(f"/etc/systemd/system/{UNIT}.d/zz-tuner-applied.conf") or b"").decode()
    assert re.findall(r'^Environment="([A-Z_]+)=(\S*)"', applied, flags=re.MULTILINE) == [
        ("OLLAMA_NUM_PARALLEL", "1")
    ], applied
    environment, argv, user = _process(host)
    assert {k: v for k, v in environment.items() if process[0].get(k) != v} == {"OLLAMA_NUM_PARALLEL": "1"}
    assert (argv, user) == process[1:] and _answers(port)
    assert {p: b for p, b in _files(host).items() if not p.endswith("zz-tuner-applied.conf")} == files

    # restore: the host byte-identical, the server as the operator runs it.
    done = run_tuner("restore", str(study), env=env, timeout=600)
    assert done.returncode == 0 and "removed" in done.stdout, done.stdout + done.stderr
    _wait_answering(host, port)
    assert _files(host) == files and _process(host) == process
