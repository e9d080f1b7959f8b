"""A real container runtime for the tests: Debian's podman with Debian's runc, as root, and images made
offline from the builds `tuner setup` caches (no registry is reachable).

Every podman command a test runs, and every `tuner` run (a subprocess through `run_tuner(..., env=...)`, or
`run_cli` in this process with `monkeypatch.setenv("CONTAINERS_CONF", ...)`) that calls podman, must see
`CONTAINERS_CONF` naming the containers.conf `podman_host()` writes (`PodmanHost.env`, or
`podman_env(conf)`): it sets the runtime to runc (Debian's default crun refuses this machine's cgroups) and
lowers the default ulimits to 1024 (podman raises nofile and nproc past what the machine grants, and the
container then fails to start). Where CONTAINERS_CONF is set podman reads that file alone, over its
built-in defaults, so it repeats what Debian's /usr/share/containers/containers.conf sets (its default
capabilities, without the built-in AUDIT_WRITE, MKNOD and NET_RAW, and its ping sysctl).

A run that gives any `--ulimit` replaces the default ulimits whole: podman then raises the ones it was not
given to 1048576, and on this machine a container given `--ulimit nofile=...` alone fails to start
("error setting rlimit type 6", nproc). Give both, e.g. `--ulimit nofile=512:512 --ulimit nproc=1024:1024`.

The images, `localhost/serve-tuner-test/llama-server:TAG` and `localhost/serve-tuner-test/ollama:TAG`, hold
the binary at /usr/local/bin/, the shared libraries `ldd` names at their own paths, /bin/sh (Debian's dash),
/etc/passwd and /etc/group with root and the user `llama` (or `ollama`), uid and gid 1000, whose home
/home/<user> it owns, and /tmp (mode 1777). They have no entrypoint and no command: a run names the
binary. The model is bind-mounted, never in the image. TAG is a hash of the binary's bytes and of
this module's recipe, so that a rebuilt binary gives a new image; an image is built only where
`podman image exists` says it is missing.

Containers are named by `PodmanHost.name` (`st-test-<pid>-<hint>-<n>`); `PodmanHost.remove_all` removes
every container whose name starts with the host's prefix, whoever started it (a test, or the tuner given
such a name), and tests/real/conftest.py calls it after each test that uses the `podman_host` fixture.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import DATA
from tuner import assets

__all__ = [
    "BATCH_STUDY_REST",
    "CONTAINERS_CONF",
    "CONTAINER_PREFIX",
    "IMAGE_REPOSITORY",
    "PodmanHost",
    "PodmanUnavailable",
    "make_llama_server_image",
    "make_ollama_image",
    "podman_env",
    "podman_host",
    "podman_unavailable",
    "write_containers_conf",
]

CONTAINER_PREFIX = "st-test-"
IMAGE_REPOSITORY = "localhost/serve-tuner-test"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
default_capabilities = [
  "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP",
  "SETUID", "SYS_CHROOT",
]
default_sysctls = ["net.ipv4.ping_group_range=0 0"]

[engine]
runtime = "runc"
"""
RUNC = Path("/usr/sbin/runc")
PODMAN_TIMEOUT_S = 120.0
UID = GID = 1000
# Part of every image tag: change it when the layout below changes, so that the new layout is built.
_RECIPE = "serve-tuner-test-image-1"
_LOADER = "/lib64/ld-linux-x86-64.so.2"


class PodmanUnavailable(Exception):
    """This machine cannot run the test containers; the message says why."""


def write_containers_conf(directory: Path) -> Path:
    """The tests' containers.conf (CONTAINERS_CONF above) in `directory`."""
    conf = directory / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return conf


