"""A trace's file (JSONL, version 1: `trace_format.py`): read a line at a time into a `Trace`, every
problem named with the file and line number; written a batch of lines at a time from the columns."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from pydantic import ValidationError
from pydantic_core import to_json

from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.files import special_file
from tuner.workloads.trace import Trace, TraceBuilder
from tuner.workloads.trace_format import TRACE_VERSION, TraceHeader, TraceRequest

__all__ = ["dump_trace", "load_trace", "trace_lines"]


def load_trace(path: Path, *, named_by: str = "workload.path") -> Trace:
    """Reads a trace, a line at a time (a million requests fit in a few hundred MB); every problem is
    reported with the file and line number. Values are not coerced (`"new_tokens": "90"` is refused),
    and NaN or infinite numbers are refused. `named_by` is where the user named the path: the fix to check."""
    special = special_file(path)
    if special is not None:
        raise WorkloadError(f"{path} is {special}, not a trace file; check {named_by}")
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: workload file not found; check {named_by}") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path} is a directory; name the trace file (JSONL) in it") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    builder: TraceBuilder | None = None
    with handle:
        try:
            # A binary file is named as one before any line of it is read as text.
            binary = b"\x00" in handle.read(8192)
            handle.seek(0)
            for number, raw in enumerate(handle, start=1):
                if binary or b"\x00" in raw:
                    raise WorkloadError(f"{path}: is a binary file, not a trace (JSONL text); check {named_by}")
                try:
                    # A BOM before the header is harmless here.
                    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError:
                    raise WorkloadError(
                        f"{path}:{number}: not UTF-8 text; a trace is JSONL written by serve-tuner"
                    ) from None
                if not line.strip():
                    continue
                if builder is None:
                    header = _parse_line(path, number, line, TraceHeader)
                    if header.version != TRACE_VERSION:
                        raise WorkloadError(
                            f"{path}:{number}: trace version {header.version} is not supported (this tool reads "
                            f"version {TRACE_VERSION}); convert the file or upgrade serve-tuner"
                        )
                    builder = TraceBuilder(header)
                    continue
                builder.add(_parse_line(path, number, line, TraceRequest))
        except OSError as exc:
            raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    if builder is None:
        raise WorkloadError(f"{path}: empty; expected a header line and requests")
    if not len(builder):
        raise WorkloadError(f"{path}: has a header but no requests")
    trace = builder.build()
    repeated = _repeated_id(trace.ids)
    if repeated is not None:
        raise WorkloadError(f"{path}: request id {repeated!r} appears twice; ids must be unique")
    return trace.in_arrival_order()


def _repeated_id(ids: Sequence[str]) -> str | None:
    """An id that appears more than once, or None. Compared by hash first (8 bytes an id, where a set of
    a million ids takes 90 MB), then exactly among ids of equal hash."""
    hashes = np.fromiter((hash(i) for i in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    equal = np.flatnonzero(ordered[1:] == ordered[:-1])
    pairs = zip(order[equal].tolist(), order[equal + 1].tolist(), strict=True)
    repeated = [min(a, b) for a, b in pairs if ids[a] == ids[b]]
    return ids[min(repeated)] if repeated else None


ModelT = TypeVar("ModelT", bound=StrictModel)


def _parse_line(path: Path, number: int, line: str, model: type[ModelT]) -> ModelT:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise WorkloadError(f"{path}:{number}: nested too deeply to be a trace line") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}:{number}: expected a JSON object")
    try:
        return model.model_validate_json(line, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(line)"
        problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        shown = "" if first["type"] in ("extra_forbidden", "missing") else f" (got {first.get('input')!r:.60})"
        raise WorkloadError(f"{path}:{number}: {where}: {problem}{shown}") from None


def dump_trace(trace: Trace) -> str:
    """The trace as JSONL text: the header line, then one request per line."""
    return b"".join(trace_lines(trace)).decode()


def trace_lines(trace: Trace, *, batch: int = 2000) -> Iterator[bytes]:
    """The trace's JSONL, a batch of lines at a time: what a writer streams to the file. Each line is
    what the request's model writes (`model_dump_json(exclude_defaults=True)`), made from the columns
    without the model: for a million requests the models would take most of the time."""
    yield trace.header.model_dump_json(exclude_defaults=False).encode() + b"\n"
    for start in range(0, len(trace), batch):
        indices = range(start, min(start + batch, len(trace)))
        yield b"".join(to_json(row) + b"\n" for row in trace.stored_rows(indices))
