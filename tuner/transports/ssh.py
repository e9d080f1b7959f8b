"""The `ssh` transport (asyncssh): a production host reached over SSH, safely.

- Only hosts whose key is pinned in serve-tuner's own known_hosts file are reached (`tuner trust-host
  HOST` shows the fingerprint and pins it); an unknown or changed key stops everything.
- Key authentication only; keepalives notice a dead link; every call has a timeout, opening the
  channel included (`timeout` runs on the host too, so a command past its time is killed there).
- A lost connection is re-opened with backoff within `reconnect_window_s`; a command is re-sent only
  if it never reached the host.
- `sudo: true` runs privileged steps (file writes, systemctl) through `sudo -n`, never asking.
- Commands are one argv, quoted for the remote shell with `shlex.join`: nothing a value contains is
  ever interpreted.
- `forward_port` makes a server that listens only on the host's loopback reachable from here.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import asyncssh
from pydantic import Field

from tuner.config import StrictModel
from tuner.errors import CommandFailed, HostUnreachable, TransportError
from tuner.transports.base import TRANSPORTS, CommandResult

__all__ = [
    "DEFAULT_KNOWN_HOSTS",
    "SshOptions",
    "SshProcess",
    "SshTransport",
    "fetch_host_key",
    "pin_host_key",
]

DEFAULT_KNOWN_HOSTS = "~/.config/serve-tuner/known_hosts"
_KILL_AFTER_S = 2


class SshOptions(StrictModel):
    host: str = Field(min_length=1, description="Host name or address.")
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = Field(default=None, description="Login user (default: the local user).")
    known_hosts: str = Field(
        default=DEFAULT_KNOWN_HOSTS, description="Pinned host keys; `tuner trust-host HOST` adds one."
    )
    client_keys: list[str] = Field(
        default_factory=list, description="Private key files (default: the SSH agent and ~/.ssh/id_*)."
    )
    connect_timeout_s: float = Field(default=15.0, gt=0, description="Longest wait to connect or open a channel.")
    keepalive_interval_s: float = Field(default=10.0, gt=0, description="Keepalive every this many seconds.")
    keepalive_count_max: int = Field(default=3, ge=1, description="Missed keepalives before the link is dead.")
    reconnect_window_s: float = Field(
        default=60.0, ge=0, description="How long to keep re-opening a lost connection before giving up."
    )
    sudo: bool = Field(default=False, description="Run privileged steps through `sudo -n`.")


class _NotTrusted(TransportError):
    """The host's key is not pinned, or it refused our keys: waiting and retrying cannot help."""


def _known_hosts_path(configured: str) -> Path:
    return Path(configured).expanduser()


class SshProcess:
    """A background process on the host: its own session (`setsid`), so stopping it stops its group;
    its exit status is written next to its log when it ends."""

    def __init__(self, transport: SshTransport, pid: int, status_path: str) -> None:
        self._transport = transport
        self._pid = pid
        self._status_path = status_path

    @property
    def pid(self) -> int:
        return self._pid

    async def poll(self) -> int | None:
        alive = await self._transport.run(["kill", "-0", str(self._pid)], timeout_s=15, check=False)
        if alive.exit_status == 0:
            return None
        status = await self._transport.run(["cat", self._status_path], timeout_s=15, check=False)
        text = status.stdout.strip()
        return int(text) if text.lstrip("-").isdigit() else -1

    async def stop(self, *, grace_s: float) -> int:
        group = f"-{self._pid}"
        await self._transport.run(["kill", "-TERM", "--", group], timeout_s=15, check=False)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            status = await self.poll()
            if status is not None:
                return status
            await asyncio.sleep(0.1)
        await self._transport.run(["kill", "-KILL", "--", group], timeout_s=15, check=False)
        for _ in range(50):
            status = await self.poll()
            if status is not None:
                return status
            await asyncio.sleep(0.1)
        raise TransportError(f"process {self._pid} on {self._transport.host} did not end after SIGKILL")


