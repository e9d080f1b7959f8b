"""The importer seam: a file in some other tool's format in, a trace out; chosen by `kind`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from tuner.config import validate_options
from tuner.errors import WorkloadError
from tuner.registry import Registry
from tuner.workloads import TRACE_FORMAT, TRACE_VERSION, Trace, TraceBuilder, TraceHeader, TraceRequest

__all__ = [
    "IMPORTERS",
    "Importer",
    "guess_importer",
    "import_builder",
    "import_trace",
    "imported_trace",
    "read_lines",
    "stream_lines",
]


class Importer(Protocol):
    @property
    def description(self) -> str: ...

    @property
    def options_model(self) -> type[BaseModel]: ...

    def read(self, path: Path, options: Any, *, name: str) -> Trace:
        """The trace the file describes; `WorkloadError` naming the file and line for bad input."""
        ...


IMPORTERS: Registry[type[Importer]] = Registry("importer")


def import_trace(kind: str, path: Path, options: Mapping[str, Any], *, name: str) -> Trace:
    importer = IMPORTERS.get(kind)()
    validated = validate_options(importer.options_model, options, where=f"{kind} importer")
    try:
        trace = importer.read(path, validated, name=name)
        if not len(trace):
            raise WorkloadError(f"{path}: no requests found for the {kind} importer")
    except WorkloadError as exc:
        raise WorkloadError(f"{exc}{_format_hint(path, kind)}") from None
    return trace


def guess_importer(path: Path) -> str | None:
    """The importer whose format the file's first non-blank line has, or None when none clearly fits.
    Only used to word an error: a file that an importer could not read is named with the one that fits."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            first = next((line.strip() for line in itertools.islice(handle, 200) if line.strip()), "")
    except OSError:
        return None
    if first.startswith("{"):
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            return None
        if isinstance(row, dict) and {"input_length", "output_length"} <= row.keys():
            return "mooncake"
        if isinstance(row, dict) and ("request" in row or "body" in row) and "response" in row:
            return "openai-log"
        return None
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= {c.strip() for c in first.split(",")}:
        return "azure"
    # llama-server's own log lines ("srv  llama_server: ...", "slot launch_slot_: ..."), plain or journalctl's.
    if " srv " in f" {first} " or " slot " in f" {first} " or "llama-server" in first or "llama_server" in first:
        return "llama-server-log"
    return None


def _format_hint(path: Path, kind: str) -> str:
    """What to run instead when the file is in another importer's format; else the formats there are."""
    fits = guess_importer(path)
    if fits is not None and fits != kind:
        return f"; the file looks like {fits} input: `tuner workload import {fits} {path} --out TRACE`"
    if fits == kind or not _has_text(path):
        return ""  # the importer is right, or no importer would read it (a directory, an empty file)
    return f"; the importer is the first argument of `tuner workload import` ({', '.join(IMPORTERS.kinds())})"


def _has_text(path: Path) -> bool:
    """Whether the path is a file with something other than blank lines in its first 64 KiB."""
    try:
        with path.open("rb") as handle:
            return bool(handle.read(65536).strip())
    except OSError:
        return False


def imported_trace(path: Path, name: str, requests: list[TraceRequest]) -> Trace:
    """A trace of `requests` in arrival order, its header naming the file it came from."""
    header = TraceHeader(
        format=TRACE_FORMAT, version=TRACE_VERSION, name=name, description=f"imported from {path.name}"
    )
    return Trace(header=header, requests=sorted(requests, key=lambda r: r.offset_s))


def import_builder(path: Path, name: str) -> TraceBuilder:
    """A builder for the trace imported from `path`, its header naming the file."""
    return TraceBuilder(
        TraceHeader(format=TRACE_FORMAT, version=TRACE_VERSION, name=name, description=f"imported from {path.name}")
    )


def stream_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's lines with their numbers, read as a stream (a big trace is never held whole). A leading
    byte-order mark (a spreadsheet's export) is dropped; a byte that is not UTF-8 reads as U+FFFD."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            yield from enumerate((line.rstrip("\r\n") for line in handle), start=1)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
