"""`exec_start = "container"`: the operator's foreground `docker run`/`podman run` read from a unit's command
line, what it is refused for, and the trial's `run` made from it (the operator's words up to the image, the
trial's variables by name, its program and arguments). The real unit is tests/real/test_container_unit.py."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from tuner.deployers.systemd.container_unit import parse_container_run, reached_at, trial_exec_start
from tuner.errors import ConfigError
from tuner.models import LaunchSpec

UNIT = "llm.service"
OPERATOR = shlex.split(
    "/usr/bin/podman --runtime runc run --rm --name llm --network host -v /srv/models:/models:ro -e HF_HOME=/hf "
    "-it --entrypoint /opt/old /opt/images/llama:1 -m /models/m.gguf --port 8080"
)


def launch(**env: str) -> LaunchSpec:
    return LaunchSpec(executable="/usr/local/bin/llama-server", args=("--port", "8080"), env=env, port=8080)


def test_the_trials_run_is_the_operators_up_to_the_image_with_its_variables_by_name() -> None:
    run = parse_container_run(OPERATOR, unit=UNIT)
    assert run.image == "/opt/images/llama:1" and run.command == ["-m", "/models/m.gguf", "--port", "8080"]
    argv = trial_exec_start(run, launch(LLAMA_ARG_UBATCH="64"))
    assert argv == [
        *OPERATOR[: OPERATOR.index("--entrypoint")],
        "--env", "LLAMA_ARG_UBATCH", "--entrypoint", "/usr/local/bin/llama-server",
        "/opt/images/llama:1", "--port", "8080",
    ]  # fmt: skip
    assert not any("=64" in word for word in argv)  # the value is the drop-in's Environment=, never argv


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("/usr/bin/podman run -d --name llm img", "runs its container detached (-d)"),
        ("/usr/bin/docker run -dit --name llm img", "runs its container detached (-dit)"),
        ("/usr/bin/docker run --detach --name llm img", "runs its container detached (--detach)"),
        ("/usr/bin/podman run -d=true --name llm img", "runs its container detached (-d=true)"),
        ("/opt/llama/bin/llama-server -m /m", "runs /opt/llama/bin/llama-server, not docker or podman"),
        ("/usr/bin/podman start -a llm", "runs `/usr/bin/podman start`, not a `run`"),
        ("/usr/bin/podman run --rm --name llm", "names no image"),
    ],
)
def test_a_unit_command_that_is_not_a_foreground_run_is_refused_with_the_way(command: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_container_run(shlex.split(command), unit=UNIT)
    assert said in str(refused.value)


def test_switches_that_take_no_value_are_not_taken_for_the_image() -> None:
    run = parse_container_run(shlex.split("/usr/bin/podman run --rm --rmi --passwd --name llm img -m x"), unit=UNIT)
    assert run.image == "img" and run.command == ["-m", "x"]
    assert parse_container_run(shlex.split("/usr/bin/podman run --detach=false img"), unit=UNIT).image == "img"


def test_the_trial_is_reached_on_the_hosts_network_or_through_the_published_port() -> None:
    on_host = parse_container_run(OPERATOR, unit=UNIT)
    assert reached_at(on_host, launch()) == ("127.0.0.1", 8080)
    bridge = parse_container_run(shlex.split("/usr/bin/docker run --rm -p 10.0.0.5:18080:8080 img"), unit=UNIT)
    assert reached_at(bridge, launch()) == ("10.0.0.5", 18080)
    anywhere = parse_container_run(shlex.split("/usr/bin/docker run --rm --publish=18081:8080/tcp img"), unit=UNIT)
    assert reached_at(anywhere, launch()) == ("127.0.0.1", 18081)


class _UnitRunning:
    """A unit whose process runs `argv` with `environ`, as /proc shows them (all verify_started reads)."""

    name = UNIT

    def __init__(self, argv: list[str], environ: dict[str, str]) -> None:
        self._files = {
            "/proc/2/cmdline": "".join(f"{word}\0" for word in argv).encode(),
            "/proc/2/environ": "".join(f"{k}={v}\0" for k, v in environ.items()).encode(),
        }

    async def read(self, path: str) -> bytes | None:
        return self._files.get(path)


def test_a_container_units_trial_is_scored_only_where_its_process_runs_the_trials_own_run() -> None:
    from tuner.deployers.systemd.start import verify_started
    from tuner.deployers.systemd.unit import UnitState
    from tuner.errors import DeployError

    trial = launch(LLAMA_ARG_UBATCH="64")
    argv = trial_exec_start(parse_container_run(OPERATOR, unit=UNIT), trial)
    before = UnitState({"MainPID": "1", "InvocationID": "a", "NeedDaemonReload": "no"})
    after = UnitState({"MainPID": "2", "InvocationID": "b", "NeedDaemonReload": "no"})

    def verify(running: list[str]) -> None:
        unit = _UnitRunning(running, {"LLAMA_ARG_UBATCH": "64"})
        asyncio.run(verify_started(unit, trial, before, after, exec_start="container", command=argv))  # type: ignore[arg-type]

    verify(argv)
    with pytest.raises(DeployError, match="not the trial's command line"):
        verify([*argv, "--ubatch-size", "512"])  # a flag someone added wins over the variable
