"""The importer seam: a file in some other tool's format in, a trace out; chosen by `kind`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from tuner.config import validate_options
from tuner.errors import WorkloadError
from tuner.registry import Registry
from tuner.workloads import TRACE_FORMAT, TRACE_VERSION, Trace, TraceHeader, TraceRequest

__all__ = ["IMPORTERS", "Importer", "import_trace", "imported_trace", "read_lines"]


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
    trace = importer.read(path, validated, name=name)
    if not trace.requests:
        raise WorkloadError(f"{path}: no requests found for the {kind} importer; is this the right --kind?")
    return trace


def imported_trace(path: Path, name: str, requests: list[TraceRequest]) -> Trace:
    """A trace of `requests` in arrival order, its header naming the file it came from."""
    header = TraceHeader(
        format=TRACE_FORMAT, version=TRACE_VERSION, name=name, description=f"imported from {path.name}"
    )
    return Trace(header=header, requests=sorted(requests, key=lambda r: r.offset_s))


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
