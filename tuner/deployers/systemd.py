"""The `systemd` deployer: a trial is one drop-in of ours on the operator's unit, under /run.

    enter:   take the host's lock; put back whatever an earlier, killed run left; snapshot the unit
             (its files, their hashes, its environment, whether it ran)
    apply:   refuse if an operator drop-in sorting after ours sets one of our keys
             arm the dead-man timer on the host (it restores the baseline if this controller vanishes)
             write /run/systemd/system/UNIT.d/zz-tuner.conf atomically; daemon-reload; reset-failed;
             restart; wait for health while watching Result=, NRestarts and MainPID; then verify that
             what runs is what was meant (no pending reload, a new MainPID and InvocationID, the
             process's own environment and, with `exec_start = "replace"`, its argv)
    restore: remove our drop-in; daemon-reload; reset-failed; restart (or stop, if the unit was not
             running); verify every file is byte-identical to the snapshot; disarm the timer; unlock
    persist: (`tuner apply`, after a verification run) the same text as APPLIED_NAME under /etc, ours
             under /run removed: the running server already has these settings, so it is not restarted

The drop-in lives under /run, so a host rebooted mid-trial boots on its baseline. We never run
`systemctl revert`: it would delete the operator's drop-ins too. `tuner restore` removes the file
`tuner apply` wrote, and only that.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field

from tuner.catalog import SYSTEMD_APPLIED_DROP_IN
from tuner.config import StrictModel
from tuner.deployers.base import DEPLOYERS, Deployment, wait_until_healthy
from tuner.errors import (
    CommandFailed,
    ConfigError,
    DeployError,
    HostUnreachable,
    ServerNotReady,
    StudyError,
    TransportError,
)
from tuner.faults import crash_point
from tuner.http import tls_context
from tuner.models import CheckLine, LaunchSpec, OperatorServer, ServerCommand, TunedKnob
from tuner.redact import redact
from tuner.transports.base import Transport

__all__ = [
    "APPLIED_NAME",
    "DROP_IN_NAME",
    "SystemdDeployer",
    "SystemdOptions",
    "check_kept_command",
    "parse_show_environment",
    "quote_unit_word",
    "render_drop_in",
    "render_secrets_file",
]

DROP_IN_NAME = "zz-tuner.conf"  # sorts after the operator's override.conf, so our values win
# `tuner apply` writes this one under /etc: it sorts before DROP_IN_NAME, so later trials still win over
# it (a file of the same name in /etc would hide ours in /run). Named in the catalog, for the morning report.
APPLIED_NAME = SYSTEMD_APPLIED_DROP_IN
RUNTIME_DIR = "/run/systemd/system"
PERSISTENT_DIR = "/etc/systemd/system"
STATE_DIR = "/run/serve-tuner"
PERSISTENT_SECRETS_DIR = "/etc/serve-tuner"
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\-]+\.service\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHOW_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "MainPID", "InvocationID", "NRestarts",
    "NeedDaemonReload", "FragmentPath", "DropInPaths", "Environment", "ExecMainStatus", "ExecStart",
)  # fmt: skip


class SystemdOptions(StrictModel):
    unit: str = Field(description="The service that runs the server, e.g. `llama-server.service`.")
    exec_start: Literal["keep", "replace"] = Field(
        default="keep",
        description="`keep`: the unit's own ExecStart runs, with the trial's settings as Environment= "
        "lines. `replace`: the drop-in also resets ExecStart= to the engine's full command line (needed "
        "for flags without an environment variable, such as LoRA adapters, or a unit whose ExecStart "
        "sets a tuned flag, which would win over the environment).",
    )
    start_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for a trial to be healthy.")
    restore_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for the baseline to be back.")
    dead_man_s: float = Field(
        default=3600.0,
        ge=5,
        description="The host restores its baseline by itself this long after the controller was last "
        "heard from (a timer armed on the host before every change, re-armed after every round): make it "
        "longer than a trial's longest round.",
    )
    lock_stale_s: float = Field(
        default=900.0, gt=0, description="A lock whose holder has not been heard from for this long is taken over."
    )

    def model_post_init(self, context: object, /) -> None:
        if not _UNIT_NAME.match(self.unit):
            raise ValueError(f"deploy.unit {self.unit!r} is not a service name: write it as NAME.service")


def quote_unit_word(text: str, *, in_exec: bool, what: str) -> str:
    """One word of a unit file, double-quoted so that systemd reads back exactly `text`.

    Inside quotes systemd undoes C escapes (so backslash and quote are escaped), expands `%` specifiers
    everywhere (`%%`), and in ExecStart= also `$VAR` (`$$`). Control characters cannot be carried in a
    unit file line at all and are refused."""
    _check_no_control_characters(text, what=what)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} is not valid UTF-8; remove the stray bytes") from None
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if in_exec:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def _check_env_name(name: str) -> None:
    if not _ENV_NAME.match(name):
        raise ConfigError(f"environment variable name {name!r} is not valid; use letters, digits and _")


def _check_no_control_characters(text: str, *, what: str) -> None:
    bad = next((char for char in text if ord(char) < 0x20 or ord(char) == 0x7F), None)
    if bad is not None:
        raise ConfigError(f"{what} contains the control character {bad!r}, which a unit file cannot carry; remove it")


def render_secrets_file(launch: LaunchSpec) -> str:
    """An EnvironmentFile= for the launch's secrets: `systemctl show` and D-Bus show Environment= values
    to anyone, the contents of a 0600 file to no one."""
    lines = []
    for name, value in launch.secret_values().items():
        _check_env_name(name)
        _check_no_control_characters(value, what=f"the value of {name}")
        escaped = "".join("\\" + char if char in '"\\`$' else char for char in value)
        lines.append(f'{name}="{escaped}"\n')
    return "".join(lines)


def render_drop_in(
    launch: LaunchSpec, *, exec_start: Literal["keep", "replace"], note: str, secrets_file: str | None = None
) -> str:
    """The text of our drop-in for `launch`; raises `ConfigError` for a value systemd cannot carry.
    With `keep`, the launch's arguments are the unit's own business (`check_kept_command` checks that
    its ExecStart already passes them)."""
    lines = [f"# {note}", "[Service]"]
    for name, value in launch.env.items():
        _check_env_name(name)
        lines.append("Environment=" + quote_unit_word(f"{name}={value}", in_exec=False, what=f"the value of {name}"))
    if launch.secret_env:
        assert secrets_file is not None
        lines.append(f"EnvironmentFile={secrets_file}")
    if exec_start == "replace":
        if not launch.executable.startswith("/"):
            raise ConfigError(
                f"ExecStart= needs the server program's absolute path on the host, not {launch.executable!r}; set "
                "engine.binary (vLLM: the first word of engine.command) to it"
            )
        words = [quote_unit_word(word, in_exec=True, what="a command-line argument") for word in launch.command]
        lines += ["ExecStart=", "ExecStart=" + " ".join(words)]
    return "\n".join(lines) + "\n"


def shown_argv(exec_start_shown: str) -> list[str]:
    """The command line in `systemctl show -p ExecStart`: systemd joins its words with spaces, unquoted,
    so a word that holds a space cannot be told apart (a running unit's /proc/PID/cmdline can)."""
    match = re.search(r"argv\[\]=(.*?) ;", exec_start_shown)
    return match.group(1).split() if match else []


def read_holder(raw: bytes | None) -> dict[str, object]:
    """A lock's holder as `owner.json` says; anything unreadable counts as no holder (a stale lock)."""
    try:
        holder = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def check_kept_command(launch: LaunchSpec, exec_start_shown: str) -> None:
    """With `exec_start = "keep"`, the unit's own command line must already pass the launch's arguments
    (`serve` for Ollama; LoRA adapters would need to be there for llama-server), in order."""
    unit_args = shown_argv(exec_start_shown)[1:]
    position = 0
    for arg in launch.args:
        try:
            position = unit_args.index(arg, position) + 1
        except ValueError:
            raise ConfigError(
                f"this configuration passes {' '.join(launch.args[:4])}, which the unit's ExecStart does not; "
                'set deploy.exec_start = "replace" in the study file so the drop-in carries the command line'
            ) from None


def parse_show_environment(text: str) -> dict[str, str]:
    """`systemctl show -p Environment --value`: assignments separated by spaces, each bare or in double
    quotes with backslash escapes (systemd's shell_maybe_quote)."""
    result: dict[str, str] = {}
    index = 0
    while index < len(text):
        if text[index] == " ":
            index += 1
            continue
        word: list[str] = []
        if text[index] == '"':
            index += 1
            while index < len(text) and text[index] != '"':
                if text[index] == "\\" and index + 1 < len(text):
                    index += 1
                word.append(text[index])
                index += 1
            index += 1
        else:
            while index < len(text) and text[index] != " ":
                word.append(text[index])
                index += 1
        name, _, value = "".join(word).partition("=")
        result[name] = value
    return result


def _assigned_keys(unit_text: str) -> tuple[set[str], bool]:
    """Environment names a unit file or drop-in assigns, and whether it sets ExecStart=."""
    names: set[str] = set()
    sets_exec = False
    for raw in unit_text.splitlines():
        line = raw.strip()
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment="), posix=True):
                names.add(word.partition("=")[0])
        elif line.startswith("ExecStart="):
            sets_exec = True
    return names, sets_exec


def _read_snapshot(raw: bytes) -> dict[str, object]:
    """The snapshot an earlier run left on the host; one it cannot read still says to restart the unit."""
    try:
        snapshot = json.loads(raw)
    except ValueError:
        return {"active": True}
    if not isinstance(snapshot, dict):
        return {"active": True}
    if not isinstance(snapshot.get("files"), dict) or not isinstance(snapshot.get("environment"), dict):
        return {"active": bool(snapshot.get("active", True))}
    return snapshot


def _environ(raw: bytes) -> dict[str, str]:
    """A process's environment as /proc/PID/environ holds it."""
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


@dataclass(frozen=True)
class UnitState:
    properties: Mapping[str, str]

    def __getitem__(self, name: str) -> str:
        return self.properties.get(name, "")

    @property
    def main_pid(self) -> int:
        return int(self["MainPID"] or 0)

    @property
    def restarts(self) -> int:
        return int(self["NRestarts"] or 0)

    @property
    def drop_ins(self) -> list[str]:
        return self["DropInPaths"].split()


@DEPLOYERS.register("systemd")
class SystemdDeployer:
    options_model = SystemdOptions

    @staticmethod
    def server_command(options: SystemdOptions, *, local_host: bool) -> ServerCommand:
        """`keep`: the unit's own command line, model and address; `replace`: the study's, with host paths."""
        if options.exec_start == "keep":
            return ServerCommand.UNIT
        return ServerCommand.LOCAL if local_host else ServerCommand.REMOTE

    # What it runs as root (through `sudo -n` for a plain login), the transport's file steps included.
    privileged_commands = ("systemctl", "systemd-run", "journalctl", "mkdir", "rm", "sh", "cat")

    @staticmethod
    def check_launch(options: SystemdOptions, launch: LaunchSpec) -> None:
        """A launch no drop-in can carry is refused before the host is touched."""
        render_drop_in(launch, exec_start=options.exec_start, note="check", secrets_file="/dev/null")

    def __init__(self, options: SystemdOptions, *, transport: Transport) -> None:
        self._options = options
        self._transport = transport
        self._unit = options.unit
        self._runtime_drop_in = f"{RUNTIME_DIR}/{self._unit}.d/{DROP_IN_NAME}"
        self._state_path = f"{STATE_DIR}/{self._unit}.json"
        self._lock_dir = f"{STATE_DIR}/{self._unit}.lock"
        self._restore_script = f"{STATE_DIR}/{self._unit}.restore.sh"
        self._secrets_path = f"{STATE_DIR}/{self._unit}.secret.env"
        self._timer = "serve-tuner-restore-" + self._unit.removesuffix(".service").replace("@", "_")
        self._owner = {"controller": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        self._locked = False
        self._baseline: dict[str, object] | None = None
        self._written: str | None = None  # our drop-in's text, while one is in place
        self._deployed: UnitState | None = None
        self._launch: LaunchSpec | None = None
        self._operator: OperatorServer | None = None  # with `keep`: the unit's own server, read once
        self._last_beat = 0.0

    # ---- the host's commands ------------------------------------------------------------------

    async def _systemctl(self, *args: str, timeout_s: float = 60, check: bool = True) -> str:
        try:
            result = await self._transport.run(
                ["systemctl", *args], timeout_s=timeout_s, check=check, privileged=True, idempotent=True
            )
        except CommandFailed as exc:
            raise DeployError(f"systemctl {' '.join(args)} failed: {exc.stderr_tail.strip()[-300:]}") from None
        return result.stdout

    async def _state(self) -> UnitState:
        args = [arg for name in _SHOW_PROPERTIES for arg in ("-p", name)]
        out = await self._systemctl("show", self._unit, *args)
        return UnitState(dict(line.split("=", 1) for line in out.splitlines() if "=" in line))

    async def _read(self, path: str) -> bytes | None:
        try:
            return await self._transport.read_file(path)
        except TransportError:
            return None

    async def _unit_files(self, state: UnitState) -> dict[str, str]:
        """Every file that configures the unit, hashed: the fragment and each drop-in but ours."""
        paths = [state["FragmentPath"], *state.drop_ins] if state["FragmentPath"] else state.drop_ins
        hashes = {}
        for path in paths:
            if path.endswith("/" + DROP_IN_NAME):
                continue
            data = await self._read(path)
            hashes[path] = hashlib.sha256(data or b"").hexdigest()
        return hashes

    # ---- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> SystemdDeployer:
        await self._lock()
        try:
            state = await self._state()
            if state["LoadState"] != "loaded":
                raise DeployError(
                    f"the host has no unit {self._unit} ({state['LoadState'] or 'unknown'}); set deploy.unit to "
                    "the service that runs the server (`systemctl list-units --type=service`)"
                )
            previous = await self._read(self._state_path)
            if previous is not None or await self._read(self._runtime_drop_in) is not None:
                # An earlier controller died before it had restored (its snapshot is removed only once the
                # host is back): put the host back before looking at it, and hold the result to that
                # run's snapshot, as its own restore would have.
                self._written = "(left by an earlier run)"
                self._baseline = _read_snapshot(previous) if previous else {"active": True}
                await self.restore()
                await self._lock()
                state = await self._state()
            self._baseline = {
                "active": state["ActiveState"] in ("active", "activating", "reloading"),
                "files": await self._unit_files(state),
                "environment": parse_show_environment(state["Environment"]),
            }
        except BaseException:
            await self._unlock()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.restore()

    async def _lock(self) -> None:
        """One controller per host and unit: a directory made atomically, with its holder inside."""
        if self._locked:
            return
        owner_path = f"{self._lock_dir}/owner.json"
        await self._transport.run(
            ["mkdir", "-p", "--", STATE_DIR], timeout_s=30, check=False, privileged=True, idempotent=True
        )
        made = await self._transport.run(["mkdir", "--", self._lock_dir], timeout_s=30, check=False, privileged=True)
        if made.exit_status != 0:
            holder = read_holder(await self._read(owner_path))
            if not self._stale(holder):
                raise StudyError(
                    f"another serve-tuner (pid {holder.get('pid')} on {holder.get('controller')}) is tuning "
                    f"{self._unit} on this host; wait for it to finish, or stop it (a holder silent for "
                    f"{self._options.lock_stale_s:g} s is taken over; removing {self._lock_dir} forces it now)"
                )
        await self._write_owner()
        self._locked = True

    async def _write_owner(self) -> None:
        """Who holds the lock, and when it was last heard from (what `_stale` reads on another run)."""
        self._owner["beat"] = time.time()
        self._last_beat = time.monotonic()
        path = f"{self._lock_dir}/owner.json"
        await self._transport.write_file(path, json.dumps(self._owner).encode(), mode=0o600)

    def _stale(self, holder: Mapping[str, object]) -> bool:
        if not holder:
            return True  # a lock directory without its holder: the controller died while taking it
        if holder.get("controller") == self._owner["controller"]:
            pid = holder.get("pid")
            if isinstance(pid, int) and not Path(f"/proc/{pid}").exists():
                return True  # the holder ran on this machine and is gone
        beat = holder.get("beat")
        return not isinstance(beat, (int, float)) or time.time() - beat > self._options.lock_stale_s

    async def _unlock(self) -> None:
        if self._locked:
            await self._transport.run(["rm", "-rf", "--", self._lock_dir], timeout_s=30, check=False, privileged=True)
            self._locked = False

    async def _heartbeat(self) -> None:
        """Re-arm the dead-man timer and refresh the lock, at most every few minutes."""
        if time.monotonic() - self._last_beat < min(120.0, self._options.dead_man_s / 4):
            return
        await self._write_owner()
        if self._written is not None:
            await self._arm_dead_man()

    async def _arm_dead_man(self) -> None:
        """A transient timer on the host that restores the baseline unless re-armed in time. Its script
        is a file beside the lock, which an operator can read, rather than a command line systemd would
        re-escape."""
        await self._disarm_dead_man()
        active = bool(self._baseline and self._baseline.get("active", True))
        unit = shlex.quote(self._unit)
        script = "\n".join([
            "#!/bin/sh",
            f"# serve-tuner: puts {self._unit} back on its baseline if the controller stopped answering.",
            f"rm -f {shlex.quote(self._runtime_drop_in)} {shlex.quote(self._secrets_path)}",
            "systemctl daemon-reload",
            f"systemctl reset-failed {unit}",
            f"systemctl restart {unit}" if active else f"systemctl stop {unit}",
            f"rm -f {shlex.quote(self._state_path)}",
            f"rm -rf {shlex.quote(self._lock_dir)}",
            'rm -f -- "$0"',  # the shell holds the script open: it reads on after the name is gone
            "",
        ])  # fmt: skip
        await self._transport.write_file(self._restore_script, script.encode(), mode=0o700)
        await self._transport.run(
            ["systemd-run", f"--unit={self._timer}", f"--on-active={int(self._options.dead_man_s)}s",
             "--timer-property=AccuracySec=1s", "--description=serve-tuner: restore the baseline of " + self._unit,
             "/bin/sh", self._restore_script],
            timeout_s=60,
            privileged=True,
        )  # fmt: skip

    async def _disarm_dead_man(self) -> None:
        await self._transport.run(
            ["systemctl", "stop", f"{self._timer}.timer"], timeout_s=60, check=False, privileged=True
        )
        await self._transport.run(
            ["systemctl", "reset-failed", f"{self._timer}.timer", f"{self._timer}.service"],
            timeout_s=60,
            check=False,
            privileged=True,
        )

    # ---- a trial ------------------------------------------------------------------------------

    async def operator_server(self, launch: LaunchSpec, state: UnitState | None = None) -> OperatorServer:
        """The unit's own server (program, model, address), read from its running process, or from its
        ExecStart= and Environment= where it is not running; with `keep` a trial listens where it does."""
        if self._operator is not None:
            return self._operator
        if launch.listen is None:
            raise DeployError(f"{self._unit}: this engine cannot say where the unit's server listens")
        state = state or await self._state()
        argv, environ = await self._command_line(state)
        if not argv:
            raise DeployError(
                f"cannot read {self._unit}'s command line (ExecStart=); check `systemctl cat {self._unit}`"
            )
        try:
            self._operator = launch.listen.read(argv, environ)
        except ValueError:
            raise DeployError(
                f"{self._unit} sets a port that is not a port number (1-65535); check its ExecStart= and Environment="
            ) from None
        return self._operator

    async def _command_line(self, state: UnitState) -> tuple[list[str], dict[str, str]]:
        """The unit's argv and environment: its running process's own, or where it does not run, its
        ExecStart= and Environment= as systemd shows them (an EnvironmentFile= is then not read)."""
        if state["ActiveState"] == "active" and state.main_pid:
            cmdline = await self._read(f"/proc/{state.main_pid}/cmdline")
            argv = (cmdline or b"").decode(errors="replace").split("\0")[:-1]
            if argv:
                return argv, _environ(await self._read(f"/proc/{state.main_pid}/environ") or b"")
        return shown_argv(state["ExecStart"]), parse_show_environment(state["Environment"])

    async def check(self, launch: LaunchSpec, *, tuned: Sequence[TunedKnob]) -> list[CheckLine]:
        """What `tuner run --check` reads of the unit, changing nothing and taking no lock: the unit, who
        holds it, what its server runs and where it answers, and whatever would decide a tuned knob
        instead of the trial's drop-in."""
        state = await self._state()
        unit = f"unit {self._unit}"
        if state["LoadState"] != "loaded":
            fix = "set deploy.unit to the service that runs the server (`systemctl list-units --type=service`)"
            return [CheckLine(unit, False, f"the host has no such unit ({state['LoadState'] or 'unknown'}); {fix}")]
        lines = [await self._check_lock()]
        try:
            server = await self.operator_server(launch, state) if launch.listen is not None else None
        except DeployError as exc:
            return [*lines, CheckLine(unit, False, str(exc))]
        runs = f"; runs {server.describe()}" if server else ""
        if state["ActiveState"] == "failed":
            fix = f"the baseline could not start either; see `systemctl status {self._unit}` and fix the unit first"
            return [*lines, CheckLine(unit, False, f"failed (result {state['Result']}){runs}; {fix}")]
        lines.append(CheckLine(unit, True, f"{state['ActiveState']}{runs}"))
        if self._options.exec_start == "keep":
            lines += await self._check_kept(launch, state, tuned)
        try:
            await self._refuse_later_overrides(launch, state, tuned=[knob.env for knob in tuned if knob.env])
        except DeployError as exc:
            lines.append(CheckLine("operator drop-ins", False, str(exc)))
        lines.append(await self._check_answers(launch, state))
        return lines

    @property
    def operator(self) -> OperatorServer | None:
        """The unit's own server, once read (`operator_server`)."""
        return self._operator

    async def running_log(self) -> str:
        """The start of the log of the unit's running invocation (the operator's server, for `--check`):
        its first lines, where the server says how long it took to start, not weeks of requests."""
        invocation = (await self._state())["InvocationID"]
        if not invocation:
            return ""
        head = f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation)} -o cat --no-pager | head -n 400"
        result = await self._transport.run(["sh", "-c", head], timeout_s=120, check=False, privileged=True)
        return result.stdout

    async def _check_lock(self) -> CheckLine:
        raw = await self._read(f"{self._lock_dir}/owner.json")
        holder = read_holder(raw)
        if raw is not None and not self._stale(holder):
            return CheckLine(
                "lock", False,
                f"another serve-tuner (pid {holder.get('pid')} on {holder.get('controller')}) is tuning {self._unit}; "
                "wait for it to finish",
            )  # fmt: skip
        if await self._read(self._state_path) is not None:
            return CheckLine(
                "lock", True, "an earlier run did not finish its restore: the run puts the unit back first"
            )
        return CheckLine("lock", True, "free")

    async def _check_kept(self, launch: LaunchSpec, state: UnitState, tuned: Sequence[TunedKnob]) -> list[CheckLine]:
        """With `keep`: the unit's command line passes what the launch needs, and nothing of the unit's own
        (a flag, an EnvironmentFile= line) decides a tuned knob over the drop-in's Environment= line."""
        lines = []
        try:
            check_kept_command(launch, state["ExecStart"])
        except ConfigError as exc:
            lines.append(CheckLine("command line", False, str(exc)))
        argv, environ = await self._command_line(state)
        shown = parse_show_environment(state["Environment"])
        for knob in tuned:
            given = next((w for w in argv[1:] for f in knob.flags if w == f or w.startswith(f + "=")), None)
            if given is not None:
                lines.append(CheckLine(
                    f"knob {knob.name}", False,
                    f"{self._unit}'s ExecStart= passes {given.split('=')[0]}, which decides {knob.name} in every "
                    'trial; remove it from ExecStart= or set deploy.exec_start = "replace"',
                ))  # fmt: skip
            elif knob.env and knob.env in environ and knob.env not in shown:
                lines.append(CheckLine(
                    f"knob {knob.name}", False,
                    f"{knob.env} comes from {self._unit}'s EnvironmentFile=, which wins over the trial's "
                    "Environment= line; move it to an Environment= line or remove it from that file",
                ))  # fmt: skip
        if not lines:
            names = ", ".join(knob.name for knob in tuned) or "none"
            lines.append(CheckLine("knobs", True, f"nothing in {self._unit} overrides the tuned knobs ({names})"))
        return lines

    async def _check_answers(self, launch: LaunchSpec, state: UnitState) -> CheckLine:
        if state["ActiveState"] != "active":
            return CheckLine("server", True, f"{self._unit} is {state['ActiveState']}: the study starts it")
        # The server running now is the operator's, wherever the study's own command line would put a trial's.
        server = self._operator
        base_url = await (self._transport.reach(server.reach_host, server.port) if server else self._address(launch))
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), verify=tls_context()) as client:
                answer = await client.get(base_url + launch.health_path)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            answer = None
            why = type(exc).__name__
        where = self._operator.address if self._operator else f"{launch.host}:{launch.port}"
        if answer is not None and answer.status_code == 200:
            return CheckLine("server", True, f"answers {launch.health_path} on {where}")
        why = f"HTTP {answer.status_code}" if answer is not None else why
        return CheckLine(
            "server", False,
            f"{self._unit} is active but nothing healthy answers on {where} ({why}); check the unit's address "
            "and port, or its log (`journalctl -u " + self._unit + "`)",
        )  # fmt: skip

    async def _address(self, launch: LaunchSpec) -> str:
        """Where this controller reaches the server: the unit's own address with `keep`, else the launch's."""
        if self._options.exec_start == "keep" and launch.listen is not None:
            server = await self.operator_server(launch)
            return await self._transport.reach(server.reach_host, server.port)
        return await self._transport.reach(launch.host, launch.port)

    async def _refuse_later_overrides(self, launch: LaunchSpec, state: UnitState, *, tuned: Sequence[str] = ()) -> None:
        """An operator drop-in that sorts after ours and sets one of our keys (or of `tuned`, the variables
        every trial of the study may set) would silently win."""
        ours = set(launch.env) | set(launch.secret_env) | set(tuned)
        for path in state.drop_ins:
            name = path.rsplit("/", 1)[-1]
            if name <= DROP_IN_NAME or not path.startswith(("/etc/", "/run/", "/usr/lib/", "/lib/")):
                continue
            text = (await self._read(path) or b"").decode(errors="replace")
            names, sets_exec = _assigned_keys(text)
            clash = sorted(ours & names) + (
                ["ExecStart"] if sets_exec and self._options.exec_start == "replace" else []
            )
            if clash:
                raise DeployError(
                    f"{path} sorts after serve-tuner's {DROP_IN_NAME} and sets {', '.join(clash)}, which would "
                    f"override the trial's value; rename it to sort before {DROP_IN_NAME} or remove those lines"
                )

    async def apply(self, launch: LaunchSpec, *, log_path: str) -> Deployment:
        if self._baseline is None:
            raise DeployError("the systemd deployer was used outside `async with`")
        text = render_drop_in(
            launch,
            exec_start=self._options.exec_start,
            note="serve-tuner trial; removed when the study ends",
            secrets_file=self._secrets_path,
        )
        secrets = render_secrets_file(launch)
        before = await self._state()
        await self._refuse_later_overrides(launch, before)
        if self._options.exec_start == "keep":
            check_kept_command(launch, before["ExecStart"])
            if launch.listen is not None:
                await self.operator_server(launch, before)
        base_url = await self._address(launch)
        if (
            text == self._written
            and self._deployed is not None
            and before.main_pid == self._deployed.main_pid != 0
            and before["ActiveState"] == "active"
            and before["NeedDaemonReload"] == "no"
        ):
            # The same settings are already running: no restart (P5), only a check that they still serve.
            took = await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=self.check_alive
            )
            self._launch = launch
            return Deployment(
                launch=launch, pid=before.main_pid, started_in_s=took, log_path=log_path, base_url=base_url
            )
        self._launch = launch
        if self._written is None:
            # Kept on the host until a restore finishes: a run that finds it knows the host is not on its
            # baseline, even where the drop-in is already gone (a controller killed mid-restore).
            await self._transport.write_file(self._state_path, json.dumps(self._baseline).encode(), mode=0o600)
        await self._arm_dead_man()
        self._written = text
        if secrets:
            await self._transport.write_file(self._secrets_path, secrets.encode(), mode=0o600)
        await self._transport.write_file(self._runtime_drop_in, text.encode(), mode=0o644)
        crash_point("after-write")
        await self._systemctl("daemon-reload")
        started = time.monotonic()
        await self._restart(before, timeout_s=self._options.start_timeout_s)
        crash_point("after-restart")
        self._deployed = None
        watcher = _StartWatcher(self, before)
        try:
            await wait_until_healthy(
                launch, base_url=base_url, timeout_s=self._options.start_timeout_s, exited=watcher.failure
            )
        except ServerNotReady as exc:
            raise ServerNotReady(f"{exc}{await self._journal_tail()}") from None
        after = await self._state()
        await self._verify(launch, before, after)
        self._deployed = after
        log = await self._journal(after["InvocationID"])
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(redact(log))  # the server's own lines may quote the key
        return Deployment(
            launch=launch,
            pid=after.main_pid,
            started_in_s=time.monotonic() - started,
            log_path=log_path,
            base_url=base_url,
        )

    async def persist(self, *, note: str) -> str:
        """The running trial's drop-in moved under /etc (as APPLIED_NAME): the same settings, so no restart."""
        if self._written is None or self._launch is None or self._deployed is None:
            raise DeployError("nothing to apply: no verified trial is running")
        path = f"{PERSISTENT_DIR}/{self._unit}.d/{APPLIED_NAME}"
        secrets_path = f"{PERSISTENT_SECRETS_DIR}/{self._unit}.secret.env"
        text = render_drop_in(self._launch, exec_start=self._options.exec_start, note=note, secrets_file=secrets_path)
        if self._launch.secret_env:
            await self._transport.write_file(secrets_path, render_secrets_file(self._launch).encode(), mode=0o600)
        await self._transport.write_file(path, text.encode(), mode=0o644)
        await self._transport.remove_file(self._runtime_drop_in)
        await self._transport.remove_file(self._secrets_path)
        await self._systemctl("daemon-reload")
        self._written = None
        state = await self._state()
        if state.main_pid != self._deployed.main_pid or state["NeedDaemonReload"] != "no":
            raise DeployError(f"{self._unit} changed while its settings were made permanent; check it by hand")
        await self._disarm_dead_man()
        await self._transport.remove_file(self._restore_script)
        await self._transport.remove_file(self._state_path)
        return path

    async def remove_persisted(self, launch: LaunchSpec) -> str | None:
        path = f"{PERSISTENT_DIR}/{self._unit}.d/{APPLIED_NAME}"
        if await self._read(path) is None:
            return None
        await self._transport.remove_file(path)
        await self._transport.remove_file(f"{PERSISTENT_SECRETS_DIR}/{self._unit}.secret.env")
        await self._systemctl("daemon-reload")
        await self._restart(await self._state(), timeout_s=self._options.restore_timeout_s)
        self._launch = launch
        await self._wait_restored()
        return path

    async def _verify(self, launch: LaunchSpec, before: UnitState, after: UnitState) -> None:
        """What runs is what was meant: scored trials must not measure a stale or half-applied config (P6)."""
        if after["NeedDaemonReload"] != "no":
            raise DeployError(f"{self._unit} has a pending daemon-reload: its files changed while the trial started")
        if after.main_pid in (0, before.main_pid) or after["InvocationID"] == before["InvocationID"]:
            raise DeployError(
                f"{self._unit} did not restart (MainPID {after.main_pid}); the trial would measure the old settings"
            )
        environ = await self._read(f"/proc/{after.main_pid}/environ")
        if environ is None:
            raise DeployError(f"cannot read the environment of {self._unit}'s process {after.main_pid}")
        running = _environ(environ)
        for name, value in launch.env.items():
            if running.get(name) != value:
                raise DeployError(
                    f"{self._unit} runs with {name}={running.get(name, '(unset)')!r}, not {value!r}: an "
                    "EnvironmentFile= or a later drop-in overrides it; remove that setting from the unit"
                )
        for name, secret in launch.secret_values().items():
            if running.get(name) != secret:  # compared, never shown
                raise DeployError(
                    f"{self._unit} does not run with the {name} it was given: another setting overrides it"
                )
        if self._options.exec_start == "replace":
            cmdline = await self._read(f"/proc/{after.main_pid}/cmdline")
            argv = (cmdline or b"").decode(errors="replace").split("\0")[:-1]
            if argv != list(launch.command):
                raise DeployError(f"{self._unit} runs {shlex.join(argv)[:200]}, not the trial's command line")

    async def check_alive(self) -> str | None:
        if self._deployed is None:
            return "no trial is running"
        state = await self._state()
        await self._heartbeat()
        if state.main_pid != self._deployed.main_pid:
            return f"{self._unit}'s main process changed ({self._deployed.main_pid} -> {state.main_pid or 'none'})"
        if state.restarts != self._deployed.restarts:
            return f"{self._unit} restarted {state.restarts - self._deployed.restarts} time(s) (Restart= hid a crash)"
        if state["ActiveState"] != "active":
            return f"{self._unit} is {state['ActiveState']} (result: {state['Result']})"
        return None

    async def _journal(self, invocation: str) -> str:
        if not invocation:
            return ""
        result = await self._transport.run(
            ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager"],
            timeout_s=120,
            check=False,
            privileged=True,
            idempotent=True,
        )
        return result.stdout

    async def _journal_tail(self) -> str:
        result = await self._transport.run(
            ["journalctl", "-u", self._unit, "-n", "30", "-o", "cat", "--no-pager"],
            timeout_s=60,
            check=False,
            privileged=True,
        )
        lines = result.stdout.strip().splitlines()
        for line in reversed(lines):
            lowered = line.lower()
            if any(word in lowered for word in ("error", "failed", "invalid", "abort")) and self._unit not in line:
                return f"; server log: {redact(line.strip())[:200]}"
        return f"; journal ends: {redact(lines[-1].strip())[:200]}" if lines else ""

    async def read_log(self, since: int) -> tuple[str, int]:
        if self._deployed is None:
            return "", since
        text = await self._journal(self._deployed["InvocationID"])
        return text[since:], len(text)

    async def restore(self) -> None:
        """Our drop-in removed and the unit back as the snapshot found it; the files compared byte for byte."""
        try:
            await self._restore()
        except HostUnreachable as exc:
            if self._written is None:
                raise
            raise HostUnreachable(
                f"{exc}; the host's dead-man timer puts {self._unit} back on its baseline within "
                f"{self._options.dead_man_s:g} s of the last contact, and the next run checks it"
            ) from None

    async def _restore(self) -> None:
        difference = None
        try:
            if self._written is not None:
                await self._transport.remove_file(self._runtime_drop_in)
                await self._transport.remove_file(self._secrets_path)
                crash_point("mid-restore")
                await self._systemctl("daemon-reload")
                active = bool(self._baseline is None or self._baseline.get("active", True))
                if active:
                    await self._restart(await self._state(), timeout_s=self._options.restore_timeout_s)
                else:
                    await self._systemctl("reset-failed", self._unit, check=False)
                    await self._systemctl("stop", self._unit, timeout_s=self._options.restore_timeout_s)
                self._written, self._deployed = None, None
                if active:
                    await self._wait_restored()
                if self._baseline is not None and "files" in self._baseline:
                    difference = await self._difference_from_snapshot(await self._state())
            # Our drop-in is gone and the unit restarted: nothing of ours stays armed, whether or not
            # the unit now matches the snapshot (a difference is someone else's change, for a person).
            await self._disarm_dead_man()
            await self._transport.remove_file(self._restore_script)
            await self._transport.remove_file(self._state_path)
        finally:
            await self._unlock()
        if difference is not None:
            raise DeployError(difference)

    async def _difference_from_snapshot(self, state: UnitState) -> str | None:
        """After a restore: every file of the unit byte-identical, and its effective environment (what
        `systemctl show` reports from all its files) the one found before the study."""
        assert self._baseline is not None
        files, snapshot = await self._unit_files(state), self._baseline["files"]
        assert isinstance(snapshot, dict)
        changed = sorted(path for path in {*files, *snapshot} if files.get(path) != snapshot.get(path))
        if changed:
            return (
                f"{changed[0]} differs from the snapshot taken before the study (someone changed "
                f"{self._unit}'s files meanwhile); check the unit by hand"
            )
        environment = parse_show_environment(state["Environment"])
        if environment != self._baseline["environment"]:
            return (
                f"{self._unit}'s environment differs from the one before the study after restoring; check "
                f"`systemctl show -p Environment {self._unit}` by hand"
            )
        return None

    async def _restart(self, before: UnitState, *, timeout_s: float) -> None:
        """reset-failed (a start limit would refuse the start), restart without waiting for the start
        job, then wait until a new invocation exists: until then the old process may still answer the
        health check, and a trial would be taken for started while the old settings still run."""
        await self._systemctl("reset-failed", self._unit, check=False)
        await self._systemctl("restart", "--no-block", self._unit)
        deadline = time.monotonic() + timeout_s
        while True:
            state = await self._state()
            if state["InvocationID"] != before["InvocationID"] or state["ActiveState"] == "failed":
                return
            if time.monotonic() > deadline:
                raise ServerNotReady(f"{self._unit} did not restart within {timeout_s:g} s ({state['ActiveState']})")
            await asyncio.sleep(0.1)

    async def _wait_restored(self) -> None:
        deadline = time.monotonic() + self._options.restore_timeout_s
        launch = self._launch
        while True:
            state = await self._state()
            if state["ActiveState"] == "active":
                break
            if state["ActiveState"] == "failed" or time.monotonic() > deadline:
                raise DeployError(
                    f"{self._unit} did not come back on its baseline ({state['ActiveState']}, result "
                    f"{state['Result']}){await self._journal_tail()}; check it with `systemctl status {self._unit}`"
                )
            await asyncio.sleep(0.25)
        if launch is not None:
            base_url = await self._address(launch)
            remaining = max(deadline - time.monotonic(), 1.0)

            async def stopped() -> str | None:
                now = await self._state()
                return (
                    None if now["ActiveState"] in ("active", "activating") else f"{self._unit} is {now['ActiveState']}"
                )

            try:
                await wait_until_healthy(launch, base_url=base_url, timeout_s=remaining, exited=stopped)
            except ServerNotReady as exc:
                raise DeployError(f"{self._unit} is back on its baseline but not healthy: {exc}") from None


class _StartWatcher:
    """Tells, while a trial starts, whether systemd gave up on it: Type=simple units report a
    successful start even when the binary fails at once, so Result=, NRestarts and the state decide."""

    def __init__(self, deployer: SystemdDeployer, before: UnitState) -> None:
        self._deployer = deployer
        self._before = before
        self._seen_pid = 0

    async def failure(self) -> str | None:
        state = await self._deployer._state()
        unit = self._deployer._unit
        if state["ActiveState"] == "failed":
            return f"{unit} failed ({state['Result']}, exit status {state['ExecMainStatus']})"
        if state.main_pid and state.main_pid != self._before.main_pid:
            if self._seen_pid and state.main_pid != self._seen_pid:
                return f"{unit} exited and was restarted by Restart= (exit status {state['ExecMainStatus']})"
            self._seen_pid = state.main_pid
        if state.restarts > 0:  # reset-failed zeroed the counter before our restart
            return f"{unit} exited and was restarted {state.restarts} time(s) (exit status {state['ExecMainStatus']})"
        if state["ActiveState"] == "activating" and state["SubState"] == "auto-restart":
            return f"{unit} exited (exit status {state['ExecMainStatus']}) and waits to be restarted"
        return None
