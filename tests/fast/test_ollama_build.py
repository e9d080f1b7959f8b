"""`tuner setup --ollama` refuses, in one line naming the fix, a machine it cannot build Ollama on: no Go, a
Go older than the pinned module needs, no C++ compiler for cgo. Nothing is built or fetched first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import one_error_line, run_tuner
from tuner.assets import BUILD_FLAVOR, LLAMA_CPP, MODEL_FILENAME, SMOLLM2, _require_go
from tuner.errors import AssetError


def _bin_with(directory: Path, tools: dict[str, str]) -> str:
    directory.mkdir()
    for name, script in tools.items():
        tool = directory / name
        tool.write_text(f"#!/bin/sh\n{script}\n")
        tool.chmod(0o755)
    return str(directory)


@pytest.mark.parametrize(
    ("tools", "said"),
    [
        ({}, "building Ollama needs Go 1.24 or later, and `go` is not on PATH: install it and run again"),
        (
            {"go": "echo go1.21.13"},
            "building Ollama needs Go 1.24 or later, and `go` is go1.21.13: install a newer Go and run again",
        ),
        (
            {"go": "echo go1.24rc1", "gcc": "exit 0"},  # a release candidate of the least Go that builds it
            "building Ollama needs a C and C++ compiler for cgo (g++ missing): install them (Debian/Ubuntu: "
            "apt-get install g++) and run again",
        ),
        (
            {"go": "printf 'go1.26.8\\nclang\\nclang++\\n'", "gcc": "exit 0", "g++": "exit 0"},  # cgo's own
            "building Ollama needs a C and C++ compiler for cgo (clang, clang++ missing): install them "
            "(Debian/Ubuntu: apt-get install g++) and run again",
        ),
    ],
)
def test_a_machine_that_cannot_build_ollama_is_told_what_to_install(
    tmp_path: Path, tools: dict[str, str], said: str
) -> None:
    path = _bin_with(tmp_path / "bin", tools)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path)
        with pytest.raises(AssetError) as refused:
            _require_go()
    assert str(refused.value) == said


def test_setup_says_so_in_one_line_before_building(tmp_path: Path) -> None:
    """Through the command: a cache with the model and llama-server in it (stand-ins), no Go on PATH."""
    cache = tmp_path / "cache"
    model = cache / f"smollm2-{SMOLLM2.version}" / MODEL_FILENAME
    model.parent.mkdir(parents=True)
    model.write_bytes(b"")
    (model.parent / "SmolLM2-135M-test-lora.gguf").write_bytes(b"")
    server = cache / f"llama-server-{LLAMA_CPP.version}-{BUILD_FLAVOR}" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    path = _bin_with(tmp_path / "bin", {})
    env = {**os.environ, "SERVE_TUNER_CACHE": str(cache), "PATH": f"{path}:{Path(sys.executable).parent}"}
    env.pop("SERVE_TUNER_OLLAMA", None)
    done = run_tuner("setup", "--ollama", env=env, timeout=60)
    assert done.returncode == 1
    assert one_error_line(done) == (
        "error: building Ollama needs Go 1.24 or later, and `go` is not on PATH: install it and run again"
    )
    assert sorted(p.name for p in cache.iterdir()) == [server.parent.name, model.parent.name]
