"""The ssh transport against a real sshd on loopback (tests/real/conftest.py: throwaway keys, pinned)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, run_tuner
from tests.support.sshd import SshHost
from tuner.config import PluginSpec
from tuner.errors import TransportError
from tuner.transports import create_transport
from tuner.transports.ssh import SshTransport

CANARY = "sk-canary-" + "7" * 24


def ssh(host: SshHost, **extra: object) -> SshTransport:
    transport = create_transport(PluginSpec.model_validate({"kind": "ssh", **host.options(**extra)}))
    assert isinstance(transport, SshTransport)
    return transport


def test_an_unpinned_host_is_refused_with_the_command_that_pins_it(sshd_host: SshHost, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ssh(sshd_host, known_hosts=str(tmp_path / "none")):
            pass

    with pytest.raises(TransportError, match=r"tuner trust-host 127\.0\.0\.1"):
        asyncio.run(scenario())


def test_a_changed_host_key_is_refused(sshd_host: SshHost, tmp_path: Path) -> None:
    import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    pinned = tmp_path / "known_hosts"
    pinned.write_text(f"[127.0.0.1]:{sshd_host.port} {other}\n")

    async def scenario() -> None:
        async with ssh(sshd_host, known_hosts=str(pinned)):
            pass

    with pytest.raises(TransportError, match="does not match a pinned key"):
        asyncio.run(scenario())


def test_trust_host_shows_the_fingerprint_and_pins_the_key_that_then_connects(
    sshd_host: SshHost, tmp_path: Path
) -> None:
    import asyncssh

    pinned = tmp_path / "pinned"
    command = [sys.executable, "-m", "tuner", "trust-host", "127.0.0.1", "--port", str(sshd_host.port)]
    done = subprocess.run(
        [*command, "--known-hosts", str(pinned), "--yes"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    fingerprint = asyncssh.read_private_key(str(sshd_host.host_key)).get_fingerprint("sha256")
    assert fingerprint in done.stdout
    assert oct(pinned.stat().st_mode & 0o777) == "0o600"

    async def scenario() -> str:
        async with ssh(sshd_host, known_hosts=str(pinned)) as transport:
            return (await transport.run(["echo", "hello"], timeout_s=10)).stdout

    assert asyncio.run(scenario()) == "hello\n"
    refused = subprocess.run(
        [*command, "--known-hosts", str(tmp_path / "other")],
        input="n\n",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert refused.returncode == 1 and not (tmp_path / "other").exists()


def nasty_values(count: int) -> Iterator[str]:
    """Values a settings file or command could carry, chosen to break quoting: shell syntax, quotes,
    newlines, systemd specifiers, leading dashes, unicode; then random strings of all of those."""
    yield from [
        "$(touch /tmp/pwned)",
        "`id`",
        "a'b\"c",
        "; rm -rf /",
        "line1\nline2",
        "--help",
        "%h %n $HOME ${PATH}",
        "\\\\ \\n \\t",
        "ünïcødé ✓",
        " leading and trailing ",
        "*",
        "",
    ]
    alphabet = string.printable + "ü✓\u00a0"
    rng = random.Random(7)
    for _ in range(count):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))


def test_no_value_is_ever_interpreted_by_the_remote_shell(sshd_host: SshHost, tmp_path: Path) -> None:
    values = [v for v in nasty_values(300) if "\x00" not in v]
    names = ["$(touch x)", "a b", "quote'd", "semi;colon", "new\nline", "-dash", "✓"]

    async def scenario() -> None:
        async with ssh(sshd_host) as transport:
            # Every value as its own argument of one command: each must arrive whole and unchanged.
            echoed = await transport.run(["printf", "%s\\0", *values], timeout_s=30)
            assert echoed.stdout.split("\0")[:-1] == values
            for name, value in zip(names, values, strict=False):
                target = tmp_path / name
                await transport.write_file(str(target), value.encode(), mode=0o600)
                assert await transport.read_file(str(target)) == value.encode()
                await transport.remove_file(str(target))

    asyncio.run(scenario())
    assert not Path("/tmp/pwned").exists()
    assert list(tmp_path.iterdir()) == []


def test_a_secret_in_the_environment_never_appears_on_a_command_line(sshd_host: SshHost, tmp_path: Path) -> None:
    log = tmp_path / "server.log"

    async def scenario() -> tuple[int, bool]:
        async with ssh(sshd_host) as transport:
            child = await transport.spawn(
                ["sh", "-c", 'echo "key has ${#API_KEY} characters"; sleep 30'],
                env={"API_KEY": CANARY, "PATH": os.environ["PATH"]},
                log_path=str(log),
            )
            for _ in range(100):
                if log.exists() and "characters" in log.read_text():
                    break
                await asyncio.sleep(0.05)
            leaked = any(CANARY.encode() in cmdline for cmdline in _all_command_lines())
            await child.stop(grace_s=2)
            return child.pid, leaked

    pid, leaked = asyncio.run(scenario())
    assert not leaked, "the canary key was visible in a process's command line"
    assert f"key has {len(CANARY)} characters" in log.read_text()
    assert CANARY not in log.read_text()
    assert not Path(f"{log}.env").exists(), "the environment file outlived the start"
    assert pid > 0


def _all_command_lines() -> list[bytes]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return lines


def test_a_lost_connection_is_reopened_and_the_next_command_runs(sshd_host: SshHost) -> None:
    async def scenario() -> str:
        async with ssh(sshd_host, reconnect_window_s=10) as transport:
            connection = transport._connection
            assert connection is not None
            connection.abort()  # what a cut link looks like to the client
            await asyncio.wait_for(connection.wait_closed(), timeout=10)  # the loss is seen before the next command
            return (await transport.run(["echo", "back"], timeout_s=10)).stdout

    assert asyncio.run(scenario()) == "back\n"


def test_a_host_gone_for_longer_than_the_reconnect_window_fails_with_the_reason(
    sshd_host: SshHost, tmp_path: Path
) -> None:
    async def scenario() -> None:
        transport = ssh(sshd_host, reconnect_window_s=1.5, connect_timeout_s=1)
        async with transport:
            assert transport._connection is not None
            transport._connection.abort()
            gone = free_port()  # nothing listens there: every reconnect is refused
            transport._options = transport._options.model_copy(update={"port": gone})
            started = time.monotonic()
            with pytest.raises(TransportError, match=r"could not re-open it within 1\.5 s"):
                await transport.run(["true"], timeout_s=5)
            assert time.monotonic() - started < 10
            transport._options = transport._options.model_copy(update={"port": sshd_host.port})

    asyncio.run(scenario())


def test_a_server_on_the_hosts_loopback_is_reached_through_a_forwarded_port(sshd_host: SshHost, tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("through the tunnel")
    port = free_port()

    async def scenario() -> str:
        async with ssh(sshd_host) as transport:
            await transport.spawn(
                [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
                env={"PATH": os.environ["PATH"]},
                log_path=str(tmp_path / "http.log"),
            )
            local = await transport.forward_port(port)
            async with httpx.AsyncClient(timeout=5) as client:
                for _ in range(100):
                    try:
                        return (await client.get(f"http://127.0.0.1:{local}/index.html")).text
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
            return ""

    assert asyncio.run(scenario()) == "through the tunnel"


@pytest.mark.real_server
def test_a_study_runs_its_server_on_a_host_reached_over_ssh(
    sshd_host: SshHost, llama_server_binary: Path, tmp_path: Path
) -> None:
    """The thin remote path: the process deployer starts llama-server through the ssh transport, the
    health check and the replay reach it through a forwarded port, and the run ends with it stopped."""
    from tests.real.conftest import llama_server_processes
    from tuner import assets
    from tuner.report import build_leaderboard
    from tuner.runs import RunDirectory
    from tuner.storage import open_optuna_study_readonly

    data = Path(__file__).resolve().parents[1] / "data"
    text = (data / "tiny-study.toml").read_text().replace('name = "tiny"', 'name = "remote"')
    text = text.replace('"stall-small.jsonl"', json.dumps(str(data / "stall-small.jsonl")))
    text = text.replace('"batch-space.toml"', json.dumps(str(data / "batch-space.toml")))
    # The paths are the host's (a study's own command line on another host takes no `auto`); this host is
    # this machine reached over ssh, so its build is where `tuner setup` put it.
    model = assets.find_model()
    assert model is not None
    paths = f"binary = {json.dumps(str(llama_server_binary))}\nmodel = {json.dumps(str(model))}"
    text = text.replace('kind = "llama-server"', f'kind = "llama-server"\n{paths}')
    host = "\n".join(f"{key} = {json.dumps(value)}" for key, value in {"kind": "ssh", **sshd_host.options()}.items())
    (tmp_path / "remote.toml").write_text(f"{text}\n[host]\n{host}\n")

    before = llama_server_processes(llama_server_binary, under=tmp_path)
    sshd_log = sshd_host.workdir / "sshd.log"
    logins_before = sshd_log.read_text().count("Accepted publickey")
    command = ["run", str(tmp_path / "remote.toml"), "--runs-dir", str(tmp_path)]
    command += ["--set", "budget.trials=0", "--set", "confirm.top=0"]
    done = run_tuner(*command, timeout=600)  # past it, SIGTERM: the study restores the host and stops its server
    assert done.returncode == 0, done.stderr
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(tmp_path / "remote")))
    (baseline,) = board.rows
    assert baseline.baseline and baseline.state == "COMPLETE"
    assert baseline.metrics["stall_tok_s"][0] > 0
    # Reached over ssh: the study logged in, and the server's environment file was read and removed.
    assert sshd_log.read_text().count("Accepted publickey") > logins_before
    trial_dir = tmp_path / "remote" / "trials" / "0000"
    assert (trial_dir / "server.log").exists() and not (trial_dir / "server.log.env").exists()
    assert llama_server_processes(llama_server_binary, under=tmp_path) == before