@TRANSPORTS.register("ssh")
class SshTransport:
    options_model = SshOptions

    def __init__(self, options: SshOptions) -> None:
        self._options = options
        self._connection: asyncssh.SSHClientConnection | None = None
        self._children: list[SshProcess] = []
        self._forwards: list[asyncio.Server] = []
        self._reached: dict[tuple[str, int], str] = {}

    @property
    def host(self) -> str:
        return self._options.host

    async def __aenter__(self) -> SshTransport:
        await self._connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            for child in self._children:
                await child.stop(grace_s=5.0)
        finally:
            self._children.clear()
            for listener in self._forwards:
                listener.close()
            self._forwards.clear()
            self._reached.clear()
            if self._connection is not None:
                self._connection.close()
                await self._connection.wait_closed()
                self._connection = None

    async def _connect(self) -> asyncssh.SSHClientConnection:
        options = self._options
        known_hosts = _known_hosts_path(options.known_hosts)
        if not known_hosts.is_file():
            raise _NotTrusted(
                f"no pinned host keys at {known_hosts}; run `tuner trust-host {options.host}` to check and pin the "
                "host's key"
            )
        try:
            self._connection = await asyncssh.connect(
                options.host,
                port=options.port,
                username=options.user,
                known_hosts=str(known_hosts),
                client_keys=options.client_keys or (),
                agent_path=None if options.client_keys else (),
                keepalive_interval=options.keepalive_interval_s,
                keepalive_count_max=options.keepalive_count_max,
                connect_timeout=options.connect_timeout_s,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise _NotTrusted(
                f"the host key of {options.host}:{options.port} does not match a pinned key ({exc.reason}); if the "
                f"host was reinstalled, check its fingerprint and run `tuner trust-host {options.host}`"
            ) from None
        except asyncssh.PermissionDenied:
            raise _NotTrusted(
                f"{options.host} refused our keys; add ours to its authorized_keys or set host.client_keys"
            ) from None
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise TransportError(
                f"cannot connect to {options.host}:{options.port}: {exc}; check host.host, host.port, host.user "
                "and host.client_keys, and that sshd runs there"
            ) from None
        return self._connection

    async def _live_connection(self) -> asyncssh.SSHClientConnection:
        """The connection, re-opened with backoff if it was lost, within the reconnect window."""
        if self._connection is not None and not self._connection.is_closed():
            return self._connection
        deadline = time.monotonic() + self._options.reconnect_window_s
        delay = 0.5
        while True:
            try:
                return await self._connect()
            except _NotTrusted:
                raise
            except TransportError as exc:
                if time.monotonic() + delay > deadline:
                    raise HostUnreachable(
                        f"lost the connection to {self._options.host} and could not re-open it within "
                        f"{self._options.reconnect_window_s:g} s: {exc}"
                    ) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 8.0)

    def _privileged(self, argv: Sequence[str]) -> list[str]:
        return ["sudo", "-n", "--", *argv] if self._options.sudo else list(argv)

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        check: bool = True,
        privileged: bool = False,
        idempotent: bool = False,
    ) -> CommandResult:
        command = self._privileged(argv) if privileged else list(argv)
        return await self._run(command, timeout_s=timeout_s, check=check, idempotent=idempotent)

    async def _run(
        self, argv: list[str], *, timeout_s: float, check: bool, stdin: bytes | None = None, idempotent: bool = False
    ) -> CommandResult:
        # `timeout` kills the command on the host too; the local deadline covers a host that stopped answering.
        seconds = f"{max(timeout_s, 0.1):g}"
        remote = shlex.join(["timeout", "-k", str(_KILL_AFTER_S), seconds, *argv])
        for attempt in (1, 2):
            connection = await self._live_connection()
            try:
                async with asyncio.timeout(timeout_s + _KILL_AFTER_S + self._options.connect_timeout_s):
                    if stdin:
                        completed = await connection.run(remote, check=False, input=stdin, encoding=None)
                    else:  # an empty input would leave the remote stdin open: a `cat` would wait for ever
                        completed = await connection.run(remote, check=False, stdin=asyncssh.DEVNULL, encoding=None)
                break
            except asyncssh.ChannelOpenError:
                # The command never reached the host: re-sending it cannot run it twice.
                if attempt == 2:
                    raise TransportError(f"cannot open a channel to {self._options.host}") from None
                self._connection = None
            except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as exc:
                self._connection = None
                if idempotent and attempt == 1:
                    continue  # safe to send again: the next attempt re-opens the link within the window
                raise TransportError(f"lost the connection to {self._options.host} during {argv[0]}: {exc}") from None
            except TimeoutError:
                raise TransportError(
                    f"{argv[0]} did not finish within {timeout_s:g} s on {self._options.host}"
                ) from None
        status = completed.exit_status if completed.exit_status is not None else -1
        if status == 124:
            raise TransportError(f"{argv[0]} did not finish within {timeout_s:g} s on {self._options.host}")
        stdout, stderr = completed.stdout or b"", completed.stderr or b""
        result = CommandResult(
            argv=tuple(argv),
            exit_status=status,
            stdout=stdout.decode(errors="replace") if isinstance(stdout, bytes) else str(stdout),
            stderr=stderr.decode(errors="replace") if isinstance(stderr, bytes) else str(stderr),
        )
        if check and status != 0:
            raise CommandFailed(argv=argv, exit_status=status, stderr_tail=result.stderr[-2000:])
        return result

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """A temporary file beside the target, then one rename: a reader sees old or new, never a part."""
        directory = str(Path(path).parent)
        # The byte count is checked before the rename: when the link dies mid-way, `cat` sees the end of
        # its input and exits 0 with a part, which must not replace the file. The traps remove the
        # temporary file however the script ends, the controller being gone by then; its name ends in
        # the shell's pid, so the copy re-sent after a reconnect never shares it with a dying first one.
        script = (
            't="$2.$$.tmp"; trap \'rm -f -- "$t"\' EXIT && trap "exit 1" HUP INT TERM PIPE && umask 077 && '
            'mkdir -p -- "$1" && cat > "$t" && [ "$(wc -c < "$t")" -eq "$5" ] && chmod "$3" -- "$t" && '
            'sync -- "$t" && mv -f -- "$t" "$4"'
        )
        prefix = f"{directory}/.{Path(path).name}.{secrets.token_hex(4)}"
        argv = self._privileged(["sh", "-c", script, "write", directory, prefix, f"{mode:o}", path, str(len(data))])
        try:
            await self._run(argv, timeout_s=60, check=True, stdin=data, idempotent=True)
        except CommandFailed as exc:
            raise TransportError(f"cannot write {path} on {self._options.host}: {exc.stderr_tail.strip()}") from None

    async def read_file(self, path: str) -> bytes:
        remote = shlex.join(self._privileged(["cat", "--", path]))
        for attempt in (1, 2):  # reading twice is harmless: a link lost meanwhile is re-opened once
            connection = await self._live_connection()
            try:
                async with asyncio.timeout(60):
                    completed = await connection.run(remote, check=False, stdin=asyncssh.DEVNULL, encoding=None)
                break
            except (asyncssh.ConnectionLost, asyncssh.DisconnectError, asyncssh.ChannelOpenError) as exc:
                self._connection = None
                if attempt == 2:
                    raise TransportError(f"cannot read {path} on {self._options.host}: {exc}") from None
            except (TimeoutError, asyncssh.Error, OSError) as exc:
                raise TransportError(f"cannot read {path} on {self._options.host}: {exc}") from None
        if completed.exit_status != 0:
            error = completed.stderr.decode(errors="replace") if isinstance(completed.stderr, bytes) else ""
            raise TransportError(f"cannot read {path} on {self._options.host}: {error.strip()}")
        return completed.stdout if isinstance(completed.stdout, bytes) else b""

    async def remove_file(self, path: str) -> None:
        await self._run(self._privileged(["rm", "-f", "--", path]), timeout_s=30, check=True, idempotent=True)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: str) -> SshProcess:
        """Starts `argv` in its own session with exactly `env`, output to `log_path`; its exit status
        goes to `log_path.exit` when it ends. The environment travels in a file only the user can read,
        removed as soon as it is read, never on a command line, where `ps` would show a secret in it."""
        status_path, env_path = f"{log_path}.exit", f"{log_path}.env"
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
        await self.write_file(env_path, exports.encode(), mode=0o600)
        inner = shlex.join(["sh", "-c", '. "$0" && rm -f -- "$0" && exec "$@"', env_path, *argv])
        script = (
            'mkdir -p -- "$(dirname -- "$1")" && rm -f -- "$2" && '
            f"setsid env -i sh -c {shlex.quote(inner + '; echo $? > ' + shlex.quote(status_path))} "
            '>> "$1" 2>&1 < /dev/null & echo $!'
        )
        result = await self._run(["sh", "-c", script, "spawn", log_path, status_path], timeout_s=30, check=True)
        try:
            pid = int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TransportError(f"cannot start {argv[0]} on {self._options.host}: {result.stderr.strip()}") from None
        child = SshProcess(self, pid, status_path)
        self._children.append(child)
        return child

    async def reach(self, host: str, port: int) -> str:
        """Through a forwarded local port: the server may listen only on the host's loopback."""
        if (host, port) not in self._reached:
            self._reached[(host, port)] = f"http://127.0.0.1:{await self.forward_port(port, remote_host=host)}"
        return self._reached[(host, port)]

    async def forward_port(self, remote_port: int, *, remote_host: str = "127.0.0.1") -> int:
        """Forwards a free local port to `remote_host:remote_port` as seen from the host; returns it.

        The local listener is ours, not the connection's: each accepted connection opens its channel on
        whatever link is live then, so the port (and the URL the study holds) outlives a reconnect."""
        await self._live_connection()  # fails here, not at the first request, if the host is unreachable

        async def tunnel(local_reader: asyncio.StreamReader, local_writer: asyncio.StreamWriter) -> None:
            try:
                connection = await self._live_connection()
                remote_reader, remote_writer = await connection.open_connection(remote_host, remote_port)
            except (TransportError, asyncssh.Error, OSError):
                local_writer.close()
                return
            try:
                await asyncio.gather(_pump(local_reader, remote_writer), _pump(remote_reader, local_writer))
            finally:
                local_writer.close()
                remote_writer.close()

        server = await asyncio.start_server(tunnel, "127.0.0.1", 0)
        self._forwards.append(server)
        return int(server.sockets[0].getsockname()[1])


