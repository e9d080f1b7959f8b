from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner import assets


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The real llama-server; a test needing it skips only when it could not be built here."""
    binary, model = assets.find_llama_server(), assets.find_model()
    if binary is None or model is None:
        why = os.environ.get("SERVE_TUNER_SETUP_ERROR") or "run `tuner setup` (scripts/test.sh does it)"
        pytest.skip(f"the real llama-server or model is missing: {why}")
    return binary


def llama_server_processes(binary: Path) -> list[int]:
    """PIDs of running processes of this binary, to check that nothing was left running."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")) == binary.resolve():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
