"""A stand-in `docker` CLI for the container deployer's tests (no container engine runs here).

It keeps containers in a JSON state file (FAKE_DOCKER_STATE), records every invocation (its real
argv, as `ps` would show it), answers `inspect` in docker's documented shape (a JSON array;
`-f '{{.State.Status}} {{.State.ExitCode}}'`; `image inspect --format '{{json .Config.Entrypoint}}'` with
the image's entrypoint, `["vllm","serve"]`), and for a running container runs
tests/data/health_server.py on the published host port with the container's environment, so that
health checks are real and the environment a container got can be read from /proc.

`run --env-file PATH` reads PATH as docker does (one `KEY=VALUE` a line, `#` comments, a missing file
is an error) and records, under "env_files", the file's path, mode and content at that moment: the
tests check what the deployer left there while `run` ran, and that it is gone afterwards. `run` takes any
flag the deployer may pass: `--flag VALUE` (or `--flag=VALUE`) pairs generically, the boolean flags by name;
its `--label KEY=VALUE`s are the container's `Config.Labels`.

Failures on demand: `run ... --fail-to-start` makes the container exit at once, as a bad flag would;
`"run_fails": "MESSAGE"` in the state makes `run` itself fail as a daemon error does (exit 125). A
container whose stand-in server was killed is reported exited with 137, as docker reports SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

STATE = Path(os.environ["FAKE_DOCKER_STATE"])
STAND_IN = Path(__file__).resolve().parent / "health_server.py"
IMAGE_ENTRYPOINT = ["vllm", "serve"]  # every image's here, as vLLM's image has it
# `run`'s flags that take no value; every other `--flag` takes the next word.
BOOLEAN_FLAGS = {"-d", "--detach", "--privileged", "--read-only", "--init", "--publish-all", "--oom-kill-disable"}


def load() -> dict[str, Any]:
    state: dict[str, Any] = json.loads(STATE.read_text())
    return state


def save(state: dict[str, Any]) -> None:
    """Whole or not at all: a test (or the watcher's own `docker`) reading meanwhile never sees a part."""
    part = STATE.with_name(f".{STATE.name}.{os.getpid()}")
    part.write_text(json.dumps(state, indent=1))
    part.replace(STATE)


def host_port(inspect: dict[str, Any]) -> int:
    bindings = inspect["HostConfig"]["PortBindings"]
    return int(next(iter(bindings.values()))[0]["HostPort"])


def alive(pid: int) -> bool:
    """The process runs and is not a zombie waiting for its parent (this CLI exited long ago)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def refresh(state: dict[str, Any]) -> None:
    """What docker's daemon notices by itself: a container whose process died has exited."""
    for container in state["containers"].values():
        if container.get("pid") and not alive(container["pid"]):
            container["pid"] = None
            container["State"] = {"Status": "exited", "ExitCode": 137}


def read_env_file(path: str) -> list[str]:
    """docker's env-file parser: leading whitespace dropped, blank lines and `#` comments skipped,
    a name with whitespace refused; the value is everything after the first `=`, as written."""
    entries = []
    for raw in Path(path).read_text().split("\n"):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        name = line.split("=", 1)[0]
        if any(c.isspace() for c in name):
            raise ValueError(f"variable '{name}' contains whitespaces")
        entries.append(line)
    return entries


def start(state: dict[str, Any], name: str, *, fail: bool = False) -> None:
    container = state["containers"][name]
    log = STATE.parent / f"{name}.log"
    if fail:
        log.write_text("error: unrecognized arguments: --fail-to-start\n")
        container["State"] = {"Status": "exited", "ExitCode": 2}
        container["pid"] = None
        return
    with log.open("a") as out:
        process = subprocess.Popen(
            [sys.executable, str(STAND_IN)],
            env={
                **os.environ,
                **dict(entry.split("=", 1) for entry in container["Config"]["Env"] if "=" in entry),
                "PORT": str(host_port(container)),
                "LOADING_S": "0.3",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    container["pid"] = process.pid
    container["State"] = {"Status": "running", "ExitCode": 0}


def stop(state: dict[str, Any], name: str) -> None:
    container = state["containers"][name]
    if container.get("pid"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(container["pid"], signal.SIGTERM)
    container["pid"] = None
    container["State"] = {"Status": "exited", "ExitCode": 0}


def create(state: dict[str, Any], args: list[str]) -> int:
    """`run -d --name NAME -p ADDR:HOST:CONTAINER [--label K=V] [-e K=V] [--env-file PATH] ... IMAGE ARGS`:
    a container, started; docker's exit status."""
    name = args[args.index("--name") + 1]
    ports = [args[i + 1] for i, a in enumerate(args) if a == "-p"]
    published, _, container_port = ports[0].rpartition(":")
    address, _, port = published.rpartition(":")
    env = []
    for i, a in enumerate(args):
        if a == "--env-file":
            path = args[i + 1]
            try:
                mode = Path(path).stat().st_mode & 0o777
                content = Path(path).read_text()
                entries = read_env_file(path)
            except FileNotFoundError:
                print(f"docker: open {path}: no such file or directory.", file=sys.stderr)
                return 125
            except ValueError as exc:
                print(f"docker: poorly formatted environment: {exc}.", file=sys.stderr)
                return 125
            state.setdefault("env_files", []).append({"path": path, "mode": mode, "content": content})
            env += entries
        elif a == "-e":
            env.append(args[i + 1])
    if state.get("run_fails"):
        print(f"docker: Error response from daemon: {state['run_fails']}.", file=sys.stderr)
        return 125
    labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
    rest, i = [], 0
    while i < len(args):
        if args[i] in BOOLEAN_FLAGS or (args[i].startswith("-") and "=" in args[i]):
            i += 1
        elif args[i].startswith("-"):
            i += 2
        else:
            rest = args[i:]
            break
    state["containers"][name] = {
        "Name": "/" + name,
        "Config": {
            "Image": rest[0],
            "Cmd": rest[1:],
            "Env": env,
            "Entrypoint": IMAGE_ENTRYPOINT,
            "Labels": labels,
        },
        "HostConfig": {"PortBindings": {container_port: [{"HostIp": address, "HostPort": port}]}},
    }
    start(state, name, fail="--fail-to-start" in rest)
    return 0


def main(argv: list[str]) -> int:
    state = load()
    state["calls"].append(argv)
    refresh(state)
    containers = state["containers"]
    command, args = argv[0], argv[1:]
    code = 0
    if command == "image" and args[:1] == ["inspect"]:
        print(json.dumps(IMAGE_ENTRYPOINT))
    elif command == "inspect":
        name = args[-1]
        if name not in containers:
            print(f"Error: No such container: {name}", file=sys.stderr)
            code = 1
        elif "-f" in args:
            current = containers[name]["State"]
            print(f"{current['Status']} {current['ExitCode']}")
        else:
            shown = {k: v for k, v in containers[name].items() if k != "pid"}
            print(json.dumps([shown]))
    elif command == "stop":
        stop(state, args[-1])
    elif command == "start":
        start(state, args[-1])
    elif command == "rename":
        containers[args[1]] = containers.pop(args[0])
        containers[args[1]]["Name"] = "/" + args[1]
    elif command == "rm":
        if args[-1] in containers:
            stop(state, args[-1])
            del containers[args[-1]]
    elif command == "logs":
        log = STATE.parent / f"{args[-1]}.log"
        print(log.read_text() if log.exists() else "", end="")
    elif command == "run":
        code = create(state, args)
        if code == 0:
            print("0123456789ab")
    else:
        print(f"fake docker: unsupported command {command}", file=sys.stderr)
        code = 125
    save(state)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
