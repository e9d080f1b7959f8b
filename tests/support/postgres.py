"""A real PostgreSQL for the fleet tests: Debian's server binaries, a cluster made by initdb in a temporary
directory, started on a free loopback port (and a socket in that directory), stopped after.

As root, initdb refuses to run, so the cluster belongs to the `postgres` system user and its commands run
through `runuser -u postgres --`; as anyone else they run directly. `pg_ctl -w` waits for the server to
accept connections: no fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support import free_port

__all__ = ["find_postgres_bin", "running_postgres"]


def find_postgres_bin() -> Path | None:
    """The directory of Debian's initdb and pg_ctl (the newest installed version), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@contextlib.contextmanager
def running_postgres(base: Path, *, database: str = "tuner") -> Iterator[str]:
    """Starts a fresh cluster under `base` and yields a URL of an empty database in it."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("initdb is not installed")
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    user = "postgres" if as_root else os.environ.get("USER", "postgres")
    base.mkdir(parents=True, exist_ok=True)
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir(exist_ok=True)
    if as_root:
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
        base.chmod(0o755)
        for parent in base.parents:  # the postgres user must reach the directory (mkdtemp makes it 0700)
            if parent in (Path("/"), Path("/tmp")):
                break
            with contextlib.suppress(OSError):
                parent.chmod(parent.stat().st_mode | 0o011)
    port = free_port()

    def run(*argv: str) -> None:
        done = subprocess.run([*prefix, *argv], check=False, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:1])} exited {done.returncode}: {(done.stderr or done.stdout)[-500:]}")

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", user, "-A", "trust", "--no-sync", "-E", "UTF8")
    options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={sockets} -c fsync=off"
    log = base / "postgres.log"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
    try:
        run(str(bin_dir / "createdb"), "-h", str(sockets), "-p", str(port), "-U", user, database)
        yield f"postgresql://{user}@127.0.0.1:{port}/{database}"
    finally:
        try:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        except RuntimeError:
            status = subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "status"], check=False, timeout=30
            )
            if status.returncode != 3:  # 3: no server running (it stopped already)
                raise