async def _pump(
    reader: asyncio.StreamReader | asyncssh.SSHReader[bytes], writer: asyncio.StreamWriter | asyncssh.SSHWriter[bytes]
) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncssh.Error):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, asyncssh.Error):
            writer.close()


async def fetch_host_key(host: str, port: int = 22, *, timeout_s: float = 15.0) -> asyncssh.SSHKey:
    try:
        async with asyncio.timeout(timeout_s):
            key = await asyncssh.get_server_host_key(host, port)
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise TransportError(f"cannot reach {host}:{port} to read its host key: {exc}") from None
    if key is None:
        raise TransportError(f"{host}:{port} offered no host key")
    return key


def pin_host_key(known_hosts: Path, host: str, port: int, key: asyncssh.SSHKey) -> str:
    """Adds the key to the pinned file (atomically); returns the line written."""
    name = host if port == 22 else f"[{host}]:{port}"
    line = f"{name} {key.export_public_key('openssh').decode().strip()}\n"
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    existing = known_hosts.read_text() if known_hosts.is_file() else ""
    kept = "".join(entry + "\n" for entry in existing.splitlines() if entry and entry.split()[0] != name)
    temporary = known_hosts.with_name(f".{known_hosts.name}.{secrets.token_hex(4)}.tmp")
    temporary.write_text(kept + line)
    temporary.chmod(0o600)
    temporary.replace(known_hosts)
    return line