def podman_env(conf: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (os.environ by default) with CONTAINERS_CONF naming `conf`: for podman, and for a tuner that
    calls it."""
    return {**(os.environ if base is None else base), "CONTAINERS_CONF": str(conf)}


def podman_unavailable() -> str | None:
    """Why this machine cannot run the test containers (no podman, no runc, not root), or None."""
    if shutil.which("podman") is None:
        return "`podman` is not on PATH"
    if not os.access(RUNC, os.X_OK):
        return f"{RUNC} is not installed (Debian's runc)"
    if os.geteuid() != 0:
        return "the test containers run as root (rootless podman needs subuids and a user namespace)"
    return None


def _podman(
    *args: str, env: Mapping[str, str] | None, check: bool = True, timeout: float = PODMAN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args],
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise PodmanUnavailable(f"`podman {' '.join(args)}` exited {done.returncode}: {_tail(done.stderr)}")
    return done


def _tail(text: str, lines: int = 3) -> str:
    said = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(said[-lines:]) or "no output"


# ---- images ---------------------------------------------------------------------------------------


def make_llama_server_image(*, env: Mapping[str, str] | None = None) -> str:
    """The llama-server image's reference, built from `tuner setup`'s binary if missing."""
    binary = assets.find_llama_server()
    if binary is None:
        raise PodmanUnavailable("llama-server is not built (`tuner setup`)")
    return _image("llama-server", binary, user="llama", env=env)


def make_ollama_image(*, env: Mapping[str, str] | None = None) -> str:
    """The Ollama image's reference, built from `tuner setup --ollama`'s binary if missing. Run it with
    `--user 1000:1000`, HOME=/home/ollama (where `ollama serve` writes its key pair) and
    ollama_models_dir() bind-mounted as OLLAMA_MODELS."""
    binary = assets.find_ollama()
    if binary is None:
        raise PodmanUnavailable("ollama is not built (`tuner setup --ollama`)")
    return _image("ollama", binary, user="ollama", env=env)


def _image(name: str, binary: Path, *, user: str, env: Mapping[str, str] | None) -> str:
    digest = hashlib.sha256(_RECIPE.encode())
    with binary.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    reference = f"{IMAGE_REPOSITORY}/{name}:{digest.hexdigest()[:16]}"
    # One build at a time across test processes (pytest-xdist workers): the second finds the image.
    lock = assets.cache_root() / "podman-test-images.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if _podman("image", "exists", reference, env=env, check=False).returncode != 0:
            _import(reference, _rootfs(binary, name, user), env=env)
    return reference


def _shared_libraries(binary: Path) -> list[Path]:
    """The libraries the dynamic loader resolves for `binary`, and the loader itself."""
    said = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=60).stdout
    found = {Path(_LOADER)}  # named by path, with no "=>"
    for line in said.splitlines():
        resolved = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(0x", line)
        if resolved:
            found.add(Path(resolved[1]))
    return sorted(found)


def _rootfs(binary: Path, name: str, user: str) -> bytes:
    """The image's root filesystem, as a tar archive (owners and modes set in it, nothing written to disk)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:

        def directory(path: str, mode: int = 0o755, uid: int = 0) -> None:
            entry = tarfile.TarInfo(path.lstrip("/"))
            entry.type, entry.mode, entry.uid, entry.gid = tarfile.DIRTYPE, mode, uid, uid
            archive.addfile(entry)

        def text(path: str, content: str) -> None:
            data = content.encode()
            entry = tarfile.TarInfo(path.lstrip("/"))
            entry.size, entry.mode = len(data), 0o644
            archive.addfile(entry, io.BytesIO(data))

        def copy(source: Path, path: str) -> None:
            entry = archive.gettarinfo(str(source.resolve()), arcname=path.lstrip("/"))
            entry.uid = entry.gid = 0
            entry.uname = entry.gname = "root"
            entry.mode = 0o755
            with source.resolve().open("rb") as handle:
                archive.addfile(entry, handle)

        made: set[str] = set()

        def parents(path: str) -> None:
            for parent in reversed(Path(path).parents[:-1]):
                if str(parent) not in made:
                    made.add(str(parent))
                    directory(str(parent))

        libraries = sorted({*_shared_libraries(binary), *_shared_libraries(Path("/bin/dash"))})
        for path in ("/bin/sh", f"/usr/local/bin/{name}", *map(str, libraries)):
            parents(path)
        directory("/tmp", 0o1777)
        directory("/home")
        directory(f"/home/{user}", 0o755, uid=UID)
        parents("/etc/x")
        text("/etc/passwd", f"root:x:0:0:root:/root:/bin/sh\n{user}:x:{UID}:{GID}:{user}:/home/{user}:/bin/sh\n")
        text("/etc/group", f"root:x:0:\n{user}:x:{GID}:\n")
        copy(Path("/bin/dash"), "/bin/sh")
        copy(binary, f"/usr/local/bin/{name}")
        for library in libraries:
            copy(library, str(library))
    return buffer.getvalue()


def _import(reference: str, rootfs: bytes, *, env: Mapping[str, str] | None) -> None:
    done = subprocess.run(
        ["podman", "import", "--message", _RECIPE, "-", reference],
        input=rootfs,
        env=None if env is None else dict(env),
        capture_output=True,
        check=False,
        timeout=PODMAN_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise PodmanUnavailable(f"`podman import` of {reference} failed: {_tail(done.stderr.decode(errors='replace'))}")


# The rest of a short llama-server study file after its [engine] section: the small stall workload, n_batch and
# n_ubatch at two values each (tests/data/batch-space.toml), scored on prefill throughput.
BATCH_STUDY_REST = f"""[workload]
path = {json.dumps(str(DATA / "stall-small.jsonl"))}
request_timeout_s = 120
[search]
space = {json.dumps(str(DATA / "batch-space.toml"))}
sampler = "random"
[metrics]
long_prompt_tokens = 600
[[objectives]]
metric = "prefill_tok_s"
direction = "maximize"
"""


# ---- containers -----------------------------------------------------------------------------------


@dataclass
class PodmanHost:
    """podman as the tests run it: `env` (CONTAINERS_CONF set) for every podman and tuner they start, and
    the names of their containers, all under `prefix`, so that `remove_all` leaves none behind."""

    conf: Path
    env: dict[str, str]
    llama_server_image: str
    prefix: str = field(default_factory=lambda: f"{CONTAINER_PREFIX}{os.getpid()}-")
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def podman(
        self, *args: str, check: bool = True, timeout: float = PODMAN_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """`podman ARGS` with this host's environment, its output captured; `check` raises AssertionError
        (with podman's stderr) where it exits non-zero."""
        done = _podman(*args, env=self.env, check=False, timeout=timeout)
        assert not check or done.returncode == 0, f"`podman {' '.join(args)}` exited {done.returncode}: {done.stderr}"
        return done

    def name(self, hint: str = "c") -> str:
        """A new container name under this host's prefix: removed by `remove_all`."""
        return f"{self.prefix}{hint}-{next(self._counter)}"

    def inspect(self, name: str) -> dict[str, Any]:
        """`podman inspect --type container NAME`'s one element."""
        said = json.loads(self.podman("inspect", "--type", "container", name).stdout)
        assert isinstance(said, list) and len(said) == 1 and isinstance(said[0], dict), said
        return said[0]

    def remove(self, name: str) -> None:
        """The container stopped (at once) and removed; a missing one is no error."""
        self.podman("rm", "--force", "--ignore", "--time", "0", name, timeout=60)

    def containers(self) -> list[str]:
        """The names of this host's containers, running or not."""
        listed = self.podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^{self.prefix}").stdout
        return [name for name in listed.split() if name.startswith(self.prefix)]

    def remove_all(self) -> None:
        """Every container of this host removed."""
        for name in self.containers():
            self.remove(name)


@contextlib.contextmanager
def podman_host() -> Iterator[PodmanHost]:
    """A PodmanHost with its containers.conf in a temporary directory, the llama-server image made, and a
    trivial container run from it to prove the runtime works (PodmanUnavailable says why not). On exit
    every container of the host is removed, and the directory with them."""
    why = podman_unavailable()
    if why is not None:
        raise PodmanUnavailable(why)
    with tempfile.TemporaryDirectory(prefix="serve-tuner-podman-") as tmp:
        env = podman_env(write_containers_conf(Path(tmp)))
        _remove_orphans(env)
        host = PodmanHost(
            conf=Path(tmp) / "containers.conf", env=env, llama_server_image=make_llama_server_image(env=env)
        )
        try:
            name = host.name("probe")
            probe = _podman(
                "run", "--rm", "--name", name, host.llama_server_image, "/bin/sh", "-c", "true", env=env, check=False
            )
            if probe.returncode != 0:
                raise PodmanUnavailable(f"a trivial container exited {probe.returncode}: {_tail(probe.stderr)}")
            yield host
        finally:
            host.remove_all()


def _remove_orphans(env: Mapping[str, str]) -> None:
    """The containers of test processes that are gone (killed before their teardown ran)."""
    listed = _podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^{CONTAINER_PREFIX}", env=env).stdout
    for name in listed.split():
        owner = re.match(rf"{re.escape(CONTAINER_PREFIX)}(\d+)-", name)
        if owner and not Path(f"/proc/{owner[1]}").exists():
            _podman("rm", "--force", "--ignore", "--time", "0", name, env=env, check=False, timeout=60)
