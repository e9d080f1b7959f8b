"""The systemd deployer's unit-file text, pure: our drop-in and secrets file written so that systemd reads
back exactly what was meant, and what `systemctl show` and /proc say read back. No host, no I/O: the
functions scripts/mutmut.sh mutates (tests/fast/test_unit_file_rendering.py pins each rule)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Literal

from tuner.errors import ConfigError
from tuner.models import LaunchSpec

# How a trial's settings reach the unit: its own ExecStart with Environment= lines (`keep`), the engine's
# whole command line (`replace`), or the unit's own container `run` carrying the trial's (`container`).
ExecStartMode = Literal["keep", "replace", "container"]

__all__ = [
    "ExecStartMode",
    "assigned_keys",
    "check_kept_command",
    "parse_environ",
    "parse_show_environment",
    "quote_unit_word",
    "render_drop_in",
    "render_secrets_file",
    "shown_argv",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
    launch: LaunchSpec,
    *,
    exec_start: ExecStartMode,
    note: str,
    secrets_file: str | None = None,
    exec_argv: Sequence[str] | None = None,
) -> str:
    """The text of our drop-in for `launch`; raises `ConfigError` for a value systemd cannot carry.
    With `keep`, the launch's arguments are the unit's own business (`check_kept_command` checks that
    its ExecStart already passes them); with `container`, `exec_argv` is the unit's own `run` carrying the
    trial (container_unit.py)."""
    lines = [f"# {note}", "[Service]"]
    for name, value in launch.env.items():
        _check_env_name(name)
        lines.append("Environment=" + quote_unit_word(f"{name}={value}", in_exec=False, what=f"the value of {name}"))
    if launch.secret_env:
        assert secrets_file is not None
        lines.append(f"EnvironmentFile={secrets_file}")
    if exec_start == "container" and exec_argv is not None:
        words = [quote_unit_word(word, in_exec=True, what="a command-line argument") for word in exec_argv]
        lines += ["ExecStart=", "ExecStart=" + " ".join(words)]
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


def assigned_keys(unit_text: str) -> tuple[set[str], bool]:
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


def parse_environ(raw: bytes) -> dict[str, str]:
    """A process's environment as /proc/PID/environ holds it."""
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)
